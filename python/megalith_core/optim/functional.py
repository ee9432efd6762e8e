"""Fused optimizer steps on lists of tensors: one engine call per list.

This is the layer the optimizers in :mod:`megalith.optim` and the ZeRO/offload
packages build on. Every tensor of one call lives on one device; parameters and
states are fp32; gradients are one of fp32, bf16 or fp16 for the whole list;
``param_copies`` (optional) receive the updated parameters in bf16/fp16/fp32 in
the same pass. The lists may hold numpy arrays instead of torch tensors (host
steps with no torch tensor anywhere: JAX on the CPU, see megalith.jax). On the
CPU the call returns whether any scaled gradient was
inf/nan (with ``nonfinite="detect"`` or ``"skip"``); on CUDA the call is
asynchronous on the current stream and returns False: use
:func:`grad_check` and ``DeviceScalars.found_inf`` for skips without a sync.

[Note: pointer tables] Each tensor is validated here (dtype, device, size,
contiguity, aliasing) and its data pointer goes into one int64 table handed to
the engine; converting hundreds of tensors through DLPack would cost more than
the step itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from megalith_core import _engine

from ..dtypes import GRAD_DTYPES, engine_dtype, nonfinite_mode
from ._numpy_table import is_numpy, numpy_grad_ptrs, numpy_table

Tensors = Sequence[torch.Tensor]


@dataclass(frozen=True)
class DeviceScalars:
    """GPU-resident scalars read by CUDA steps (each an fp32 one-element tensor).

    inv_scale: gradients are multiplied by it (1/loss_scale).
    found_inf: when non-zero the step changes nothing.
    grad_sum_sq: with max_grad_norm > 0, gradients are also scaled by
        min(1, max_grad_norm / (sqrt(grad_sum_sq) + 1e-6)).
    """

    inv_scale: torch.Tensor | None = None
    found_inf: torch.Tensor | None = None
    grad_sum_sq: torch.Tensor | None = None
    max_grad_norm: float = 0.0

    def to_engine(self) -> _engine.DeviceScalars:
        def ptr(t: torch.Tensor | None, name: str) -> int:
            if t is None:
                return 0
            if t.dtype != torch.float32 or t.numel() != 1 or not t.is_cuda:
                raise ValueError(
                    f"DeviceScalars.{name}: expected a one-element float32 CUDA tensor"
                )
            return t.data_ptr()

        return _engine.DeviceScalars(
            inv_scale=ptr(self.inv_scale, "inv_scale"),
            found_inf=ptr(self.found_inf, "found_inf"),
            grad_sum_sq=ptr(self.grad_sum_sq, "grad_sum_sq"),
            max_grad_norm=self.max_grad_norm,
        )


def _check_lengths(op: str, params, grads, states, param_copies) -> None:
    n = len(params)
    if len(grads) != n:
        raise ValueError(f"{op}: got {n} params but {len(grads)} grads")
    for name, lst in states:
        if lst is not None and len(lst) != n:
            raise ValueError(f"{op}: got {n} params but {len(lst)} {name}")
    if param_copies is not None and len(param_copies) != n:
        raise ValueError(f"{op}: got {n} params but {len(param_copies)} param_copies")


@dataclass(frozen=True)
class _Lean:
    """The dtypes and extra columns of a lean Adam table (see _lean_columns)."""

    param_dtype: torch.dtype
    state_dtypes: tuple[torch.dtype, torch.dtype]
    extras: Sequence[tuple[str, Tensors | None, torch.dtype]]  # columns 6, 7, 8


def _build_table(
    op: str,
    params: Tensors,
    grads: Tensors,
    states: Sequence[tuple[str, Tensors | None]],
    param_copies: Tensors | None,
    lean: _Lean | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.device, torch.dtype, torch.dtype]:
    n = len(params)
    _check_lengths(op, params, grads, states, param_copies)
    cols = 6 if lean is None else 9
    param_dtype = torch.float32 if lean is None else lean.param_dtype
    if n == 0:
        empty = torch.zeros((0, cols), dtype=torch.int64)
        return (
            empty,
            torch.zeros(0, dtype=torch.int64),
            torch.device("cpu"),
            torch.float32,
            torch.bfloat16,
        )

    device = params[0].device
    grad_dtype = grads[0].dtype
    copy_dtype = param_copies[0].dtype if param_copies is not None else torch.bfloat16
    if grad_dtype not in GRAD_DTYPES:
        raise TypeError(f"{op}: grads[0] is {grad_dtype}; expected float32, bfloat16 or float16")
    rows: list[list[int]] = []
    numels: list[int] = []
    for i in range(n):
        p = params[i]
        numel = p.numel()
        row = [0] * cols
        named = [("params", p, 0, param_dtype, numel), ("grads", grads[i], 1, grad_dtype, numel)]
        for k, (name, lst) in enumerate(states):
            if lst is not None:
                dtype = torch.float32 if lean is None or k > 1 else lean.state_dtypes[k]
                named.append((name, lst[i], 2 + k, dtype, numel))
        if param_copies is not None:
            named.append(("param_copies", param_copies[i], 5, copy_dtype, numel))
        if lean is not None:
            blocks = _engine.q8_scale_count(numel)
            for k, (name, lst, dtype) in enumerate(lean.extras):
                if lst is not None:
                    named.append((name, lst[i], 6 + k, dtype, blocks if k < 2 else numel))
        for name, t, col, dtype, want in named:
            if t.dtype != dtype:
                raise TypeError(f"{op}: {name}[{i}] is {t.dtype}; expected {dtype}")
            if t.device != device:
                raise ValueError(
                    f"{op}: {name}[{i}] is on {t.device}; expected {device} like params[0]"
                )
            if t.numel() != want:
                raise ValueError(
                    f"{op}: {name}[{i}] has {t.numel()} elements; expected {want} for "
                    f"params[{i}] of {numel}"
                )
            if not t.is_contiguous():
                raise ValueError(f"{op}: {name}[{i}] is not contiguous; call .contiguous() first")
            row[col] = t.data_ptr()
        used = [x for x in row if x]
        if numel and len(set(used)) != len(used):
            raise ValueError(f"{op}: two of the buffers of parameter {i} are the same memory")
        rows.append(row)
        numels.append(numel)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{op}: tensors are on {device}; the engine runs on cpu and cuda")
    return (
        torch.tensor(rows, dtype=torch.int64),
        torch.tensor(numels, dtype=torch.int64),
        device,
        grad_dtype,
        copy_dtype,
    )


def _run(
    op: str,
    cpu_fn,
    cuda_fn,
    hyper,
    params: Tensors,
    grads: Tensors,
    states: Sequence[tuple[str, Tensors | None]],
    param_copies: Tensors | None,
    step: int,
    grad_scale: float,
    nonfinite: str,
    device_scalars: DeviceScalars | None,
    lean: _Lean | None = None,
    formats: dict | None = None,
) -> bool:
    formats = formats or {}
    if params and is_numpy(params[0]):
        if lean is not None:
            raise TypeError(
                f"{op}: lean state formats take torch tensors, not numpy arrays"
            )  # host arrays without torch (numpy, JAX on the CPU)
        _check_lengths(op, params, grads, states, param_copies)
        if device_scalars is not None:
            raise ValueError(f"{op}: device_scalars are for CUDA tensors; pass grad_scale")
        table, numels, g_dtype, c_dtype = numpy_table(op, params, grads, states, param_copies)
        args = _engine.StepArgs(
            grad_dtype=g_dtype,
            copy_dtype=c_dtype,
            grad_scale=float(grad_scale),
            step=int(step),
            nonfinite=nonfinite_mode(nonfinite),
        )
        return bool(cpu_fn(table, numels, hyper, args))
    table, numels, device, grad_dtype, copy_dtype = _build_table(
        op, params, grads, states, param_copies, lean
    )
    if table.shape[0] == 0:
        return False
    args = _engine.StepArgs(
        grad_dtype=engine_dtype(grad_dtype, "grads"),
        copy_dtype=engine_dtype(copy_dtype, "param_copies"),
        grad_scale=float(grad_scale),
        step=int(step),
        nonfinite=nonfinite_mode(nonfinite),
        **formats,
    )
    if device.type == "cpu":
        if device_scalars is not None:
            raise ValueError(
                f"{op}: device_scalars are for CUDA tensors; pass grad_scale on the CPU"
            )
        return bool(cpu_fn(table.numpy(), numels.numpy(), hyper, args))
    if nonfinite != "ignore":
        raise ValueError(
            f"{op}: nonfinite={nonfinite!r} needs a host sync on CUDA; use grad_check() and "
            "DeviceScalars(found_inf=...) instead"
        )
    stream = torch.cuda.current_stream(device).cuda_stream
    dev = (device_scalars or DeviceScalars()).to_engine()
    with torch.cuda.device(device):
        cuda_fn(table.numpy(), numels.numpy(), hyper, args, dev, stream)
    return False


def adam_step(
    params: Tensors,
    grads: Tensors,
    exp_avgs: Tensors,
    exp_avg_sqs: Tensors,
    *,
    max_exp_avg_sqs: Tensors | None = None,
    param_copies: Tensors | None = None,
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled_weight_decay: bool = True,
    amsgrad: bool = False,
    bias_correction: bool = True,
    maximize: bool = False,
    grad_scale: float = 1.0,
    nonfinite: str = "ignore",
    device_scalars: DeviceScalars | None = None,
    exp_avg_scales: Tensors | None = None,
    exp_avg_sq_scales: Tensors | None = None,
    param_comps: Tensors | None = None,
    seed: int = 0,
) -> bool:
    """One fused Adam/AdamW step over every tensor in the lists (see module doc).

    Lean formats (see [Note: lean states] in core/include/megalith/optim/slots.h)
    follow from the dtypes of the first tensors:
      - exp_avgs/exp_avg_sqs bfloat16: bf16 states, stochastically rounded with
        the stream of ``seed`` and ``step`` (the position in the list is part of it);
      - exp_avgs int8 and exp_avg_sqs uint8: 8-bit block-quantised states, with
        ``exp_avg_scales``/``exp_avg_sq_scales`` float32 tensors of
        ceil(numel / 256) block scales each;
      - params bfloat16: bf16 masters with ``param_comps`` (bfloat16) holding the
        Kahan compensation.
    """
    if amsgrad and max_exp_avg_sqs is None:
        raise ValueError("adam_step: amsgrad=True needs max_exp_avg_sqs")
    lean, formats = _lean_columns(
        params, exp_avgs, exp_avg_sqs, exp_avg_scales, exp_avg_sq_scales, param_comps, seed
    )
    hyper = _engine.AdamHyper(
        lr=lr,
        beta1=betas[0],
        beta2=betas[1],
        eps=eps,
        weight_decay=weight_decay,
        decoupled_weight_decay=decoupled_weight_decay,
        amsgrad=amsgrad,
        bias_correction=bias_correction,
        maximize=maximize,
    )
    states = [
        ("exp_avgs", exp_avgs),
        ("exp_avg_sqs", exp_avg_sqs),
        ("max_exp_avg_sqs", max_exp_avg_sqs if amsgrad else None),
    ]
    return _run(
        "adam_step",
        _engine.cpu_adam_step,
        _engine.cuda_adam_step,
        hyper,
        params,
        grads,
        states,
        param_copies,
        step,
        grad_scale,
        nonfinite,
        device_scalars,
        lean,
        formats,
    )


_STATE_FORMATS = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.int8: "q8",
}


def _lean_columns(
    params: Tensors,
    exp_avgs: Tensors,
    exp_avg_sqs: Tensors,
    exp_avg_scales: Tensors | None,
    exp_avg_sq_scales: Tensors | None,
    param_comps: Tensors | None,
    seed: int,
) -> tuple[_Lean | None, dict]:
    """The lean-format table columns and StepArgs settings the tensors ask for."""
    if not params or is_numpy(params[0]):
        return None, {}
    state_dtype = exp_avgs[0].dtype
    if state_dtype not in _STATE_FORMATS:
        raise TypeError(
            f"adam_step: exp_avgs[0] is {state_dtype}; expected float32, bfloat16 or int8 (q8 codes)"
        )
    state_format = _STATE_FORMATS[state_dtype]
    sq_dtype = torch.uint8 if state_format == "q8" else state_dtype
    kahan = params[0].dtype == torch.bfloat16
    if state_format == "f32" and not kahan:
        return None, {}
    if state_format == "q8" and (exp_avg_scales is None or exp_avg_sq_scales is None):
        raise ValueError(
            "adam_step: int8 exp_avgs (q8 states) need exp_avg_scales and exp_avg_sq_scales "
            "(float32, ceil(numel / 256) elements each)"
        )
    if kahan and param_comps is None:
        raise ValueError(
            "adam_step: bfloat16 params (bf16 masters) need param_comps, a bfloat16 "
            "compensation buffer per parameter (zeros to start)"
        )
    q8 = state_format == "q8"
    lean = _Lean(
        param_dtype=torch.bfloat16 if kahan else torch.float32,
        state_dtypes=(state_dtype, sq_dtype),
        extras=[
            ("exp_avg_scales", exp_avg_scales if q8 else None, torch.float32),
            ("exp_avg_sq_scales", exp_avg_sq_scales if q8 else None, torch.float32),
            ("param_comps", param_comps if kahan else None, torch.bfloat16),
        ],
    )
    formats = dict(
        state_format=getattr(_engine.StateFormat, state_format),
        master_format=_engine.MasterFormat.bf16_kahan if kahan else _engine.MasterFormat.f32,
        seed=int(seed) & (2**64 - 1),
    )
    return lean, formats


def sgd_step(
    params: Tensors,
    grads: Tensors,
    momentum_buffers: Tensors | None = None,
    *,
    param_copies: Tensors | None = None,
    first_step: bool,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    maximize: bool = False,
    grad_scale: float = 1.0,
    nonfinite: str = "ignore",
    device_scalars: DeviceScalars | None = None,
) -> bool:
    """One fused SGD step. With momentum, ``first_step=True`` sets each buffer
    to the (decayed) gradient, as torch.optim.SGD does when it creates it."""
    if momentum != 0.0 and momentum_buffers is None:
        raise ValueError("sgd_step: momentum != 0 needs momentum_buffers")
    hyper = _engine.SgdHyper(
        lr=lr,
        momentum=momentum,
        dampening=dampening,
        weight_decay=weight_decay,
        nesterov=nesterov,
        maximize=maximize,
    )
    states = [("momentum_buffers", momentum_buffers if momentum != 0.0 else None)]
    return _run(
        "sgd_step",
        _engine.cpu_sgd_step,
        _engine.cuda_sgd_step,
        hyper,
        params,
        grads,
        states,
        param_copies,
        1 if first_step else 2,
        grad_scale,
        nonfinite,
        device_scalars,
    )


def lion_step(
    params: Tensors,
    grads: Tensors,
    exp_avgs: Tensors,
    *,
    param_copies: Tensors | None = None,
    step: int,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.99),
    weight_decay: float = 0.0,
    maximize: bool = False,
    grad_scale: float = 1.0,
    nonfinite: str = "ignore",
    device_scalars: DeviceScalars | None = None,
) -> bool:
    """One fused Lion step (Chen et al., 2023)."""
    hyper = _engine.LionHyper(
        lr=lr, beta1=betas[0], beta2=betas[1], weight_decay=weight_decay, maximize=maximize
    )
    return _run(
        "lion_step",
        _engine.cpu_lion_step,
        _engine.cuda_lion_step,
        hyper,
        params,
        grads,
        [("exp_avgs", exp_avgs)],
        param_copies,
        step,
        grad_scale,
        nonfinite,
        device_scalars,
    )


def grad_stats(grads: Tensors, *, scale: float = 1.0) -> tuple[float, bool]:
    """(sum of squares of grad*scale, any inf/nan) over CPU gradients (torch tensors or
    numpy arrays), in one pass."""
    if not grads:
        return 0.0, False
    if is_numpy(grads[0]):
        ptrs_np, numels_np, dtype_e = numpy_grad_ptrs(grads)
        sum_sq, bad = _engine.cpu_grad_stats(ptrs_np, numels_np, dtype_e, scale)
        return float(sum_sq), bool(bad)
    dtype = grads[0].dtype
    for i, g in enumerate(grads):
        if g.device.type != "cpu" or g.dtype != dtype or not g.is_contiguous():
            raise ValueError(f"grad_stats: grads[{i}] must be a contiguous CPU tensor of {dtype}")
    ptrs = torch.tensor([g.data_ptr() for g in grads], dtype=torch.int64)
    numels = torch.tensor([g.numel() for g in grads], dtype=torch.int64)
    sum_sq, bad = _engine.cpu_grad_stats(
        ptrs.numpy(), numels.numpy(), engine_dtype(dtype, "grads"), scale
    )
    return float(sum_sq), bool(bad)


def grad_check(
    grads: Tensors,
    found_inf: torch.Tensor,
    sum_sq: torch.Tensor | None = None,
    *,
    inv_scale: torch.Tensor | None = None,
    unscale_in_place: bool = False,
) -> None:
    """CUDA: one fused pass that (optionally) unscales gradients in place, sets
    ``found_inf`` to 1 on any inf/nan and adds the sum of squares of the
    unscaled gradients to ``sum_sq``. Accumulates: zero the outputs first."""
    if not grads:
        return
    dtype, device = grads[0].dtype, grads[0].device
    for i, g in enumerate(grads):
        if not g.is_cuda or g.device != device or g.dtype != dtype or not g.is_contiguous():
            raise ValueError(
                f"grad_check: grads[{i}] must be a contiguous {dtype} tensor on {device}"
            )
    scalars = DeviceScalars(
        inv_scale=inv_scale, found_inf=found_inf, grad_sum_sq=sum_sq
    ).to_engine()
    ptrs = torch.tensor([g.data_ptr() for g in grads], dtype=torch.int64)
    numels = torch.tensor([g.numel() for g in grads], dtype=torch.int64)
    with torch.cuda.device(device):
        _engine.cuda_grad_check(
            ptrs.numpy(),
            numels.numpy(),
            engine_dtype(dtype, "grads"),
            scalars.inv_scale,
            unscale_in_place,
            scalars.found_inf,
            scalars.grad_sum_sq,
            torch.cuda.current_stream(device).cuda_stream,
        )
