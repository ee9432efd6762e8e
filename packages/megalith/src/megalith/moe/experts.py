"""Expert parallelism for transformers' mixture-of-experts layers.

transformers keeps a MoE layer's experts as one module of 3-D weights, gate_up_proj
[E, 2I, H] and down_proj [E, H, I], called with the router's choices:
experts(hidden [T, H], top_k_index [T, K], top_k_weights [T, K]). Mixtral's module is the
reference; transformers' modular files copy its computation into some 50 other families
(Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, OLMoE, GraniteMoE, Phi-MoE, ...), and a module is
taken when its forward is that same code.

ExpertParallelExperts replaces such a module on each rank of an expert-parallel group of
ep ranks: rank r keeps experts [r E/ep, (r+1) E/ep); every (token, chosen expert) row is
sent to the expert's rank, computed there and sent back (dispatch.py), then weighted and
summed per token as transformers does. Every local expert runs, with no rows if none
came, so each rank's expert weights always get a gradient (zeros where unused): the
gradient reductions over data-parallel ranks then match tensor for tensor.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

import megalith_comm as comm
from megalith_comm import ProcessGroup

from ..tensor_parallel.shards import ShardSpec
from .dispatch import exchange_counts, exchange_rows, exchange_rows_grad


def _body(fn) -> str:
    """A function's statements (its docstring and formatting left out), to compare code."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(fn))))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return "\n".join(ast.dump(stmt) for stmt in body)


def _reference_body() -> str | None:
    try:
        from transformers.models.mixtral.modeling_mixtral import MixtralExperts
    except ImportError:
        return None
    return _body(MixtralExperts.forward)


def is_fused_experts(module: nn.Module) -> bool:
    """A transformers experts module that computes as Mixtral's (see the module doc)."""
    if isinstance(module, ExpertParallelExperts):
        return False
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    if not isinstance(gate_up, nn.Parameter) or not isinstance(down, nn.Parameter):
        return False
    if gate_up.dim() != 3 or down.dim() != 3 or not hasattr(module, "num_experts"):
        return False
    reference = _reference_body()
    try:
        return reference is not None and _body(type(module).forward) == reference
    except (OSError, TypeError):
        return False


