"""AutoParallel on bad input (issue 18, deliverable 7): no chosen plan ever exceeds the
memory budget (a property over models and clusters); a model that fits nowhere says the
least memory it needs and which knob gets closest, and what it says works when taken;
an impossible constraint names the constraint."""

from __future__ import annotations

import dataclasses
import random
import re

import pytest

from megalith import models
from megalith.autoparallel import AlphaBeta, Cluster, analyze
from megalith.autoparallel.knobs import Knobs
from megalith.autoparallel.memory import peak_memory
from megalith.autoparallel.search import NoFeasiblePlan, search

from .handmade import cpu_like, gpt_analysis, h200_cluster, h200_like

pytestmark = pytest.mark.timeout(120)
GB = 10**9


def _knobs(c) -> Knobs:
    fields = {f.name for f in dataclasses.fields(Knobs)} - {"precision"}
    return Knobs(**{k: getattr(c, k) for k in fields})


def _budgets(cluster: Cluster, headroom: float) -> tuple[int, int]:
    device = cluster.device_memory_bytes or cluster.profile.device_memory_bytes
    host = cluster.host_memory_bytes or cluster.profile.host_memory_bytes
    return int(device * headroom), int(host * headroom) // cluster.per_node


def _random_case(rng: random.Random):
    """A model (handmade GPT or a traced preset) and a cluster of random memory."""
    if rng.random() < 0.25:
        name = rng.choice(("gpt-tiny", "llama-tiny"))
        model = models.create(name, n_layers=rng.choice((2, 4)))
        analysis = analyze(model, rng.choice((128, 256)), name=name)
    else:
        heads = rng.choice((8, 16, 32))
        analysis = gpt_analysis(
            hidden=heads * rng.choice((64, 128)),
            layers=rng.choice((4, 8, 16)),
            heads=heads,
            seq_len=rng.choice((512, 1024, 2048)),
        )
        model = None
    if rng.random() < 0.5:
        nodes = rng.choice((1, 2, 4))
        cluster = dataclasses.replace(
            h200_cluster(nodes),
            device_memory_bytes=int(rng.uniform(0.3, 141) * GB),
            host_memory_bytes=int(rng.uniform(8, 2000) * GB),
        )
    else:
        cluster = Cluster(
            profile=cpu_like(),
            gpus_per_node=rng.choice((2, 4)),
            device_memory_bytes=int(rng.uniform(0.3, 8) * GB),
        )
    return analysis, model, cluster


def test_no_candidate_ever_exceeds_the_budget():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    outcomes = {"planned": 0, "fits nowhere": 0}
    for _ in range(14):
        analysis, model, cluster = _random_case(rng)
        headroom = rng.choice((0.8, 0.9, 1.0))
        budget, host_budget = _budgets(cluster, headroom)
        tokens = analysis.seq_len * cluster.world * rng.choice((1, 2, 4))
        try:
            ranked = search(
                analysis, cluster, global_batch_tokens=tokens, memory_headroom=headroom,
                top=rng.choice((3, 8)), model=model,
            )  # fmt: skip
        except NoFeasiblePlan as err:
            outcomes["fits nowhere"] += 1
            assert err.smallest_bytes > budget or "host" in str(err), (seed, str(err))
            continue
        outcomes["planned"] += 1
        for c in ranked:
            m = peak_memory(analysis, cluster, _knobs(c), model)
            assert c.predicted_peak_bytes == m.device <= budget, (seed, c)
            assert m.host <= host_budget, (seed, c)
    # tight memory forces the other branch where the random cases never reached it
    a = gpt_analysis(hidden=4096, layers=32, heads=32)
    tight = Cluster(profile=cpu_like(), device_memory_bytes=2 * GB)
    with pytest.raises(NoFeasiblePlan) as info:
        search(a, tight, global_batch_tokens=a.seq_len * 4)
    assert info.value.smallest_bytes > 2 * GB * 0.9
    assert outcomes["planned"] > 0, (seed, outcomes)


def test_fits_nowhere_names_the_need_and_the_knob_that_works():
    a = gpt_analysis(hidden=4096, layers=16, heads=32, seq_len=1024)
    small = Cluster(profile=cpu_like(), device_memory_bytes=3 * GB, host_memory_bytes=400 * GB)
    with pytest.raises(NoFeasiblePlan) as info:
        search(a, small, global_batch_tokens=a.seq_len * 64)
    err, text = info.value, str(info.value)
    assert err.smallest_bytes > 3 * GB * 0.9
    assert f"needs {err.smallest_bytes / GB:.1f} GB per device" in text
    assert f"the smallest plan ({err.closest})" in text and "the knob that gets closest" in text
    # the device count it names fits, at the same batch
    found = re.search(r"(\d+) devices \((\d+) nodes of (\d+)", text)
    assert found, text
    world, nodes, per_node = map(int, found.groups())
    assert world == nodes * per_node > small.world
    more = dataclasses.replace(small, nodes=nodes, inter_node=AlphaBeta(1e-4, 1e9))
    assert search(a, more, global_batch_tokens=a.seq_len * 64)
    # and so does the device size it names
    gb = float(re.search(r"a device of at least ([\d.]+) GB", text).group(1))
    bigger = dataclasses.replace(small, device_memory_bytes=int(gb * GB))
    ranked = search(a, bigger, global_batch_tokens=a.seq_len * 64)
    assert ranked[0].predicted_peak_bytes <= gb * GB * 0.9


