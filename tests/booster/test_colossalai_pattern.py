"""ColossalAI's getting-started pattern runs on megalith with only the imports changed.

The script below is the shape of ColossalAI's quick-start examples (launch_from_torch,
HybridAdam, a Booster with a plugin, boost, booster.backward, save and load); the only
lines that differ from a ColossalAI script are the three imports, marked.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import torch
import torch.nn as nn
import megalith as colossalai                                   # was: import colossalai
from megalith.booster import Booster                            # was: from colossalai.booster import Booster
from megalith.booster.plugin import {plugin_cls}                # was: from colossalai.booster.plugin import ...
from megalith.optim import HybridAdam                           # was: from colossalai.nn.optimizer import HybridAdam

colossalai.launch_from_torch(seed=42)
plugin = {plugin_cls}({plugin_args})
booster = Booster(plugin=plugin)

model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = HybridAdam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss()
data = torch.utils.data.TensorDataset(torch.randn(256, 32, generator=torch.Generator().manual_seed(0)),
                                      torch.randint(0, 4, (256,), generator=torch.Generator().manual_seed(1)))
dataloader = plugin.prepare_dataloader(data, batch_size=16, shuffle=True)
lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
model, optimizer, criterion, dataloader, lr_scheduler = booster.boost(model, optimizer, criterion, dataloader, lr_scheduler)

first = None
for epoch in range(3):
    for x, y in dataloader:
        outputs = model(x)
        loss = criterion(outputs.float(), y)
        booster.backward(loss, optimizer)
        optimizer.step()
        optimizer.zero_grad()
        first = first if first is not None else loss.item()
    lr_scheduler.step()

booster.save_model(model, "ckpt/model", shard=True)
booster.save_optimizer(optimizer, "ckpt/optimizer", shard=True)
booster.save_lr_scheduler(lr_scheduler, "ckpt/lr_scheduler")
booster.load_model(model, "ckpt/model")
booster.load_optimizer(optimizer, "ckpt/optimizer")
booster.load_lr_scheduler(lr_scheduler, "ckpt/lr_scheduler")
if torch.distributed.get_rank() == 0:
    print(f"OK first {{first:.3f}} last {{loss.item():.3f}}")
"""

CASES = [
    ("TorchDDPPlugin", ""),
    ("LowLevelZeroPlugin", "stage=2, precision='bf16'"),
    ("GeminiPlugin", "precision='bf16'"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("plugin_cls", "plugin_args"), CASES)
def test_getting_started_runs_with_only_imports_changed(tmp_path, plugin_cls, plugin_args):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(plugin_cls=plugin_cls, plugin_args=plugin_args))
    out = subprocess.run(
        [sys.executable, "-m", "megalith", "run", "--nproc_per_node", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=280,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    # megalith run prefixes each rank's lines with [rankN]: (as torchrun's --tee does)
    line = next(x.split(":", 1)[1] for x in out.stdout.splitlines() if x.startswith("[rank0]:OK"))
    first, last = float(line.split()[2]), float(line.split()[4])
    assert last < first, line
    assert (tmp_path / "ckpt" / "model" / "model.safetensors.index.json").exists()
