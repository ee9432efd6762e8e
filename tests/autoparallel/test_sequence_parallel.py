"""all_to_all sequence parallelism (Ulysses) in the planner: which sp sizes are legal,
the activations it divides, its communication counted from the traced graph, the
reason when it wins, and a plan with sp > 1 training on 4 CPU ranks to plain torch's
losses."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from megalith.autoparallel import AlphaBeta, Cluster, analyze, search
from megalith.autoparallel.cost import TP_SYNC_S, predict
from megalith.autoparallel.knobs import Knobs
from megalith.autoparallel.memory import block_activation, peak_memory
from megalith.autoparallel.space import why_illegal_layout
from megalith.testing import run_grid

from .auto_workers import BATCH, SEQ, Setting, auto_train, plain_losses
from .handmade import cpu_like, gpt_analysis
from .test_auto_plugin import KEYS, close

pytestmark = pytest.mark.timeout(120)


def _model(rng: random.Random, seq: int, family: str = "gpt-tiny", **sizes):
    from megalith import models

    heads = rng.choice((4, 8))
    dims = {"vocab_size": 256, "d_model": 16 * heads, "n_layers": rng.choice((2, 3))}
    dims |= {"n_heads": heads, "max_seq_len": seq, **sizes}
    if family == "gpt-tiny":
        dims["d_ff"] = 4 * dims["d_model"]
    return models.create(family, device="meta", **dims)


def _cluster(world: int = 4, **memory) -> Cluster:
    profile = cpu_like()
    measured = {str(g): AlphaBeta(3e-4, 2e9) for g in (2, 4)}
    profile = replace(profile, collectives={**profile.collectives, "all_to_all": measured})
    return Cluster(profile=profile, gpus_per_node=world, **memory)


def test_sp_is_legal_where_heads_and_sequence_divide_beside_tp_and_pp():
    a = gpt_analysis(hidden=256, layers=4, heads=4, seq_len=96)
    c = Cluster(profile=cpu_like(), gpus_per_node=8)
    assert why_illegal_layout(a, c, tp=1, pp=1, sp=4) is None
    assert why_illegal_layout(a, c, tp=2, pp=2, sp=2) is None  # beside tp and a pipeline
    assert "must divide the 4 heads" in why_illegal_layout(a, c, tp=2, pp=1, sp=4)
    odd = replace(a, seq_len=98)  # 98 tokens do not split over 4
    assert "the sequence of 98" in why_illegal_layout(odd, c, tp=1, pp=1, sp=4)
    ranked = search(a, c, global_batch_tokens=96 * 8, precision="fp32", sp=2, top=50)
    assert ranked and all(x.sp == 2 and a.heads % (x.tp * 2) == 0 for x in ranked)
    assert any(x.pp > 1 for x in ranked)  # sp beside a pipeline is in the search
    assert all(x.to_json()["sp"] == 2 and x.to_json()["plugin"] == "hybrid" for x in ranked)


def test_sp_divides_the_layers_activations_not_the_embeddings_or_the_heads():
    rng = random.Random()
    seq = 64 * rng.choice((2, 4))
    a = analyze(_model(rng, seq), seq, precision="fp32")
    b = rng.choice((1, 2))
    layers = sum(block_activation(x, Knobs(micro_batch=b), False, 1.0) for x in a.blocks)
    ends = (a.pre.activation_bytes + a.post.activation_bytes) * b
    peaks = []
    for sp in (1, 2, 4):
        # one dp rank's model state, the same at every sp (ZeRO-1: the gradients are
        # whole, not in the activations' place as stage 0's with one micro-batch)
        knobs = Knobs(sp=sp, zero_stage=1, micro_batch=b, precision="fp32")
        m = peak_memory(a, _cluster(), knobs)
        assert m.activations == int(layers / sp + ends)
        peaks.append(m.device)
    assert peaks[0] > peaks[1] > peaks[2]


@pytest.mark.parametrize("family", ["gpt-tiny", "llama-tiny"])
def test_ulysses_communication_is_counted_from_the_graph(family):
    rng = random.Random()
    seq, b, m = 32 * rng.choice((1, 2)), rng.choice((1, 2)), rng.choice((1, 2))
    extra = {"n_kv_heads": 2} if family == "llama-tiny" else {}
    model = _model(rng, seq, family, **extra)
    a = analyze(model, seq, precision="fp32")
    hidden = a.hidden
    for block, module in zip(a.blocks, model.blocks):
        # q, k, v (grouped kv heads expanded to q's, as Ulysses sends them) and the output
        assert block.attention_io_bytes == 4 * seq * hidden * 4
        assert block.param_tensors == len(list(module.parameters()))
    c = _cluster()
    a2a, ar, ag = (
        c.profile.collectives[op]["2"] for op in ("all_to_all", "all_reduce", "all_gather")
    )
    got = predict(a, c, dp=2, sp=2, micro_batch=b, num_microbatches=m, precision="fp32")
    sync = TP_SYNC_S["gloo"]  # each blocking collective's wait for its partner, as tp's
    per_layer = 2 * 4 * (a2a.time(seq * hidden * 4 * b / 2) + sync)  # 4 all-to-alls each way
    per_layer_grads = [
        x.param_tensors * (ar.time(x.params * 4 / x.param_tensors) + sync) for x in a.blocks
    ]
    span = 2 * (ag.time(seq * hidden * 4 * b) + sync)  # gathered after the last layer, grads
    want = m * (len(a.blocks) * per_layer + sum(per_layer_grads) + span)
    assert got.breakdown["tp_sp_comm"] == pytest.approx(want, rel=1e-9)
    assert predict(a, c, dp=4, micro_batch=b, precision="fp32").breakdown["tp_comm"] == 0


def test_when_only_sp_fits_the_winners_reason_says_so():
    rng = random.Random()
    seq = 1024 * rng.choice((2, 4))
    a = analyze(_model(rng, seq), seq, precision="fp32")
    tokens = seq * 4  # a sequence per rank: dp alone cannot split one further
    roomy = _cluster()
    # without sp (nor tp or pp) the most frugal plan: ZeRO-3, all offloaded, all recomputed
    frugal = Knobs(dp=4, zero_stage=3, offload="host", offload_fraction=1.0, ckpt=1.0)
    smallest = peak_memory(a, roomy, replace(frugal, precision="fp32")).device
    tight = replace(roomy, device_memory_bytes=smallest - 1)
    ranked = search(
        a, tight, global_batch_tokens=tokens, precision="fp32", memory_headroom=1.0, tp=1, pp=1
    )
    winner = ranked[0]
    first = winner.reason.splitlines()[0]
    assert winner.sp > 1 and winner.predicted_peak_bytes < smallest
    assert f"sp{winner.sp} because no plan without sequence parallelism fits" in first, first
    assert "activations" in first, first


def test_a_plan_with_sp_trains_on_4_ranks_as_plain_torch():
    seed = random.randrange(1000)
    settings = [
        Setting(seed, kwargs={"constraints": {"sp": 2, "tp": 1}}),  # dp 2 x sp 2
        Setting(seed, kwargs={"constraints": {"sp": 2, "tp": 2}}),  # tp 2 x sp 2
        Setting(seed, kwargs={"constraints": {"sp": 2, "tp": 1}}, hf=True),  # transformers'
    ]
    for setting, runs in zip(settings, run_grid(auto_train, settings, 4, timeout=100)):
        reference = plain_losses(seed, setting.hf)
        plans = [r["plan"] for r in runs]
        assert all(p == plans[0] for p in plans), "ranks ran different plans"
        chosen = plans[0]["chosen"]
        assert set(KEYS) <= set(chosen) and chosen["sp"] == 2 and chosen["plugin"] == "hybrid"
        assert chosen["dp"] * chosen["tp"] * chosen["sp"] == 4
        assert chosen["dp"] * chosen["micro_batch"] * chosen["num_microbatches"] == BATCH
        assert plans[0]["seq_len"] == SEQ
        losses = runs[0]["losses"]
        assert close(losses, reference, 1e-5), f"sp2 tp{chosen['tp']}: {losses} vs {reference}"
