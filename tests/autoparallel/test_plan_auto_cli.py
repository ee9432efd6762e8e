"""`megalith plan --auto`: the ranked table, --json's keys and order (the same plans the
search API gives), a transformers directory read from its config.json alone, CPU ranks
on this machine, and every bad option as one line on stderr with exit status 2 before
any model is built."""

from __future__ import annotations

import json
import random

import pytest

from megalith import models
from megalith.autoparallel import Cluster, analyze
from megalith.autoparallel.profiles import with_group_sizes
from megalith.autoparallel.search import search
from megalith.cli import plan_auto
from megalith.cli.main import main

from .handmade import h200_like

pytestmark = pytest.mark.timeout(120)

JSON_KEYS = {
    "dp", "tp", "pp", "sp", "zero_stage", "offload", "micro_batch", "num_microbatches",
    "ckpt", "schedule", "predicted_step_s", "predicted_tokens_per_s", "predicted_peak_bytes",
}  # fmt: skip
COLUMNS = "# dp tp pp sp zero offload mb nmb ckpt schedule step s tokens/s MFU peak GiB"


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "h200-like.json"
    h200_like().save(path)
    return str(path)


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", "--auto", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_table_ranks_plans_with_reasons(capsys, profile):
    gpus = random.choice((2, 4, 8))
    rc, out, err = _plan(capsys, "--model", "llama-tiny", "--profile", profile,
                         "--gpus", str(gpus), "--top", "4")  # fmt: skip
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("llama-tiny:") and "sequence 256" in lines[0]
    assert f"1 node(s) x {gpus} H200" in lines[1]
    assert " ".join(lines[2].split()) == COLUMNS
    rows = [line.split() for line in lines[3:] if line.split()[0].isdigit()]
    assert [r[0] for r in rows] == [str(i) for i in range(1, len(rows) + 1)]
    assert 1 <= len(rows) <= 4
    steps = [float(r[-4]) for r in rows]  # from the end: "host 1" is two words
    assert steps == sorted(steps) and steps[0] > 0
    for r in rows:
        assert int(r[1]) * int(r[2]) * int(r[3]) * int(r[4]) == gpus
        assert 0 < float(r[-1]) <= 141e9 * 0.9 / 2**30
    reason = lines[3 + len(rows) :]
    assert reason[0].startswith("winner dp")
    assert any(line.startswith("pp>1:") for line in reason)


def test_json_is_the_search_best_first(capsys, profile):
    layers = random.choice((2, 4))
    tokens = 256 * 8 * random.choice((4, 8))
    rc, out, err = _plan(capsys, "--model", "gpt-tiny", "--layers", str(layers),
                         "--profile", profile, "--gpus", "8", "--top", "5",
                         "--global-batch-tokens", str(tokens), "--json")  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)
    assert 1 <= len(got) <= 5
    for c in got:
        assert JSON_KEYS <= set(c)
        assert c["dp"] * c["tp"] * c["pp"] * c["sp"] == 8
        assert c["dp"] * c["micro_batch"] * c["num_microbatches"] * 256 == tokens
        assert 0 < c["predicted_peak_bytes"] <= 141e9 * 0.9
    steps = [c["predicted_step_s"] for c in got]
    assert steps == sorted(steps)
    assert got[0]["reason"].startswith("winner ")
    # the same plans as the API on the same inputs
    model = models.create("gpt-tiny", n_layers=layers)
    cluster = Cluster(profile=with_group_sizes(h200_like(), [2, 4, 8]), gpus_per_node=8)
    want = search(
        analyze(model, 256, name="gpt-tiny"), cluster, global_batch_tokens=tokens, top=5,
        model=model,
    )  # fmt: skip
    assert [{k: c[k] for k in JSON_KEYS} for c in got] == [
        {k: w.to_json()[k] for k in JSON_KEYS} for w in want
    ]


def _tiny_llama_dir(tmp_path, heads: int = 32, layers: int = 2):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=8 * heads,
        intermediate_size=16 * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        vocab_size=512,
        max_position_embeddings=128,
    )
    path = tmp_path / "tiny-llama"
    config.save_pretrained(path)
    assert sorted(p.name for p in path.iterdir()) == ["config.json"]  # no weights
    return path


def test_a_transformers_directory(capsys, tmp_path, profile):
    path = _tiny_llama_dir(tmp_path, heads=random.choice((4, 8)))
    rc, out, err = _plan(capsys, "--model", str(path), "--profile", profile, "--gpus", "4",
                         "--top", "3", "--json")  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)
    assert got and all(c["dp"] * c["tp"] * c["pp"] * c["sp"] == 4 for c in got)
    rc, out, err = _plan(capsys, "--model", str(path), "--profile", profile, "--gpus", "4")
    assert rc == 0 and out.startswith("tiny-llama:") and "sequence 128" in out


