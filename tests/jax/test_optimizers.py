"""megalith.jax.adamw / lion / sgd against optax's own, 50 steps on fresh random data.

fp32: within fp32 rounding of optax (3e-6 relative, norm of the difference over the
norm), and for AdamW no further from a float64 reference than optax itself (x2). Lion
steps by sign(b1 m + (1 - b1) g): where that sum is at rounding distance from zero the
two implementations may take opposite signs, so Lion's parameters may differ by whole
2 lr steps in a few entries and by rounding everywhere else.
bf16 parameters: megalith keeps an fp32 master, so it equals optax run on fp32
parameters, rounded to bf16 (at most one bf16 step apart, almost all equal).
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import megalith.jax as mj  # noqa: E402

SHAPES = {"w": (48, 33), "b": (33,), "emb": {"table": (17, 8)}}
STEPS = 50
LION_LR = 1e-3


def rel(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def lion_sign_flips(a, ref, lr: float) -> np.ndarray:
    """How many 2*lr sign flips each entry of a is from ref; AssertionError where the
    difference is not a whole number of flips (within rounding)."""
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    flips = (a - ref) / (2 * lr)
    whole = np.round(flips)
    rounding = 1e-5 * (1 + np.abs(ref)) / (2 * lr)
    off = np.abs(flips - whole) > np.maximum(rounding, 1e-2)
    assert not off.any(), f"{off.sum()} entries differ by other than whole sign flips"
    return whole


def make(rng, dtype=np.float32, scale=1.0):
    return jax.tree.map(
        lambda s: jnp.asarray((scale * rng.standard_normal(s)).astype(np.float32), dtype),
        SHAPES,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def run(opt, params, grads, jit=False):
    state = opt.init(params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step) if jit else step
    for g in grads:
        params, state = step(params, state, g)
    return params, state


def ref64_adamw(params, grads, lr, b1, b2, eps, wd):
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    m = jax.tree.map(np.zeros_like, p)
    v = jax.tree.map(np.zeros_like, p)
    for t, g in enumerate(grads, 1):
        g = jax.tree.map(lambda x: np.asarray(x, np.float64), g)
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2, a = 1 - b1**t, 1 - b2**t, lr(t - 1)
        p = jax.tree.map(
            lambda p, m, v, c1=c1, c2=c2, a=a: (
                p - a * ((m / c1) / (np.sqrt(v / c2) + eps) + wd * p)
            ),
            p,
            m,
            v,
        )
    return p


OPTIMIZERS = {
    "adamw": lambda o: o.adamw(3e-3, b1=0.8, b2=0.99, eps=1e-7, weight_decay=0.1),
    "adamw_schedule_mask": lambda o: o.adamw(
        optax.warmup_cosine_decay_schedule(0.0, 1e-2, 10, STEPS),
        mask=lambda p: {"w": True, "b": False, "emb": False},
    ),
    "lion": lambda o: o.lion(LION_LR, weight_decay=0.01),
    "sgd": lambda o: o.sgd(0.05),
    "sgd_nesterov": lambda o: o.sgd(0.05, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fp32_equals_optax(name, rng):
    params = make(rng)
    grads = [make(rng, scale=0.1) for _ in range(STEPS)]
    ours, _ = run(OPTIMIZERS[name](mj), params, grads)
    theirs, _ = run(OPTIMIZERS[name](optax), params, grads)
    for a, b, p0 in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs), jax.tree.leaves(params)):
        assert a.dtype == jnp.float32
        if name == "lion":
            flips = lion_sign_flips(a, b, LION_LR)
            assert np.mean(flips != 0) < 0.005, name
            a = np.asarray(a) - 2 * LION_LR * flips
        assert rel(a, b) < 3e-6, name
        assert rel(a, p0) > 1e-4  # the parameters did move


def test_adamw_as_close_to_float64_as_optax(rng):
    params = make(rng)
    grads = [make(rng, scale=0.1) for _ in range(STEPS)]
    ours, _ = run(mj.adamw(1e-2, weight_decay=0.1), params, grads)
    theirs, _ = run(optax.adamw(1e-2, weight_decay=0.1), params, grads)
    exact = ref64_adamw(params, grads, lambda t: 1e-2, 0.9, 0.999, 1e-8, 0.1)
    for a, b, r in zip(*(jax.tree.leaves(t) for t in (ours, theirs, exact))):
        assert rel(a, r) <= 2 * rel(b, r) + 1e-7


@pytest.mark.parametrize(
    ("name", "low"),
    [
        ("adamw", "bfloat16"),
        ("lion", "bfloat16"),
        ("sgd_nesterov", "bfloat16"),
        ("adamw", "float16"),
    ],
)
def test_bf16_params_equal_optax_on_fp32_rounded(name, low, rng):
    low = jnp.dtype(low)
    params32 = make(rng)
    params16 = jax.tree.map(lambda x: x.astype(low), params32)
    params32 = jax.tree.map(lambda x: x.astype(jnp.float32), params16)  # same start
    grads = [make(rng, low, scale=0.1) for _ in range(STEPS)]
    ours, state = run(OPTIMIZERS[name](mj), params16, grads)
    # optax gets the same gradients in fp32 (exact): (1 - b1) * g would round in bf16
    grads32 = [jax.tree.map(lambda g: g.astype(jnp.float32), g) for g in grads]
    theirs, _ = run(OPTIMIZERS[name](optax), params32, grads32)
    equal = total = 0
    for i, (a, b) in enumerate(zip(jax.tree.leaves(ours), jax.tree.leaves(theirs))):
        assert a.dtype == low
        if name == "lion":  # theirs moved onto our sign choices where they flipped
            flips = lion_sign_flips(state.master[i], b, LION_LR)
            assert np.mean(flips != 0) < 0.005
            b = jnp.asarray(np.asarray(b) + 2 * LION_LR * flips, jnp.float32)
        a32, b16 = np.asarray(a, np.float32), np.asarray(b.astype(low), np.float32)
        step = np.maximum(np.abs(a32), np.abs(b16)) * float(jnp.finfo(low).eps)  # one step of `low`
        assert np.all(np.abs(a32 - b16) <= step * 1.01)
        equal += int(np.sum(a32 == b16))
        total += a32.size
    # over all leaves: one entry off by a rounding step is 0.7% of the 136-entry table
    assert equal / total > 0.995
    for i, p in enumerate(jax.tree.leaves(ours)):  # the caller holds exactly bf16(master)
        np.testing.assert_array_equal(np.asarray(p), state.master[i].astype(p.dtype))


@pytest.mark.parametrize("name", ["adamw", "sgd_nesterov"])
def test_under_jit_equals_eager(name, rng):
    params = make(rng)
    grads = [make(rng, scale=0.1) for _ in range(8)]
    eager, s1 = run(OPTIMIZERS[name](mj), params, grads)
    jitted, s2 = run(OPTIMIZERS[name](mj), params, grads, jit=True)
    assert s1.count == s2.count == 8
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_jitted_grad_then_update_outside(rng):
    """The documented pattern: loss and grads in jit, the engine step outside it."""
    x = jnp.asarray(rng.standard_normal((16, 48)).astype(np.float32))
    params = {"w": jnp.asarray(rng.standard_normal((48, 4)).astype(np.float32))}
    grad_fn = jax.jit(jax.grad(lambda p: jnp.mean((x @ p["w"]) ** 2)))
    out = {}
    for o in (mj, optax):
        opt, p = o.adamw(1e-2), params
        s = opt.init(p)
        for _ in range(10):
            u, s = opt.update(grad_fn(p), s, p)
            p = optax.apply_updates(p, u)
        out[o.__name__] = p["w"]
    assert rel(out["megalith.jax"], out["optax"]) < 3e-6


def test_updates_handed_out_stay_unchanged(rng):
    """Updates alias engine memory without a copy; a later step must not write into them."""
    params = make(rng)
    opt = mj.adamw(1e-2)
    state = opt.init(params)
    u1, state = opt.update(make(rng), state, params)
    kept = jax.tree.map(np.array, u1)
    _, state = opt.update(make(rng), state, optax.apply_updates(params, u1))
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(kept)):
        np.testing.assert_array_equal(np.asarray(a), b)
        assert np.abs(b).sum() > 0


def test_errors_name_the_fix(rng):
    with pytest.raises(ValueError, match="eps_root"):
        mj.adamw(1e-3, eps_root=1e-8)
    with pytest.raises(ValueError, match="nadamw"):
        mj.adamw(1e-3, nesterov=True)
    with pytest.raises(ValueError, match="mu_dtype=None"):
        mj.adamw(1e-3, mu_dtype=jnp.bfloat16)
    with pytest.raises(ValueError, match="momentum"):
        mj.sgd(1e-3, nesterov=True)
    opt = mj.adamw(1e-3)
    with pytest.raises(TypeError, match="int32"):
        opt.init({"n": jnp.zeros(3, jnp.int32)})
    state = opt.init(make(rng))
    with pytest.raises(ValueError, match="same tree"):
        opt.update({"w": jnp.zeros((48, 33))}, state)
    with pytest.raises(TypeError, match="init"):
        opt.update(make(rng), optax.adamw(1e-3).init(make(rng)))
