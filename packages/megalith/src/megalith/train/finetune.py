"""`megalith train --from-pretrained DIR [--lora R]`: fine-tune a pretrained model.

DIR is a folder transformers' save_pretrained wrote (config.json plus safetensors), or
a megalith checkpoint's model/ folder (the same files). Its config.json decides the
architecture; the model is built lazily (megalith.lazy) and each tensor read from the
files into its own storage (megalith.pretrained), before the plugin shards it: nothing
random is drawn for it. The model is transformers' AutoModelForCausalLM class for the
config (megalith.models' GPT-2 or Llama where transformers is not installed).

With --lora, peft adds adapters (Booster.enable_lora) and only they train; the run ends
by writing them in peft's format to runs/NAME/adapter/. A full fine-tune's checkpoints
hold a transformers model under model/ (config.json beside the weights).

check() runs before any rank starts (ValueError naming the option and the fix);
everything here keeps its imports inside the functions (the CLI parser imports this).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

#: config.json keys holding the context length, by the model families that use them
_CONTEXT_KEYS = ("n_positions", "max_position_embeddings", "n_ctx", "max_seq_len")


def add_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("fine-tuning")
    g.add_argument(
        "--from-pretrained",
        default=None,
        metavar="DIR",
        help="start from this transformers checkpoint folder (or a megalith checkpoint's "
        "model/); its config.json decides the architecture",
    )
    g.add_argument(
        "--lora",
        type=int,
        default=None,
        metavar="R",
        help="train LoRA adapters of rank R only (needs peft); the adapter is written to "
        "runs/NAME/adapter/ in peft's format",
    )
    g.add_argument("--lora-alpha", type=float, default=None, help="LoRA's alpha (default: 2 R)")
    g.add_argument(
        "--lora-targets",
        default=None,
        help="comma-separated module names to adapt, e.g. q_proj,v_proj (default: peft's "
        "choice for the model type)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="a local Hugging Face tokenizer folder (default: bytes, a vocabulary of 256)",
    )
    g.add_argument(
        "--text-field",
        default="text",
        help="the text of each record of a .jsonl or datasets --data (default: text)",
    )
    g.add_argument(
        "--sample-tokens",
        type=int,
        default=32,
        help="tokens of greedy text printed at each evaluation (0: none; default: 32)",
    )


def read_config(directory: str) -> dict[str, Any]:
    """config.json of --from-pretrained DIR; ValueError naming what the folder lacks."""
    path = Path(directory)
    if not path.is_dir():
        raise ValueError(f"--from-pretrained {directory}: no such directory")
    file = path / "config.json"
    if not file.is_file():
        raise ValueError(
            f"--from-pretrained {directory}: no config.json; pass a folder transformers' "
            "save_pretrained wrote, or a megalith checkpoint's model/ folder"
        )
    if not any(path.glob("*.safetensors")):
        raise ValueError(
            f"--from-pretrained {directory}: no .safetensors weights (megalith reads "
            "safetensors only; save the model with safe_serialization=True)"
        )
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--from-pretrained {file}: not JSON ({e.msg})") from None


def context_of(hf: dict[str, Any]) -> int | None:
    """The longest sequence the model takes, from its config.json (None: not said)."""
    return next((int(hf[k]) for k in _CONTEXT_KEYS if hf.get(k)), None)


def label(directory: str) -> str:
    """The model's name in the run's name and summary: the folder's name, or for a
    checkpoint's runs/NAME/checkpoints/step_N/model, NAME."""
    d = Path(directory).resolve()
    if d.name == "model" and d.parent.name.startswith("step_") and len(d.parents) > 2:
        return d.parents[2].name
    return d.name


def _disagreement(preset: Any, hf: dict[str, Any]) -> str | None:
    """Why a megalith.models preset is not the checkpoint's architecture (None: it is)."""
    from megalith.models.hf import from_hf_config

    try:
        theirs = from_hf_config(hf)
    except (KeyError, ValueError):
        return f"a {hf.get('model_type', 'model')} that no megalith preset describes"
    if type(theirs) is not type(preset):
        return f"a {hf.get('model_type')} model, not a {type(preset).__name__}"
    for field in ("d_model", "n_layers", "n_heads", "d_ff"):
        if getattr(theirs, field) != getattr(preset, field):
            return f"{field} {getattr(theirs, field)} (the preset's: {getattr(preset, field)})"
    return None


def resolve_model(args: argparse.Namespace) -> None:
    """args.model: the preset (default gpt-tiny), or with --from-pretrained the
    checkpoint's label; ValueError when --model names another architecture."""
    for key in ("from_pretrained", "tokenizer"):  # checkpoints name them from anywhere
        if getattr(args, key) is not None and Path(getattr(args, key)).exists():
            setattr(args, key, str(Path(getattr(args, key)).resolve()))
    if args.from_pretrained is None:
        args.model = args.model or "gpt-tiny"
        return
    name = label(args.from_pretrained)
    if args.model is None or args.model == name:
        args.model = name
        return
    from megalith import models

    hf = read_config(args.from_pretrained)
    if args.model not in models.PRESETS:
        raise ValueError(
            f"--model {args.model} with --from-pretrained: the checkpoint's config.json "
            "decides the architecture; leave --model out"
        )
    why = _disagreement(models.get_config(args.model), hf)
    if why is not None:
        raise ValueError(
            f"--model {args.model} disagrees with --from-pretrained {args.from_pretrained} "
            f"({why}); leave --model out: the checkpoint's config.json decides the architecture"
        )


