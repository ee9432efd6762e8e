"""save_state / load_state / state_dict of a zero1_adamw state: one whole file, any world size.

[Note: a gathered file] Each rank holds the master, m and v of its slice of the flattened
parameters (megalith/jax/zero1.py). A checkpoint is most useful whole, so the group's
first rank gathers the three vectors and writes them in megalith.jax.adamw's format
('count', 'master<leaf>', 'mu<leaf>', 'nu<leaf>'; one safetensors file, atomic): it
resumes at any world size, and in zero1_adamw, adamw or offloaded_adamw alike. To load,
every rank reads from the file only the rows of the leaves its shard touches; as for
megalith's other checkpoints, every rank must be able to read the path (a shared
filesystem, or a copy on each node). The cost of whole files: the writer holds the
whole state (12 N bytes) while it writes, and every rank receives each gathered vector
(4 N bytes, one vector at a time: the non-writers into the gradients' N-element buffer).
Every rank learns whether all the others succeeded, so an error (a full disk on the
writer, an unreadable file, the state of another model) raises on every rank instead of
leaving the others to hang in the next collective.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import cast

import jax
import numpy as np
import torch

from megalith_core.atomic_files import atomic_path

from .state import FORMAT, SavedState
from .zero1 import NAME, Zero1State


def _vectors(state: Zero1State) -> dict[str, np.ndarray]:
    """This rank's shard of each saved vector, by the prefix of its keys."""
    return {"master": state.master, "mu": state.mu, "nu": state.nu}


def _all_gather(state: Zero1State, shard: np.ndarray, whole: np.ndarray) -> None:
    import megalith_comm as comm

    g = state.group
    if g.size == 1:
        np.copyto(whole, shard)
        return
    out, mine = torch.from_numpy(whole), torch.from_numpy(shard)
    even = len(set(state.counts)) == 1
    comm.all_gather(out if even else list(torch.split(out, state.counts)), mine, group=g)


def _gather(state: Zero1State, here: bool) -> dict[str, np.ndarray] | None:
    """The whole state where `here` (None elsewhere); collective over the state's group."""
    jax.effects_barrier()  # a jitted step in flight still writes the shard
    out = {"count": np.array([state.steps], dtype=np.int64)} if here else None
    for prefix, shard in _vectors(state).items():
        # flat_grads is free between steps: the non-writers receive into it
        whole = np.empty(state.total, np.float32) if here else state.flat_grads
        _all_gather(state, shard, whole)
        if out is not None:
            offset = 0
            for name, shape, n in zip(state.names, state.shapes, state.sizes):
                out[prefix + name] = whole[offset : offset + n].reshape(shape)
                offset += n
    return out


def _agree(state: Zero1State, error: Exception | None, what: str, then: str) -> None:
    """Raises on every rank if any rank of the group failed (its own error where it did)."""
    import megalith_comm as comm

    g = state.group
    failed = [g.ranks[g.rank]] if error is not None else []
    if g.size > 1:
        mine = torch.tensor([error is not None], dtype=torch.int64)
        every = torch.empty(g.size, dtype=torch.int64)
        comm.all_gather(every, mine, group=g)
        failed = [g.ranks[i] for i, v in enumerate(every.tolist()) if v]
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(
            f"megalith.jax.{what} failed on rank(s) {failed} (their error says why); {then}"
        )


def gathered_state_dict(state: Zero1State) -> dict[str, np.ndarray]:
    """The whole state on every rank, keyed as megalith.jax.state_dict (collective)."""
    return cast(dict[str, np.ndarray], _gather(state, here=True))  # here: never None


def save_zero1(path: str | os.PathLike, state: Zero1State) -> None:
    """The group's first rank writes the whole state (see [Note: a gathered file])."""
    writer = state.group.rank == 0
    whole = _gather(state, here=writer)
    error = None
    if whole is not None:
        from safetensors.numpy import save_file

        meta = {"format": FORMAT, "optimizer": NAME, "world_size": str(state.group.size)}
        try:
            with atomic_path(path) as tmp:
                save_file(whole, str(tmp), metadata=meta)
        except Exception as exc:  # every rank must hear of it: see _agree
            error = exc
    _agree(state, error, "save_state", f"{path} was not written (the last one is kept)")


def load_zero1(source: str | os.PathLike | Mapping[str, np.ndarray], state: Zero1State) -> None:
    """Every rank fills its shard from a whole saved state (see [Note: a gathered file])."""
    jax.effects_barrier()
    saved, error = None, None
    try:
        saved = SavedState(source, NAME)
        expected = {"count": ((1,), "int64")}
        for name, shape in zip(state.names, state.shapes):
            for prefix in _vectors(state):
                expected[prefix + name] = (shape, "float32")
        saved.check(expected)
    except Exception as exc:
        error = exc
    _agree(state, error, "load_state", "the state is unchanged on every rank")
    saved = cast(SavedState, saved)  # read: _agree raised otherwise
    steps, error = 0, None
    try:
        for s in state.segments:
            span = slice(s.at, s.at + s.hi - s.lo)
            for prefix, shard in _vectors(state).items():
                shard[span] = saved.flat_range(prefix + state.names[s.leaf], s.lo, s.hi)
        steps = saved.count()
    except Exception as exc:
        error = exc
    _agree(state, error, "load_state", "the states are partly loaded: init them again")
    state.steps = steps
