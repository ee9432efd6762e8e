"""How analyze() sees a model: its parts (pre, repeated blocks, post), the inputs of one
training forward, the loss, and the sizes a planner needs (heads, hidden, vocabulary).

Parts come from where a pipeline may cut the model: the tp policy's pipeline_parts()
when one matches (transformers models), else the model's own pipeline_parts()
(megalith.models), else the longest nn.ModuleList of modules of one class. Each part
is the set of the model's own modules it holds (stage wrappers are looked through).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

Parts = list[list[nn.Module]]  # [pre, block 1, ..., block n, post]


def _own_modules(part: nn.Module, own: set[int]) -> list[nn.Module]:
    """The outermost modules of the model that `part` holds (itself if it is one)."""
    if id(part) in own:
        return [part]
    found: list[nn.Module] = []
    for child in part.children():
        found += _own_modules(child, own)
    return found


def _without_ancestors(modules: list[nn.Module], claimed: set[int]) -> list[nn.Module]:
    """modules, each that holds another part's module replaced by its children (BertModel's
    head stage holds the whole encoder, whose layers are the blocks)."""
    out: list[nn.Module] = []
    for m in modules:
        if any(id(sub) in claimed for sub in list(m.modules())[1:]):
            out += _without_ancestors(list(m.children()), claimed)
        else:
            out.append(m)
    return out


def _longest_module_list(model: nn.Module) -> list[nn.Module]:
    best: list[nn.Module] = []
    for m in model.modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best):
            if len({type(b) for b in m}) == 1:
                best = list(m)
    return best


def model_parts(model: nn.Module) -> Parts:
    from megalith.tensor_parallel.policies import policy_for

    cut = None
    try:
        cut = policy_for(model).pipeline_parts(model)
    except ValueError:
        pass
    if cut is None and hasattr(model, "pipeline_parts"):
        cut = model.pipeline_parts()
    if cut is None:
        blocks = _longest_module_list(model)
        if not blocks:
            raise ValueError(
                f"analyze: {type(model).__name__} has no repeated blocks (no nn.ModuleList "
                "of one module class and no pipeline_parts()); give it a pipeline_parts() "
                "returning (embedding, blocks, head)"
            )
        return [[], *[[b] for b in blocks], []]
    own = {id(m) for m in model.modules()}
    embed, blocks, head = cut
    parts = [_own_modules(p, own) for p in (embed, *blocks, head)]
    claimed = {id(m) for part in parts for m in part}
    return [_without_ancestors(part, claimed) for part in parts]


def forward_inputs(model: nn.Module, seq_len: int) -> dict[str, torch.Tensor]:
    """The keyword inputs of one training forward of a batch of 1 x seq_len on meta."""
    ids = torch.zeros((1, seq_len), dtype=torch.long, device="meta")
    names = inspect.signature(model.forward).parameters
    inputs = {"input_ids": ids}
    config = getattr(model, "config", None)
    if "decoder_input_ids" in names and getattr(config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = ids
    if "labels" in names:
        inputs["labels"] = ids
    return inputs


def training_loss(output: Any, seq_len: int) -> torch.Tensor:
    """The model's loss when it computed one, else a cross-entropy over its output
    (the logits, or the first floating-point tensor it returned)."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if loss is None and isinstance(output, tuple) and output and output[0].dim() == 0:
        loss = output[0]
    if loss is not None:
        return loss
    logits = getattr(output, "logits", None)
    if logits is None:
        values = output.values() if isinstance(output, dict) else output
        values = list(values) if isinstance(values, (tuple, list, type({}.values()))) else [values]
        logits = next(v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point())
    flat = logits.reshape(-1, logits.shape[-1]).float()
    targets = torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device)
    return F.cross_entropy(flat, targets)


def _first(config: Any, *names: str) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def model_sizes(model: nn.Module, blocks: int) -> dict[str, int]:
    """heads, kv_heads, hidden, vocab and layers from the model's config (megalith's or
    transformers'); layers counts an encoder-decoder's two stacks, and falls back to the
    number of repeated blocks."""
    c = getattr(model, "config", None)
    heads = _first(c, "n_heads", "num_attention_heads", "n_head", "num_heads")
    kv = _first(c, "num_kv_heads", "num_key_value_heads", "n_kv_heads") or heads
    layers = _first(c, "n_layers", "num_hidden_layers", "n_layer", "num_layers")
    if getattr(c, "is_encoder_decoder", False):
        layers += _first(c, "num_decoder_layers") or layers
    return {
        "heads": heads,
        "kv_heads": kv,
        "hidden": _first(c, "d_model", "hidden_size", "n_embd"),
        "vocab": _first(c, "vocab_size"),
        "layers": layers or blocks,
    }