def test_an_impossible_device_count_names_the_heads(capsys, tmp_path, profile):
    """32 heads on 3 devices: no tp or sp, and dp alone cannot hold one long sequence's
    activations; 4 devices can split them."""
    path = _tiny_llama_dir(tmp_path, heads=32, layers=4)
    args = ["--model", str(path), "--profile", profile, "--seq-len", "65536",
            "--global-batch-tokens", str(65536 * 12), "--gpu-gb", "1.5", "--host-gb", "64"]  # fmt: skip
    rc, out, err = _plan(capsys, *args, "--gpus", "3")
    assert rc == 2 and out == "" and len(err.splitlines()) == 1, err
    assert err.startswith("megalith plan: error: tiny-llama fits nowhere on 3 devices")
    assert "tp=3: the model's 32 heads are not divisible by 3" in err and "needs" in err
    rc, out, err = _plan(capsys, *args, "--gpus", "4", "--json")
    assert rc == 0, err
    assert all(c["tp"] * c["sp"] > 1 for c in json.loads(out))


def test_cpu_ranks_on_this_machine(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("megalith.autoparallel.profiles.default_profile_path",
                        lambda: tmp_path / "none.json")  # fmt: skip
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    rc, out, err = _plan(capsys, "--model", "gpt-tiny", "--layers", "2", "--nproc", "2",
                         "--top", "2", "--json")  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)
    assert got and all(c["dp"] * c["tp"] * c["pp"] * c["sp"] == 2 for c in got)
    # the ci_cpu profile's host memory, shared by the two ranks
    from megalith.autoparallel import load_profile

    share = load_profile("ci_cpu").host_memory_bytes // 2
    assert all(c["predicted_peak_bytes"] <= share * 0.9 for c in got)


BAD = [
    (["--gpus", "0"], "--gpus 0: devices per node must be > 0"),
    (["--nodes", "0"], "--nodes 0: the node count must be > 0"),
    (["--gpu-gb", "0"], "--gpu-gb 0: device memory must be > 0"),
    (["--gpu-gb", "-3"], "--gpu-gb -3"),
    (["--host-gb", "-1"], "--host-gb -1"),
    (["--top", "0"], "--top 0"),
    (["--profile", "no-such"], "no machine profile 'no-such'"),
    (["--model", "llama-7x"], "unknown model 'llama-7x'"),
    (["--seq-len", "256", "--global-batch-tokens", "1000"], "give a multiple of 256, e.g. 768"),
    (["--nproc", "2", "--gpus", "2"], "--nproc plans for this machine; it takes no --gpus"),
    (["--plugin", "zero1"], "--plugin with --auto: the planner chooses it"),
    (["--world", "4"], "--world with --auto"),
    (["--offload", "host"], "--offload with --auto"),
    (["--optim-frac", "0.5"], "--optim-frac with --auto"),
    (
        ["--device-budget-gb", "40"],
        "--device-budget-gb is the exact plan's budget; with --auto give --gpu-gb",
    ),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_are_one_line_before_any_work(capsys, monkeypatch, profile, argv, message):
    def no_build(*_a, **_k):
        raise AssertionError("the model was built before the options were checked")

    monkeypatch.setattr(plan_auto, "_build", no_build)
    base = {"--model": "gpt-tiny", "--profile": profile}
    for flag in argv:
        base.pop(flag, None)
    if "--nproc" in argv:
        base.pop("--profile")
    rc, out, err = _plan(capsys, *[x for kv in base.items() for x in kv], *argv)
    assert rc == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("megalith plan: error: "), err
    assert message in err, err


def test_a_directory_without_config(capsys, tmp_path, profile):
    rc, _, err = _plan(capsys, "--model", str(tmp_path), "--profile", profile)
    assert rc == 2 and "not a directory with a transformers config.json" in err
    (tmp_path / "config.json").write_text("{not json")
    rc, _, err = _plan(capsys, "--model", str(tmp_path), "--profile", profile)
    assert rc == 2 and "not a JSON config" in err and len(err.splitlines()) == 1


def test_auto_options_without_auto_say_so(capsys):
    with pytest.raises(SystemExit, match="--gpus, --json plans with the planner: add --auto"):
        main(["plan", "--model", "gpt-tiny", "--gpus", "8", "--json"])
