"""How attention heads split over tensor-parallel ranks, grouped-query attention included.

Query heads split evenly. Key/value heads split too when their number divides by
tp; when tp is a multiple of it instead, each rank computes the one kv head its
query heads read (the projection is replicated, see HeadRowsLinear). Anything else
would give a rank query heads that read parts of two kv heads: an error.
"""

from __future__ import annotations

from dataclasses import dataclass

from .shards import check_divisible


@dataclass(frozen=True)
class HeadSplit:
    n_heads: int
    n_kv_heads: int
    tp: int
    rank: int

    def __post_init__(self) -> None:
        check_divisible("the number of attention heads", self.n_heads, self.tp)
        kv, tp = self.n_kv_heads, self.tp
        if kv <= 0 or self.n_heads % kv:
            raise ValueError(f"{self.n_heads} attention heads is not a multiple of {kv} kv heads")
        if kv % tp and tp % kv:
            raise ValueError(
                f"tensor parallel size {tp} and {kv} key/value heads: one must divide the "
                f"other (split the kv heads when {kv} % tp == 0, replicate them when "
                f"tp % {kv} == 0); choose a tp_size that divides {kv} or is a multiple of it"
            )

    @property
    def local_heads(self) -> int:
        return self.n_heads // self.tp

    @property
    def kv_replicated(self) -> bool:
        return self.n_kv_heads % self.tp != 0

    @property
    def local_kv_heads(self) -> int:
        return 1 if self.kv_replicated else self.n_kv_heads // self.tp

    def kv_rows(self, head_dim: int) -> slice:
        """The rows of a replicated k/v projection this rank uses (one kv head)."""
        head = self.rank // (self.tp // self.n_kv_heads)
        return slice(head * head_dim, (head + 1) * head_dim)
