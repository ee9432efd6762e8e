"""A small GPT in plain JAX (no flax): token and position embeddings, pre-norm blocks of
causal self-attention and an MLP, tied output head. Parameters are a dict of arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def init_params(key: jax.Array, vocab: int, d: int, layers: int, seq: int, dtype=jnp.float32):
    keys = iter(jax.random.split(key, 2 + 4 * layers))

    def dense(n_in: int, n_out: int) -> jax.Array:
        return (jax.random.normal(next(keys), (n_in, n_out)) * n_in**-0.5).astype(dtype)

    params = {
        "wte": (jax.random.normal(next(keys), (vocab, d)) * 0.02).astype(dtype),
        "wpe": (jax.random.normal(next(keys), (seq, d)) * 0.02).astype(dtype),
        "ln_f": {"g": jnp.ones(d, dtype), "b": jnp.zeros(d, dtype)},
        "blocks": [],
    }
    for _ in range(layers):
        params["blocks"].append(
            {
                "ln1": {"g": jnp.ones(d, dtype), "b": jnp.zeros(d, dtype)},
                "qkv": dense(d, 3 * d),
                "proj": dense(d, d),
                "ln2": {"g": jnp.ones(d, dtype), "b": jnp.zeros(d, dtype)},
                "fc": dense(d, 4 * d),
                "out": dense(4 * d, d),
            }
        )
    return params


def layer_norm(x: jax.Array, p: dict) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mu = x32.mean(-1, keepdims=True)
    var = ((x32 - mu) ** 2).mean(-1, keepdims=True)
    return ((x32 - mu) * jax.lax.rsqrt(var + 1e-5)).astype(x.dtype) * p["g"] + p["b"]


def attention(x: jax.Array, blk: dict, heads: int) -> jax.Array:
    b, t, d = x.shape
    q, k, v = jnp.split(x @ blk["qkv"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for a in (q, k, v))
    scores = (q @ k.transpose(0, 1, 3, 2)).astype(jnp.float32) * (d // heads) ** -0.5
    mask = jnp.tril(jnp.ones((t, t), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1).astype(x.dtype)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return y @ blk["proj"]


def forward(params: dict, tokens: jax.Array, heads: int) -> jax.Array:
    t = tokens.shape[1]
    x = params["wte"][tokens] + params["wpe"][:t]
    for blk in params["blocks"]:
        x = x + attention(layer_norm(x, blk["ln1"]), blk, heads)
        h = layer_norm(x, blk["ln2"])
        x = x + jax.nn.gelu(h @ blk["fc"]) @ blk["out"]
    return layer_norm(x, params["ln_f"]) @ params["wte"].T


def loss_fn(params: dict, tokens: jax.Array, heads: int) -> jax.Array:
    logits = forward(params, tokens[:, :-1], heads).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()
