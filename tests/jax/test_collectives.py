"""megalith.jax's collectives and zero1_adamw on CPU ranks (Gloo), one group per world size.

- all_reduce / reduce_scatter / all_gather at world sizes 1, 2, 3, 4 on fresh random inputs
  equal numpy's reduction of the same inputs (rows that do not divide split as
  numpy.array_split does);
- zero1_adamw trains a small MLP for 20 steps on each rank's share of random batches
  (eagerly and under jax.jit) at world 2 (even shards) and 3 (uneven), and 1: equal to
  single-process optax.adamw on the whole batch within fp32 rounding (the losses 1e-5,
  the parameters in units of lr: tests/jax/closeness.py), parameters the same on every
  rank, each rank's state 1/world of the full one;
- misuses fail on every rank with a message naming the fix, and the group goes on.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402

import megalith.jax as mj  # noqa: E402
from megalith.testing import run_grid  # noqa: E402
from tests.jax import collective_workers as W  # noqa: E402
from tests.jax.closeness import assert_adam_close  # noqa: E402
from tests.support.gpu import gpu  # noqa: E402

ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}


def rel(a, ref) -> float:
    a, ref = np.asarray(a, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(a - ref) / max(np.linalg.norm(ref), 1e-30))


def reduce(op: str, xs: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(xs).astype(np.float64)
    if op == "avg":
        out = stack.mean(0)
        return np.trunc(out) if xs[0].dtype.kind == "i" else out
    return {"sum": np.sum, "max": np.max, "min": np.min}[op](stack, 0)


def check_collectives(size: int, seed: int, results: list[dict]) -> None:
    for key in results[0]:
        kind, *rest = key.split("/")
        for r, got in enumerate(r[key] for r in results):
            where = f"{key} on rank {r} of {size}"
            if kind == "all_reduce":
                op, dtype = rest
                xs = [
                    W.rank_input(seed, q, (5, 3), "float32" if dtype == "bfloat16" else dtype)
                    for q in range(size)
                ]
                if dtype == "bfloat16":  # inputs rounded to bf16 first, a bf16 result
                    xs = [np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32)) for x in xs]
                    np.testing.assert_allclose(
                        got, reduce(op, xs), rtol=2**-6, atol=0.05, err_msg=where
                    )
                elif dtype == "int32":
                    np.testing.assert_array_equal(got, reduce(op, xs), err_msg=where)
                else:
                    np.testing.assert_allclose(
                        got, reduce(op, xs), rtol=1e-6, atol=1e-6, err_msg=where
                    )
            elif kind == "reduce_scatter":
                op, rows = rest[0], int(rest[1])
                xs = [W.rank_input(seed + rows, q, (rows, 4)) for q in range(size)]
                want = np.array_split(reduce(op, xs), size)[r]
                assert got.shape == want.shape, where
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=where)
            elif key == "all_gather/stacked":
                want = np.stack([W.rank_input(seed, q, (3, 2)) for q in range(size)])
                np.testing.assert_array_equal(got, want, err_msg=where)
            elif key == "all_gather/tiled_uneven":
                want = np.concatenate([W.rank_input(seed, q, (q + 1, 2)) for q in range(size)])
                np.testing.assert_array_equal(got, want, err_msg=where)
            elif key == "all_gather/tiled":
                want = np.concatenate([W.rank_input(seed, q, (4, 2)) for q in range(size)])
                np.testing.assert_array_equal(got, want, err_msg=where)


def optax_reference(seed: int):
    params = W.init_mlp(seed)
    tx = optax.adamw(W.LR, weight_decay=W.WD, mask=W.decay_mask)
    params, losses, _ = W.train(tx, params, seed, slice(None), jit=False)
    return jax.tree.map(np.asarray, params), losses


def check_zero1(size: int, seed: int, results: list[dict]) -> None:
    ref_params, ref_losses = optax_reference(seed)
    mean_loss = np.mean([r["losses"] for r in results], axis=0)  # equal shares: the batch loss
    assert rel(mean_loss, ref_losses) < 1e-5, (mean_loss, ref_losses)
    for r, res in enumerate(results):
        for k in ref_params:
            assert_adam_close(res["params"][k], ref_params[k], W.LR, f"{k} on rank {r} of {size}")
            np.testing.assert_array_equal(res["params"][k], results[0]["params"][k])
        assert res["count"] == W.STEPS
    counts = results[0]["counts"]
    total = sum(int(np.size(p)) for p in ref_params.values())
    assert sum(counts) == total and max(counts) - min(counts) <= 1
    assert (len(set(counts)) > 1) == (total % size != 0)
    full = mj.adamw(W.LR).init(W.init_mlp(seed)).nbytes  # master, m, v of every leaf
    for r, res in enumerate(results):
        assert res["nbytes"] == 3 * 4 * counts[r]
        assert res["nbytes"] <= full / size + 3 * 4, (res["nbytes"], full, size)


def check_bf16(size: int, seed: int, steps: int, results: list[dict]) -> None:
    """Against optax on fp32 parameters with the ranks' mean gradient: one bf16 step apart."""
    params = W.init_mlp(seed)
    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16).astype(jnp.float32), params)
    tx = optax.adamw(W.LR, weight_decay=W.WD)
    state = tx.init(params)
    for t in range(steps):
        grads = {
            k: jnp.asarray(np.mean([W.rank_input(seed + t, q, p.shape) for q in range(size)], 0))
            for k, p in params.items()
        }
        u, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, u)
    for k, p in params.items():
        want = np.asarray(p.astype(jnp.bfloat16).astype(jnp.float32))
        for res in results:
            np.testing.assert_allclose(res[k], want, rtol=2**-7, atol=1e-6, err_msg=k)


