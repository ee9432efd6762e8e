"""Index files may name only files inside their checkpoint (issue 21 item 4): an entry
that is absolute, climbs out with "..", or is a link to a file elsewhere is refused,
naming the entry and the index, for model and optimizer indexes; a transformers-cache
layout (links beside the index's own real file) still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from megalith.booster.checkpoint_io import CheckpointIndexFile, GeneralCheckpointIO


def _saved(tmp_path: Path) -> tuple[torch.nn.Module, torch.optim.Optimizer, Path]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(4, 5)).square().mean().backward()
    opt.step()
    ckpt = tmp_path / "ckpt"
    io = GeneralCheckpointIO()
    io.save_model(model, str(ckpt / "model"), shard=True, size_per_shard=0.0001)
    io.save_optimizer(opt, str(ckpt / "optim"), shard=True, size_per_shard=0.0001)
    return model, opt, ckpt


def _point(index: Path, key_part: str, target: str) -> str:
    """Rewrites the first weight_map entry whose key contains key_part; returns the key."""
    data = json.loads(index.read_text())
    key = next(k for k in data["weight_map"] if key_part in k)
    data["weight_map"][key] = target
    index.write_text(json.dumps(data))
    return key


def _outside(tmp_path: Path, like: Path) -> Path:
    """A valid safetensors file outside the checkpoint holding like's tensors."""
    from safetensors.torch import load_file

    out = tmp_path / "outside.safetensors"
    save_file({k: torch.randn_like(v) for k, v in load_file(str(like)).items()}, str(out))
    return out


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink"])
@pytest.mark.parametrize("which", ["model", "optim"])
def test_an_entry_leading_out_is_refused(tmp_path, how, which):
    model, opt, ckpt = _saved(tmp_path)
    stem = "model" if which == "model" else "optimizer"
    index = ckpt / which / f"{stem}.safetensors.index.json"
    first = ckpt / which / json.loads(index.read_text())["weight_map"].popitem()[1]
    outside = _outside(tmp_path, first)
    if how == "dotdot":
        target = "../../outside.safetensors"
    elif how == "absolute":
        target = str(outside)
    else:
        (ckpt / which / "linked.safetensors").symlink_to(outside)
        target = "linked.safetensors"
    _point(index, "", target)
    io = GeneralCheckpointIO()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError) as e:
        if which == "model":
            io.load_model(model, str(ckpt / "model"))
        else:
            io.load_optimizer(opt, str(ckpt / "optim"))
    text = str(e.value)
    assert repr(target) in text and str(index) in text, text
    assert ("leads out of" in text) if how != "symlink" else ("outside the checkpoint" in text)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not list(tmp_path.glob("**/.megalith-view-*")), "a view was left behind"


def test_a_prefixed_index_file_is_checked_too(tmp_path):
    model, _, ckpt = _saved(tmp_path)
    io = GeneralCheckpointIO()
    io.save_model(model, str(ckpt / "p"), shard=True, prefix="v1", size_per_shard=0.0001)
    index = ckpt / "p" / "model.v1.safetensors.index.json"
    _point(index, "weight", "../../outside.safetensors")
    with pytest.raises(ValueError, match="leads out of the checkpoint directory"):
        io.load_model(model, str(index))
    assert (
        not (ckpt / "outside.safetensors").exists()
        and not (tmp_path / "outside.safetensors").exists()
    )


def test_checkpoint_index_file_refuses_it(tmp_path):
    _, _, ckpt = _saved(tmp_path)
    index = ckpt / "model" / "model.safetensors.index.json"
    _point(index, "", "/etc/passwd")
    with pytest.raises(ValueError, match="'/etc/passwd'"):
        CheckpointIndexFile.from_file(index).get_checkpoint_filenames()


def test_links_beside_the_index_real_file_load(tmp_path):
    """transformers' cache: snapshots/<rev>/* are links into blobs/, the index's too."""
    model, _, ckpt = _saved(tmp_path)
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    for f in (ckpt / "model").iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(blobs / f.name)
    torch.manual_seed(5)
    other = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
    GeneralCheckpointIO().load_model(other, str(snap))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
