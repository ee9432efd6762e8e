"""TensorDetector: which tensors are alive, and which came and went since the last look.

    detector = TensorDetector(include_cpu=False, module=model)
    detector.detect()          # prints "+" rows for new tensors, "-" rows for freed ones

Tensors are found through the garbage collector; a module's parameters are named by
their qualified names, other tensors "Tensor" (" (with grad)" when they hold one).
"""

from __future__ import annotations

import gc
import sys
import warnings

import torch

_ROW = "{:3s}{:<30s}{:>10s}{:>20s}{:>10s}{:>20s}{:>15s}\n"
_LINE = "-" * 108 + "\n"


def _fmt(nbytes: float) -> str:
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size} {unit}"
    return f"{int(nbytes)} B"


class TensorDetector:
    def __init__(
        self,
        show_info: bool = True,
        log: str | None = None,
        include_cpu: bool = False,
        module: torch.nn.Module | None = None,
    ) -> None:
        self.show_info = show_info
        self.log = log
        self.include_cpu = include_cpu
        self.module = module
        self.info = ""
        self._names = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
        self._seen: dict[int, tuple[str, ...]] = {}

    def get_tensor_mem(self, tensor: torch.Tensor) -> str:
        """The memory of a tensor's storage (and of its grad), formatted."""
        size = tensor.untyped_storage().nbytes()
        if tensor.grad is not None and (tensor.is_leaf or tensor.retains_grad):
            size += tensor.grad.untyped_storage().nbytes()
        return self.mem_format(size)

    def mem_format(self, real_memory_size: float) -> str:
        return _fmt(real_memory_size)

    def _row(self, t: torch.Tensor) -> tuple[str, ...]:
        name = self._names.get(id(t), "Tensor")
        if t.grad is not None and (t.is_leaf or t.retains_grad):
            name += " (with grad)"
        return (
            name,
            str(t.device),
            str(tuple(t.shape)),
            str(t.requires_grad),
            str(t.dtype),
            self.get_tensor_mem(t),
        )

    def _alive(self) -> dict[int, tuple[str, ...]]:
        out = {}
        with warnings.catch_warnings():  # asking deprecated objects their type warns
            warnings.simplefilter("ignore")
            for obj in gc.get_objects():
                try:
                    is_tensor = torch.is_tensor(obj)
                except Exception:  # objects whose type check fails (lazy proxies)
                    continue
                if is_tensor and (self.include_cpu or obj.device.type != "cpu"):
                    out[id(obj)] = self._row(obj)
        return out

    def detect(self, include_cpu: bool = False) -> None:
        """Prints (and with log, appends to <log>.log) the tensors new or changed since the
        last detect() ("+") and those gone ("-"), then the device memory allocated."""
        self.include_cpu = include_cpu or self.include_cpu
        alive = self._alive()
        added = [row for key, row in alive.items() if self._seen.get(key) != row]
        gone = [row for key, row in self._seen.items() if key not in alive or alive[key] != row]
        info = _LINE + _ROW.format("  ", "Tensor", "device", "shape", "grad", "dtype", "Mem")
        info += _LINE
        info += "".join(_ROW.format("+", *row) for row in added)
        if added and gone:
            info += "\n"
        info += "".join(_ROW.format("-", *row) for row in gone)
        caller = sys._getframe(1)
        info += _LINE + f'Detect Location: "{caller.f_code.co_filename}" line {caller.f_lineno}\n'
        devices = sorted({row[1] for row in alive.values() if row[1].startswith("cuda")})
        for device in devices:
            allocated = _fmt(torch.cuda.memory_allocated(device))
            info += f"Total GPU Memory Allocated on {device} is {allocated}\n"
        info += _LINE + "\n\n"
        self.info = info
        self._seen = alive
        if self.show_info:
            print(info)
        if self.log is not None:
            with open(self.log + ".log", "a") as f:
                f.write(info)

    def close(self) -> None:
        self._seen.clear()
        self.module = None
        self._names = {}

    def __repr__(self) -> str:
        return f"TensorDetector(include_cpu={self.include_cpu}, tracked={len(self._seen)})"
