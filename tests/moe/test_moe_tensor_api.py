"""ColossalAI's colossalai.tensor.moe_tensor.api on megalith's experts: after
MoeHybridParallelPlugin(ep_size=2) boosts a tiny Mixtral on 4 CPU ranks (ep 2 x moe_dp 2),
each expert weight reports its groups, sizes and ranks, and the groups work with
torch.distributed as ColossalAI scripts use them."""

from __future__ import annotations

import pytest

from megalith.testing import run_distributed

pytest.importorskip("transformers")


def _api_case(rank: int) -> list[str]:
    import torch
    import torch.distributed as dist

    from megalith.booster import Booster
    from megalith.booster.plugin import MoeHybridParallelPlugin
    from megalith.tensor.moe_tensor import api
    from tests.moe.moe_workers import tiny

    model = tiny("mixtral", 4, 7)
    plugin = MoeHybridParallelPlugin(tp_size=1, pp_size=1, ep_size=2, precision="fp32")
    model, *_ = Booster(plugin=plugin).boost(model)
    errors = []
    experts = [p for p in model.unwrap().parameters() if api.is_moe_tensor(p)]
    if len(experts) != 4:  # gate_up_proj and down_proj of 2 layers
        errors.append(f"{len(experts)} expert weights")
    p = experts[0]
    ep_rank, dp_rank = rank % 2, rank // 2  # dp rank = moe_dp rank x ep + ep rank
    got = (api.get_ep_size(p), api.get_dp_size(p), api.get_ep_rank(p), api.get_dp_rank(p))
    if got != (2, 2, ep_rank, dp_rank):
        errors.append(f"sizes and ranks {got}")
    if api.get_ep_group_ranks(p) != [rank - ep_rank, rank - ep_rank + 1]:
        errors.append(f"ep ranks {api.get_ep_group_ranks(p)}")
    if api.get_dp_group_ranks(p) != [ep_rank, ep_rank + 2]:
        errors.append(f"dp ranks {api.get_dp_group_ranks(p)}")
    for name, group in (("ep", api.get_ep_group(p)), ("dp", api.get_dp_group(p))):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        want = sum(api.get_ep_group_ranks(p) if name == "ep" else api.get_dp_group_ranks(p))
        if dist.get_world_size(group) != 2 or float(t) != want:
            errors.append(f"{name} group: size {dist.get_world_size(group)}, sum {float(t)}")
    dense = model.unwrap().model.embed_tokens.weight
    if api.is_moe_tensor(dense):
        errors.append("a dense weight reported as an expert")
    return errors


@pytest.mark.timeout(90)
def test_expert_weights_report_their_groups():
    for errors in run_distributed(_api_case, 4, timeout=80):
        assert errors == []
