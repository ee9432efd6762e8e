"""Which checkpoint tensor fills which tensor of the model.

megalith.models use transformers' own parameter names, so a transformers checkpoint
needs no renaming table; what differs between a checkpoint and a model is:
  - ties: transformers writes a tied tensor once (GPT-2's lm_head.weight is stored as
    transformer.wte.weight), so each tensor of the model is looked up under all of its
    names;
  - the head: a checkpoint of the bare backbone (GPT2Model's "h.0.attn.c_attn.weight")
    loads into the model with a head ("transformer.h.0.attn.c_attn.weight") and back:
    one prefix added or dropped for the whole checkpoint, whichever matches most;
  - leftovers: GPT-2's original files also hold the causal-mask buffers
    (attn.bias, attn.masked_bias) that today's models compute.
Tensor-parallel shards, pipeline stages and ZeRO shards keep these names (the policies
and plugins rename nothing), so the same plan serves every plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: checkpoint tensors no model of today has a place for
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")


def _firsts(names: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(n.split(".", 1)[0] + "." for n in names if "." in n))


def plan(groups: Sequence[Sequence[str]], keys: Sequence[str]) -> tuple[dict[int, str], list[str]]:
    """({group index: the checkpoint key that fills it}, checkpoint keys left unused).
    groups: each tensor of the model under all its names."""
    key_set = set(keys)
    model_names = [n for g in groups for n in g]
    renames: list[Callable[[str], str | None]] = [lambda n: n]
    for p in _firsts(model_names):
        renames.append(lambda n, p=p: n[len(p) :] if n.startswith(p) else None)
    for q in _firsts(list(keys)):
        renames.append(lambda n, q=q: q + n)
    best: dict[int, str] = {}
    for rename in renames:
        found: dict[int, str] = {}
        for i, names in enumerate(groups):
            key = next((k for k in map(rename, names) if k is not None and k in key_set), None)
            if key is not None:
                found[i] = key
        if len(found) > len(best):
            best = found
    used = set(best.values())
    unused = [k for k in keys if k not in used and not k.endswith(IGNORED_SUFFIXES)]
    return best, unused
