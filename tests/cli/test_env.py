"""The command line: `python -m megalith` / `megalith` top-level flags and `megalith env`."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import megalith
from megalith.cli import env as env_cmd
from megalith.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ["megalith", "build", "cpu", "cuda", "nccl", "torch", "packages"]
BUILD_KEYS = (
    "version",
    "cxx_compiler",
    "cxx_flags",
    "build_type",
    "simd_levels_compiled",
    "simd_level_best",
    "simd_level_active",
    "threads",
)
CUDA_KEYS = ("cuda_compiled", "cuda_archs", "cuda_status")


def run_module(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "megalith", *args], capture_output=True, text=True, timeout=120
    )


# -- top-level flags -----------------------------------------------------------


def test_cmake_dir_holds_megalith_config():
    result = run_module("--cmake-dir")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert path.is_dir(), path
    assert (path / "megalithConfig.cmake").is_file()
    assert (path / "megalithConfigVersion.cmake").is_file()
    assert (path / "megalithTargets.cmake").is_file()
    assert path == Path(megalith.get_cmake_dir())


def test_include_dir_holds_headers():
    result = run_module("--include-dir")
    assert result.returncode == 0, result.stderr
    path = Path(result.stdout.strip())
    assert (path / "megalith" / "megalith.h").is_file()
    assert (path / "megalith" / "config.h").is_file(), "the generated config.h is not installed"


def test_version_matches_pyproject():
    result = run_module("--version")
    assert result.returncode == 0, result.stderr
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE).group(1)
    assert result.stdout.strip() == megalith.__version__ == declared


def test_no_arguments_prints_help():
    result = run_module()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m megalith")
    for word in ("--cmake-dir", "--include-dir", "--version", "env"):
        assert word in result.stdout


def test_flags_are_exclusive(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version", "--cmake-dir"])
    assert exit_info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_main_in_process(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == megalith.__version__


def test_import_megalith_is_cheap():
    code = "import sys, megalith; print(sorted(m for m in ('megalith._engine', 'torch') if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", "import megalith must not load the engine or torch"


# -- megalith env ---------------------------------------------------------------


def test_env_json_shows_every_section_and_key():
    result = run_module("env", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert list(report) == SECTIONS

    assert report["megalith"]["version"] == megalith.__version__
    assert Path(report["megalith"]["location"]) == Path(megalith.__file__).resolve().parent
    assert Path(report["megalith"]["engine"]).is_file(), report["megalith"]["engine"]
    assert Path(report["megalith"]["cmake_dir"], "megalithConfig.cmake").is_file()

    build = report["build"]
    for key in BUILD_KEYS:
        assert key in build, f"build section lacks {key}: {build}"
        assert not str(build[key]).startswith("unavailable"), (key, build[key])
    assert build["version"] == megalith.__version__
    compiled = build["simd_levels_compiled"].replace(",", " ").split()
    assert "scalar" in compiled
    assert build["simd_level_active"].split()[0] in compiled
    assert build["simd_level_best"] in compiled
    assert int(build["threads"]) >= 1

    for key in CUDA_KEYS:
        assert key in report["cuda"], f"cuda section lacks {key}: {report['cuda']}"
    assert "library" in report["nccl"]
    assert set(report["cpu"]) >= {"model", "machine", "flags"}
    assert report["torch"]["version"]
    assert list(report["packages"]) == [f"megalith_{n}" for n in env_cmd.SUBPACKAGES]


def test_env_text_report():
    result = run_module("env")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    for section in SECTIONS:
        assert f"[{section}]" in result.stdout
    for label in ("simd level active", "simd level best", "cuda status", "library", "flags"):
        assert label in result.stdout


def test_megalith_console_script():
    script = shutil.which("megalith", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip(
            f"no `megalith` script next to {sys.executable}: megalith is not pip-installed here"
        )
    result = subprocess.run([script, "env"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "[build]" in result.stdout and "[nccl]" in result.stdout


def test_env_survives_failing_probes(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(megalith, "build_info", boom)
    monkeypatch.setattr(env_cmd, "_cpu_model", boom)
    monkeypatch.setattr(env_cmd, "torch_section", boom)
    monkeypatch.setattr(env_cmd, "find_nccl", boom)

    assert env_cmd.run(argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    for section in SECTIONS:
        assert f"[{section}]" in out
    assert (
        out.count("unavailable: RuntimeError: probe exploded") == 5
    )  # build, cuda, cpu model, nccl, torch

    assert env_cmd.run(argparse.Namespace(json=True)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"] == {"error": "unavailable: RuntimeError: probe exploded"}
    assert report["cpu"]["model"] == "unavailable: RuntimeError: probe exploded"
    assert report["cpu"]["machine"]


# -- NCCL discovery ---------------------------------------------------------------


def build_fake_nccl(directory: Path, version_code: int) -> Path:
    """A libnccl.so.2 whose only symbol is ncclGetVersion."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build a stand-in libnccl.so.2")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "fake_nccl.c"
    source.write_text(f"int ncclGetVersion(int* v) {{ *v = {version_code}; return 0; }}\n")
    lib = directory / env_cmd.NCCL_SONAME
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(source)], check=True, timeout=60)
    return lib