def experts_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(qualified name, module) of every MoE experts module of model."""
    for name, module in model.named_modules():
        if is_fused_experts(module) or isinstance(module, ExpertParallelExperts):
            yield name, module


def unsupported_experts(model: nn.Module) -> list[str]:
    """Class names of modules that look like experts (a 3-D gate_up_proj or w1 weight, an
    `experts` ModuleList) but are not taken: expert parallelism would leave them whole."""
    found = []
    for name, module in model.named_modules():
        if is_fused_experts(module) or isinstance(module, ExpertParallelExperts):
            continue
        leaf = name.rsplit(".", 1)[-1]
        weight = getattr(module, "gate_up_proj", None)
        if (isinstance(weight, nn.Parameter) and weight.dim() == 3) or (
            leaf == "experts" and isinstance(module, nn.ModuleList)
        ):
            found.append(type(module).__qualname__)
    return sorted(set(found))


def validate_experts(model: nn.Module, ep: int) -> int:
    """Before any collective, for ep > 1: the model has experts, all of a kind taken
    here, whose count divides by ep. Returns how many experts modules there are."""
    modules = list(experts_modules(model))
    odd = unsupported_experts(model)
    if odd:
        raise ValueError(
            f"expert parallelism: {', '.join(odd)} is not a transformers experts module "
            "that computes as Mixtral's (3-D gate_up_proj and down_proj); pass ep_size=1 "
            "or use a model whose experts are (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3, "
            "OLMoE, ...)"
        )
    if ep > 1 and not modules:
        raise ValueError(
            f"ep_size={ep}: {type(model).__name__} has no mixture-of-experts layer "
            "(transformers' *Experts modules); use HybridParallelPlugin, or ep_size=1"
        )
    for name, m in modules:
        if m.num_experts % ep:
            raise ValueError(
                f"ep_size={ep}: {name} has {m.num_experts} experts, which do not divide over "
                f"{ep} ranks; pass an ep_size that divides {m.num_experts}"
            )
    return len(modules)


class ExpertParallelExperts(nn.Module):
    """This rank's experts of a transformers experts module (see the module doc)."""

    def __init__(
        self, experts: nn.Module, ep_group: ProcessGroup, moe_dp_group: ProcessGroup
    ) -> None:
        super().__init__()
        total, ep = experts.num_experts, ep_group.size
        self.num_experts = total
        self.num_local_experts = total // ep
        self.first_expert = ep_group.rank * self.num_local_experts
        self.hidden_dim = getattr(experts, "hidden_dim", experts.gate_up_proj.shape[-1])
        self.intermediate_dim = getattr(experts, "intermediate_dim", experts.down_proj.shape[-1])
        self.act_fn = experts.act_fn
        self.ep_group = ep_group
        span = slice(self.first_expert, self.first_expert + self.num_local_experts)
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            p = nn.Parameter(full.detach()[span].clone(), requires_grad=full.requires_grad)
            mark_expert_param(p, ShardSpec(dim=0, parts=(total,)), ep_group, moe_dp_group)
            setattr(self, name, p)

    def extra_repr(self) -> str:
        return (
            f"experts {self.first_expert}..{self.first_expert + self.num_local_experts - 1} "
            f"of {self.num_experts} (ep {self.ep_group.size})"
        )

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        tokens, k = top_k_index.shape
        expert = top_k_index.reshape(-1)
        token = torch.arange(tokens, device=expert.device).repeat_interleave(k)
        weight = top_k_weights.reshape(-1)
        kept = expert < self.num_experts  # transformers' sentinel E: no expert
        expert, token, weight = expert[kept], token[kept], weight[kept]
        order = torch.argsort(expert, stable=True)
        expert, token, weight = expert[order], token[order], weight[order]

        group = self.ep_group
        send = torch.bincount(
            expert // self.num_local_experts, minlength=group.size
        ).tolist()  # rows for each rank, in rank order since experts are sorted
        recv = exchange_counts(torch.tensor(send, dtype=torch.int64), group)
        rows = exchange_rows_grad(hidden_states[token], send, recv, group)
        local = exchange_rows(expert, send, recv, group) - self.first_expert
        out = exchange_rows_grad(self._compute(rows, local), recv, send, group)
        out = out * weight[:, None]
        final = torch.zeros_like(hidden_states)
        return final.index_add(0, token, out.to(final.dtype))

    def _compute(self, rows: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(rows)
        for e in range(self.num_local_experts):
            at = (local == e).nonzero().squeeze(1)
            h = rows.index_select(0, at)
            gate, up = F.linear(h, self.gate_up_proj[e]).chunk(2, dim=-1)
            h = F.linear(self.act_fn(gate) * up, self.down_proj[e])
            out = out.index_copy(0, at, h.to(out.dtype))
        return out


def mark_expert_param(
    p: torch.Tensor, spec: ShardSpec, ep_group: ProcessGroup, moe_dp_group: ProcessGroup
) -> None:
    """An expert weight: a shard (ep_spec) over ep_group, replicated over moe_dp_group
    (ColossalAI's is_moe_tensor reads `ep_group`)."""
    p.ep_spec = spec
    p.ep_group = ep_group
    p.moe_dp_group = moe_dp_group


def is_expert_param(p: torch.Tensor) -> bool:
    return hasattr(p, "ep_spec")


@torch.no_grad()
def apply_expert_parallel(
    model: nn.Module, ep_group: ProcessGroup, moe_dp_group: ProcessGroup, dp_group: ProcessGroup
) -> int:
    """Replaces every experts module of model by this rank's ExpertParallelExperts, after
    taking data-parallel rank 0's full expert weights (so every rank slices the same
    experts). Returns the number replaced; validate_experts first."""
    replaced = 0
    for name, module in list(experts_modules(model)):
        if isinstance(module, ExpertParallelExperts):
            continue
        if dp_group.size > 1:
            for t in (module.gate_up_proj, module.down_proj):
                comm.broadcast(t.data, src=dp_group.global_rank(0), group=dp_group)
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, leaf, ExpertParallelExperts(module, ep_group, moe_dp_group))
        replaced += 1
    return replaced
