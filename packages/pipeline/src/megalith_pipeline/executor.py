"""Running one rank's passes of a schedule: forward, backward (whole or split), messages.

The executor walks the rank's pass list in order. F receives the stage input
(or takes the micro-batch, on the first stage), runs the stage, and sends the
output on (or computes the loss, on the last stage). B receives the output
gradient, runs backward and sends the input gradient back. I and W are B split
in two (backward_split.py). Everything one (stage, micro-batch) keeps between
its passes lives in `_live` and is dropped by its last pass.

Compute errors are raised as PipelineStageError naming the stage, the pass and
the micro-batch; through megalith_comm's failure reports that name reaches every
other rank (their receives fail with "rank r failed with PipelineStageError:
pipeline stage s ...").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .backward_split import WeightPass, input_pass
from .channels import Channels
from .schedule import BACKWARD, FORWARD, INPUT_GRAD, WEIGHT_GRAD, Action, Schedule
from .stats import StepStats, clock_for


class PipelineStageError(RuntimeError):
    """A stage's forward, loss or backward raised; `stage` is the stage, `rank` its pp rank."""

    def __init__(self, message: str, stage: int, rank: int):
        super().__init__(message)
        self.stage = stage
        self.rank = rank


@dataclass
class _Live:
    inputs: list[torch.Tensor] = field(default_factory=list)  # input leaves requiring grad
    outputs: list[torch.Tensor] = field(default_factory=list)  # outputs requiring grad, or [loss]
    weight_pass: WeightPass | None = None
    result: Any = None  # forward-only: the last stage's output


