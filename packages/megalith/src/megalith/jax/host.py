"""Host buffers from the engine's allocator, seen as numpy arrays and handed to JAX.

[Note: aligned host memory] XLA's CPU client adopts a numpy array's memory instead of
copying it when the data is 64-byte aligned (``jax.device_put`` on the CPU). Every array
here starts at a 64-byte-aligned offset of one engine buffer, so the updates handed to
JAX on the CPU are the very memory the kernel wrote. Such an array is never written
again once JAX holds it: each step's updates get a fresh buffer.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from megalith_core import _engine

ALIGN = 64  # see [Note: aligned host memory]


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


class FlatHost:
    """Arrays of the given shapes and dtypes at aligned offsets of one engine buffer."""

    def __init__(
        self,
        resource: _engine.memory.Resource,
        shapes: Sequence[tuple[int, ...]],
        dtypes: Sequence[np.dtype],
        *,
        zero: bool = False,
    ):
        offsets, total = [], 0
        for shape, dtype in zip(shapes, dtypes):
            offsets.append(total)
            total += _round_up(
                int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, ALIGN
            )
        self.nbytes = total
        self.buffer = resource.allocate(max(total, ALIGN), 4096)
        raw = np.from_dlpack(self.buffer.view("u8", max(total, ALIGN)))
        if zero:
            raw[:] = 0
        self.arrays: list[np.ndarray] = []
        for off, shape, dtype in zip(offsets, shapes, dtypes):
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            self.arrays.append(raw[off : off + n].view(dtype).reshape(shape))

    def __getitem__(self, i: int) -> np.ndarray:
        return self.arrays[i]

    def __len__(self) -> int:
        return len(self.arrays)


def host_view(x: jax.Array | np.ndarray) -> np.ndarray:
    """A C-contiguous numpy view of `x`: no copy for a JAX array on the CPU (read-only),
    the device-to-host copy for one on a GPU."""
    a = np.asarray(x)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def to_jax(a: np.ndarray, like: jax.Array | np.ndarray) -> jax.Array:
    """`a` as a JAX array where `like` lives: no copy on the CPU (aligned, see the note)."""
    sharding = getattr(like, "sharding", None)
    return jax.device_put(a, sharding) if sharding is not None else jax.device_put(a)


def widen_difference(new: np.ndarray, old: np.ndarray, out: np.ndarray) -> None:
    """out (fp32) = new - old of two bf16/fp16 arrays, exactly. bf16 is widened by a
    16-bit shift (2.5x faster than ml_dtypes' casts, which were most of a bf16 step)."""
    if new.dtype.name != "bfloat16":
        np.subtract(new, old, out=out, dtype=np.float32)
        return
    wide_old = np.left_shift(old.view(np.uint16), 16, dtype=np.uint32).view(np.float32)
    np.left_shift(new.view(np.uint16), 16, out=out.view(np.uint32), dtype=np.uint32)
    np.subtract(out, wide_old, out=out)
