"""Automatic placement (placement="auto"): which chunks' masters and optimizer states
come back to the device after a warm-up step, under a device budget.

[Note: auto placement]
1. Before anything is allocated (megalith_zero.shard calls check_resident before its
   first collective): the budget must hold the model state that no placement moves
   off the device (working params, gradients, one chunk's gradients in flight, one
   gathered chunk at stage 3); otherwise it fails with those numbers.
2. Warm-up: the first step runs with every chunk's states offloaded, the static
   full-offload placement, so auto fits wherever full offload fits. NonModelMeter
   measures the step's non-model memory: on CUDA the peak of torch's allocator over
   forward, backward and step (activations, temporaries, stage 3's gathered chunks;
   the engine's model state is not torch's); on CPU ranks (a simulated device) the
   peak bytes of the tensors autograd saves for backward in the model's forward,
   which is what activations are there. The engine's accounting gives the model
   state's peaks per kind over the same step; at stage 3 the chunks that prefetching
   holds from the second step on (the warm-up records the order, it does not
   prefetch) are added.
3. After the warm-up (check_warmup): room = budget * (1 - headroom) - (non-model
   peak + model-state peaks). choose() moves chunks back to the device in layout
   order while they fit (first fit). The order is the defensible one: backward
   produces gradients last-layer first, so the first chunks' gradients arrive last;
   an offloaded chunk's host step can only overlap the backward still to come after
   its gradients arrive, so the first chunks gain most from staying on the device.
   Every later step then peaks at the warm-up's peak plus the bytes moved, at most
   budget * (1 - headroom).
4. At ZeRO stage 3 the working-parameter shards move too (each rank holds only its
   shards there, like the masters): the warm-up runs with every shard in host memory
   as well (the gathers copy them up), so auto fits wherever the static full offload
   with param_frac=1 fits, and step 1 leaves out the shards from the resident model
   state. After the warm-up the shards come back first, in layout order, then the
   masters and states of chunks whose shards are back (choose_with_params).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch


def device_budget(budget: int | None, device: torch.device) -> int:
    """The budget in bytes: as given, or the GPU's total memory when None."""
    if budget is not None:
        return budget
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    raise ValueError(
        "OffloadConfig: placement='auto' on CPU ranks needs device_budget_bytes (the "
        "simulated device's memory); it defaults to the GPU's total memory only on CUDA"
    )


@dataclass(frozen=True)
class Resident:
    """Bytes that stay on the device whatever the placement, from the chunk layout."""

    params: int  # working params (stage 3: this rank's shards)
    grads: int  # gradients kept between backward and step
    in_flight: int  # the largest chunk's full gradient while it reduces (stages 2, 3)
    gathered: int  # the largest chunk's gathered params (stage 3)
    one_chunk: int  # the smallest trainable chunk's params and grads
    one_chunk_index: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.in_flight + self.gathered


def check_resident(budget: int, resident: Resident) -> None:
    if budget < resident.one_chunk:
        raise ValueError(
            f"OffloadConfig: device_budget_bytes={budget} is too small for even one chunk: "
            f"chunk {resident.one_chunk_index}'s working params and gradients alone take "
            f"{resident.one_chunk} bytes on the device (placement='auto' budgets every byte "
            "the step uses there); raise it"
        )
    if budget < resident.total:
        raise ValueError(
            f"OffloadConfig: device_budget_bytes={budget} is too small: the model state that "
            f"no placement moves off the device takes {resident.total} bytes (working params "
            f"{resident.params}, gradients {resident.grads}, one chunk's gradients in flight "
            f"{resident.in_flight}, one gathered chunk {resident.gathered}) before any "
            "activation; raise it"
        )


