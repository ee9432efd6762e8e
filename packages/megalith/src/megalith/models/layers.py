"""The building blocks both decoders share: a GPT-2 style linear, RMSNorm, RoPE."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class InOutLinear(nn.Module):
    """y = x @ weight + bias with weight stored as [in_features, out_features].

    GPT-2's checkpoints (and transformers' GPT2LMHeadModel, through its Conv1D
    layer) keep the projection transposed against nn.Linear. Storing it the same
    way makes our state dict load into GPT2LMHeadModel, and theirs into ours,
    with no conversion step that a sharded checkpoint would have to repeat.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(
            torch.empty(in_features, out_features, device=device, dtype=dtype)
        )
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # F.linear wants [out, in]; .t() is a view, and matmul picks the transposed kernel.
        return F.linear(x, self.weight.t(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, the statistic taken in fp32."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        # Cast back before the scale, as Llama's reference does, so bf16 runs round alike.
        return self.weight * x32.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape [seq_len, head_dim] for positions 0..seq_len-1.

    Computed in fp32 and cast, never stored as a buffer: a buffer would need
    re-filling after materialising a meta model, and costs seq_len * head_dim
    trig calls, nothing beside the attention it feeds.
    """
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    )
    positions = torch.arange(seq_len, device=device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)  # halves layout, not interleaved pairs
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates x [batch, heads, seq, head_dim]: dims i and i + head_dim/2 form a pair."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
