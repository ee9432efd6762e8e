"""peft adapters on a lazily built model: booster.enable_lora before boost.

peft makes each new adapter (lora_A, lora_B) a real nn.Linear, draws its values from
the default generator, then moves it to its base layer's device: for a model built in
LazyInitContext that is the meta device, which keeps the shapes and drops the values,
and the adapter has no record to replay them from. with_adapters(model, make) runs
peft's `make` so that the adapters

- stay real on the host, in the dtype peft casts them to: a few MB, materialised now,
  while the base weights stay lazy until boost materialises them (a chunk at a time
  under GeminiPlugin and LowLevelZeroPlugin, chunks.py);
- hold what eager peft draws. A lazily built model drew no random numbers, so when the
  generators have not moved since its context closed they are first set where eager
  construction left them (random_ops.state_after: the walk a chunked boost makes anyway,
  cached on the record). Generators the caller has reseeded since are used as they are,
  as eager peft would use them; so is a model with a checkpoint to load
  (booster.load_model before boost), as transformers' from_pretrained draws nothing for
  the weights it loads. Reseeding to the very state the context was entered with cannot
  be told from not reseeding: the generators are then moved as if untouched.

peft.get_peft_model inside the LazyInitContext works without this (the adapters are
recorded and replayed with the base weights); called after the context closed it loses
their values, and boost refuses the model (check_adapters).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .context import _TRACES, _tensors, _trace_of
from .random_ops import state_after
from .trace import Trace, set_generators


def with_adapters(model: nn.Module, make: Callable[[], nn.Module], draws: bool) -> nn.Module:
    """make() (peft's get_peft_model or PeftModel.from_pretrained on the lazily built
    `model`) with its new adapters real; draws: whether they take random values (not
    when they are read from a saved adapter)."""
    from ..pretrained.deferred import pending_load

    if draws and pending_load(model) is None:
        advance_generators(model)
    with adapters_kept_real():
        adapted = make()
    check_adapters(adapted)
    return adapted


def advance_generators(module: nn.Module) -> bool:
    """Sets the default generators where eager construction of module would have left
    them, if they have not moved since its LazyInitContext closed (a module recorded in
    one context); returns whether it did."""
    traces = _traces(module)
    if len(traces) != 1 or traces[0].exit_rng is None or not _unmoved(traces[0]):
        return False
    set_generators(state_after(traces[0]))
    return True


class _NothingToMeta(TorchFunctionMode):
    """A real tensor's .to(...) that would land on the meta device keeps its device (and
    takes the dtype asked for): peft moves each new adapter to its base layer's device,
    in more than one place (LoraModel._replace_module, the layers' update_layer)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") != "to" or not isinstance(out, torch.Tensor):
            return out
        src = args[0]
        if out.is_meta and isinstance(src, torch.Tensor) and not src.is_meta:
            return src.to(dtype=out.dtype)
        return out


@contextlib.contextmanager
def adapters_kept_real() -> Iterator[None]:
    """Within it, no real tensor is moved to the meta device: peft's new adapters stay
    where they were made (torch's default device) beside base weights on meta."""
    with _NothingToMeta():
        yield


def check_adapters(model: nn.Module) -> None:
    """ValueError if a peft adapter of model is on the meta device with nothing to
    compute its values from."""
    for name, module in model.named_modules():
        if not (hasattr(module, "base_layer") and hasattr(module, "lora_A")):
            continue
        for part in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B"):
            for key, p in getattr(module, part, {}).named_parameters():
                if p.is_meta and _trace_of(p) is None:
                    raise ValueError(
                        f"{name}.{part}.{key}: a peft adapter on the meta device with no "
                        "values. peft.get_peft_model on a model built in LazyInitContext, "
                        "called after the context closed, moves its new adapters to the "
                        "meta device of the base weights; add them with "
                        "booster.enable_lora(model, lora_config=...), or call "
                        "peft.get_peft_model inside the LazyInitContext"
                    )


def _traces(module: nn.Module) -> list[Trace]:
    found = {id(t): t for _, _, x, _ in _tensors(module) if (t := _trace_of(x)) is not None}
    return [t for t in _TRACES if id(t) in found]


def _unmoved(trace: Trace) -> bool:
    cpu, cuda = trace.exit_rng
    if not torch.equal(torch.random.get_rng_state(), cpu):
        return False
    return cuda is None or all(
        torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda)
    )
