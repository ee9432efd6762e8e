"""HybridParallelPlugin through the Booster against the unsharded model in one process."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from megalith.booster import Booster
from megalith.booster.plugin import HybridParallelPlugin
from megalith.tensor_parallel import gather_full
from tests.tensor_parallel.common import check, exact_entries
from tests.tensor_parallel.models import SEQ, VOCAB, ModelCase, build, loss_of


@dataclass(frozen=True)
class PluginCase:
    family: str = "llama"
    zero_stage: int = 0
    sp: bool = False
    max_norm: float = 0.0
    accumulate: int = 1
    precision: str = "fp32"
    tp: int = 2
    sp_size: int | None = None
    steps: int = 2

    def run(self, rank: int) -> tuple[list[str], float]:
        import megalith_comm as comm

        start = time.perf_counter()
        model_case = ModelCase("megalith", self.family)
        ref = build(model_case)
        plugin = HybridParallelPlugin(
            tp_size=self.tp,
            zero_stage=self.zero_stage,
            enable_sequence_parallelism=self.sp,
            sequence_parallelism_mode="all_to_all" if self.sp_size else None,
            sp_size=self.sp_size,
            max_norm=self.max_norm,
            precision=self.precision,
        )
        model = copy.deepcopy(ref)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
        model, opt, *_ = Booster(plugin=plugin).boost(model, opt)
        opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
        dp_rank, dp = plugin.dp_rank_size
        gen = torch.Generator().manual_seed(5)
        errors: list[str] = []
        losses: list[float] = []
        # bf16: the weights after a few steps agree within what bf16 compute allows.
        tol = 1e-5 if self.precision == "fp32" else 2e-2
        for _ in range(self.steps):
            for micro in range(self.accumulate):
                ids = torch.randint(0, VOCAB, (2 * dp, SEQ), generator=gen)
                ref_loss = loss_of(ref, ids, model_case, None) / self.accumulate
                ref_loss.backward()
                loss = loss_of(model, ids.chunk(dp)[dp_rank], model_case, None) / self.accumulate
                mean = loss.detach().float().clone()  # equal-sized dp chunks: mean of means
                comm.all_reduce(mean, op="avg", group=plugin.mesh.group("dp"))
                check(errors, f"loss {len(losses)}", mean, ref_loss.detach(), tol)
                losses.append(float(mean))
                if micro < self.accumulate - 1:
                    with plugin.no_sync(model, opt):
                        opt.backward(loss)
                else:
                    opt.backward(loss)
            if self.max_norm:
                torch.nn.utils.clip_grad_norm_(ref.parameters(), self.max_norm)
            opt_ref.step()
            opt.step()
            opt_ref.zero_grad()
            opt.zero_grad()
        ref_params = dict(ref.named_parameters())
        tp_group = plugin.mesh.group("tp")
        for name, p in model.unwrap().named_parameters():
            full, want = gather_full(p, tp_group), ref_params[name].detach()
            keep = exact_entries(name, want)
            check(errors, f"weight {name}", full[keep].float(), want[keep], tol)
        return errors, time.perf_counter() - start


@dataclass(frozen=True)
class BadPluginCase:
    """tp that does not fit the world or the model fails on every rank before any collective."""

    def run(self, rank: int) -> tuple[list[str], float]:
        import megalith_comm as comm

        start = time.perf_counter()
        world_group = comm.get_world().group
        issued = world_group.issued
        errors: list[str] = []
        for tp, heads, needles in ((3, 4, ("world size 4", "tp_size 3")), (4, 6, ("(6)", "4"))):
            model = build(ModelCase("megalith", "gpt2"))
            if heads != 4:
                model = build_gpt(n_heads=heads, d_model=48)
            opt = torch.optim.AdamW(model.parameters())
            try:
                Booster(plugin=HybridParallelPlugin(tp_size=tp)).boost(model, opt)
                errors.append(f"tp_size={tp}: no error")
            except ValueError as exc:
                missing = [n for n in needles if n not in str(exc)]
                if missing:
                    errors.append(f"tp_size={tp}: {exc} lacks {missing}")
        if world_group.issued != issued:
            errors.append(f"{world_group.issued - issued} collectives before the errors")
        return errors, time.perf_counter() - start


def build_gpt(**overrides) -> torch.nn.Module:
    import megalith.models as mm

    base = dict(vocab_size=VOCAB, max_seq_len=SEQ, d_model=32, n_layers=1, n_heads=4, d_ff=64)
    return mm.create(mm.GPTConfig(**{**base, **overrides}), device="cpu")


@dataclass(frozen=True)
class DropoutCase:
    """Ranks seeded differently, dropout on: replicated weights stay equal over tp."""

    def run(self, rank: int) -> tuple[list[str], float]:
        import megalith_comm as comm

        start = time.perf_counter()
        model = build_gpt(dropout=0.2)
        torch.manual_seed(100 + rank)
        plugin = HybridParallelPlugin(tp_size=2, enable_sequence_parallelism=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model, opt, *_ = Booster(plugin=plugin).boost(model, opt)
        ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(3))
        for _ in range(2):
            opt.backward(model(ids, labels=ids).loss)
            opt.step()
            opt.zero_grad()
        tp = plugin.mesh.group("tp")
        errors: list[str] = []
        for name, p in model.unwrap().named_parameters():
            if hasattr(p, "tp_spec"):
                continue
            both = torch.empty((tp.size, *p.shape))
            comm.all_gather(both, p.detach().contiguous(), group=tp)
            if not torch.equal(both[0], both[1]):
                errors.append(f"replicated {name} differs between tp ranks")
        return errors, time.perf_counter() - start
