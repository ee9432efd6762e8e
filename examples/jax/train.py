"""Trains the plain-JAX GPT of gpt.py on counting sequences with optax.adamw,
megalith.jax.adamw or megalith.jax.offloaded_adamw, and prints the loss per step.

    python examples/jax/train.py --optimizer all --steps 20

The loss and gradients come out of one jitted function; the optimizer update is jitted
too (megalith's runs on the host kernel through an ordered io_callback). With
--optimizer all the three runs start from the same parameters and see the same
batches, and their losses are printed side by side.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt

import megalith.jax as mj

OPTIMIZERS = {
    "optax": lambda lr: optax.adamw(lr, weight_decay=0.1),
    "megalith": lambda lr: mj.adamw(lr, weight_decay=0.1),
    "offloaded": lambda lr: mj.offloaded_adamw(lr, weight_decay=0.1),
}


def counting_data(rng: np.random.Generator, steps: int, batch: int, n: int, vocab: int):
    """Sequences that count up mod vocab from a random start by a stride of 1, 2 or 3:
    learnable, so the loss falls within a few dozen steps."""
    start = rng.integers(0, vocab, (steps, batch, 1))
    stride = rng.integers(1, 4, (steps, batch, 1))
    return (start + stride * np.arange(n)) % vocab


def train(
    optimizer: str,
    steps: int = 20,
    *,
    vocab: int = 64,
    d: int = 32,
    layers: int = 2,
    heads: int = 4,
    seq: int = 16,
    batch: int = 8,
    lr: float = 3e-3,
    dtype=jnp.float32,
    seed: int = 0,
) -> list[float]:
    """Losses of `steps` steps; same seed, same parameters and batches for every optimizer."""
    params = gpt.init_params(jax.random.PRNGKey(seed), vocab, d, layers, seq, dtype)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, steps // 5), steps)
    opt = OPTIMIZERS[optimizer](schedule)
    state = opt.init(params)
    data = counting_data(np.random.default_rng(seed), steps, batch, seq + 1, vocab)

    @jax.jit
    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(gpt.loss_fn)(params, tokens, heads)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for tokens in data:
        params, state, loss = step(params, state, jnp.asarray(tokens))
        losses.append(float(loss))
    return losses


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", choices=[*OPTIMIZERS, "all"], default="all")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bf16", action="store_true", help="bf16 parameters (fp32 master in megalith)")
    args = ap.parse_args(argv)
    names = list(OPTIMIZERS) if args.optimizer == "all" else [args.optimizer]
    dtype = jnp.bfloat16 if args.bf16 else jnp.float32
    runs = {n: train(n, args.steps, dtype=dtype) for n in names}
    print("step  " + "  ".join(f"{n:>10}" for n in names))
    for i in range(args.steps):
        print(f"{i:4d}  " + "  ".join(f"{runs[n][i]:10.6f}" for n in names))


if __name__ == "__main__":
    main()
