"""What the tensor-parallel test workers share: the mesh per process, comparisons."""

from __future__ import annotations

import torch

import megalith_comm as comm

_MESHES: dict[tuple[int, int], comm.Mesh] = {}


def mesh(dp: int, tp: int) -> comm.Mesh:
    """One Mesh(dp, tp) per process (building one is collective, so every rank asks alike)."""
    if (dp, tp) not in _MESHES:
        _MESHES[(dp, tp)] = comm.Mesh(None, dp=dp, tp=tp, name=f"tp_test_{dp}x{tp}")
    return _MESHES[(dp, tp)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(errors: list[str], what: str, a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5):
    err = rel(a, b)
    if not err < tol:
        errors.append(f"{what}: relative error {err:.3g}")


def check_trained(
    errors: list[str], what: str, got: torch.Tensor, want: torch.Tensor, start: torch.Tensor
) -> None:
    """A weight trained by a few AdamW steps against the reference's: within 1e-4 of the
    weight plus 1e-3 of what the steps moved it. Adam's normalised step turns the fp32
    summation-order noise of a small gradient entry into a relative change of the step
    itself, which a weight started at zero (a bias) is made of alone."""
    got, want, start = (t.detach().double() for t in (got, want, start))
    allowed = 1e-4 * want.norm() + 1e-3 * (want - start).norm()
    err = (got - want).norm()
    if not err <= allowed:
        errors.append(f"{what}: error {err:.3g} over {allowed:.3g} allowed")


def exact_entries(name: str, t: torch.Tensor) -> slice | torch.Tensor:
    """The entries whose gradient is not rounding noise.

    A key bias adds the same q . b_k to every score of a row, which softmax ignores:
    its exact gradient is zero, and AdamW turns the ~1e-9 noise into lr-sized steps
    that differ between any two summation orders.
    """
    if name.endswith("c_attn.bias"):
        d = t.shape[0] // 3
        return torch.cat((torch.arange(d), torch.arange(2 * d, 3 * d)))
    if name.endswith("k_proj.bias"):
        return torch.arange(0)
    return slice(None)


def expect_value_error(errors: list[str], what: str, fn, *needles: str) -> None:
    """fn() must raise ValueError with every needle in its message; else an error is noted."""
    try:
        fn()
    except ValueError as exc:
        missing = [n for n in needles if n not in str(exc)]
        if missing:
            errors.append(f"{what}: message {str(exc)!r} lacks {missing}")
        return
    errors.append(f"{what}: no error")


def grid_failures(cases: list, results: list) -> list[str]:
    """The first errors of every rank of every case, from run_grid over (errors, seconds)."""
    return [
        f"{case} rank {rank}: {err}"
        for case, per_rank in zip(cases, results)
        for rank, (errs, _) in enumerate(per_rank)
        for err in errs[:4]
    ]
