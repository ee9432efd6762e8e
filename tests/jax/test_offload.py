"""megalith.jax.offloaded_adamw: state in the engine's host memory, stepped by chunks,
equal to the in-memory adamw; its state through safetensors and back.

bf16 parameters: bit for bit. fp32: the in-memory adamw starts each step from the
caller's parameters, old + (new - old), which can be one fp32 rounding off new where a
parameter crosses zero; offloaded_adamw never reads them. So fp32 agrees to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import megalith.jax as mj  # noqa: E402

SHAPES = [(64, 40), (40,), (40, 64), (7,)]


def make(rng, dtype=jnp.float32, scale=1.0):
    return [jnp.asarray((scale * rng.standard_normal(s)).astype(np.float32), dtype) for s in SHAPES]


def steps(opt, params, state, grads):
    for g in grads:
        u, state = opt.update(g, state, params)
        params = optax.apply_updates(params, u)
    return params, state


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_offloaded_equals_in_memory(dtype, rng):
    params = make(rng, dtype)
    grads = [make(rng, dtype, 0.1) for _ in range(20)]
    # 4 KiB chunks: every leaf is stepped in a chunk of its own
    off = mj.offloaded_adamw(1e-2, weight_decay=0.1, chunk_bytes=4096)
    mem = mj.adamw(1e-2, weight_decay=0.1)
    p_off, s_off = steps(off, params, off.init(params), grads)
    p_mem, s_mem = steps(mem, params, mem.init(params), grads)
    exact = dtype == jnp.bfloat16

    def same(a, b):
        if exact:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)

    for a, b, p0 in zip(p_off, p_mem, params):
        assert a.dtype == dtype
        same(np.asarray(a, np.float32), np.asarray(b, np.float32))
        assert np.any(np.asarray(a) != np.asarray(p0))
    d_off, d_mem = mj.state_dict(s_off), mj.state_dict(s_mem)
    assert d_off.keys() == d_mem.keys()
    for k in d_off:
        same(d_off[k], d_mem[k])
    assert s_off.resource.current_bytes >= s_off.nbytes > 0  # the engine counts the state


def test_checkpoint_round_trip(tmp_path, rng):
    params = make(rng, jnp.bfloat16)
    grads = [make(rng, jnp.bfloat16, 0.1) for _ in range(12)]
    sched = optax.linear_schedule(1e-2, 1e-3, 12)
    opt = mj.offloaded_adamw(sched, chunk_bytes=4096)
    straight, _ = steps(opt, params, opt.init(params), grads)

    half, state = steps(opt, params, opt.init(params), grads[:6])
    mj.save_state(tmp_path / "opt.safetensors", state)
    fresh = opt.init(half)
    mj.load_state(tmp_path / "opt.safetensors", fresh)
    assert fresh.count == 6
    resumed, _ = steps(opt, half, fresh, grads[6:])
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    # an in-memory adamw loads the offloaded state too (same keys), and continues alike
    mem = mj.adamw(sched)
    other = mem.init(half)
    mj.load_state(tmp_path / "opt.safetensors", other)
    resumed_mem, _ = steps(mem, half, other, grads[6:])
    for a, b in zip(resumed_mem, straight):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_checkpoint_refusals(tmp_path, rng):
    params = make(rng)
    opt = mj.offloaded_adamw(1e-3)
    state = opt.init(params)
    mj.save_state(tmp_path / "a.safetensors", state)
    with pytest.raises(ValueError, match="init the optimizer"):
        mj.load_state(tmp_path / "a.safetensors", opt.init(params[:2]))
    lion = mj.lion(1e-3)
    with pytest.raises(ValueError, match="adamw state"):
        mj.load_state(tmp_path / "a.safetensors", lion.init(params))
    reshaped = [p.reshape(-1) for p in params]
    with pytest.raises(ValueError, match="expects"):
        mj.load_state(tmp_path / "a.safetensors", opt.init(reshaped))


def test_limit_bytes_is_enforced(rng):
    params = make(rng)  # 4 x ~10 KiB of fp32; master + m + v need > 30 KiB
    opt = mj.offloaded_adamw(1e-3, limit_bytes=16 << 10)
    with pytest.raises(MemoryError):
        opt.init(params)
