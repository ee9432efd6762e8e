"""numpy arrays through the engine with no torch tensor: megalith_core.optim.functional's
steps and grad_stats, the memory resources' buffers and the async file I/O.

Each step is compared with torch.optim's on the same fresh random data (fp32: 1e-6
relative); bf16 gradients and bf16 param_copies use ml_dtypes' bfloat16.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megalith_core import _engine
from megalith_core.optim import functional as F


def rel(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-300))


def test_adam_step_numpy_equals_torch_adamw(rng):
    shapes = [(33,), (7, 129), (1,)]
    params = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    ref = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params]
    opt = torch.optim.AdamW(ref, lr=3e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1)
    for step in range(1, 21):
        grads = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        F.adam_step(
            params, grads, m, v, step=step, lr=3e-3, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.1
        )
        for r, g in zip(ref, grads):
            r.grad = torch.from_numpy(g)
        opt.step()
    for p, r in zip(params, ref):
        assert rel(p, r.detach().numpy()) < 1e-6
        assert np.abs(p).sum() > 0


def test_bf16_grads_and_param_copies(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    p = rng.standard_normal(1000).astype(np.float32)
    m, v, copy = np.zeros_like(p), np.zeros_like(p), np.zeros(1000, bf16)
    g = rng.standard_normal(1000).astype(bf16)
    ref = torch.nn.Parameter(torch.from_numpy(p.copy()))
    F.adam_step([p], [g], [m], [v], param_copies=[copy], step=1, lr=1e-2)
    ref.grad = torch.from_numpy(g.astype(np.float32))
    torch.optim.Adam([ref], lr=1e-2).step()
    assert rel(p, ref.detach().numpy()) < 1e-6
    assert np.array_equal(copy.astype(np.float32), p.astype(bf16).astype(np.float32))


def test_sgd_and_lion_numpy(rng):
    p = rng.standard_normal(257).astype(np.float32)
    buf = np.zeros_like(p)
    ref = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt = torch.optim.SGD([ref], lr=0.05, momentum=0.9, nesterov=True)
    for step in range(5):
        g = rng.standard_normal(257).astype(np.float32)
        F.sgd_step([p], [g], [buf], first_step=step == 0, lr=0.05, momentum=0.9, nesterov=True)
        ref.grad = torch.from_numpy(g)
        opt.step()
    assert rel(p, ref.detach().numpy()) < 1e-6

    q = rng.standard_normal(64).astype(np.float32)
    q0, mu = q.copy(), np.zeros_like(q)
    g = rng.standard_normal(64).astype(np.float32)
    F.lion_step([q], [g], [mu], step=1, lr=0.01, betas=(0.9, 0.99), weight_decay=0.0)
    np.testing.assert_allclose(q, q0 - 0.01 * np.sign(0.1 * g), rtol=1e-6)
    np.testing.assert_allclose(mu, 0.01 * g, rtol=1e-5)  # (1 - b2) in fp32


def test_grad_stats_numpy(rng):
    grads = [rng.standard_normal(n).astype(np.float32) for n in (5, 300)]
    sum_sq, bad = F.grad_stats(grads, scale=0.5)
    expect = sum(float(np.sum((g.astype(np.float64) * 0.5) ** 2)) for g in grads)
    assert abs(sum_sq - expect) / expect < 1e-5 and not bad
    grads[1][3] = np.inf
    assert F.grad_stats(grads)[1]


def test_numpy_errors_name_the_fix(rng):
    p = rng.standard_normal(8).astype(np.float32)
    m, v = np.zeros_like(p), np.zeros_like(p)
    with pytest.raises(ValueError, match=r"read-only.*np.array"):
        ro = p.copy()
        ro.flags.writeable = False
        F.adam_step([ro], [p.copy()], [m], [v], step=1, lr=1e-3)
    with pytest.raises(TypeError, match="float64"):
        F.adam_step([p], [p.astype(np.float64)], [m], [v], step=1, lr=1e-3)
    with pytest.raises(ValueError, match="same memory"):
        F.adam_step([p], [p], [m], [v], step=1, lr=1e-3)
    with pytest.raises(TypeError, match="numpy array"):
        F.adam_step([p], [torch.zeros(8)], [m], [v], step=1, lr=1e-3)
    with pytest.raises(ValueError, match="C-contiguous"):
        big = np.zeros(16, np.float32)
        F.adam_step([big[::2]], [p], [m], [v], step=1, lr=1e-3)


def test_engine_buffers_and_io_with_numpy(tmp_path, rng):
    buf = _engine.memory.HostResource().allocate(4096, 256)
    view = np.from_dlpack(buf.view("f32", 1024))
    assert view.ctypes.data == buf.data_ptr  # aliases the engine's memory
    data = rng.standard_normal(1024).astype(np.float32)
    view[:] = data
    assert np.array_equal(np.from_dlpack(buf.view("f32", 1024)), data)

    io = _engine.io.AsyncIO(threads=1, direct=False)
    path = str(tmp_path / "x.bin")
    io.write(path, 0, data).wait()
    back = np.zeros_like(data)
    io.read(path, 0, back).wait()
    assert np.array_equal(back, data)
    with pytest.raises((TypeError, ValueError)):  # the engine writes into it: must be writable
        io.read(path, 0, np.asarray(data).view()[::2])
