"""Plugin: how the Booster turns a model and optimizer into a parallel training setup."""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from megalith.strategy import Strategy

if TYPE_CHECKING:
    from ..checkpoint_io import CheckpointIO

PRECISIONS = ("fp32", "fp16", "bf16")


def check_precision(owner: str, precision: str | None) -> str:
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise ValueError(
            f"{owner}: precision={precision!r}; expected one of {', '.join(PRECISIONS)}"
        )
    return precision


_WARNED: set[tuple[str, str]] = set()


def warn_ignored(owner: str, argument: str, value: Any, why: str) -> None:
    """Once per (owner, argument): a performance-only argument megalith does not use."""
    if (owner, argument) in _WARNED:
        return
    _WARNED.add((owner, argument))
    warnings.warn(
        f"{owner}: {argument}={value!r} is ignored ({why}); results are as without it",
        stacklevel=4,
    )


def warn_non_defaults(owner: str, given: dict[str, Any], why: dict[str, tuple[Any, str]]) -> None:
    """warn_ignored for each argument of `why` (name: (its default, why it is ignored))
    that `given` sets to something else."""
    for name, (default, reason) in why.items():
        if name in given and given[name] != default:
            warn_ignored(owner, name, given[name], reason)


def require(package: str, dist: str, what: str) -> Any:
    """Imports a megalith sub-package, or says which pip package brings it."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ImportError(f"{what} needs {package}: pip install {dist}") from e


def peft_model(
    owner: str,
    model: torch.nn.Module,
    pretrained_dir: str | None,
    lora_config: Any,
    bnb_quantization_config: Any,
) -> torch.nn.Module:
    """LoRA adapters on `model` through Hugging Face peft, as ColossalAI adds them: a new
    adapter from lora_config, or the trainable adapter saved in pretrained_dir."""
    try:
        import peft
    except ImportError as e:
        raise ImportError(f"{owner}.enable_lora needs Hugging Face peft: pip install peft") from e
    if bnb_quantization_config is not None:
        raise NotImplementedError(
            f"{owner}.enable_lora: bnb_quantization_config (QLoRA's 4-bit base weights) is "
            "not built in megalith; leave it None (quantize=False) to train LoRA on the "
            "model's own weights"
        )
    if isinstance(model, torch.nn.Module) and hasattr(model, "unwrap"):
        raise ValueError(f"{owner}.enable_lora: call it before booster.boost(model)")

    def make() -> torch.nn.Module:
        if pretrained_dir is None:
            return peft.get_peft_model(model, lora_config)
        return peft.PeftModel.from_pretrained(model, pretrained_dir, is_trainable=True)

    from megalith.lazy import is_lazy

    if is_lazy(model):  # adapters real now, base weights lazy until boost
        from megalith.lazy.adapters import with_adapters

        return with_adapters(model, make, pretrained_dir)
    return make()


def world():
    """megalith_comm's World, initialising it from the launcher's environment if needed."""
    import megalith_comm as comm

    if not comm.is_initialized():
        comm.init()
    return comm.get_world()


class Plugin:
    """ColossalAI's Plugin interface. The Booster asks control_precision() whether its
    mixed_precision applies (False: the Booster's precision wraps the model; True: the
    plugin's own precision= rules), and support_no_sync()/support_lora() before no_sync
    and enable_lora."""

    #: made by from_strategy: the Strategy names the precision, and a Booster without
    #: mixed_precision keeps it (a plugin built bare takes the Booster's, None being fp32,
    #: as in ColossalAI)
    precision_from_strategy: bool = False

    #: True when the plugin runs only with one CUDA GPU per rank.
    needs_gpu = False
    #: the working precision (the built-in plugins read theirs from their Strategy)
    precision: str = "fp32"

    # -- ColossalAI's capability questions --------------------------------------
    def supported_devices(self) -> list[str]:
        return ["cuda", "cpu"]

    def control_precision(self) -> bool:
        """Whether the plugin's own precision argument rules (Booster's is then ignored)."""
        return True

    def control_device(self) -> bool:
        return True

    def control_checkpoint_io(self) -> bool:
        return True

    def support_no_sync(self) -> bool:
        return True

    def support_lora(self) -> bool:
        return False

    def enable_lora(
        self,
        model: torch.nn.Module,
        pretrained_dir: str | None = None,
        lora_config: Any = None,
        bnb_quantization_config: Any = None,
    ) -> torch.nn.Module:
        """The peft model of `model` (plugins that support_lora())."""
        if not self.support_lora():
            raise NotImplementedError(
                f"{type(self).__name__} does not train LoRA adapters; use TorchDDPPlugin, "
                "LowLevelZeroPlugin, GeminiPlugin or HybridParallelPlugin with "
                "booster.enable_lora"
            )
        return peft_model(
            type(self).__name__, model, pretrained_dir, lora_config, bnb_quantization_config
        )

    # -- called by the Booster ----------------------------------------------
    def configure(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        criterion: Callable | None,
        dataloader: DataLoader | None,
        lr_scheduler: Any,
    ) -> tuple[Any, Any, Any, Any, Any]:
        raise NotImplementedError

    def no_sync(self, model: Any, optimizer: Any) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def get_checkpoint_io(self) -> CheckpointIO:
        """How the Booster saves and loads this plugin's models and optimizers; a plugin
        whose ranks hold whole models keeps this one."""
        from ..checkpoint_io import GeneralCheckpointIO

        return GeneralCheckpointIO()

    def supported_precisions(self) -> tuple[str, ...]:
        return PRECISIONS

    def check(self) -> None:
        """Fails on every rank, before any collective, when this machine cannot run the plugin."""
        if self.needs_gpu and not torch.cuda.is_available():
            raise RuntimeError(
                f"{type(self).__name__} needs a CUDA GPU per rank and none is visible; "
                "use TorchDDPPlugin or the ZeRO plugins, which run on CPU ranks too"
            )

    @property
    def dp_rank_size(self) -> tuple[int, int]:
        w = world()
        return w.rank, w.world_size

    def prepare_dataloader(
        self,
        dataset: Dataset,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 1024,
        drop_last: bool = False,
        pin_memory: bool = False,
        num_workers: int = 0,
        distributed_sampler_cls: type | None = None,
        **kwargs: Any,
    ) -> DataLoader:
        """A DataLoader whose sampler gives each data-parallel rank its own share, as
        ColossalAI builds it: the sampler is distributed_sampler_cls (DistributedSampler)
        with its own default seed and no drop_last (so the order of a shuffled epoch is
        ColossalAI's); `seed` seeds every worker's random, numpy and torch generators;
        drop_last drops each rank's last incomplete batch; kwargs go to the DataLoader."""
        rank, size = self.dp_rank_size
        sampler = (distributed_sampler_cls or DistributedSampler)(
            dataset, num_replicas=size, rank=rank, shuffle=shuffle
        )
        kwargs.setdefault("worker_init_fn", _WorkerSeed(seed))
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            drop_last=drop_last,
            pin_memory=pin_memory,
            num_workers=num_workers,
            **kwargs,
        )

    @staticmethod
    @contextlib.contextmanager
    def nothing() -> Iterator[None]:
        yield


