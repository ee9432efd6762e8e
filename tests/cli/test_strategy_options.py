"""`megalith train` and `megalith plan` read one set of strategy options into the same
Strategy; the old spellings still work, each with a one-line note naming the new one."""

from __future__ import annotations

import argparse

import pytest

from megalith.cli.main import build_parser, main
from megalith.strategy import Strategy
from megalith.train.options import add_options, to_argv
from megalith_offload import OffloadConfig


def train_args(*words: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="megalith train")
    add_options(p)
    return p.parse_args(list(words))


def plan_args(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(["plan", *words])


# Shared by both commands; the train side turns off its default clipping, which `megalith
# plan` has no option for.
SAME = [
    ["--plugin", "zero2", "--precision", "bf16"],
    ["--plugin", "gemini", "--precision", "bf16", "--offload", "host", "--optim-frac", "0.5"],
    ["--plugin", "zero2", "--precision", "bf16", "--offload", "nvme", "--master-tier", "nvme"],
    ["--plugin", "gemini", "--precision", "bf16", "--offload", "auto", "--device-budget-gb", "8"],
    [
        *("--plugin", "zero2", "--precision", "bf16", "--offload", "host+nvme"),
        *("--host-budget-gb", "4", "--swap-dir", "/tmp"),
    ],
]


@pytest.mark.parametrize("words", SAME)
def test_train_and_plan_read_the_same_strategy(words):
    train = Strategy.from_cli(train_args(*words, "--max-norm", "0"))
    plan = Strategy.from_cli(plan_args(*words))
    assert train == plan


def test_the_strategy_the_options_name():
    s = Strategy.from_cli(
        plan_args("--plugin", "gemini", "--offload", "nvme", "--param-frac", "0.5",
                  "--param-tier", "nvme", "--host-budget-gb", "2")
    )  # fmt: skip
    assert (s.plugin, s.zero_stage, s.precision, s.max_norm) == ("gemini", 3, "bf16", 0.0)
    assert s.offload == OffloadConfig(
        tier="nvme", param_frac=0.5, param_tier="nvme", host_budget_bytes=2_000_000_000
    )
    auto = Strategy.from_cli(train_args("--offload", "auto", "--device-budget-gb", "1.5"))
    assert auto.plugin == "zero2"  # ddp offloads as ZeRO-2
    assert auto.offload == OffloadConfig(placement="auto", device_budget_bytes=1_500_000_000)
    assert auto.max_norm == 1.0 and auto.precision == "fp32"  # train's defaults on CPU ranks


@pytest.mark.parametrize(
    ("old", "new", "note"),
    [
        (
            ["--offload", "cpu"],
            ["--offload", "host"],
            "--offload cpu is deprecated; use --offload host",
        ),
        (
            ["--offload", "nvme", "--nvme-masters"],
            ["--offload", "nvme", "--master-tier", "nvme"],
            "--nvme-masters is deprecated; use --master-tier nvme",
        ),
        (["--stage", "1"], ["--plugin", "zero1"], "--stage 1 is deprecated; use --plugin zero1"),
        (["--stage", "3"], ["--plugin", "gemini"], "--stage 3 is deprecated; use --plugin gemini"),
    ],
)
@pytest.mark.parametrize("parse", [train_args, plan_args])
def test_old_spellings_still_work_with_a_note(parse, old, new, note, capsys):
    assert vars(parse(*old)) == vars(parse(*new))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and note in err, err


def test_ranks_get_the_new_spellings(capsys):
    """The launcher passes the options on to the ranks in their new names only, so the
    notes are printed once, by the launcher."""
    argv = to_argv(train_args("--offload", "nvme", "--nvme-masters", "--stage", "3"))
    capsys.readouterr()
    assert "--nvme-masters" not in argv and "--stage" not in argv
    assert vars(train_args(*argv)) == vars(train_args("--offload", "nvme", "--master-tier",
                                                      "nvme", "--plugin", "gemini"))  # fmt: skip
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--offload", "host", "--swap-dir", "/tmp"], "--swap-dir /tmp is for --offload nvme"),
        (
            ["--master-tier", "nvme", "--offload", "host"],
            "--master-tier nvme is for --offload nvme",
        ),
        (["--host-budget-gb", "4"], "--host-budget-gb is for --offload auto, host"),
        (["--param-frac", "0.5"], "add --offload host, nvme or host+nvme"),
        (["--offload", "auto", "--device-budget-gb", "0"], "expected a positive size"),
        (["--offload", "host+nvme"], "needs host_budget_bytes"),
        (["--offload", "host", "--param-frac", "0.5"], "use plugin='gemini'"),
    ],
)
def test_options_that_cannot_work_name_the_fix(words, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        Strategy.from_cli(plan_args(*words))


def test_plan_without_zero_says_so():
    with pytest.raises(SystemExit, match="plugin='ddp' at ZeRO stage 0 shards nothing"):
        main(["plan", "--plugin", "ddp"])