def check_errors(size: int, results: list[dict]) -> None:
    for out in results:
        for key in ("shape", "dtype", "rows"):
            assert out[key].startswith("CollectiveMismatchError"), (key, out[key])
            assert "same collectives in the same order" in out[key], out[key]
        assert "shapes after axis 0 differ" in out["tiled"] and "rank 0: [1, 4]" in out["tiled"]
        assert out["traced"].startswith("TypeError") and "outside the jitted" in out["traced"]
        assert "expected one of sum, avg, max, min" in out["op"]
        assert "rank(s) [1] differ" in out["replicated"] and "same seed" in out["replicated"]
        assert "rank=jax.process_index()" in out["layout"]
        x = [W.rank_input(42, q, (4,)) for q in range(size)]
        np.testing.assert_allclose(out["after"], np.sum(x, 0), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_collectives_and_zero1(size, rng):
    seed = int(rng.integers(2**31))
    settings = [("collectives", dict(seed=seed))]
    if size > 1:  # one rank cannot disagree with the others
        settings.append(("errors", dict(seed=42)))
    if size == 1:  # no communication: the shard is the whole
        settings.append(("zero1", dict(seed=seed, jit=False)))
    elif size <= 3:
        settings += [
            ("zero1", dict(seed=seed, jit=False)),
            ("zero1", dict(seed=seed + 1, jit=True)),
            ("zero1_bf16", dict(seed=seed, steps=5)),
        ]
    grid = run_grid(W.dispatch, settings, size, timeout=90, env=ENV)
    for (kind, s), results in zip(settings, grid):
        if kind == "collectives":
            check_collectives(size, s["seed"], results)
        elif kind == "zero1":
            check_zero1(size, s["seed"], results)
        elif kind == "zero1_bf16":
            check_bf16(size, s["seed"], s["steps"], results)
        else:
            check_errors(size, results)


def test_before_init_names_the_fix():
    import megalith_comm as comm

    if comm.is_initialized():
        pytest.skip("megalith_comm is initialized in this process")
    with pytest.raises(RuntimeError, match=r"call megalith_comm.init\(\) on every rank first"):
        mj.all_reduce(jnp.ones(3))
    with pytest.raises(RuntimeError, match=r"megalith_comm.init\(\)"):
        mj.zero1_adamw(1e-3).init({"w": jnp.ones(3)})


@gpu
def test_collectives_on_gpu_arrays(rng):
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        pytest.skip("this jax has no GPU backend")
    if len(gpus) < 2:
        pytest.skip("needs 2 GPUs visible to jax")
    seed = int(rng.integers(2**31))
    (results,) = run_grid(W.dispatch, [("gpu_collectives", dict(seed=seed))], 2, backend="nccl")
    xs = [W.rank_input(seed, q, (6, 3)) for q in range(2)]
    for r, out in enumerate(results):
        assert out["on_gpu"]
        np.testing.assert_allclose(out["all_reduce"], np.mean(xs, 0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(
            out["reduce_scatter"], np.array_split(np.sum(xs, 0), 2)[r], rtol=1e-6, atol=1e-6
        )
        np.testing.assert_array_equal(out["all_gather"], np.concatenate(xs))