class _WorkerSeed:
    """A DataLoader worker's init: the same seed for random, numpy and torch (picklable)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, worker_id: int) -> None:
        import numpy as np

        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)


_P = TypeVar("_P", bound="StrategyPlugin")


class StrategyPlugin(Plugin):
    """A plugin configured by one megalith.strategy.Strategy (the built-in plugins): its
    constructor turns ColossalAI's arguments into the Strategy, from_strategy takes one as
    it is, and precision, clipping and the rest are read from it."""

    #: the Strategy.plugin names this class runs
    runs: tuple[str, ...] = ()

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy

    @classmethod
    def from_strategy(cls: type[_P], strategy: Strategy) -> _P:
        """The plugin that runs `strategy`; its options outside the Strategy (DDP's bucket
        size, a tensor-parallel policy, ...) at their defaults."""
        plugin = cls.__new__(cls)
        plugin._default_options()
        StrategyPlugin.__init__(plugin, strategy)
        plugin.precision_from_strategy = True
        return plugin

    def _default_options(self) -> None:
        """Sets this plugin's options that are not the Strategy's to their defaults."""

    @property
    def strategy(self) -> Strategy:
        return self._strategy

    @strategy.setter
    def strategy(self, strategy: Strategy) -> None:
        if not isinstance(strategy, Strategy) or strategy.plugin not in self.runs:
            raise ValueError(
                f"{type(self).__name__} runs Strategy(plugin={' or '.join(map(repr, self.runs))}), "
                f"not {strategy!r}: build the plugin with strategy.make_plugin()"
            )
        self._strategy = strategy

    @property
    def precision(self) -> str:  # type: ignore[override]
        return self.strategy.precision

    @precision.setter
    def precision(self, precision: str) -> None:
        checked = check_precision(type(self).__name__, precision)
        self.strategy = self.strategy.replace(precision=checked)

    @property
    def max_norm(self) -> float:
        return self.strategy.max_norm

    @max_norm.setter
    def max_norm(self, max_norm: float) -> None:
        self.strategy = self.strategy.replace(max_norm=max_norm)

    def set_precision(self, precision: str | None) -> None:
        if precision is not None:
            self.precision = precision