class Executor:
    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        modules: dict[int, nn.Module],
        channels: Channels,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    ):
        self.schedule = schedule
        self.rank = rank
        self.modules = modules
        self.channels = channels
        self.loss_fn = loss_fn
        self.last = schedule.num_stages - 1
        self._clock: Any = None  # per device, kept across steps (stats.py)
        self._clock_device: torch.device | None = None

    @contextlib.contextmanager
    def _stage_errors(self, a: Action, what: str) -> Iterator[None]:
        try:
            yield
        except PipelineStageError:
            raise
        except Exception as exc:
            chunk = self.schedule.chunk_of(a.stage)
            where = f", chunk {chunk}" if self.schedule.chunks > 1 else ""
            raise PipelineStageError(
                f"pipeline stage {a.stage} (pp rank {self.rank}{where}) failed in {what} of "
                f"micro-batch {a.mb}: {type(exc).__name__}: {exc}",
                a.stage,
                self.rank,
            ) from exc

    def run(
        self,
        inputs: list[Any] | None,
        targets: list[Any] | None,
        weights: list[float],
        *,
        train: bool = True,
        no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> tuple[torch.Tensor | None, list[Any], StepStats]:
        """Runs the rank's passes (forward only when not train). Returns (the weighted loss
        sum on the loss rank, else None; the last stage's outputs for forward-only runs
        without loss_fn; timings)."""
        order = [a for a in self.schedule.actions(self.rank) if train or a.kind == FORWARD]
        last_weight = max(
            (i for i, a in enumerate(order) if a.kind in (BACKWARD, WEIGHT_GRAD)), default=-1
        )
        self._inputs, self._targets, self._weights = inputs, targets, weights
        self._live: dict[tuple[int, int], _Live] = {}
        self._loss: torch.Tensor | None = None
        results: dict[int, Any] = {}
        if self._clock is None or self._clock_device != self.channels.device:
            self._clock = clock_for(self.channels.device)  # GPU time on CUDA (stats.py)
            self._clock_device = self.channels.device
        stats = StepStats(start=self._clock.start())
        self.channels.begin(train)
        with torch.set_grad_enabled(train):
            for i, a in enumerate(order):
                # Gradients are reduced (by DDP or ZeRO) in the rank's last weight-gradient pass
                # only. I passes defer too: a parameter whose gradient autograd cannot leave
                # for W (nn.MultiheadAttention's fused in_proj bias) accumulates in I.
                defer = (
                    no_sync is not None
                    and a.kind in (BACKWARD, INPUT_GRAD, WEIGHT_GRAD)
                    and i != last_weight
                )
                with no_sync() if defer else contextlib.nullcontext():
                    # the last W pass defers all its calls but one itself (backward_split.py)
                    t0, t1 = self._pass(a, no_sync if i == last_weight else None)
                stats.spans.append((a.kind, a.stage, a.mb, t0, t1))
                if not train:
                    live = self._live.pop((a.stage, a.mb))
                    if a.stage == self.last:
                        results[a.mb] = live.result
        self.channels.wait()
        self._clock.finish(stats)
        stats.recv_wait_s = self.channels.recv_wait_s
        stats.sent, stats.received = self.channels.sent, self.channels.received
        self._live.clear()
        return self._loss, [results[mb] for mb in sorted(results)], stats

    def _pass(
        self, a: Action, no_sync: Callable[[], contextlib.AbstractContextManager] | None = None
    ) -> tuple[Any, Any]:
        """Runs one pass; returns when its compute started and ended (receives excluded),
        as the step's clock marks them (stats.py). no_sync: given for the step's last
        weight-gradient pass (see WeightPass.run)."""
        if a.kind == FORWARD:
            return self._forward(a)
        live = self._live[(a.stage, a.mb)]
        if a.kind == WEIGHT_GRAD:
            t0 = self._clock.now()
            with self._stage_errors(a, "the weight-gradient pass"):
                live.weight_pass.run(no_sync)
            del self._live[(a.stage, a.mb)]
            return t0, self._clock.now()
        if a.stage == self.last:
            grads: list[torch.Tensor | None] = [None] * len(live.outputs)
        else:
            grads = self.channels.recv_grads(a.stage, a.mb, len(live.outputs))
        t0 = self._clock.now()
        if a.kind == INPUT_GRAD:
            with self._stage_errors(a, "the input-gradient pass"):
                # looked up now: a stage materialised after the pipeline was built has new ones
                weights = [p for p in self.modules[a.stage].parameters() if p.requires_grad]
                input_grads, live.weight_pass = input_pass(
                    live.outputs, grads, live.inputs, weights
                )
            live.outputs, live.inputs = [], []
        else:
            with self._stage_errors(a, "backward"):
                if live.outputs:
                    torch.autograd.backward(live.outputs, grads)
            input_grads = [torch.zeros_like(x) if x.grad is None else x.grad for x in live.inputs]
            del self._live[(a.stage, a.mb)]
        if a.stage > 0:
            self.channels.send_grads(a.stage, a.mb, input_grads)
        return t0, self._clock.now()

    def _forward(self, a: Action) -> tuple[Any, Any]:
        s, mb = a.stage, a.mb
        live = self._live[(s, mb)] = _Live()
        if s == 0:
            if self._inputs is None:
                raise ValueError(
                    f"pipeline: pp rank {self.rank} runs the first stage but got no inputs"
                )
            x = self._inputs[mb]
        else:
            x, live.inputs = self.channels.recv_activation(s, mb)
        t0 = self._clock.now()
        with self._stage_errors(a, "forward"):
            y = self.modules[s](x)
        if s < self.last:
            live.outputs = self.channels.send_activation(s, mb, y)
        elif self.loss_fn is None:
            live.result = y
        else:
            with self._stage_errors(a, "the loss function"):
                loss = self.loss_fn(y, None if self._targets is None else self._targets[mb])
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    raise TypeError(f"loss_fn must return a one-element tensor, got {loss!r}")
                scaled = loss.reshape(()) * self._weights[mb]
            live.outputs = [scaled] if scaled.requires_grad else []
            total = scaled.detach().float()
            self._loss = total if self._loss is None else self._loss + total
            if not torch.is_grad_enabled():
                live.result = loss.detach()
        return t0, self._clock.now()
