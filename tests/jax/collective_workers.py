"""Rank functions of tests/jax/test_collectives.py (run_grid needs them importable).

Every function takes (rank, setting) and returns numpy arrays and strings only; the
test process computes the references. Inputs are drawn from (seed, rank), so the test
can draw the same ones again.
"""

from __future__ import annotations

import numpy as np

# the model of the ZeRO-1 test: 7 -> 62 -> 3 and a scalar, 686 parameters: even shards on
# 2 ranks, uneven on 3 (229, 229, 228), leaves straddling the shard boundaries
DIMS = (7, 62, 3)
BATCH = 12
STEPS = 20
LR, WD = 1e-2, 0.1


def dispatch(rank: int, setting: tuple) -> dict:
    """run_grid's function: setting = (name of a function below, its argument)."""
    kind, args = setting
    return globals()[kind](rank, args)


def rank_input(seed: int, rank: int, shape: tuple, dtype: str = "float32") -> np.ndarray:
    rng = np.random.default_rng([seed, rank])
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, shape).astype(dtype)
    return rng.standard_normal(shape).astype(np.float32)


def collectives(rank: int, setting: dict) -> dict:
    """Every collective on fresh inputs; returns {name: (inputs of this rank, result)}."""
    import jax.numpy as jnp

    import megalith.jax as mj
    import megalith_comm as comm

    seed, size = setting["seed"], comm.get_world().world_size
    out = {}
    for op in ("sum", "avg", "max", "min"):
        for dtype in ("float32", "int32", "bfloat16"):
            x = rank_input(seed, rank, (5, 3), "float32" if dtype == "bfloat16" else dtype)
            y = mj.all_reduce(jnp.asarray(x, dtype), op=op)
            out[f"all_reduce/{op}/{dtype}"] = np.asarray(y.astype(jnp.float32))
    for rows in (2 * size, 2 * size + 1, size + 1, 1):
        for op in ("sum", "avg", "max"):
            x = rank_input(seed + rows, rank, (rows, 4))
            out[f"reduce_scatter/{op}/{rows}"] = np.asarray(mj.reduce_scatter(jnp.asarray(x), op))
    x = rank_input(seed, rank, (3, 2))
    out["all_gather/stacked"] = np.asarray(mj.all_gather(jnp.asarray(x)))
    x = rank_input(seed, rank, (rank + 1, 2))
    out["all_gather/tiled_uneven"] = np.asarray(mj.all_gather(jnp.asarray(x), tiled=True))
    x = rank_input(seed, rank, (4, 2))
    out["all_gather/tiled"] = np.asarray(mj.all_gather(jnp.asarray(x), tiled=True))
    return out


def init_mlp(seed: int):
    import jax.numpy as jnp

    rng = np.random.default_rng([seed, 99])
    d0, d1, d2 = DIMS
    return {
        "w1": jnp.asarray(rng.standard_normal((d0, d1)).astype(np.float32) / np.sqrt(d0)),
        "b1": jnp.asarray(0.1 * rng.standard_normal(d1).astype(np.float32)),
        "w2": jnp.asarray(rng.standard_normal((d1, d2)).astype(np.float32) / np.sqrt(d1)),
        "b2": jnp.asarray(0.1 * rng.standard_normal(d2).astype(np.float32)),
        "scale": jnp.asarray(np.float32(1.0 + 0.1 * rng.standard_normal())),
    }


def decay_mask(params):
    return {k: k.startswith("w") for k in params}


def batch(seed: int, step: int):
    rng = np.random.default_rng([seed, 7, step])
    x = rng.standard_normal((BATCH, DIMS[0])).astype(np.float32)
    y = rng.standard_normal((BATCH, DIMS[2])).astype(np.float32)
    return x, y


def loss_fn(params, x, y):
    import jax.numpy as jnp

    h = jnp.tanh(x @ params["w1"] + params["b1"])
    out = (h @ params["w2"] + params["b2"]) * params["scale"]
    return jnp.mean((out - y) ** 2)


