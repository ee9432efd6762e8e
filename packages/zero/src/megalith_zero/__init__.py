"""megalith_zero: ZeRO stages 1, 2 and 3 with mixed precision on the megalith engine.

    import megalith_comm as comm, megalith_zero as zero
    comm.init()
    model, opt = zero.shard(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                            zero.ZeroConfig(stage=2, precision="bf16"))
    loss = loss_fn(model(x), y)
    opt.backward(loss)
    opt.clip_grad_norm_(1.0)
    opt.step()
    opt.zero_grad()

See packages/zero/README.md.
"""

from megalith_core.loss_scale import DynamicLossScaler

from .api import ZeroModel, shard
from .checkpoint import load_full, load_sharded, save_full, save_sharded
from .config import LossScaleConfig, ZeroConfig
from .file_layout import FileLayout
from .full_optimizer import load_full_optimizer, save_full_optimizer
from .optimizer import ModelParallel, ZeroOptimizer

__version__ = "0.1.0"

__all__ = [
    "DynamicLossScaler",
    "FileLayout",
    "LossScaleConfig",
    "ModelParallel",
    "ZeroConfig",
    "ZeroModel",
    "ZeroOptimizer",
    "__version__",
    "load_full",
    "load_full_optimizer",
    "load_sharded",
    "save_full",
    "save_full_optimizer",
    "save_sharded",
    "shard",
]
