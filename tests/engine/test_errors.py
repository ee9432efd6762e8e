"""Wrong arguments get ValueError/TypeError naming the argument and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megalith import _engine
from megalith.optim import CPUAdam, FusedAdam
from megalith.optim import functional as F

H = _engine.AdamHyper()


def bufs(n=64, dtype=torch.float32):
    return [torch.randn(n, dtype=dtype) for _ in range(4)]


def test_flat_api_steps_numpy_and_torch():
    rng = np.random.default_rng()
    p, g = rng.standard_normal(100, dtype=np.float32), rng.standard_normal(100, dtype=np.float32)
    m, v = np.zeros(100, np.float32), np.zeros(100, np.float32)
    before = p.copy()
    _engine.adam_step_flat(p, g, m, v, hyper=H, step=1)
    assert not np.array_equal(p, before)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-6)


def test_wrong_dtype_names_argument():
    p, g, m, v = bufs()
    with pytest.raises(TypeError, match="exp_avg_sq: expected dtype float32, got float64"):
        _engine.adam_step_flat(p, g, m, v.double(), hyper=H, step=1)
    with pytest.raises(
        TypeError, match="grad: expected dtype float32 or bfloat16 or float16, got int32"
    ):
        _engine.adam_step_flat(p, g.int(), m, v, hyper=H, step=1)


def test_wrong_size_names_argument():
    p, g, m, v = bufs()
    with pytest.raises(ValueError, match="exp_avg: expected 64 elements like param, got 63"):
        _engine.adam_step_flat(p, g, m[:63], v, hyper=H, step=1)


def test_non_contiguous_rejected():
    p, g, m, v = bufs(128)
    with pytest.raises(ValueError, match="grad: expected a contiguous array"):
        _engine.adam_step_flat(p[:64], g[::2], m[:64], v[:64], hyper=H, step=1)


def test_aliasing_rejected():
    p, g, m, v = bufs()
    with pytest.raises(ValueError, match="overlap"):
        _engine.adam_step_flat(p, g, m, m, hyper=H, step=1)
    big = torch.randn(100)
    with pytest.raises(ValueError, match="overlap"):
        _engine.adam_step_flat(big[:64], g, big[30:94], v, hyper=H, step=1)


def test_bad_step_and_amsgrad_without_buffer():
    p, g, m, v = bufs()
    with pytest.raises(ValueError, match="step is 0"):
        _engine.adam_step_flat(p, g, m, v, hyper=H, step=0)
    with pytest.raises(ValueError, match="max_exp_avg_sq: required"):
        _engine.adam_step_flat(p, g, m, v, hyper=_engine.AdamHyper(amsgrad=True), step=1)


def test_functional_names_list_and_index():
    p, g, m, v = bufs()
    with pytest.raises(TypeError, match=r"grads\[1\] is torch.float64"):
        F.adam_step(
            [p, p.clone()], [g, g.double()], [m, m.clone()], [v, v.clone()], step=1, lr=1e-3
        )
    with pytest.raises(ValueError, match=r"exp_avgs\[0\] has 10 elements; expected 64"):
        F.adam_step([p], [g], [m[:10]], [v], step=1, lr=1e-3)
    with pytest.raises(ValueError, match="nonfinite: expected one of"):
        F.adam_step([p], [g], [m], [v], step=1, lr=1e-3, nonfinite="sometimes")


def test_optimizer_messages():
    half = torch.nn.Parameter(torch.randn(4, 4).half())
    half.grad = torch.randn(4, 4).half()
    with pytest.raises(TypeError, match="float16; the engine keeps fp32"):
        CPUAdam([half]).step()
    t = torch.nn.Parameter(torch.randn(4, 4).t())  # a transposed view: not contiguous
    t.grad = torch.randn(4, 4)
    with pytest.raises(ValueError, match="not contiguous"):
        CPUAdam([t]).step()
    cpu_param = torch.nn.Parameter(torch.randn(3))
    cpu_param.grad = torch.randn(3)
    with pytest.raises(ValueError, match=r"FusedAdam steps cuda parameters.*CPUAdam"):
        FusedAdam([cpu_param]).step()
    with pytest.raises(ValueError, match="invalid beta2"):
        CPUAdam([cpu_param], betas=(0.9, 1.0))
    with pytest.raises(NotImplementedError, match="megalith-offload"):
        CPUAdam([cpu_param], nvme_offload_fraction=0.5)


def test_simd_and_threads_controls():
    with pytest.raises(ValueError, match="unknown SIMD level 'sse9'"):
        _engine.force_simd_level("sse9")
    with pytest.raises(ValueError, match="at least 1 thread"):
        _engine.set_num_threads(0)
    n = _engine.num_threads()
    _engine.set_num_threads(3)
    assert _engine.num_threads() == 3
    _engine.set_num_threads(n)


def test_cuda_entry_points_explain_themselves_without_gpu():
    if _engine.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    p, g, m, v = bufs()
    table = np.array([[p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), 0, 0]], np.int64)
    with pytest.raises((RuntimeError, ValueError), match=r"CUDA|cuda"):
        _engine.cuda_adam_step(
            table, np.array([64], np.int64), H, _engine.StepArgs(), _engine.DeviceScalars(), 0
        )