def _library() -> str:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "megalith"
    return "transformers"


def lora_config(args: argparse.Namespace) -> Any:
    import peft

    targets = [t.strip() for t in args.lora_targets.split(",")] if args.lora_targets else None
    return peft.LoraConfig(
        r=args.lora,
        lora_alpha=args.lora_alpha if args.lora_alpha is not None else 2 * args.lora,
        target_modules=targets,
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )


def _meta_model(directory: str) -> Any:
    """The checkpoint's model on the meta device (nothing allocated, nothing read)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory, local_files_only=True)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config)


def _check_lora(args: argparse.Namespace) -> None:
    if args.lora < 1:
        raise ValueError(f"--lora {args.lora}; expected a rank >= 1 (e.g. --lora 8)")
    if args.lora_alpha is not None and not args.lora_alpha > 0:
        raise ValueError(f"--lora-alpha {args.lora_alpha}; expected a positive number")
    if args.from_pretrained is None:
        raise ValueError(
            "--lora adapts a pretrained model; pass --from-pretrained DIR too (LoRA on a "
            "model trained from nothing would leave its random weights frozen)"
        )
    if getattr(args, "plugin", None) == "auto":
        raise ValueError("--lora with --plugin auto, which plans full training; choose the plugin")
    try:
        import peft
    except ImportError:
        raise ValueError("--lora needs Hugging Face peft: pip install peft") from None
    if _library() != "transformers":
        raise ValueError(
            "--lora needs transformers (peft adapts its models): pip install transformers"
        )
    import torch

    try:  # building on meta still draws from the generator: the run's seed stays untouched
        with torch.random.fork_rng(devices=[]):
            peft.get_peft_model(_meta_model(args.from_pretrained), lora_config(args))
    except ValueError as e:
        first = str(e).splitlines()[0]
        raise ValueError(
            f"--lora-targets {args.lora_targets or '(peft default)'}: {first}; name the "
            "model's linear layers, e.g. --lora-targets q_proj,v_proj"
        ) from None


def check(args: argparse.Namespace) -> None:
    """ValueError naming the first fine-tuning option that cannot work (before the ranks)."""
    from . import corpus, tokenize

    if args.sample_tokens < 0:
        raise ValueError(f"--sample-tokens {args.sample_tokens}; expected >= 0 (0: no samples)")
    if args.lora is None:
        for name in ("lora_alpha", "lora_targets"):
            if getattr(args, name) is not None:
                raise ValueError(f"--{name.replace('_', '-')} is for --lora R; pass --lora too")
    tok = tokenize.load(args.tokenizer)
    corpus.check(args.data, args.text_field)
    if args.from_pretrained is None:
        if args.lora is not None:
            _check_lora(args)
        return
    hf = read_config(args.from_pretrained)
    vocab = hf.get("vocab_size")
    if vocab is not None and tok.vocab_size > vocab:
        hint = (
            " (bytes: pass --tokenizer DIR, the model's tokenizer)" if tok.name == "bytes" else ""
        )
        raise ValueError(
            f"--tokenizer {tok.name}: {tok.vocab_size} tokens, more than the model's vocabulary "
            f"of {vocab} (config.json vocab_size){hint}"
        )
    context = context_of(hf)
    if context is not None and args.seq_len > context:
        raise ValueError(
            f"--seq-len {args.seq_len} is longer than the model's context of {context} "
            f"tokens (config.json); pass --seq-len {context} or less"
        )
    if _library() == "megalith":
        from megalith.models.hf import from_hf_config

        try:
            from_hf_config(hf)
        except (KeyError, ValueError) as e:
            raise ValueError(
                f"--from-pretrained {args.from_pretrained}: {e}; other models need "
                "transformers: pip install transformers"
            ) from None
    if args.lora is not None:
        _check_lora(args)


def build(args: argparse.Namespace, booster: Any) -> tuple[Any, int | None]:
    """(the model filled from --from-pretrained, with LoRA adapters under --lora; its
    context length), on this rank's host, before boost."""
    from megalith.pretrained import from_pretrained

    hf = read_config(args.from_pretrained)
    model = from_pretrained(args.from_pretrained, library=_library()).train()
    if args.activation_checkpointing:
        if hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable()
        else:
            model.set_activation_checkpointing(True)
    if args.lora is not None:
        model = booster.enable_lora(model, lora_config=lora_config(args))
    return model, context_of(hf)


def save_adapter(booster: Any, model: Any, run_dir: Path, args: argparse.Namespace) -> Path:
    """Collective: runs/NAME/adapter/ (adapter_config.json + adapter_model.safetensors),
    naming the base checkpoint, so peft.PeftModel.from_pretrained and `megalith sample`
    find it."""
    import megalith_comm as comm

    out = run_dir / "adapter"
    booster.save_lora_as_pretrained(model, str(out), use_safetensors=True)
    comm.barrier()
    if comm.get_world().rank == 0:
        from megalith_core.atomic_files import atomic_write_json

        file = out / "adapter_config.json"
        config = json.loads(file.read_text())
        config["base_model_name_or_path"] = str(Path(args.from_pretrained).resolve())
        atomic_write_json(file, config, indent=2)
    comm.barrier()
    return out


def trainable(model: Any) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parameters(model: Any) -> int:
    """Every parameter once (a tied one counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