@pytest.mark.parametrize(("code", "expected"), [(22703, "2.27.3"), (2708, "2.7.8")])
def test_nccl_version_read_through_ctypes(tmp_path, code, expected):
    lib = build_fake_nccl(tmp_path / str(code), code)
    assert env_cmd.nccl_version(lib) == expected


def test_nccl_search_order(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    wheres = [where for where, _ in env_cmd.nccl_candidates()]
    assert wheres.index("$CUDA_HOME") < wheres.index("CUDA toolkit")
    if "nvidia-nccl-cu13 wheel" in wheres:
        assert wheres.index("nvidia-nccl-cu13 wheel") < wheres.index("$CUDA_HOME")
    assert (
        "$CUDA_HOME",
        tmp_path / "cuda" / "lib64" / env_cmd.NCCL_SONAME,
    ) in env_cmd.nccl_candidates()


def test_nccl_found_in_cuda_home(tmp_path, monkeypatch):
    lib = build_fake_nccl(tmp_path / "cuda" / "lib64", 22703)
    candidates = [("$CUDA_HOME", lib)]
    monkeypatch.setattr(env_cmd, "nccl_candidates", lambda: candidates)
    assert env_cmd.nccl_section() == {
        "library": str(lib),
        "found_in": "$CUDA_HOME",
        "version": "2.27.3",
    }


def test_nccl_found_through_ldconfig(tmp_path, monkeypatch):
    lib = tmp_path / env_cmd.NCCL_SONAME
    listing = (
        "3 libs found in cache `/etc/ld.so.cache'\n"
        "\tlibnccl.so (libc6,x86-64) => /elsewhere/libnccl.so\n"
        f"\tlibnccl.so.2 (libc6,x86-64) => {lib}\n"
    )
    monkeypatch.setattr(env_cmd, "nccl_candidates", lambda: [("CUDA toolkit", tmp_path / "nope")])
    monkeypatch.setattr(env_cmd.shutil, "which", lambda name: "/sbin/ldconfig")
    monkeypatch.setattr(
        env_cmd.subprocess,
        "run",
        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=listing, stderr=""),
    )
    assert env_cmd.find_nccl() == ("ldconfig", lib)


def test_nccl_missing_names_the_fix(monkeypatch):
    monkeypatch.setattr(env_cmd, "nccl_candidates", lambda: [])
    monkeypatch.setattr(env_cmd, "_ldconfig_nccl", lambda: None)
    assert env_cmd.nccl_section() == {"library": "not found: pip install nvidia-nccl-cu13"}
