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

peft's modules_to_save copies (a trainable head) are deep copies of lazy modules, made
after the context closed: each copied tensor is recorded as a clone of its original
(record_saved_copies), so it stays lazy and materialises with the original's values;
read from a saved adapter (pretrained_dir), the copy's values come from its file.

peft.get_peft_model inside the LazyInitContext works without this (the adapters are
recorded and replayed with the base weights); called after the context closed it loses
their values, and boost refuses the model (check_adapters).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .chunks import _put
from .context import _TRACES, _tensors, _trace_of
from .random_ops import state_after
from .trace import Trace, set_generators


def with_adapters(
    model: nn.Module, make: Callable[[], nn.Module], pretrained_dir: str | None
) -> nn.Module:
    """make() (peft's get_peft_model or PeftModel.from_pretrained on the lazily built
    `model`) with its new adapters real; pretrained_dir: the saved adapter make() reads
    (None: the adapters take random values)."""
    from ..pretrained.deferred import pending_load

    if pretrained_dir is None and pending_load(model) is None:
        advance_generators(model)
    with adapters_kept_real(), warnings.catch_warnings():
        # torch's note that a saved modules_to_save copy went into a meta tensor: it is
        # read from the file below
        warnings.filterwarnings("ignore", message=".*to a meta parameter in the current model")
        adapted = make()
    if pretrained_dir is None:
        record_saved_copies(adapted)
    else:
        _fill_loaded_copies(adapted, pretrained_dir)
    check_adapters(adapted)
    return adapted


def record_saved_copies(model: nn.Module) -> None:
    """peft's modules_to_save (a trainable copy of, say, the LM head) on a lazy model:
    peft deep-copies the lazy original after the context closed, which gives meta
    tensors with no record. Each copied tensor becomes a recorded clone of its original
    (an op appended to the original's record), so it materialises with the original's
    values wherever and whenever the original's plugin materialises (a chunk at a time
    under the ZeRO plugins)."""
    for name, module in model.named_modules():
        copies = getattr(module, "modules_to_save", None)
        original = getattr(module, "original_module", None)
        if not isinstance(copies, nn.ModuleDict) or original is None:
            continue
        want = [(n, t) for _, n, t, _ in _named_tensors(original)]
        for adapter, copy in copies.items():
            got = [(n, t) for _, n, t, _ in _named_tensors(copy)]
            if [n for n, _ in got] != [n for n, _ in want]:
                raise ValueError(
                    f"{name}.modules_to_save.{adapter}: not a copy of the original module "
                    "(its tensors differ); build the model eagerly to train this head"
                )
            for (_, src), (_, dst) in zip(want, got):
                trace = _trace_of(src)
                if trace is not None and dst.is_meta and _trace_of(dst) is None:
                    trace.record_clone(src, dst)


def _fill_loaded_copies(model: nn.Module, directory: str) -> None:
    """A saved adapter's modules_to_save values, read from its file into peft's copies of
    lazy modules: peft loads them into meta tensors, which keeps nothing."""
    wrappers = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(getattr(m, "modules_to_save", None), nn.ModuleDict)
        and any(t.is_meta for c in m.modules_to_save.values() for _, _, t, _ in _tensors(c))
    ]
    if not wrappers:
        return
    from peft.utils import load_peft_weights

    weights = load_peft_weights(directory, device="cpu")
    for name, module in wrappers:
        for copy in module.modules_to_save.values():
            for owner, attr, t, is_param in _named_tensors(copy):
                if not t.is_meta:
                    continue
                key = f"{name}.{attr}"  # peft's file names leave out modules_to_save.<adapter>
                if key not in weights:
                    raise ValueError(
                        f"{directory}: no {key!r} for the modules_to_save copy {name}; save "
                        "the adapter with save_lora_as_pretrained or peft's save_pretrained"
                    )
                value = weights[key].to(t.dtype)
                _put(owner, attr.rpartition(".")[2], t, value, is_param)


def _named_tensors(module: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, bool]]:
    """_tensors with each tensor's dotted name under module."""
    names = {id(m): p for p, m in module.named_modules()}
    return [
        (owner, f"{names[id(owner)]}.{n}".lstrip("."), t, kind)
        for owner, n, t, kind in _tensors(module)
    ]


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