def train(tx, params, seed: int, rows: slice, jit: bool):
    """STEPS steps of `tx` on this rank's rows of each batch; (params, losses, state)."""
    import jax
    import optax

    state = tx.init(params)
    # jit=False: the gradients jitted, the update eager; jit=True: the whole step jitted
    grad_fn = jax.value_and_grad(loss_fn) if jit else jax.jit(jax.value_and_grad(loss_fn))

    def step(p, s, x, y):
        loss, g = grad_fn(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    step = jax.jit(step) if jit else step
    losses = []
    for t in range(STEPS):
        x, y = batch(seed, t)
        params, state, loss = step(params, state, x[rows], y[rows])
        losses.append(float(loss))
    return params, losses, state


def zero1(rank: int, setting: dict) -> dict:
    """ZeRO-1 training of the MLP on this rank's share of every batch."""
    import jax

    import megalith.jax as mj
    import megalith_comm as comm

    size = comm.get_world().world_size
    share = BATCH // size
    params = init_mlp(setting["seed"])
    tx = mj.zero1_adamw(LR, weight_decay=WD, mask=decay_mask)
    rows = slice(rank * share, (rank + 1) * share)
    params, losses, state = train(tx, params, setting["seed"], rows, setting["jit"])
    return dict(
        params=jax.tree.map(np.asarray, params),
        losses=losses,
        nbytes=state.nbytes,
        counts=state.counts,
        count=state.count,
    )


def zero1_bf16(rank: int, setting: dict) -> dict:
    """bf16 parameters, given fp32 gradients: the fp32 master is sharded, updates exact."""
    import jax
    import jax.numpy as jnp
    import optax

    import megalith.jax as mj

    params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), init_mlp(setting["seed"]))
    tx = mj.zero1_adamw(LR, weight_decay=WD)
    state = tx.init(params)
    for t in range(setting["steps"]):
        grads = {
            k: jnp.asarray(rank_input(setting["seed"] + t, rank, p.shape))
            for k, p in params.items()
        }
        u, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, u)
    return jax.tree.map(lambda p: np.asarray(p.astype(jnp.float32)), params)


def errors(rank: int, setting: dict) -> dict:
    """The messages of the misuses (every rank raises, and the group goes on)."""
    import jax
    import jax.numpy as jnp

    import megalith.jax as mj
    import megalith_comm as comm

    def message(fn) -> str:
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    x = jnp.asarray(rank_input(setting["seed"], rank, (4,)))
    out = {
        "shape": message(lambda: mj.all_reduce(x if rank else jnp.concatenate([x, x]))),
        "dtype": message(lambda: mj.all_gather(x if rank else x.astype(jnp.int32))),
        "rows": message(lambda: mj.reduce_scatter(x if rank else x[:3])),
        "tiled": message(
            lambda: mj.all_gather(x.reshape(2, 2) if rank else x.reshape(1, 4), tiled=True)
        ),
        "traced": message(lambda: jax.jit(mj.all_reduce)(x)),
        "op": message(lambda: mj.all_reduce(x, op="mean")),
    }
    params = init_mlp(setting["seed"] + (rank == 1))
    out["replicated"] = message(lambda: mj.zero1_adamw(1e-3).init(params))
    real = jax.process_count
    jax.process_count = lambda: comm.get_world().world_size + 1
    try:
        out["layout"] = message(lambda: mj.all_reduce(x))
    finally:
        jax.process_count = real
    # the group still works after all of that
    out["after"] = np.asarray(mj.all_reduce(x, op="sum"))
    return out


def gpu_collectives(rank: int, setting: dict) -> dict:
    """The collectives on CUDA arrays (one GPU per rank, through the engine's NCCL)."""
    import jax

    device = jax.devices("gpu")[rank]
    seed = setting["seed"]
    out = {}
    import megalith.jax as mj

    x = jax.device_put(rank_input(seed, rank, (6, 3)), device)
    out["all_reduce"] = np.asarray(mj.all_reduce(x, op="avg"))
    out["reduce_scatter"] = np.asarray(mj.reduce_scatter(x, op="sum"))
    out["all_gather"] = np.asarray(mj.all_gather(x, tiled=True))
    out["on_gpu"] = all(
        next(iter(y.devices())).platform == "gpu" for y in (mj.all_reduce(x), mj.all_gather(x))
    )
    return out
