"""Plugin: how the Booster turns a model and optimizer into a parallel training setup."""

from __future__ import annotations

import contextlib
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


def require(package: str, dist: str, what: str) -> Any:
    """Imports a megalith sub-package, or says which pip package brings it."""
    import importlib

    try:
        return importlib.import_module(package)
    except ImportError as e:
        raise ImportError(f"{what} needs {package}: pip install {dist}") from e


def world():
    """megalith_comm's World, initialising it from the launcher's environment if needed."""
    import megalith_comm as comm

    if not comm.is_initialized():
        comm.init()
    return comm.get_world()


class Plugin:
    #: True when the plugin runs only with one CUDA GPU per rank.
    needs_gpu = False
    #: the working precision (the built-in plugins read theirs from their Strategy)
    precision: str = "fp32"

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
        """A DataLoader whose sampler gives each data-parallel rank its own share."""
        rank, size = self.dp_rank_size
        sampler = (distributed_sampler_cls or DistributedSampler)(
            dataset, num_replicas=size, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
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
