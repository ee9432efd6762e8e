"""What each rank runs in tests/booster/test_checkpoint_io.py."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from megalith.booster import Booster, TorchDDPPlugin


def _boosted(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    booster = Booster(plugin=TorchDDPPlugin())
    model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)
    return booster, model, opt, sched


def ddp_round_trip_without_zero(rank: int, root: str) -> dict:
    """TorchDDPPlugin's model (one file and sharded), optimizer and scheduler saved and
    loaded into a differently seeded run, with megalith_zero unimportable."""
    sys.modules["megalith_zero"] = None  # import megalith_zero raises ImportError now
    path = Path(root)
    booster, model, opt, sched = _boosted(seed=1)
    model(torch.randn(5, 4)).square().mean().backward()
    opt.step()
    sched.step()
    booster.save_model(model, str(path / "model.safetensors"))
    booster.save_model(model, str(path / "model"), shard=True, size_per_shard=1)
    booster.save_optimizer(opt, str(path / "optim"))
    booster.save_lr_scheduler(sched, str(path / "sched.json"))
    result = {}
    for source in ("model.safetensors", "model"):
        booster2, model2, opt2, sched2 = _boosted(seed=2)
        booster2.load_model(model2, str(path / source))
        booster2.load_optimizer(opt2, str(path / "optim"))
        booster2.load_lr_scheduler(sched2, str(path / "sched.json"))
        pairs = zip(model.unwrap().parameters(), model2.unwrap().parameters())
        result[source] = all(torch.equal(a, b) for a, b in pairs) and all(
            torch.equal(opt.optim.state[a]["exp_avg_sq"], opt2.optim.state[b]["exp_avg_sq"])
            for a, b in zip(model.unwrap().parameters(), model2.unwrap().parameters())
        )
        result[source] &= sched2.state_dict() == sched.state_dict()
    result["left over"] = sorted(p.name for p in path.rglob("*") if p.name.startswith("."))
    result["megalith_zero"] = sys.modules.get("megalith_zero") is not None
    return result
