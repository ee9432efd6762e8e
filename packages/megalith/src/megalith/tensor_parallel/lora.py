"""peft LoRA adapters on a tensor-parallel model: each adapter split the way its base layer is.

peft's LoRA layer computes  y = base(x) + B(A(x)) * scaling  (A: in -> r, B: r -> out,
both nn.Linear). shard_with_adapters takes every LoRA layer's base layer out of its
wrapper, lets the policy shard the bare model as it shards any other, puts each
wrapper back around the layer the policy made, and splits the adapter to match it:

- column-parallel base (output features split, q|k|v parts included): B is a
  ColumnParallelLinear with the base's parts, input and output handling, so each
  rank adds the slice of B(A(x)) that matches its slice of base(x). A is whole on
  every rank; when x is already inside the tensor-parallel region (the policy entered
  it once for q, k and v) A's gradient on each rank is only its slice's share, so A
  all-reduces it (HeadRowsLinear over all rows); with the base's own input copy B's
  copy_to_region of A(x) makes it whole instead.
- row-parallel base (input features split): A is a RowParallelLinear with the base's
  input handling, so A's partial products are all-reduced before B: every rank gets
  the whole A(x) (r numbers per token, the only new communication) and B stays whole,
  with the same gradient on every rank.
- a replicated projection of which a rank uses some rows (HeadRowsLinear, grouped kv
  heads): A whole, B's same rows, both with all-reduced gradients, as the base's.

Under Megatron-style sequence parallelism (split_gather) a column-parallel base reads
the all-gathered sequence (the region's, or its own seq_all_gather, which B then does
to A(x) of this rank's tokens): A's gradient is all-reduced as above. A row-parallel
base's sum is a reduce-scatter along the sequence, and so is A's: B then meets only
this rank's tokens and all-reduces its gradient. Under Ulysses (all_to_all) nothing is
split here: the adapters stay whole in their layers and the sp group all-reduces their
gradients with every other block parameter's (ulysses.py).

This is Megatron's split carried into the adapter: no rank holds or computes more of
an adapter than its share of the base layer needs, the sums are the whole model's
(losses equal plain peft's up to summation order), and the sharded adapters carry
tp_spec, so checkpoints gather them to peft's full tensors like any other shard.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from megalith_comm import ProcessGroup

from .linear import ColumnParallelLinear, HeadRowsLinear, RowParallelLinear


def is_lora_layer(module: nn.Module) -> bool:
    """A peft LoRA layer: its base_layer wrapped with lora_A / lora_B adapters."""
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "lora_B")


def peft_base(model: nn.Module) -> nn.Module:
    """The model a policy shards: a peft PeftModel's base model (its LoRA layers inside),
    else the model itself."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        return model.get_base_model()
    return model


def _is_saved_copy_wrapper(module: nn.Module) -> bool:
    return isinstance(getattr(module, "modules_to_save", None), nn.ModuleDict) and hasattr(
        module, "original_module"
    )


def shard_with_adapters(model: nn.Module, group: ProcessGroup, shard: Callable[[], object]) -> None:
    """Runs shard() (the policy's in-place sharding of `model`) with every LoRA layer's base
    layer in the wrapper's place, then splits each adapter as its new base layer is split.
    peft's modules_to_save wrappers (a trainable copy of a head) have their original in
    their place too: a head the policy leaves replicated (a classifier's score) keeps its
    wrapper and copies, replicated as the head is; one it splits (the LM head) is refused."""
    wrappers = [(n, m) for n, m in model.named_modules() if is_lora_layer(m)]
    saved = [(n, m) for n, m in model.named_modules() if _is_saved_copy_wrapper(m)]
    if not wrappers and not saved:
        shard()
        return
    for name, wrapper in wrappers:
        _check_plain(name, wrapper)
    inner = [(n, w, w.base_layer) for n, w in wrappers] + [
        (n, w, w.original_module) for n, w in saved
    ]
    for name, _, layer in inner:
        parent, attr = _parent(model, name)
        setattr(parent, attr, layer)
    try:
        shard()
    finally:
        split = []
        for name, wrapper, layer in inner:
            parent, attr = _parent(model, name)
            new = getattr(parent, attr)
            setattr(parent, attr, wrapper)
            if new is not layer:
                split.append((name, wrapper, new))
    for name, wrapper, new in split:
        if _is_saved_copy_wrapper(wrapper):
            raise ValueError(
                f"{name}: peft's modules_to_save copy of a layer the tensor-parallel policy "
                "splits (an LM head) is not built; under tp_size > 1 only heads the policy "
                "keeps replicated (a classifier's score) take modules_to_save. Leave it out, "
                "add the layer to LoraConfig(target_modules=...) for a LoRA adapter on it, or "
                "train it under tp_size=1 (TorchDDPPlugin, LowLevelZeroPlugin, GeminiPlugin)"
            )
        wrapper.base_layer = new
        _split_adapters(name, wrapper, group)


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


def _check_plain(name: str, wrapper: nn.Module) -> None:
    if getattr(wrapper, "lora_variant", None) or any(getattr(wrapper, "use_dora", {}).values()):
        raise NotImplementedError(
            f"{name}: LoRA variants (DoRA and the like) are not built under tensor "
            "parallelism; use a plain LoraConfig (use_dora=False)"
        )
    if getattr(wrapper, "merged", False):
        raise ValueError(f"{name}: the adapter is merged into its base layer; unmerge it first")


def _split_adapters(name: str, wrapper: nn.Module, group: ProcessGroup) -> None:
    base = wrapper.base_layer
    for key in list(wrapper.lora_A.keys()):
        a, b = wrapper.lora_A[key], wrapper.lora_B[key]
        if isinstance(base, ColumnParallelLinear):
            inside_region = base.input_comm != "copy"
            wrapper.lora_B[key] = ColumnParallelLinear.from_linear(
                b, group, parts=_parts(base, b), gather_output=base.gather_output,
                input_comm=base.input_comm,
            )  # fmt: skip
            if inside_region:
                wrapper.lora_A[key] = _reduced(a, group)
        elif isinstance(base, RowParallelLinear):
            wrapper.lora_A[key] = RowParallelLinear.from_linear(
                a, group, input_is_parallel=base.input_is_parallel,
                sequence_parallel=base.sequence_parallel,
            )  # fmt: skip
            if base.sequence_parallel:  # B sees this rank's tokens only
                wrapper.lora_B[key] = _reduced(b, group)
        elif isinstance(base, HeadRowsLinear):
            wrapper.lora_A[key] = _reduced(a, group)
            wrapper.lora_B[key] = HeadRowsLinear(b, group, base.rows)
        else:
            raise NotImplementedError(
                f"{name}: a LoRA adapter on a {type(base).__name__} is not built under tensor "
                "parallelism; leave this module out of LoraConfig(target_modules=...)"
            )


def _parts(base: ColumnParallelLinear, b: nn.Linear) -> tuple[int, ...]:
    if sum(base.parts) != b.out_features:
        raise ValueError(
            f"LoRA B has {b.out_features} output features, its base layer {sum(base.parts)}"
        )
    return base.parts


def _reduced(linear: nn.Linear, group: ProcessGroup) -> HeadRowsLinear:
    """The whole linear on every rank with its gradient all-reduced over group."""
    return HeadRowsLinear(linear, group, slice(0, linear.out_features))
