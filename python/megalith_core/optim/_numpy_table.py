"""The pointer table of :mod:`megalith_core.optim.functional` built from numpy arrays.

The engine never sees torch: it takes an int64 table of data pointers ([Note:
pointer tables] in functional.py). This builds the same table from numpy arrays
(JAX arrays on the host become numpy arrays without a copy; bf16 arrays are
ml_dtypes' ``bfloat16``, recognised by name so ml_dtypes is not needed here).
The checks are the torch path's: one dtype per role, equal sizes, C-contiguous,
no two buffers of one parameter in the same memory, and written-to arrays writable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from megalith_core import _engine

_ENGINE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def is_numpy(x: object) -> bool:
    return isinstance(x, np.ndarray)


def numpy_engine_dtype(dtype: np.dtype, what: str) -> _engine.DType:
    name = _ENGINE.get(np.dtype(dtype).name)
    if name is None:
        raise TypeError(
            f"{what}: numpy arrays of {np.dtype(dtype).name}; expected float32, bfloat16 "
            "(ml_dtypes.bfloat16) or float16"
        )
    return getattr(_engine.DType, name)


def numpy_table(
    op: str,
    params: Sequence[np.ndarray],
    grads: Sequence[np.ndarray],
    states: Sequence[tuple[str, Sequence[np.ndarray] | None]],
    param_copies: Sequence[np.ndarray] | None,
) -> tuple[np.ndarray, np.ndarray, _engine.DType, _engine.DType]:
    """(table (n, 6), numels (n,), grad dtype, copy dtype) for the CPU kernels."""
    n = len(params)
    firsts = [("grads", grads[0])] + ([("param_copies", param_copies[0])] if param_copies else [])
    for name, a in firsts:
        if not isinstance(a, np.ndarray):
            raise TypeError(
                f"{op}: {name}[0] is {type(a).__name__}; params[0] is a numpy array, so every "
                "buffer of the call must be one (np.asarray(...) first)"
            )
    grad_dtype = np.dtype(grads[0].dtype)
    copy_dtype = np.dtype(param_copies[0].dtype) if param_copies is not None else None
    numpy_engine_dtype(grad_dtype, f"{op}: grads")
    if copy_dtype is not None:
        numpy_engine_dtype(copy_dtype, f"{op}: param_copies")
    table = np.zeros((n, 6), dtype=np.int64)
    numels = np.zeros(n, dtype=np.int64)
    f32 = np.dtype(np.float32)
    for i in range(n):
        p = params[i]
        named = [("params", p, 0, f32, True), ("grads", grads[i], 1, grad_dtype, False)]
        for k, (name, lst) in enumerate(states):
            if lst is not None:
                named.append((name, lst[i], 2 + k, f32, True))
        if param_copies is not None:
            named.append(("param_copies", param_copies[i], 5, copy_dtype, True))
        for name, a, col, dtype, written in named:
            if not isinstance(a, np.ndarray):
                raise TypeError(
                    f"{op}: {name}[{i}] is {type(a).__name__}; params[0] is a numpy array, so "
                    "every buffer of the call must be one (np.asarray(...) first)"
                )
            if a.dtype != dtype:
                raise TypeError(f"{op}: {name}[{i}] is {a.dtype}; expected {dtype}")
            if a.size != p.size:
                raise ValueError(
                    f"{op}: {name}[{i}] has {a.size} elements; expected {p.size} like params[{i}]"
                )
            if not a.flags.c_contiguous:
                raise ValueError(
                    f"{op}: {name}[{i}] is not C-contiguous; pass np.ascontiguousarray(...)"
                )
            if written and not a.flags.writeable:
                raise ValueError(
                    f"{op}: {name}[{i}] is read-only and the step writes it; pass a writable "
                    "copy (np.array(x)): a JAX array seen through np.asarray is read-only"
                )
            table[i, col] = a.ctypes.data
        used = [x for x in table[i] if x]
        if p.size and len(set(used)) != len(used):
            raise ValueError(f"{op}: two of the buffers of parameter {i} are the same memory")
        numels[i] = p.size
    copy = numpy_engine_dtype(copy_dtype, "param_copies") if copy_dtype else _engine.DType.bf16
    return table, numels, numpy_engine_dtype(grad_dtype, "grads"), copy


def numpy_grad_ptrs(grads: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, _engine.DType]:
    """(pointers, numels, dtype) of contiguous numpy gradients of one dtype, for grad_stats."""
    dtype = grads[0].dtype
    for i, g in enumerate(grads):
        if not isinstance(g, np.ndarray) or g.dtype != dtype or not g.flags.c_contiguous:
            raise ValueError(
                f"grad_stats: grads[{i}] must be a C-contiguous numpy array of {dtype}"
            )
    ptrs = np.array([g.ctypes.data for g in grads], dtype=np.int64)
    numels = np.array([g.size for g in grads], dtype=np.int64)
    return ptrs, numels, numpy_engine_dtype(dtype, "grads")
