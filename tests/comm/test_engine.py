"""The engine's NCCL binding where no GPU is needed: where libnccl is looked for,
what is said when it is missing, and arguments refused before CUDA or NCCL."""

from __future__ import annotations

import pytest

from megalith import _engine


@pytest.fixture
def search_path():
    """set_nccl_search_path for one test, cleared afterwards."""
    yield _engine.set_nccl_search_path
    _engine.set_nccl_search_path("")


def test_search_order(search_path, monkeypatch, tmp_path):
    search_path("/opt/wheel/nvidia/nccl/lib")
    monkeypatch.setenv("MEGALITH_NCCL_PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda")
    assert _engine.nccl_search_candidates() == [
        "/opt/wheel/nvidia/nccl/lib/libnccl.so.2",
        f"{tmp_path}/libnccl.so.2",
        "/opt/cuda/lib64/libnccl.so.2",
        "/usr/local/cuda/lib64/libnccl.so.2",
        "libnccl.so.2",
    ]


def test_availability_never_raises(search_path):
    search_path("/nonexistent")
    assert isinstance(_engine.nccl_available(), bool)
    if not _engine.cuda_compiled():
        assert _engine.nccl_available() is False


def test_missing_nccl_says_where_it_looked_and_how_to_get_it():
    if _engine.nccl_available():
        pytest.skip("NCCL loads here")
    with pytest.raises(RuntimeError) as info:
        _engine.nccl_version()
    text = str(info.value)
    if _engine.cuda_compiled():
        assert "pip install nvidia-nccl-cu13" in text
        assert "libnccl.so.2" in text
    else:
        assert "built without CUDA" in text


def test_constructor_arguments_are_checked_first():
    with pytest.raises(ValueError, match="128 bytes"):
        _engine.NcclCommunicator(b"x" * 10, 2, 0, 0)
    with pytest.raises(ValueError, match=r"rank 5 is outside 0\.\.1"):
        _engine.NcclCommunicator(bytes(128), 2, 5, 0)
    with pytest.raises(ValueError, match="timeout_s"):
        _engine.NcclCommunicator(bytes(128), 1, 0, 0, timeout_s=-1.0)


def test_without_a_gpu_the_constructor_says_why():
    if _engine.cuda_device_count() > 0:
        pytest.skip("a GPU is present")
    with pytest.raises((RuntimeError, ValueError)) as info:
        _engine.NcclCommunicator(bytes(128), 1, 0, 0, name="dp")
    text = str(info.value)
    if not _engine.cuda_compiled():
        assert "built without CUDA" in text
    else:  # NCCL missing, or no device to put the communicator on
        assert "pip install nvidia-nccl-cu13" in text or "does not exist" in text
