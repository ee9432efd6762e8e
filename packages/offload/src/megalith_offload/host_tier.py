"""HostTier: the update of chunks whose fp32 masters and states live in host memory.

The host kernel updates them through the pipelined HostStepper ([Note: pipelined host
step] in host_step.py); with OffloadConfig.visit_frac every k-th of them is updated by
the device instead, its master and states streamed through a few device slots
([Note: visiting chunks] in visit.py). NvmeTier steps its chunks through the same
stepper.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import torch

from megalith_core.optim import flat_states
from megalith_core.optim.rules import Rule

from . import auto
from .chunk import ChunkUpdate, OffloadableChunk
from .host_step import HostStepper
from .offloader import Offloader
from .placement import HOST_STEP_SLOTS
from .resident import StateNames
from .visit import DeviceVisits, link_seconds_per_byte


class HostTier:
    name = "host"
    #: a chunk can be updated as soon as backward has reduced its gradients
    steps_in_backward = True

    def __init__(
        self,
        offloader: Offloader,
        chunks: Sequence[OffloadableChunk],
        rule: Rule,
        names_of: StateNames,
        state_names: tuple[str, ...],
        step_stream: torch.cuda.Stream | None,
        warming_up: bool = False,
    ):
        """chunks: every trainable chunk (those the Offloader places off the device are
        this tier's or the NVMe tier's); state_names: every optimizer state any param
        group has (the visits' device slots hold them all); warming_up: the first step
        is automatic placement's warm-up, which measures the plain host update (no
        visits)."""
        self.offloader, self.rule, self.names_of = offloader, rule, names_of
        self.chunks = list(chunks)
        self.state_names, self.step_stream = state_names, step_stream
        off = [c for c in self.chunks if offloader.tier_of(c.spec.index) != "device"]
        self.stepper: HostStepper | None = None
        if off:
            # the gradients' device: a shard kept off the device (param_frac) says nothing
            device = off[0].shard_grad.device
            self.stepper = HostStepper(off, offloader.host, device, HOST_STEP_SLOTS)
        #: host chunks updated on the device (OffloadConfig.visit_frac); made at first use
        self.visits: DeviceVisits | None = None
        self._visit_auto = offloader.config.visit_frac == "auto"
        #: the fraction of host chunks the device updates; with visit_frac="auto" 0.0
        #: until the first step with host updates has been measured (_choose_visit_frac)
        self.visit_frac = 0.0 if self._visit_auto else float(offloader.config.visit_frac)
        #: (host, link) seconds per parameter behind visit_frac="auto"'s choice
        self.visit_timing: tuple[float, float] | None = None
        self._warming_up = warming_up
        self._work_mark = (0.0, 0)  # the stepper's (seconds, params) at the last step
        self._host_wait_s = 0.0  # waiting for the host update, last step
        self._step_end_s: float | None = None  # perf_counter() at the last step's end

    def _mine(self) -> list[OffloadableChunk]:
        return [c for c in self.chunks if self.offloader.tier_of(c.spec.index) == self.name]

    # -- the tier interface -----------------------------------------------------------
    def step(
        self, updates: Sequence[ChunkUpdate], grad_scale: float, in_backward: bool = False
    ) -> None:
        """Queues the updates (they run while the caller goes on; wait() ends them)."""
        for u in updates:
            self.submit(u, grad_scale)

    def wait(self) -> None:
        if self.stepper is not None:
            start = time.perf_counter()
            self.stepper.wait()
            self._host_wait_s = time.perf_counter() - start  # the part backward did not hide
        if self.visits is not None:
            self.visits.wait()

    def end_step(self, placed: bool) -> None:
        """After each step; placed: the placement was final during it (no warm-up)."""
        self._warming_up = False
        if self.stepper is not None and not any(
            self.offloader.tier_of(c.spec.index) != "device" for c in self.chunks
        ):
            self.stepper.close()  # every chunk came back: its host staging goes
            self.stepper = None
        if self._visit_auto and self.stepper is not None:
            seconds, numel = self.stepper.work_seconds, self.stepper.work_numel
            now, last = time.perf_counter(), self._step_end_s
            # a whole step as the run will go on (from the end of the last one)
            if placed and numel > self._work_mark[1] and last is not None:
                self._choose_visit_frac(
                    seconds - self._work_mark[0], numel - self._work_mark[1], now - last
                )
            self._work_mark, self._step_end_s = (seconds, numel), now

    def report(self) -> dict[str, tuple[int, int]]:
        """Bytes in host memory by "<kind>@host" (NVMe chunks' masters and staging too)."""
        return {f"{k}@host": v for k, v in self.offloader.host.report().items()}

    def reset_peak(self) -> None:
        self.offloader.host.reset_peak()

    def close(self) -> None:
        if self.stepper is not None:
            self.stepper.wait()
            self.stepper.close()
        if self.visits is not None:
            self.visits.wait()

    # -- one chunk ----------------------------------------------------------------------
    def submit(self, u: ChunkUpdate, grad_scale: float) -> None:
        """Queues an offloaded chunk's update on the host stepper (one engine call per
        piece, on the host copies of its gradients and into staged working params), or
        on the device when it visits."""
        c, group, names, pieces = u.chunk, u.group, u.names, u.pieces
        self.offloader.ensure_states(c, names)
        rule = self.rule
        if self.visiting(c):

            def apply(master: torch.Tensor, states: dict[str, torch.Tensor]) -> None:
                for step, sl, _ in pieces:
                    rule.apply(
                        group,
                        step,
                        [master[sl]],
                        [c.shard_grad[sl]],
                        {n: [states[n][sl]] for n in names},
                        [c.shard[sl]],
                        grad_scale,
                    )

            self._device_visits().submit(c, names, apply)
            return
        # parameters kept in host memory (or staged from their swap file) are written in
        # place: nothing goes up
        in_place = self.offloader.params_off_device(c.spec.index)
        shard = c.shard

        lean = c.state_dtype != "fp32"
        seed = flat_states.stream_seed(int(group.get("seed", 0)), c.spec.index, c.rank)

        def work(grads: torch.Tensor, params: torch.Tensor) -> None:
            out = shard if in_place else params
            for step, sl, _ in pieces:
                if lean:  # [Note: lean chunk states] in megalith_core.optim.flat_states
                    flat_states.apply(
                        rule, group, step, c.master, grads, c.states, out[: c.master.numel()],
                        grad_scale, sl, seed,
                    )  # fmt: skip
                    continue
                rule.apply(
                    group,
                    step,
                    [c.master[sl]],
                    [grads[sl]],
                    {n: [c.states[n][sl]] for n in names},
                    [out[sl]],
                    grad_scale,
                )

        up = [] if in_place else [sl for _, sl, _ in pieces]
        self.stepper.submit(c, work, up)

    # -- visits -------------------------------------------------------------------------
    def visiting(self, c: OffloadableChunk) -> bool:
        """Whether the device updates this host chunk (OffloadConfig.visit_frac): every
        k-th of the host chunks whose parameters are on the device, by layout order;
        not during placement="auto"'s warm-up, which measures the plain step."""
        frac = self.visit_frac
        if not frac or self._warming_up or c.state_dtype != "fp32":
            return False  # the visits' device slots hold fp32 states only
        eligible = self._visit_candidates()
        if c not in eligible:
            return False
        j = eligible.index(c)
        return math.floor((j + 1) * frac + 1e-9) > math.floor(j * frac + 1e-9)

    def _visit_candidates(self) -> list[OffloadableChunk]:
        """The host chunks the device could update, in layout order: those whose working
        parameters are on the device (its kernel writes them in place)."""
        return [c for c in self._mine() if not self.offloader.params_off_device(c.spec.index)]

    def _device_visits(self) -> DeviceVisits:
        if self.visits is None:
            host = self._mine()
            self.visits = DeviceVisits(
                max(c.spec.shard_numel for c in host),
                self.state_names,
                host[0].memory,
                self.step_stream,
            )
        return self.visits

    def _choose_visit_frac(self, work_s: float, work_numel: int, period_s: float) -> None:
        """OffloadConfig(visit_frac="auto"), after the first whole step with host updates
        in the placement the run keeps: the fraction that lets host cores and copy
        engines finish together (auto.visit_frac_for), from the host kernel's seconds
        per parameter over that step (work_s for work_numel parameters) and the link's,
        measured on the largest chunk that could visit; none when the host update was
        off the step's critical path (auto.host_update_binds)."""
        self._visit_auto = False
        eligible = self._visit_candidates()
        host_s = work_s / work_numel
        self.visit_timing = (host_s, 0.0)
        if not eligible or not auto.host_update_binds(self._host_wait_s, work_s, period_s):
            return
        c = max(eligible, key=lambda x: x.spec.shard_numel)
        per_byte = link_seconds_per_byte(c.master, c.memory.device)
        link_s = per_byte * 4 * (1 + len(self.names_of(c)))  # the master and states, each way
        self.visit_frac = auto.visit_frac_for(host_s, link_s)
        self.visit_timing = (host_s, link_s)
