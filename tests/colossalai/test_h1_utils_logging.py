"""megalith.utils, megalith.logging and megalith.interface, used as ColossalAI scripts use them."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from megalith.interface import (
    AMPModelMixin,
    ModelWrapper,
    OptimizerWrapper,
    get_pretrained_path,
    set_pretrained_path,
)
from megalith.logging import DistributedLogger, disable_existing_loggers, get_dist_logger
from megalith.utils import (
    MultiTimer,
    TensorDetector,
    Timer,
    _cast_float,
    conditional_context,
    disposable,
    ensure_path_exists,
    free_storage,
    get_current_device,
    get_non_persistent_buffers_set,
    is_ddp_ignored,
    multi_tensor_applier,
    set_seed,
)


def test_set_seed_seeds_random_numpy_and_torch(gen):
    seed = int(torch.randint(0, 2**31, (1,), generator=gen))
    set_seed(seed)
    first = (random.random(), np.random.rand(), torch.rand(3))
    set_seed(seed)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    torch.manual_seed(seed)
    assert torch.equal(first[2], torch.rand(3))


def test_small_helpers(tmp_path, gen):
    assert get_current_device() == (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    target = tmp_path / "a" / "b" / "ckpt.bin"
    ensure_path_exists(str(target))
    assert target.parent.is_dir()

    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    with conditional_context(Ctx(), enable=False):
        pass
    with conditional_context(Ctx(), enable=True):
        pass
    assert entered == [True]

    calls = []
    once = disposable(lambda x: calls.append(x) or x * 2)
    assert (once(4), once(5), calls) == (8, None, [4])

    p = torch.nn.Parameter(torch.randn(3, generator=gen))
    assert not is_ddp_ignored(p)
    p._ddp_to_ignore = True
    assert is_ddp_ignored(p)

    t = torch.randn(1000, generator=gen)
    free_storage(t)
    assert t.untyped_storage().size() == 0
    with pytest.raises(ValueError, match="offset"):
        free_storage(torch.randn(10, generator=gen)[2:])

    nested = {"a": torch.randn(2, generator=gen), "b": [torch.arange(3), (torch.ones(1),)], "c": 1}
    cast = _cast_float(nested, torch.float16)
    assert cast["a"].dtype == torch.float16 and cast["b"][0].dtype == torch.int64
    assert isinstance(cast["b"][1], tuple) and cast["b"][1][0].dtype == torch.float16
    assert cast["c"] == 1 and torch.equal(cast["a"], nested["a"].half())


def test_non_persistent_buffers_set():
    inner = torch.nn.Module()
    inner.register_buffer("scratch", torch.zeros(2), persistent=False)
    inner.register_buffer("kept", torch.zeros(2))
    outer = torch.nn.Module()
    outer.block = inner
    outer.again = inner  # shared: counted once by default
    outer.register_buffer("mask", torch.ones(1), persistent=False)
    assert get_non_persistent_buffers_set(outer) == {"mask", "block.scratch"}
    assert get_non_persistent_buffers_set(outer, remove_duplicate=False) == {
        "mask",
        "block.scratch",
        "again.scratch",
    }
    state = outer.state_dict()
    assert all(name not in state for name in get_non_persistent_buffers_set(outer))


def test_timers():
    timer = Timer()
    timer.start()
    assert timer.lap() >= 0
    first = timer.stop(keep_in_history=True)
    timer.start()
    second = timer.stop(keep_in_history=True)
    assert timer.has_history and timer.get_elapsed_time() == second
    assert timer.get_history_sum() == pytest.approx(first + second)
    assert timer.get_history_mean() == pytest.approx((first + second) / 2)
    timer.start()
    with pytest.raises(RuntimeError, match="still running"):
        timer.get_elapsed_time()
    timers = MultiTimer()
    timers.start("fwd")
    assert timers.stop("fwd", keep_in_history=True) >= 0
    assert [name for name, _ in timers] == ["fwd"] and timers.get_timer("fwd").has_history
    timers.reset()
    assert not timers.get_timer("fwd").has_history
    timers.set_status(False)
    assert not timers.is_on() and timers.stop("fwd", True) is None


def test_multi_tensor_applier_calls_the_op_in_chunks(gen):
    def scale(chunk_size, flag, lists, factor):
        for src, dst in zip(*lists):
            dst.copy_(src * factor)
        return chunk_size

    src = [torch.randn(5, generator=gen) for _ in range(3)]
    dst = [torch.empty(5) for _ in range(3)]
    flag = torch.zeros(1, dtype=torch.int)
    assert multi_tensor_applier(scale, flag, [src, dst], 3.0) == 2048 * 32
    for s, d in zip(src, dst):
        assert torch.equal(d, s * 3.0)


def test_tensor_detector_reports_new_and_freed_tensors(capsys, tmp_path, gen):
    model = torch.nn.Linear(4, 3)
    detector = TensorDetector(include_cpu=True, module=model, log=str(tmp_path / "det"))
    detector.detect()
    first = capsys.readouterr().out
    assert "weight" in first and "(3, 4)" in first and "Detect Location" in first
    probe = torch.randn(17, 19, generator=gen)
    detector.detect()
    second = capsys.readouterr().out
    assert "+  Tensor" in second and "(17, 19)" in second and "weight" not in second
    del probe
    detector.detect()
    third = capsys.readouterr().out
    assert "-  Tensor" in third and "(17, 19)" in third
    assert (tmp_path / "det.log").read_text().count("Detect Location") == 3
    detector.close()


def test_dist_logger(tmp_path, capsys):
    logger = get_dist_logger()
    assert logger is get_dist_logger("megalith") and isinstance(logger, DistributedLogger)
    with pytest.raises(ValueError, match="get_dist_logger"):
        DistributedLogger("megalith")
    logger.log_to_file(tmp_path, suffix="run")
    logger.info("to rank zero", ranks=[0])
    logger.info("to rank one", ranks=[1])  # this process is rank 0
    logger.warning("careful")
    logger.debug("hidden at INFO")
    logger.set_level("DEBUG")
    logger.debug("shown at DEBUG")
    logger.error("bad")
    logger.set_level("INFO")
    written = (tmp_path / "rank_0_run.log").read_text()
    lines = written.splitlines()
    assert "megalith - megalith - INFO: to rank zero" in lines
    assert "megalith - megalith - WARNING: careful" in lines
    assert "megalith - megalith - ERROR: bad" in lines
    assert "to rank one" not in written and "hidden at INFO" not in written
    assert "DEBUG" not in written  # the file's own level is INFO
    assert "test_h1_utils_logging.py" in lines[0] and "test_dist_logger" in lines[0]
    assert "shown at DEBUG" in capsys.readouterr().err
    with pytest.raises(ValueError, match="INFO, DEBUG, WARNING, ERROR"):
        logger.set_level("VERBOSE")
    for handler in list(logger._logger.handlers):
        if isinstance(handler, logging.FileHandler):
            logger._logger.removeHandler(handler)
            handler.close()


def test_disable_existing_loggers():
    other = logging.getLogger("h1.some.library")
    other.setLevel(logging.DEBUG)
    get_dist_logger()
    disable_existing_loggers(include=["h1.some.library"])
    assert other.level == logging.WARNING
    assert logging.getLogger("megalith").level != logging.WARNING
    other.setLevel(logging.DEBUG)


def test_interface_names(tmp_path):
    from megalith.booster import wrappers

    assert ModelWrapper is wrappers.ModelWrapper and OptimizerWrapper is wrappers.OptimizerWrapper
    model = torch.nn.Linear(2, 2)
    wrapped = ModelWrapper(ModelWrapper(model))
    assert wrapped.unwrap() is model
    x = torch.randn(3, 2)
    assert torch.equal(wrapped(x), model(x))
    AMPModelMixin().update_master_params()
    assert get_pretrained_path(model) is None
    set_pretrained_path(model, str(tmp_path))
    assert get_pretrained_path(model) == str(tmp_path)