def test_host_memory_is_named_when_it_is_the_limit():
    a = gpt_analysis(hidden=8192, layers=32, heads=64, seq_len=1024)
    c = dataclasses.replace(h200_cluster(), device_memory_bytes=60 * GB, host_memory_bytes=64 * GB)
    with pytest.raises(NoFeasiblePlan) as info:
        search(a, c, global_batch_tokens=a.seq_len * 64)
    text = str(info.value)
    assert "on the host" in text and "the knob that gets closest is host memory" in text, text
    gb = float(re.search(r"give at least ([\d.]+) GB per node \(--host-gb\)", text).group(1))
    assert gb > 64
    roomy = dataclasses.replace(c, host_memory_bytes=int(gb * GB))
    for p in search(a, roomy, global_batch_tokens=a.seq_len * 64):
        assert p.offload == "host"


def test_activations_that_no_device_count_splits_say_so():
    """3 heads: no tp or sp on powers of two, and one layer recomputed does not fit."""
    a = gpt_analysis(hidden=192, layers=4, heads=3, seq_len=16384, vocab=512)
    c = dataclasses.replace(h200_cluster(), device_memory_bytes=3 * GB)
    with pytest.raises(NoFeasiblePlan) as info:
        search(a, c, global_batch_tokens=a.seq_len * 8)
    text = str(info.value)
    assert "more devices do not help" in text and "--seq-len" in text, text
    assert re.search(r"tp=\d: the model's 3 heads are not divisible by \d", text), text


def test_impossible_constraints_are_named():
    a = gpt_analysis(hidden=1024, layers=8, heads=32)
    c = h200_cluster()
    tokens = a.seq_len * 32
    cases = [
        ({"tp": 3}, NoFeasiblePlan, r"tp=3: no dp x tp x pp x sp of the world of 8"),
        ({"tp": 8, "zero_stage": 3}, NoFeasiblePlan, r"zero_stage=3 with tp=8.*stages 0-2"),
        ({"zero_stage": 0, "offload": "host"}, NoFeasiblePlan, r"offloading needs ZeRO stage"),
        ({"pp": 1, "schedule": "1f1b"}, NoFeasiblePlan, r"schedule=1f1b at pp=1"),
        ({"dp": 8, "micro_batch": 3}, NoFeasiblePlan, r"micro_batch / num_microbatches"),
        (
            {"pp": 8, "tp": 1, "micro_batch": 8},
            NoFeasiblePlan,
            r"pp=8 1f1b: 32 sequences per dp rank in micro-batches of 8 or more are fewer than",
        ),
        ({"ckpt": 0.3}, NoFeasiblePlan, r"ckpt=0.3: the shares"),
        ({"zero_stage": 5}, ValueError, r"zero_stage=5: 5 is not one of \(0, 1, 2, 3\)"),
        ({"tp": 0}, ValueError, r"tp=0: 0 is not an int >= 1"),
        ({"ckpt": 2.0}, ValueError, r"ckpt=2.0: 2.0 is not a share"),
    ]
    for constraint, kind, message in cases:
        with pytest.raises(kind, match=message):
            search(a, c, global_batch_tokens=tokens, **constraint)
    with pytest.raises(NoFeasiblePlan, match="dp=8: the global batch of 4 sequences"):
        search(a, c, global_batch_tokens=a.seq_len * 4, dp=8)
    # a constrained search honours num_microbatches
    got = search(a, c, global_batch_tokens=tokens, dp=8, num_microbatches=2)
    assert {(x.dp, x.num_microbatches, x.micro_batch) for x in got} == {(8, 2, 2)}


def test_impossible_clusters_are_named():
    a = gpt_analysis(hidden=512, layers=4, heads=8)
    tokens = a.seq_len * 16
    bad = [
        (Cluster(profile=h200_like(), nodes=0), r"nodes=0; give an int >= 1"),
        (Cluster(profile=h200_like(), device_memory_bytes=0), r"device_memory_bytes=0"),
        (Cluster(profile=h200_like(), host_memory_bytes=-1), r"host_memory_bytes=-1"),
        (Cluster(profile=h200_like(), nodes=2), r"2 nodes needs inter_node"),
    ]
    for cluster, message in bad:
        with pytest.raises(ValueError, match=message):
            search(a, cluster, global_batch_tokens=tokens)
    for headroom in (0.0, 1.5):
        with pytest.raises(ValueError, match="memory_headroom"):
            search(a, h200_cluster(), global_batch_tokens=tokens, memory_headroom=headroom)
    with pytest.raises(ValueError, match="give a multiple of 1024"):
        search(a, h200_cluster(), global_batch_tokens=tokens + 5)


def test_a_single_micro_batch_that_fits_where_accumulation_does_not_is_found():
    """Accumulating micro-batches keeps whole gradients at stages 2-3, so the whole
    per-rank batch as one micro-batch can need less memory than micro-batches of 1."""
    a = gpt_analysis(hidden=4096, layers=16, heads=32, seq_len=1024)
    c = h200_cluster()
    frugal = {"dp": 8, "zero_stage": 3, "offload": "host", "offload_fraction": 1.0, "ckpt": 1.0}
    accumulating = peak_memory(a, c, Knobs(**frugal, micro_batch=1, num_microbatches=2)).device
    single = peak_memory(a, c, Knobs(**frugal, micro_batch=2, num_microbatches=1)).device
    assert single < accumulating
    tight = dataclasses.replace(c, device_memory_bytes=int((single + accumulating) / 2 / 0.9))
    ranked = search(a, tight, global_batch_tokens=a.seq_len * 16, dp=8, zero_stage=(2, 3))
    assert ranked and all(p.num_microbatches == 1 and p.micro_batch == 2 for p in ranked)
    budget, _ = _budgets(tight, 0.9)
    assert all(p.predicted_peak_bytes <= budget for p in ranked)
