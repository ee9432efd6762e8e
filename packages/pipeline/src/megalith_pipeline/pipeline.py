"""Pipeline: a model cut into stages over the pp ranks, trained one step at a time.

    pipe = Pipeline(model, num_microbatches=8, schedule="1f1b", mesh=mesh, loss_fn=loss_fn)
    opt = torch.optim.AdamW(pipe.module.parameters())
    loss = pipe.step(inputs, targets)   # every micro-batch's forward and backward
    opt.step(); opt.zero_grad()

Every rank builds the whole model the same way (same seed) and passes it in;
the pipeline keeps this rank's stages in `pipe.module`. Everything that can be
wrong with the counts (micro-batches, stages, layers, batch size) raises here or
at the top of step(), on every rank that sees it, before any message is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import megalith_comm as comm

from .channels import Channels
from .executor import Executor
from .grads import ReducedGrads, TiedParams, reduce_dp
from .layers import as_layers, named_ties
from .partition import Partition, partition
from .schedule import Schedule
from .schedules import make_schedule
from .stage import StageModule
from .stats import StepStats, resolved
from .tree import split_microbatches

NoSync = Callable[[], Any]


class Pipeline:
    """This rank's part of a pipeline-parallel model, and the step that runs it.

    model: an nn.Sequential, a list of modules, PipelineParts, a model with
        pipeline_parts(), or a GPT-2/Llama layout (parts.py).
    num_microbatches: micro-batches per step; the batch is cut along dimension 0.
    schedule: "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", or a Schedule.
    chunks: virtual stages per rank (interleaved only; default 2 there).
    mesh, pp_axis, dp_axis: the device mesh; pp_axis carries the pipeline, and
        gradients are averaged over dp_axis after each step (unless no_sync is
        given to step: then the data-parallel wrapper reduces them). Without a
        mesh, `group` (default: every rank) is the pp group and there is no dp.
    balance: "layers", "params", "time" (with sample=<one micro-batch>), or
        stage sizes; see partition.py.
    loss_fn(output, target) -> loss of one micro-batch. loss_reduction: "mean"
        (loss_fn averages over its micro-batch: the step's loss is the batch
        mean, micro-batches weighted by their size) or "sum".
    loss_on_all_ranks: step() returns the loss on every rank, not only on the
        rank of the last stage.
    """

    def __init__(
        self,
        model: Any,
        *,
        num_microbatches: int,
        schedule: str | Schedule = "1f1b",
        chunks: int | None = None,
        mesh: comm.Mesh | None = None,
        pp_axis: str = "pp",
        dp_axis: str | None = "dp",
        group: comm.ProcessGroup | None = None,
        balance: str | Sequence[int] = "layers",
        sample: Any = None,
        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
        loss_reduction: str = "mean",
        loss_on_all_ranks: bool = False,
    ):
        if loss_reduction not in ("mean", "sum"):
            raise ValueError(
                f"Pipeline: loss_reduction={loss_reduction!r}; expected 'mean' or 'sum'"
            )
        if mesh is not None and group is not None:
            raise ValueError("Pipeline: pass mesh (with pp_axis) or group, not both")
        self.world = comm.get_world()
        self.mesh = mesh
        self.group = mesh.group(pp_axis) if mesh is not None else comm.group.resolve(group)
        pp = self.group.size
        if isinstance(schedule, Schedule):
            if schedule.pp != pp or schedule.num_microbatches != num_microbatches:
                raise ValueError(
                    f"Pipeline: the schedule is for pp={schedule.pp}, {schedule.num_microbatches} "
                    f"micro-batches; this pipeline has pp={pp}, num_microbatches={num_microbatches}"
                )
        else:
            schedule = make_schedule(schedule, pp, num_microbatches, chunks)
        self.schedule = schedule
        self.num_microbatches = num_microbatches
        self.rank = self.group.rank
        self.loss_fn = loss_fn
        self.loss_reduction = loss_reduction
        self.loss_on_all_ranks = loss_on_all_ranks

        layers = as_layers(model)
        self.partition: Partition = partition(
            layers, schedule.num_stages, balance, sample=sample, group=None
        )
        self.stages = {
            s: StageModule(
                [layers[i] for i in self.partition.layers(s)], self.partition.bounds[s], s
            )
            for s in schedule.stages_of(self.rank)
        }
        self.module = nn.ModuleList(self.stages[s] for s in sorted(self.stages))
        self.dp_group = None
        if mesh is not None and dp_axis is not None and dp_axis in mesh.names:
            self.dp_group = mesh.group(dp_axis)
        self.tied = TiedParams(
            layers, self.partition, schedule, self.group, mesh, pp_axis, named_ties(model)
        )
        #: under a no_sync wrapper (step(no_sync=...)): its views of the tied parameters'
        #: reduced gradients, where their sum over the stages is taken (grads.TiedParams)
        self.reduced_grads: ReducedGrads | None = None
        self.channels = Channels(schedule, self.group, self._device())
        self.executor = Executor(schedule, self.rank, self.stages, self.channels, loss_fn)
        self._last_stats: StepStats | None = None

    def set_num_microbatches(self, num_microbatches: int) -> None:
        """Runs later steps with another micro-batch count (same schedule kind, same stages:
        stage placement does not depend on the count). Raises naming the numbers, before
        any communication, for a count the schedule cannot run."""
        if num_microbatches == self.num_microbatches:
            return
        s = self.schedule
        schedule = make_schedule(s.name, s.pp, num_microbatches, s.chunks)
        if schedule.placement != s.placement:  # a custom Schedule's own placement
            raise ValueError(
                f"Pipeline: {s} cannot change its micro-batch count; build a new Pipeline"
            )
        self.schedule, self.num_microbatches = schedule, num_microbatches
        self.channels = Channels(schedule, self.group, self._device())
        self.executor = Executor(schedule, self.rank, self.stages, self.channels, self.loss_fn)

    def _device(self) -> torch.device:
        """Where this rank's stages compute (their parameters may be materialised late)."""
        devices = {p.device for p in self.module.parameters() if p.device.type != "meta"}
        return devices.pop() if len(devices) == 1 else self.world.device

    @property
    def last_stats(self) -> StepStats | None:
        """Timings of the last step (on CUDA read from its events now: see stats.py)."""
        return resolved(self._last_stats)

    @property
    def is_first(self) -> bool:
        return self.schedule.rank_of(0) == self.rank

    @property
    def is_last(self) -> bool:
        """Whether this rank computes the loss."""
        return self.schedule.last_rank == self.rank

    def _split(self, inputs: Any, targets: Any) -> tuple[list | None, list | None, list[float]]:
        self.channels.set_device(self._device())
        m = self.num_microbatches
        mbs = tgs = None
        sizes: list[int] | None = None
        if inputs is not None:
            mbs, sizes = split_microbatches(inputs, m, "inputs")
        if targets is not None:
            tgs, t_sizes = split_microbatches(targets, m, "targets")
            if sizes is not None and t_sizes != sizes:
                raise ValueError(
                    f"pipeline: inputs (batch {sum(sizes)}) and targets (batch {sum(t_sizes)}) "
                    "must have the same batch size"
                )
            sizes = t_sizes
        if self.is_first and inputs is None:
            raise ValueError(f"pipeline: pp rank {self.rank} holds the first stage: pass inputs")
        if self.is_last and self.loss_fn is not None and sizes is None:
            raise ValueError(f"pipeline: pp rank {self.rank} computes the loss: pass targets")
        if sizes is None or self.loss_reduction == "sum":
            weights = [1.0] * m
        else:
            weights = [n / sum(sizes) for n in sizes]
        return mbs, tgs, weights

    def step(
        self,
        inputs: Any = None,
        targets: Any = None,
        *,
        no_sync: NoSync | None = None,
        sum_ties: bool = True,
    ) -> torch.Tensor | None:
        """Forward and backward of every micro-batch; gradients accumulate into .grad.

        inputs are needed on the first stage's rank, targets on the loss rank;
        passing both everywhere is simplest. no_sync: the data-parallel wrapper's
        no_sync (ZeroOptimizer.no_sync, DDP.no_sync): every backward but this
        rank's last runs inside it, so the wrapper reduces gradients once per step,
        and the pipeline does not average them over dp itself. Returns the loss
        (size-weighted mean over micro-batches) on the loss rank (every rank with
        loss_on_all_ranks), else None. sum_ties=False: a step inside a gradient-
        accumulation window that has not ended: a tied parameter's copies are summed once,
        in the window's last step, over the accumulated gradients (a sum each step would
        add the earlier steps' other-stage shares again).
        """
        if self.loss_fn is None:
            raise ValueError("Pipeline.step needs loss_fn; use forward() for inference")
        if no_sync is not None and self.tied.crosses_ranks and self.reduced_grads is None:
            raise ValueError(
                "pipeline: parameters tied across stages (e.g. an embedding and its LM head) are "
                "summed over the stages after the step, and a no_sync wrapper (ZeRO) has moved "
                "their gradients off .grad: set Pipeline.reduced_grads to where it keeps them "
                "(ZeroOptimizer.reduced_grads, stage 1), or untie them"
            )
        mbs, tgs, weights = self._split(inputs, targets)
        loss, _, self._last_stats = self.executor.run(
            mbs, tgs, weights, train=True, no_sync=no_sync
        )
        if sum_ties:
            self.tied.reduce_grads(self.reduced_grads if no_sync is not None else None)
        if no_sync is None and self.dp_group is not None and self.dp_group.size > 1:
            reduce_dp(self.module, self.dp_group)
        return self._share_loss(loss)

    @torch.no_grad()
    def eval_step(self, inputs: Any = None, targets: Any = None) -> torch.Tensor | None:
        """The loss without backward (forward passes only, in the schedule's order)."""
        if self.loss_fn is None:
            raise ValueError("Pipeline.eval_step needs loss_fn; use forward() for outputs")
        mbs, tgs, weights = self._split(inputs, targets)
        loss, _, self._last_stats = self.executor.run(mbs, tgs, weights, train=False)
        return self._share_loss(loss)

    @torch.no_grad()
    def forward(self, inputs: Any = None) -> list[Any] | None:
        """The last stage's output per micro-batch, on the loss rank (None elsewhere)."""
        mbs, _, weights = self._split(inputs, None)
        executor = Executor(self.schedule, self.rank, self.stages, self.channels, None)
        _, outputs, self._last_stats = executor.run(mbs, None, weights, train=False)
        return outputs if self.is_last else None

    def _share_loss(self, loss: torch.Tensor | None) -> torch.Tensor | None:
        if not self.loss_on_all_ranks:
            return loss if self.is_last else None
        device = self.channels.device
        buf = loss.reshape(1).to(device) if self.is_last else torch.zeros(1, device=device)
        comm.broadcast(buf, src=self.group.global_rank(self.schedule.last_rank), group=self.group)
        return buf.reshape(())
