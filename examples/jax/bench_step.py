"""Times one AdamW step (update + apply_updates) on the CPU: optax.adamw jitted against
megalith.jax.adamw outside jit and inside jit, and offloaded_adamw, on the same tree.

    python examples/jax/bench_step.py --params 8e6 --leaves 8 --repeat 10
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import megalith.jax as mj


def timed(opt, params, grads, repeat: int, jit: bool) -> float:
    state = opt.init(params)

    def step(p, s, g):
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    step = jax.jit(step) if jit else step
    params, state = step(params, state, grads)  # compile / warm up
    jax.block_until_ready(params)
    t0 = time.perf_counter()
    for _ in range(repeat):
        params, state = step(params, state, grads)
    jax.block_until_ready(params)
    return (time.perf_counter() - t0) / repeat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=float, default=8e6)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    n = int(args.params) // args.leaves
    dtype = jnp.bfloat16 if args.bf16 else jnp.float32
    rng = np.random.default_rng(0)
    params = [jnp.asarray(rng.standard_normal(n, np.float32), dtype) for _ in range(args.leaves)]
    grads = [jnp.asarray(0.1 * rng.standard_normal(n, np.float32), dtype) for _ in params]
    runs = {
        "optax.adamw (jit)": (optax.adamw(1e-3), True),
        "megalith.jax.adamw (eager)": (mj.adamw(1e-3), False),
        "megalith.jax.adamw (jit)": (mj.adamw(1e-3), True),
        "megalith.jax.offloaded_adamw (eager)": (mj.offloaded_adamw(1e-3), False),
    }
    base = None
    total = n * args.leaves
    print(f"{total / 1e6:.1f}M {jnp.dtype(dtype).name} params in {args.leaves} leaves")
    for name, (opt, jit) in runs.items():
        t = timed(opt, params, grads, args.repeat, jit)
        base = base or t
        print(f"{name:38s} {t * 1e3:8.1f} ms  {total / t / 1e9:5.2f} Gparam/s  x{base / t:.2f}")


if __name__ == "__main__":
    main()
