"""Rank functions of tests/jax/test_zero1_checkpoint.py: zero1_adamw's state saved, loaded
into a fresh optimizer (at this world size or from another) and trained on.

The model, batches and loss are tests/jax/collective_workers.py's; the learning rate is a
schedule, so a resumed run that lost the step count would differ.
"""

from __future__ import annotations

import numpy as np

from tests.jax import collective_workers as W

STEPS, SAVED_AT = W.STEPS, 8


def dispatch(rank: int, setting: tuple) -> dict:
    kind, args = setting
    return globals()[kind](rank, args)


def schedule():
    import optax

    return optax.linear_schedule(W.LR, W.LR / 10, STEPS)


def make_tx():
    import megalith.jax as mj

    return mj.zero1_adamw(schedule(), weight_decay=W.WD, mask=W.decay_mask)


def start_params(seed: int, bf16: bool):
    import jax
    import jax.numpy as jnp

    params = W.init_mlp(seed)
    return jax.tree.map(lambda p: p.astype(jnp.bfloat16), params) if bf16 else params


def train(tx, params, state, seed: int, rows: slice, steps: range, jit: bool):
    """Steps `steps` of the batches (this rank's rows); (params, state)."""
    import jax
    import optax

    grad_fn = jax.grad(W.loss_fn) if jit else jax.jit(jax.grad(W.loss_fn))

    def step(p, s, x, y):
        u, s = tx.update(grad_fn(p, x, y), s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step) if jit else step
    for t in steps:
        x, y = W.batch(seed, t)
        params, state = step(params, state, x[rows], y[rows])
    return params, state


def host(tree) -> dict:
    import jax
    import jax.numpy as jnp

    return jax.tree.map(lambda p: np.asarray(p.astype(jnp.float32)), tree)


def my_rows(rank: int) -> slice:
    import megalith_comm as comm

    share = W.BATCH // comm.get_world().world_size
    return slice(rank * share, (rank + 1) * share)


def round_trip(rank: int, setting: dict) -> dict:
    """Saved at SAVED_AT, then trained on (the uninterrupted run: a save only reads the
    state) and, from a fresh optimizer that loaded the file, trained on alike; jitted."""
    import megalith.jax as mj

    seed, bf16, path = setting["seed"], setting["bf16"], setting["path"]
    rows, tx, jit = my_rows(rank), make_tx(), True
    p0 = start_params(seed, bf16)
    half, state = train(tx, p0, tx.init(p0), seed, rows, range(SAVED_AT), jit)
    mj.save_state(path, state)
    if rank == 0:  # for the runs at other world sizes that resume from it
        np.savez(path + ".params.npz", **host(half))
    straight, _ = train(tx, half, state, seed, rows, range(SAVED_AT, STEPS), jit)
    fresh = tx.init(half)
    mj.load_state(path, fresh)
    count = fresh.count
    resumed, _ = train(tx, half, fresh, seed, rows, range(SAVED_AT, STEPS), jit)
    return dict(straight=host(straight), resumed=host(resumed), count=count, counts=state.counts)


def resume(rank: int, setting: dict) -> dict:
    """Loads a whole saved state (of another world size, or of megalith.jax.adamw) with
    the parameters saved beside it, and trains on from SAVED_AT."""
    import jax.numpy as jnp

    import megalith.jax as mj

    seed, path = setting["seed"], setting["path"]
    with np.load(setting["params"]) as saved:
        half = {k: jnp.asarray(saved[k]) for k in saved.files}
    tx = make_tx()
    fresh = tx.init(half)
    mj.load_state(path, fresh)
    whole = mj.state_dict(fresh)  # gathered on every rank: what the shards now hold
    resumed, _ = train(tx, half, fresh, seed, my_rows(rank), range(SAVED_AT, STEPS), False)
    return dict(whole=whole, resumed=host(resumed), counts=fresh.counts)


def errors(rank: int, setting: dict) -> dict:
    """The messages of the refused loads and of a failed write, on every rank."""
    import jax.numpy as jnp

    import megalith.jax as mj
    import megalith_comm as comm

    def message(fn) -> str:
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    tx = make_tx()
    state = tx.init(W.init_mlp(setting["seed"]))
    good, missing = setting["good"], setting["good"] + ".missing"
    out = {
        "lion": message(lambda: mj.load_state(setting["lion"], state)),
        "tree": message(lambda: mj.load_state(setting["tree"], state)),
        "one_rank": message(lambda: mj.load_state(missing if rank == 1 else good, state)),
        "write": message(lambda: mj.save_state(setting["unwritable"], state)),  # rank 0 writes
    }
    out["count"] = state.count  # every refused load left the state as it was
    x = jnp.asarray(W.rank_input(7, rank, (4,)))
    out["after"] = np.asarray(mj.all_reduce(x))  # the group goes on
    out["sum"] = np.sum([W.rank_input(7, q, (4,)) for q in range(comm.get_world().world_size)], 0)
    return out
