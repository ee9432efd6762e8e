"""Text from a causal LM, a token at a time (no KV cache: the samples are short): greedy
when top_k is 1 or the temperature 0, else top-k sampling at that temperature. Runs on
every rank of a sharded model (its forward is collective); the same generator seed on
every rank draws the same tokens."""

from __future__ import annotations

from typing import Any

import torch


def logits_of(out: Any) -> torch.Tensor:
    """The logits of a forward: megalith's tensor, or transformers' (and peft's) output."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    return logits if logits is not None else out[0]


@torch.no_grad()
def generate(
    model: Any,
    prompt: list[int],
    max_new_tokens: int,
    *,
    context: int,
    top_k: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> list[int]:
    """The new tokens after prompt (the model sees at most its last `context` tokens)."""
    if not prompt:
        raise ValueError("generate: an empty prompt; give at least one token")
    ids = list(prompt)
    g = torch.Generator().manual_seed(seed)
    for _ in range(max_new_tokens):
        window = torch.tensor([ids[-context:]], dtype=torch.long, device=device)
        last = logits_of(model(window))[0, -1].float().cpu()
        if top_k == 1 or temperature == 0:
            ids.append(int(last.argmax()))
            continue
        values, order = last.topk(min(top_k, last.numel()) if top_k > 0 else last.numel())
        probs = torch.softmax(values / temperature, dim=-1)
        ids.append(int(order[torch.multinomial(probs, 1, generator=g)]))
    return ids[len(prompt) :]


def one_line(text: str, limit: int = 100) -> str:
    """text on one line (newlines shown as \\n), cut to limit characters."""
    flat = text.replace("\r", "").replace("\n", "\\n")
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
