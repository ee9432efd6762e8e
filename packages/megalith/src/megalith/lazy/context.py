"""LazyInitContext: ColossalAI's lazy model construction.

    with LazyInitContext():                  # no parameter memory is allocated
        model = GPT2LMHeadModel(config)
    LazyInitContext.materialize(model)       # now real, equal to eager construction

Inside the context every tensor is made on the meta device and every op on it is
recorded (trace.py, [Note: lazy init by record and replay]); `materialize` replays the
record and puts the real tensors into the module's parameters and buffers in place
(torch.utils.swap_tensors: the Parameter objects stay the same, so an optimizer built
on the lazy model steps the materialised one; a parameter something holds a weak
reference to, as torch's RNNs do, is replaced through its module's __setattr__). Ops on the model after the context
closes are not recorded: do them after materialize (the Booster materialises a lazy
model at the start of boost, or, under GeminiPlugin and LowLevelZeroPlugin, one chunk
at a time as it shards it: chunks.py).
"""

from __future__ import annotations

from typing import Any

import torch

from .trace import Recorder, Trace, ref_of, storage_key, view

#: every trace a context made (their meta storages stay alive, so keys are never reused)
_TRACES: list[Trace] = []


def _trace_of(t: torch.Tensor) -> Trace | None:
    if not t.is_meta:
        return None
    key = storage_key(t)
    return next((tr for tr in reversed(_TRACES) if key in tr.storages), None)


def _tensors(module: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.Tensor, bool]]:
    """(owner, name, tensor, is_parameter) for every parameter and buffer, each tensor once."""
    seen: set[int] = set()
    out = []
    for owner in module.modules():
        for kind, table in ((True, owner._parameters), (False, owner._buffers)):
            for name, t in table.items():
                if t is not None and id(t) not in seen:
                    seen.add(id(t))
                    out.append((owner, name, t, kind))
    return out


def _replace(owner: torch.nn.Module, name: str, new: torch.Tensor, is_param: bool) -> None:
    """Puts new in the place of a tensor that cannot be swapped in place, through the
    module's own __setattr__ (an RNN refreshes its flat weights there)."""
    if is_param:
        setattr(owner, name, new)
    else:
        owner._buffers[name] = new


def _cuda_states(trace: Trace) -> list[torch.Tensor] | None:
    return torch.cuda.get_rng_state_all() if trace.cuda_rng is not None else None


def is_lazy(module: torch.nn.Module) -> bool:
    """Whether module holds tensors a LazyInitContext made and nothing materialised yet."""
    return any(_trace_of(t) is not None for _, _, t, _ in _tensors(module))


class LazyTensor:
    """ColossalAI's lazy tensor class: megalith's lazy tensors are meta tensors plus a
    record (trace.py), so there is no such class to build."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "megalith has no LazyTensor class: build the model inside "
            "`with LazyInitContext():` and call LazyInitContext.materialize(model)"
        )


class LazyInitContext:
    """Within it, modules are built without allocating their tensors (ColossalAI's
    LazyInitContext). default_device: where the tensors of factories that name no device
    are materialised (None: torch's default device). tensor_cls: ColossalAI's, for its
    own tests; only LazyTensor (the default) is taken."""

    def __init__(
        self,
        tensor_cls: type = LazyTensor,
        default_device: torch.device | str | int | None = None,
    ) -> None:
        if tensor_cls is not LazyTensor:
            raise ValueError(
                f"LazyInitContext(tensor_cls={tensor_cls!r}): only LazyTensor, the default; "
                "leave it out"
            )
        if isinstance(default_device, int):
            default_device = torch.device("cuda", default_device)
        self.default_device = torch.device(default_device) if default_device is not None else None
        self._recorder: Recorder | None = None

    def __enter__(self) -> LazyInitContext:
        if self._recorder is not None:
            raise RuntimeError("LazyInitContext is already open: contexts do not nest")
        trace = Trace(self.default_device)
        _TRACES.append(trace)
        self._recorder = Recorder(trace)
        self._recorder.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            raise RuntimeError("LazyInitContext: __exit__ without __enter__")
        recorder.__exit__(*exc)
        trace = recorder.trace  # where the generators stood (lazy ops draw nothing)
        trace.exit_rng = (torch.random.get_rng_state(), _cuda_states(trace))

    @staticmethod
    def materialize(module: torch.nn.Module, verbose: bool = False) -> torch.nn.Module:
        """Makes every lazy parameter and buffer of module real, in place; returns module."""
        return _materialize(module, verbose, sliced=False)

    @staticmethod
    def distribute(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        """Refused: megalith shards a model when it is boosted."""
        raise NotImplementedError(
            "LazyInitContext.distribute: megalith shards at boost time; call "
            "LazyInitContext.materialize(model) (or pass the lazy model to booster.boost, "
            "which materialises it) and use HybridParallelPlugin(tp_size=...) or GeminiPlugin"
        )


def materialize_rest(module: torch.nn.Module) -> torch.nn.Module:
    """Makes the lazy tensors module still holds real by replaying only the ops they
    depend on (Trace.needed): after a checkpoint filled the parameters, the buffers
    computed at construction (a rotary embedding's inv_freq) cost their own ops only.
    Random values it draws are not eager construction's (see Trace.replay)."""
    return _materialize(module, False, sliced=True)


def _materialize(module: torch.nn.Module, verbose: bool, sliced: bool) -> torch.nn.Module:
    by_trace: dict[int, tuple[Trace, list]] = {}
    for entry in _tensors(module):
        trace = _trace_of(entry[2])
        if trace is None:
            continue
        by_trace.setdefault(id(trace), (trace, []))[1].append(entry)
    total = 0
    for trace, items in by_trace.values():
        real = trace.replay({storage_key(t) for _, _, t, _ in items}, sliced)
        for owner, name, t, is_param in items:
            value = view(real[storage_key(t)], ref_of(t))
            new = torch.nn.Parameter(value, requires_grad=t.requires_grad) if is_param else value
            try:
                torch.utils.swap_tensors(t, new)
            except RuntimeError:  # a weak reference to it (torch's RNNs keep them)
                _replace(owner, name, new, is_param)
            total += value.numel() * value.element_size()
    if verbose:
        entries = [t for _, items in by_trace.values() for _, _, t, _ in items]
        print(
            f"LazyInitContext.materialize: {len(entries)} tensors, "
            f"{total / 2**20:.1f} MiB on {sorted({str(t.device) for t in entries})}"
        )
    return module
