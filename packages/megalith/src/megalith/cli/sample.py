"""`megalith sample`: text from a trained model, on one process.

    megalith sample runs/gpt-tiny-ddp --prompt "ROMEO:"             # the run's latest checkpoint
    megalith sample runs/NAME/checkpoints/step_000200 --prompt "Hi"  # that checkpoint
    megalith sample ckpt/llama --prompt "Hi" --top-k 40 --temperature 0.8   # a transformers folder
    megalith sample runs/my-lora --prompt "Hi"                      # a LoRA run: base + adapter/

Greedy with --top-k 1 (the default) or --temperature 0; else top-k sampling (--seed).
The tokenizer is the run's (--tokenizer of `megalith train`), a transformers folder's own,
or bytes; --tokenizer DIR overrides it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sample",
        help="text from a run, a checkpoint or a transformers folder",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("source", metavar="RUN_OR_CKPT", help="a run, a checkpoint, or a model folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=64, help="default: 64")
    p.add_argument("--top-k", type=int, default=1, help="1: greedy (default); 0: all tokens")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy (default: 1.0)")
    p.add_argument("--seed", type=int, default=0, help="of the sampling (default: 0)")
    p.add_argument("--tokenizer", default=None, help="a local tokenizer folder (overrides)")
    p.set_defaults(func=run)
    return p


def _check(args: argparse.Namespace) -> None:
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}; expected >= 1")
    if args.top_k < 0:
        raise ValueError(f"--top-k {args.top_k}; expected >= 0 (1: greedy, 0: every token)")
    if args.temperature < 0:
        raise ValueError(f"--temperature {args.temperature}; expected >= 0 (0: greedy)")
    if not args.prompt:
        raise ValueError("--prompt is empty; give some text to continue")
    if not Path(args.source).exists():
        raise ValueError(f"{args.source}: no such run, checkpoint or folder")


def _library() -> str:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "megalith"
    return "transformers"


def _model_folder(directory: Path) -> Any:
    from megalith.pretrained import from_pretrained

    return from_pretrained(directory, library=_library())


def _lora_model(base: str, train_args: dict[str, Any], ckpt: Path | None, adapter: Path) -> Any:
    """A LoRA run's model: its base checkpoint plus the adapter (runs/NAME/adapter/), or
    with a checkpoint given, the adapter weights that checkpoint holds."""
    try:
        import peft
    except ImportError:
        raise ValueError("a LoRA run samples through peft: pip install peft") from None
    model = _model_folder(Path(base))
    if ckpt is None:
        return peft.PeftModel.from_pretrained(model, str(adapter))
    from megalith.pretrained import load_into
    from megalith.train import finetune

    wrapped = peft.get_peft_model(model, finetune.lora_config(argparse.Namespace(**train_args)))
    load_into(wrapped.get_base_model(), ckpt / "model")
    return wrapped


def resolve(source: str) -> tuple[Any, str | None, dict[str, Any]]:
    """(the model, in eval mode; its tokenizer folder or None for bytes; its config.json)."""
    from megalith.train import state, tokenize

    path = Path(source)
    if (path / "adapter_config.json").is_file():  # an adapter folder: peft names its base
        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
        model = _lora_model(base, {}, None, path)
        tok = base if tokenize.has_tokenizer(base) else None
        return model.eval(), tok, json.loads((Path(base) / "config.json").read_text())
    if (path / "config.json").is_file() and not (path / state.COMPLETE).is_file():
        tok = str(path) if tokenize.has_tokenizer(path) else None
        return _model_folder(path).eval(), tok, json.loads((path / "config.json").read_text())
    ckpt = state.find(path)
    if ckpt is None:
        raise ValueError(
            f"{source}: no complete checkpoint in it (nor config.json); pass a run, a "
            "checkpoint (runs/NAME/checkpoints/step_N) or a transformers model folder"
        )
    train_args = json.loads((ckpt / state.COMPLETE).read_text()).get("args", {})
    tok = train_args.get("tokenizer")
    if train_args.get("lora"):
        base = train_args["from_pretrained"]
        adapter = path / "adapter"
        given = None if ckpt != path and adapter.is_dir() else ckpt
        model = _lora_model(base, train_args, given, adapter)
        return model.eval(), tok, json.loads((Path(base) / "config.json").read_text())
    config = json.loads((ckpt / "model" / "config.json").read_text())
    return _model_folder(ckpt / "model").eval(), tok, config


def run(args: argparse.Namespace) -> int:
    try:
        _check(args)
        from megalith.train import finetune, tokenize
        from megalith.train.generate import generate

        model, tok_dir, config = resolve(args.source)
        tokenizer = tokenize.load(args.tokenizer or tok_dir)
        vocab = config.get("vocab_size")
        if vocab is not None and tokenizer.vocab_size > vocab:
            raise ValueError(
                f"tokenizer {tokenizer.name}: {tokenizer.vocab_size} tokens, more than the "
                f"model's {vocab}; pass --tokenizer DIR, the one it was trained with"
            )
        prompt = tokenizer.encode(args.prompt)
        if not prompt:
            raise ValueError(f"--prompt {args.prompt!r} gives no tokens")
        new = generate(
            model,
            prompt,
            args.max_new_tokens,
            context=finetune.context_of(config) or len(prompt) + args.max_new_tokens,
            top_k=args.top_k,
            temperature=args.temperature,
            seed=args.seed,
        )
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"megalith sample: {e}") from None
    print(args.prompt + tokenizer.decode(new), flush=True)
    return 0
