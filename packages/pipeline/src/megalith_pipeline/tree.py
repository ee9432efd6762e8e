"""What flows between stages: a tensor, or tuples, lists and dicts of them.

flatten() turns such an object into its tensors and a spec (the containers, dict
keys, and any None or number leaves); unflatten() rebuilds it. The spec travels
as a few bytes of JSON beside the tensors (encode_spec/decode_spec), together
with which tensors require grad, so a stage receives exactly what the previous
stage returned: integer ids, masks and other tensors without grad included.
split_microbatches() cuts a batch along dimension 0.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import torch

Spec = Any  # nested lists/strings/numbers, JSON-able
_CONSTANTS = (bool, int, float, str, type(None))


def flatten(obj: Any) -> tuple[list[torch.Tensor], Spec]:
    tensors: list[torch.Tensor] = []

    def walk(x: Any) -> Spec:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return "T"
        if isinstance(x, (tuple, list)):
            return ["tuple" if isinstance(x, tuple) else "list", [walk(v) for v in x]]
        if isinstance(x, dict):
            if not all(isinstance(k, str) for k in x):
                raise TypeError(
                    f"pipeline: dict keys passed between stages must be str, got {list(x)}"
                )
            return ["dict", list(x), [walk(v) for v in x.values()]]
        if isinstance(x, _CONSTANTS):
            return ["const", x]
        raise TypeError(
            f"pipeline: a stage passed a {type(x).__name__} to the next; stages exchange "
            "tensors and tuples, lists and dicts of them (plus None, numbers and strings)"
        )

    return tensors, walk(obj)


def unflatten(spec: Spec, tensors: Sequence[torch.Tensor]) -> Any:
    it = iter(tensors)

    def build(s: Spec) -> Any:
        if s == "T":
            return next(it)
        kind = s[0]
        if kind == "const":
            return s[1]
        if kind == "dict":
            return {k: build(v) for k, v in zip(s[1], s[2])}
        items = [build(v) for v in s[1]]
        return tuple(items) if kind == "tuple" else items

    return build(spec)


def encode_spec(spec: Spec, requires_grad: Sequence[bool]) -> torch.Tensor:
    text = json.dumps([spec, [int(b) for b in requires_grad]], separators=(",", ":"))
    return torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8)


def decode_spec(data: torch.Tensor) -> tuple[Spec, list[bool]]:
    spec, flags = json.loads(bytes(data.tolist()).decode())
    return spec, [bool(f) for f in flags]


def batch_size(obj: Any, what: str) -> int:
    """The common dimension-0 size of every tensor in obj; ValueError otherwise."""
    tensors, _ = flatten(obj)
    sizes = {tuple(t.shape[:1]) for t in tensors}
    if not tensors:
        raise ValueError(f"pipeline: {what} holds no tensor to split into micro-batches")
    if len(sizes) != 1 or () in sizes:
        shapes = [tuple(t.shape) for t in tensors]
        raise ValueError(
            f"pipeline: every tensor of {what} must have the same batch dimension 0 to be "
            f"split into micro-batches; got shapes {shapes}"
        )
    return tensors[0].shape[0]


def split_microbatches(obj: Any, m: int, what: str) -> tuple[list[Any], list[int]]:
    """obj cut into m pieces along dimension 0 (sizes differ by at most one), and the sizes."""
    n = batch_size(obj, what)
    if n < m:
        raise ValueError(
            f"pipeline: {what} has batch size {n}, fewer than num_microbatches={m}; "
            f"every micro-batch needs at least one sample (lower num_microbatches or grow the batch)"
        )
    tensors, spec = flatten(obj)
    pieces = [torch.tensor_split(t, m, dim=0) for t in tensors]
    out = [unflatten(spec, [p[i] for p in pieces]) for i in range(m)]
    sizes = [pieces[0][i].shape[0] for i in range(m)]
    return out, sizes
