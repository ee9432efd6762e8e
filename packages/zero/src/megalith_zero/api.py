"""shard(): wrap a model and its optimizer for ZeRO over a data-parallel group."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_map

import megalith_comm as comm
from megalith_core.memory import StateMemory
from megalith_core.optim import flat_states
from megalith_core.optim.rules import check_group, rule_for

from .chunk import ChunkSetup, FlatChunk
from .config import ZeroConfig
from .full_state import iter_full_params
from .grads import GradReducer
from .layout import Layout, layout_for
from .offload import auto_budget, auto_placement, make_offloader, make_tiers
from .optimizer import ModelParallel, ZeroOptimizer
from .param_gather import DeferredGathers
from .stage3 import Stage3Hooks
from .state_load import load_param_states, take_param_states
from .streams import Streams


class ZeroModel(torch.nn.Module):
    """The user's module, computing on chunk memory. `module` is the original object."""

    def __init__(
        self,
        module: torch.nn.Module,
        chunks: list[FlatChunk],
        layout: Layout,
        memory: StateMemory,
        stage3: Stage3Hooks | None,
        group: comm.ProcessGroup,
        param_dtype: torch.dtype,
    ):
        super().__init__()
        self.param_dtype = param_dtype
        self.module = module
        self.chunks = chunks
        self.layout = layout
        self.memory = memory
        self.stage3 = stage3
        self.group = group
        #: placement="auto" until its warm-up step ends (megalith_offload.AutoPlacement)
        self.placement: Any = None
        #: overlap_param_gather (see param_gather.py)
        self.deferred: DeferredGathers | None = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dtype = self.param_dtype
        if dtype != torch.float32:  # floating inputs to the dtype the model computes in
            args, kwargs = tree_map(
                lambda t: (
                    t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                ),
                (args, kwargs),
            )
        if self.placement is not None and self.placement.pending:
            with self.placement.forward():
                out = self.module(*args, **kwargs)
        else:
            out = self.module(*args, **kwargs)
        if self.stage3 is not None and not torch.is_grad_enabled():
            self.stage3.end_step()
        self.wait_params()
        return out

    def wait_params(self) -> None:
        """With overlap_param_gather: waits for every parameter gather the last step
        started (before reading parameters outside the model's forward)."""
        if self.deferred is not None:
            self.deferred.wait_all()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter in fp32 (the master values) and every buffer, on every rank.
        Gathered one chunk at a time; for models too large for one rank's memory,
        stream with megalith_zero.full_state.iter_full_params or save_full()."""
        out = dict(iter_full_params(self.chunks, self.group))
        out.update({name: b.detach().clone() for name, b in self.module.named_buffers()})
        return out

    def memory_report(self) -> dict[str, Any]:
        """Bytes of model state on this rank, by kind (current and peak)."""
        return self.memory.report()


def _param_groups(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, outside: Collection[int] = ()
) -> list[tuple[str, torch.nn.Parameter, int]]:
    group_of: dict[int, int] = {}
    for gi, g in enumerate(optimizer.param_groups):
        check_group(g, gi)
        for p in g["params"]:
            if id(p) in group_of:
                raise ValueError(
                    f"megalith_zero: a parameter appears in param groups {group_of[id(p)]} and {gi}"
                )
            if id(p) in outside:
                raise ValueError(
                    f"megalith_zero: param group {gi} holds a parameter passed in `outside`; "
                    "the optimizer given to shard() must hold only the parameters ZeRO steps"
                )
            group_of[id(p)] = gi
    named = [(n, p) for n, p in model.named_parameters() if id(p) not in outside]
    in_model = {id(p) for _, p in named}
    stray = [
        gi
        for gi, g in enumerate(optimizer.param_groups)
        for p in g["params"]
        if id(p) not in in_model
    ]
    if stray:
        raise ValueError(
            f"megalith_zero: param group {stray[0]} holds a parameter that is not in the model; "
            "build the optimizer from model.parameters()"
        )
    out = []
    for name, p in named:
        if not p.is_floating_point():
            raise TypeError(
                f"megalith_zero: parameter {name!r} is {p.dtype}; only floating-point parameters shard"
            )
        if p.requires_grad and id(p) not in group_of:
            raise ValueError(
                f"megalith_zero: parameter {name!r} requires grad but is in no param group of the optimizer; "
                "add it, or set requires_grad=False to freeze it"
            )
        out.append((name, p, group_of[id(p)] if p.requires_grad else -1))
    return out


def shard(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    config: ZeroConfig | None = None,
    group: comm.ProcessGroup | None = None,
    mesh: comm.Mesh | None = None,
    axis: str = "dp",
    model_parallel: ModelParallel | None = None,
    materialize: Callable[[Sequence[torch.nn.Parameter]], None] | None = None,
    outside: Collection[torch.nn.Parameter] = (),
) -> tuple[ZeroModel, ZeroOptimizer]:
    """Shards `model`'s training state over `group` (default: all ranks), or over
    `mesh`'s `axis` (every rank of the world calls it then, whatever its group).

    Every rank calls it with the same model and optimizer construction; rank 0's
    initial parameters are broadcast. The optimizer must be an Adam/AdamW, SGD or
    Lion (torch's or megalith's). One that has already stepped continues where it
    was: its per-parameter states and step counts move into the shards (its param
    groups, with their hyperparameters, are kept). Returns the model to call and the
    optimizer to step: see ZeroOptimizer.

    model_parallel: when the model is itself split over other ranks (tensor-parallel
    shards, pipeline stages) and `group` holds the data-parallel replicas of this
    rank's part: the ranks of the other parts and how much each parameter counts
    (see ModelParallel), so that clip_grad_norm_ is the norm of the whole model and an
    fp16 overflow anywhere skips the step everywhere.

    materialize: for a model whose parameters are not real yet (built lazily, on the
    meta device): called with each chunk's parameters just before the chunk is built,
    it makes them real on its `device` attribute (megalith.lazy.ChunkMaterializer), so
    no rank holds more than its shards plus one chunk of the model.

    outside: parameters of `model` that another optimizer steps (expert weights split
    over other ranks): left where they are, in no chunk, not broadcast, their gradients
    not reduced; the caller adds their squared norm to clip_grad_norm_(extra_sum_sq=...).
    """
    config = config or ZeroConfig()
    if mesh is not None:
        if group is not None:
            raise ValueError("megalith_zero.shard: pass group or mesh, not both")
        group, partition = mesh.group(axis), mesh.shape.partition([axis])
    else:
        group = comm.group.resolve(group)
        world = comm.get_world().world_size
        if group.size not in (1, world):
            raise ValueError(
                f"megalith_zero.shard: group {group.name!r} has {group.size} of {world} ranks; pass "
                f"mesh=<the Mesh> and axis=<its data-parallel axis> instead, so that every rank "
                "can create the helper groups collectively"
            )
        partition = [group.ranks]
    if model_parallel is not None and not isinstance(model_parallel, ModelParallel):
        raise TypeError(
            f"megalith_zero.shard: model_parallel={model_parallel!r}; expected None or "
            "megalith_zero.ModelParallel(group, weight)"
        )
    if config.offload is not None and config.offload.param_frac and config.stage != 3:
        raise ValueError(
            f"megalith_zero.shard: OffloadConfig(param_frac={config.offload.param_frac}) at "
            f"stage {config.stage}; only stage 3 keeps parameters sharded, so only it can "
            "keep shards in host memory: use stage=3 or param_frac=0"
        )
    if config.step_in_backward and config.scales_loss:
        raise ValueError(
            "megalith_zero.shard: ZeroConfig(step_in_backward=True) with fp16 loss scaling: "
            "an overflow must skip the whole step, which is known only once every gradient "
            "is in; train in bf16, or set step_in_backward=False"
        )
    rule = rule_for(optimizer)
    params = _param_groups(model, optimizer, {id(p) for p in outside})
    # An optimizer that has stepped: its states are taken out now (by name) and handed
    # over into the chunks' shards once they exist, so training continues where it was.
    handed = take_param_states(optimizer, [(n, p) for n, p, _ in params])
    if not params:
        raise ValueError("megalith_zero: the model has no parameters")
    devices = {p.device for _, p, _ in params}
    if materialize is not None:  # lazy ones become real on its device (a real adapter beside)
        devices = {materialize.device if d.type == "meta" else d for d in devices}
    if len(devices) != 1:
        raise ValueError(
            f"megalith_zero: parameters are on {sorted(map(str, devices))}; move the model to one device"
        )
    device = devices.pop() if materialize is None else materialize.device
    layout = layout_for(
        params, group.size, config.chunk_bytes, config.param_dtype, config.shard_each_param
    )
    # Budgets are checked before the first collective: a bad one fails on every rank alike.
    budget = auto_budget(config, layout, device)
    memory = StateMemory(device)
    offloader = make_offloader(config, layout, optimizer, rule, group.rank, device)
    with torch.no_grad():
        src = group.global_rank(0)
        for _, p, _ in params:
            if materialize is None:  # else chunk by chunk, once materialised (chunk())
                comm.broadcast(p.data, src=src, group=group)
        for b in model.buffers():
            comm.broadcast(b, src=src, group=group)

    def setup(spec: Any) -> ChunkSetup:
        trainable = spec.group >= 0
        g = optimizer.param_groups[spec.group] if trainable else {}
        names = rule.state_names(g) if trainable else ()
        fmt = flat_states.group_format(rule, g)  # lean states: the group's state_dtype
        return ChunkSetup(group.rank, config, trainable, offloader, names, fmt)

    def chunk(spec: Any) -> FlatChunk:
        ps = [params[s.param][1] for s in spec.slots]
        if materialize is not None:
            materialize(ps)
            with torch.no_grad():
                for p in ps:
                    comm.broadcast(p.data, src=src, group=group)
        return FlatChunk(spec, ps, memory, setup(spec))

    chunks = [chunk(spec) for spec in layout.chunks]
    # The parameters now live in chunk memory: their old storage, cached by torch, goes
    # back to the driver (at 12B in fp32 that is 49 GB the engine's pool needs).
    memory.release_torch_cache()
    # Its own group for parameter gathers (see stage3.py for why).
    gathers = comm.new_groups(partition, name=f"{group.name}.zero_gather", exclusive=True)
    gather_group = next(g for g in gathers if g is not None)
    streams = Streams(device)
    stage3 = None
    if config.stage == 3:
        param_chunk = {id(params[s.param][1]): c for c in chunks for s in c.spec.slots}
        stage3 = Stage3Hooks(
            model,
            chunks,
            param_chunk,
            gather_group,
            config.prefetch,
            streams,
            config.keep_gathered_bytes,
        )
    reducer = GradReducer(
        chunks,
        group,
        config.overlap,
        streams,
        on_chunk_done=stage3.chunk_done if stage3 else None,
        on_backward_end=stage3.end_step if stage3 else None,
    )
    tiers = make_tiers(offloader, chunks, optimizer, rule, streams, memory, budget is not None)
    zopt = ZeroOptimizer(
        optimizer,
        rule,
        chunks,
        reducer,
        group,
        gather_group,
        config,
        tiers,
        offloader,
        model_parallel,
    )
    zmodel = ZeroModel(model, chunks, layout, memory, stage3, group, config.param_dtype)
    if config.overlap_param_gather and group.size > 1:
        param_chunk = {id(params[s.param][1]): c.spec.index for c in chunks for s in c.spec.slots}
        zmodel.deferred = zopt.deferred = DeferredGathers(model, param_chunk)
    if budget is not None:
        keep = stage3.keep_more if stage3 is not None else None
        zmodel.placement = zopt.placement = auto_placement(
            config, budget, memory, chunks, offloader, keep
        )
    zmodel.optimizer, zopt.model = zopt, zmodel  # checkpoint functions take either
    if handed:
        load_param_states(zopt, handed)
    return zmodel, zopt
