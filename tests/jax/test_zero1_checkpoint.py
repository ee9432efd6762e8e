"""megalith.jax.save_state / load_state of a zero1_adamw state: one whole file, any world size.

- At worlds 2 (fp32 parameters) and 3 (uneven shards, bf16 parameters: the master is
  the truth): trained 8 steps under jax.jit, saved, loaded into a fresh optimizer and
  trained to 20, equal to the uninterrupted run bit for bit: the same collectives on the
  same values. (Jitted only: eager updates cost seconds of op compiles here;
  test_collectives.py steps zero1 eagerly, and the resumes below update eagerly.)
- World 2's file resumed at world 3, and megalith.jax.adamw's (one process) resumed at
  world 3: the new shards hold the saved values exactly; trained on, close to optax.adamw
  on the whole batch in units of lr (tests/jax/closeness.py: the kernels round
  differently and the gradient reduction's order differs with the world size).
- World 2's file resumed by a single-process megalith.jax.adamw, alike.
- Refusals (another optimizer's state, another tree, a file one rank cannot read, a
  failed write) raise on every rank, naming the fix or the failing rank; the group goes on.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

import megalith.jax as mj  # noqa: E402
from megalith.testing import run_grid  # noqa: E402
from tests.jax import collective_workers as W  # noqa: E402
from tests.jax import zero1_checkpoint_workers as Z  # noqa: E402
from tests.jax.closeness import assert_adam_close  # noqa: E402

ENV = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false"}


def whole_batch(tx, params, state, seed: int, steps: range):
    """`tx` on the whole of each batch, in this process."""
    grad_fn = jax.jit(jax.grad(W.loss_fn))
    for t in steps:
        x, y = W.batch(seed, t)
        u, state = tx.update(grad_fn(params, x, y), state, params)
        params = optax.apply_updates(params, u)
    return params, state


def optax_reference(seed: int) -> dict:
    tx = optax.adamw(Z.schedule(), weight_decay=W.WD, mask=W.decay_mask)
    params = W.init_mlp(seed)
    params, _ = whole_batch(tx, params, tx.init(params), seed, range(Z.STEPS))
    return Z.host(params)


def adamw_checkpoint(seed: int, path) -> None:
    """megalith.jax.adamw's state after SAVED_AT steps in one process, and its parameters."""
    tx = mj.adamw(Z.schedule(), weight_decay=W.WD, mask=W.decay_mask)
    params = W.init_mlp(seed)
    params, state = whole_batch(tx, params, tx.init(params), seed, range(Z.SAVED_AT))
    mj.save_state(path, state)
    np.savez(f"{path}.params.npz", **Z.host(params))


def check_round_trip(results: list[dict]) -> None:
    for res in results:
        assert res["count"] == Z.SAVED_AT
        for k, want in res["straight"].items():
            np.testing.assert_array_equal(res["resumed"][k], want, err_msg=k)
            np.testing.assert_array_equal(want, results[0]["straight"][k], err_msg=k)


def check_resumed(path, results: list[dict], ref: dict) -> None:
    saved = load_file(str(path))
    for res in results:
        assert res["whole"].keys() == saved.keys()
        for k, want in saved.items():
            np.testing.assert_array_equal(res["whole"][k], want, err_msg=k)
        for k, want in ref.items():
            assert_adam_close(res["resumed"][k], want, W.LR, k)
            np.testing.assert_array_equal(res["resumed"][k], results[0]["resumed"][k])


def check_errors(results: list[dict]) -> None:
    for rank, out in enumerate(results):
        assert out["lion"].startswith("ValueError") and "megalith.jax.lion" in out["lion"]
        assert "does not match this optimizer and parameter tree" in out["tree"], out["tree"]
        assert "init the optimizer" in out["tree"]
        if rank == 1:  # its own error; the others hear that rank 1 failed
            assert ".missing" in out["one_rank"], out["one_rank"]
        else:
            assert "failed on rank(s) [1]" in out["one_rank"], out["one_rank"]
            assert "unchanged" in out["one_rank"]
        if rank == 0:
            assert "not_a_folder" in out["write"], out["write"]
        else:
            assert "failed on rank(s) [0]" in out["write"] and "not written" in out["write"]
        assert out["count"] == 0
        np.testing.assert_allclose(out["after"], out["sum"], rtol=1e-6, atol=1e-6)


def test_zero1_checkpoint_across_world_sizes(tmp_path, rng):
    seed = int(rng.integers(2**31))
    ref = optax_reference(seed)

    def trip(world: int, bf16: bool):
        path = tmp_path / f"w{world}_{'bf16' if bf16 else 'fp32'}.safetensors"
        return ("round_trip", dict(seed=seed, bf16=bf16, path=str(path)))

    at2 = [trip(2, bf16=False)]
    for results in run_grid(Z.dispatch, at2, 2, timeout=90, env=ENV):
        check_round_trip(results)
    from2 = at2[0][1]["path"]

    # world 2's file in a single-process megalith.jax.adamw
    with np.load(f"{from2}.params.npz") as saved:
        half = {k: jnp.asarray(saved[k]) for k in saved.files}
    tx = mj.adamw(Z.schedule(), weight_decay=W.WD, mask=W.decay_mask)
    state = tx.init(half)
    mj.load_state(from2, state)
    resumed, _ = whole_batch(tx, half, state, seed, range(Z.SAVED_AT, Z.STEPS))
    for k, want in ref.items():
        assert_adam_close(resumed[k], want, W.LR, k)

    from_adamw = tmp_path / "adamw.safetensors"
    adamw_checkpoint(seed, from_adamw)
    lion_file, tree_file = tmp_path / "lion.safetensors", tmp_path / "tree.safetensors"
    mj.save_state(lion_file, mj.lion(1e-3).init(W.init_mlp(seed)))
    mj.save_state(tree_file, mj.adamw(1e-3).init({"w": jnp.asarray(rng.standard_normal(3))}))
    (tmp_path / "not_a_folder").write_text("")
    errors = dict(
        seed=seed,
        lion=str(lion_file),
        tree=str(tree_file),
        good=from2,
        unwritable=str(tmp_path / "not_a_folder" / "x.safetensors"),
    )
    at3 = [
        trip(3, bf16=True),
        ("resume", dict(seed=seed, path=from2, params=f"{from2}.params.npz")),
        ("resume", dict(seed=seed, path=str(from_adamw), params=f"{from_adamw}.params.npz")),
        ("errors", errors),
    ]
    for (kind, s), results in zip(at3, run_grid(Z.dispatch, at3, 3, timeout=90, env=ENV)):
        if kind == "round_trip":
            check_round_trip(results)
        elif kind == "resume":
            check_resumed(s["path"], results, ref)
            assert results[0]["counts"] == [229, 229, 228]  # resharded: world 2 had 343, 343
        else:
            check_errors(results)
