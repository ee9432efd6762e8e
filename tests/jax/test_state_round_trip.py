"""The state of every megalith.jax optimizer through safetensors and back (one process).

adamw, lion and sgd (with momentum, nesterov, and without: then the state is the master
and the count alone), fp32 and bf16 parameters, a learning-rate schedule: trained 6
steps, saved, loaded into a fresh optimizer and trained 6 more, equal bit for bit to the
run that never stopped (same kernels on the same values), the loaded state equal to the
saved one. offloaded_adamw's round trip is in test_offload.py, zero1_adamw's in
test_zero1_checkpoint.py.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import megalith.jax as mj  # noqa: E402

SHAPES = {"w": (24, 17), "b": (17,), "emb": {"table": (9, 8)}}
SAVED_AT, STEPS = 6, 12
SCHEDULE = optax.linear_schedule(1e-2, 1e-3, STEPS)

OPTIMIZERS = {
    "adamw": lambda: mj.adamw(
        SCHEDULE, weight_decay=0.1, mask={"w": True, "b": False, "emb": True}
    ),
    "lion": lambda: mj.lion(SCHEDULE, weight_decay=0.01),
    "sgd": lambda: mj.sgd(SCHEDULE),
    "sgd_momentum": lambda: mj.sgd(SCHEDULE, momentum=0.9),
    "sgd_nesterov": lambda: mj.sgd(SCHEDULE, momentum=0.9, nesterov=True),
}


def make(rng, dtype, scale=1.0):
    return jax.tree.map(
        lambda s: jnp.asarray((scale * rng.standard_normal(s)).astype(np.float32), dtype),
        SHAPES,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def steps(opt, params, state, grads):
    for g in grads:
        u, state = opt.update(g, state, params)
        params = optax.apply_updates(params, u)
    return params, state


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_round_trip_equals_uninterrupted(name, dtype, tmp_path, rng):
    opt = OPTIMIZERS[name]()
    params = make(rng, dtype)
    grads = [make(rng, dtype, 0.1) for _ in range(STEPS)]
    half, state = steps(opt, params, opt.init(params), grads[:SAVED_AT])
    path = tmp_path / f"{name}.safetensors"
    mj.save_state(path, state)
    saved = {k: np.array(v) for k, v in mj.state_dict(state).items()}
    straight, _ = steps(opt, half, state, grads[SAVED_AT:])

    fresh = opt.init(half)
    mj.load_state(path, fresh)
    assert fresh.count == SAVED_AT
    loaded = mj.state_dict(fresh)
    assert loaded.keys() == saved.keys()
    for k, v in saved.items():
        np.testing.assert_array_equal(loaded[k], v, err_msg=k)
    resumed, _ = steps(opt, half, fresh, grads[SAVED_AT:])
    for a, b, p0 in zip(jax.tree.leaves(resumed), jax.tree.leaves(straight), jax.tree.leaves(half)):
        assert a.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert np.any(np.asarray(a) != np.asarray(p0))


def test_other_settings_are_refused(tmp_path, rng):
    params = make(rng, jnp.float32)
    path = tmp_path / "momentum.safetensors"
    mj.save_state(path, mj.sgd(1e-2, momentum=0.9).init(params))
    with pytest.raises(ValueError, match=r'missing \[\], unexpected \["trace.*same momentum'):
        mj.load_state(path, mj.sgd(1e-2).init(params))
    with pytest.raises(ValueError, match=r"megalith\.jax\.sgd"):
        mj.load_state(path, mj.adamw(1e-2).init(params))