class NonModelMeter:
    """Peak non-model bytes on the device over the warm-up step (see the Note above).

    model_storages() gives the data pointers of the storages that hold parameters
    (chunk memory): tensors saved for backward that live there are model state.
    """

    def __init__(self, device: torch.device, model_storages: Callable[[], Iterable[int]]):
        self.device = device
        self.model_storages = model_storages
        self.peak = 0
        self.running = False

    def start(self) -> None:
        self.running = True
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)

    @contextlib.contextmanager
    def forward(self) -> Iterator[None]:
        """Around one forward of the model: on CPU ranks, tallies the distinct storages
        autograd saves for backward (they live until that backward)."""
        if self.device.type == "cuda" or not self.running:
            yield
            return
        seen: set[int] = set()
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            if ptr in seen or t.device.type != self.device.type:
                return t
            # Asked each time: stage 3 gathers chunks into new memory as forward runs.
            # Only counted storages join `seen`: a chunk released at stage 3 frees its
            # address, which a later activation may get; saved activations themselves
            # stay alive until backward, so their addresses are never reused here.
            if ptr not in set(self.model_storages()):
                seen.add(ptr)
                total += storage.nbytes()
                self.peak = max(self.peak, total)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def stop(self) -> int:
        self.running = False
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        return self.peak


@dataclass(frozen=True)
class Footprint:
    """The warm-up step's peak device bytes: non-model, and model state by kind."""

    non_model: int
    model: dict[str, int]

    @property
    def total(self) -> int:
        return self.non_model + sum(self.model.values())


def check_warmup(budget: int, headroom: float, footprint: Footprint) -> int:
    """The bytes left for masters and states on the device (>= 0), or MemoryError when
    even the warm-up (every chunk offloaded) did not fit the budget."""
    if footprint.total > budget:
        parts = ", ".join(f"{k} {v}" for k, v in footprint.model.items() if v)
        raise MemoryError(
            f"megalith_offload: placement='auto': the warm-up step, with every chunk's "
            f"masters and optimizer states offloaded, used {footprint.total} bytes on the "
            f"device (non-model {footprint.non_model}; {parts}), more than "
            f"device_budget_bytes={budget}; raise the budget or shrink the step"
        )
    return max(0, int(budget * (1 - headroom)) - footprint.total)


def choose_with_params(
    params: Sequence[tuple[int, int]], states: Sequence[tuple[int, int]], room: int
) -> tuple[list[int], list[int]]:
    """Stage 3, where the warm-up offloaded parameter shards too: (chunks whose shards
    move back, chunks whose masters and states move back). Shards come first, in layout
    order: a shard costs the device 2 bytes per parameter (bf16) and saves a copy up per
    gather, forward and backward, while a chunk's states cost 12 to 16 and need its
    shard on the device (the device kernel writes it). States then move by first fit,
    only for chunks whose shard is (or was) on the device."""
    back = choose(params, room)
    room -= sum(nbytes for k, nbytes in params if k in back)
    offloaded = {k for k, _ in params} - set(back)
    return back, choose([(k, b) for k, b in states if k not in offloaded], room)


def choose(costs: Sequence[tuple[int, int]], room: int) -> list[int]:
    """(chunk, device bytes) in layout order -> the chunks that move back to the device:
    first fit in layout order (see the Note above for why that order)."""
    out = []
    for index, nbytes in costs:
        if nbytes <= room:
            out.append(index)
            room -= nbytes
    return out


def visit_frac_for(host_seconds_per_param: float, link_seconds_per_param: float) -> float:
    """OffloadConfig(visit_frac="auto"): the fraction f of host chunks the device updates
    so that the host cores and the copy engines finish together. The host update of a
    parameter takes h seconds (its kernel on every host core), a visit l (its master and
    states up, then down; the two directions run on separate copy engines, so l is the
    slower one): (1 - f) * h = f * l gives f = h / (h + l). Rounded down to a
    hundredth, so a fast host keeps every chunk (no device slots taken for nothing)."""
    h, link = host_seconds_per_param, link_seconds_per_param
    if not h > 0 or not link > 0:
        return 0.0
    return math.floor(100 * h / (h + link)) / 100


def host_update_binds(wait_s: float, kernel_s: float, step_s: float) -> bool:
    """Whether a step's host update was on its critical path, so that visits can shorten
    it (visit_frac="auto"): step() waited for a tenth of the kernel's time or more, or
    the kernel ran for half of the step or more. The second test matters with
    step_in_backward: the kernel runs on every host core, so a long one slows the thread
    that drives the GPU even when step() never waits for it (the 12.2B on an H200 box:
    step() waited for none of the kernel's 1.65 s in a 1.65-s step; visiting half of the
    host chunks cut the step to 1.34 s)."""
    return wait_s >= 0.1 * kernel_s or kernel_s >= 0.5 * step_s
