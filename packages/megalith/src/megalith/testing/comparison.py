"""ColossalAI's assertions (colossalai.testing.comparison): tensors, state dicts, HF outputs.

    check_state_dict_equal(model.state_dict(), loaded.state_dict())
    assert_equal_in_group(weight)            # the same on every rank of the group

Tensors compare within assert_close_loose's 1e-3 tolerances; ignore_dtype casts the
first to the second's dtype; devices never matter (tensors are compared on the CPU
when they differ), so ignore_device is accepted for ColossalAI's signature.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.testing import assert_close

__all__ = [
    "assert_close",
    "assert_close_loose",
    "assert_equal",
    "assert_equal_in_group",
    "assert_hf_output_close",
    "assert_not_equal",
    "check_state_dict_equal",
]


def assert_equal(a: Tensor, b: Tensor) -> None:
    assert torch.all(a == b), f"expected equal tensors, got {a} vs {b}"


def assert_not_equal(a: Tensor, b: Tensor) -> None:
    assert not torch.all(a == b), f"expected tensors that differ somewhere, got {a} vs {b}"


def assert_close_loose(a: Tensor, b: Tensor, rtol: float = 1e-3, atol: float = 1e-3) -> None:
    assert_close(a, b, rtol=rtol, atol=atol)


def assert_equal_in_group(tensor: Tensor, process_group: Any = None) -> None:
    """Gathers `tensor` from every rank of process_group (None: all) and asserts they match."""
    import torch.distributed as dist

    if getattr(process_group, "size", None) == 1:  # a megalith_comm Group of one rank
        return
    group = getattr(process_group, "gloo", process_group)  # a megalith_comm Group or torch's
    copies = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(copies, tensor.contiguous(), group=group)
    for i in range(len(copies) - 1):
        assert torch.all(copies[i] == copies[i + 1]), (
            f"the tensor differs between group ranks {i} and {i + 1}: {copies[i]} vs {copies[i + 1]}"
        )


def _tensors_close(a: Tensor, b: Tensor, ignore_dtype: bool, where: str) -> None:
    assert isinstance(b, Tensor), f"{where}: a tensor against {type(b).__name__}"
    if a.device != b.device:
        a, b = a.cpu(), b.cpu()
    if ignore_dtype:
        a = a.to(b.dtype)
    try:
        assert_close_loose(a, b)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from None


def _values_equal(v1: Any, v2: Any, ignore_dtype: bool, where: str) -> None:
    if isinstance(v1, Mapping):
        assert isinstance(v2, Mapping), f"{where}: a dict against {type(v2).__name__}"
        _dicts_equal(v1, v2, ignore_dtype, where)
    elif isinstance(v1, Tensor):
        _tensors_close(v1, v2, ignore_dtype, where)
    elif isinstance(v1, (list, tuple)) and not isinstance(v1, str):
        assert isinstance(v2, (list, tuple)), f"{where}: a list against {type(v2).__name__}"
        assert len(v1) == len(v2), f"{where}: lengths {len(v1)} vs {len(v2)}"
        for i, (a, b) in enumerate(zip(v1, v2)):
            _values_equal(a, b, ignore_dtype, f"{where}[{i}]")
    else:
        assert v1 == v2, f"{where}: {v1!r} != {v2!r}"


def _dicts_equal(d1: Mapping, d2: Mapping, ignore_dtype: bool, where: str) -> None:
    missing = [k for k in d1 if k not in d2]
    extra = [k for k in d2 if k not in d1]
    assert not missing and not extra, (
        f"{where or 'state dict'}: keys only in the first {missing[:5]}, only in the second {extra[:5]}"
    )
    for key, v1 in d1.items():
        _values_equal(v1, d2[key], ignore_dtype, f"{where}[{key!r}]" if where else repr(key))


def check_state_dict_equal(
    d1: Mapping, d2: Mapping, ignore_device: bool = True, ignore_dtype: bool = False
) -> None:
    """Asserts two (nested) state dicts hold the same keys, tensors and values; the
    message names the first key that differs."""
    _dicts_equal(d1, d2, ignore_dtype, "")


def assert_hf_output_close(
    out1: Any,
    out2: Any,
    ignore_keys: Sequence[str] | None = None,
    track_name: str = "",
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> None:
    """Compares two transformers outputs (dicts, lists, tensors) leaf by leaf, skipping the
    keys in ignore_keys; the message names the path of the leaf that differs."""
    if isinstance(out1, Mapping) and isinstance(out2, Mapping):
        assert set(out1) == set(out2), f"{track_name}: keys {sorted(out1)} vs {sorted(out2)}"
        for key in out1:
            if ignore_keys is None or key not in ignore_keys:
                assert_hf_output_close(
                    out1[key], out2[key], ignore_keys, f"{track_name}.{key}", atol, rtol
                )
    elif isinstance(out1, (list, tuple)) and isinstance(out2, (list, tuple)):
        assert len(out1) == len(out2), f"{track_name}: lengths {len(out1)} vs {len(out2)}"
        for i, (a, b) in enumerate(zip(out1, out2)):
            assert_hf_output_close(a, b, ignore_keys, f"{track_name}.{i}", atol, rtol)
    elif isinstance(out1, Tensor) and isinstance(out2, Tensor):
        if out1.shape != out2.shape:
            raise AssertionError(f"{track_name}: shapes {tuple(out1.shape)} vs {tuple(out2.shape)}")
        assert_close(out1, out2, atol=atol, rtol=rtol, msg=lambda m: f"{track_name}: {m}")
    else:
        assert out1 == out2, f"{track_name}: {out1!r} != {out2!r}"
