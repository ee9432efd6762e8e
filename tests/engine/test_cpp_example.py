"""examples/cpp builds against the installed megalith with find_package, and runs.

This is the embedding contract of DESIGN.md (user 3): a C++ program finds the
package through `megalith.get_cmake_dir()`, links megalith::core, and gets the
same optimizer results as a double-precision reference, with no Python at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import megalith

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cpp"


def run(cmd: list[str], timeout: int, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{' '.join(cmd)} exited {result.returncode}:\n{output}"
    return output


@pytest.mark.slow
def test_cpp_example_builds_and_runs(tmp_path):
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not on PATH: pip install cmake (and ninja) to build examples/cpp")
    cmake_dir = megalith.get_cmake_dir()  # fails, naming the fix, when megalith is not installed

    build = tmp_path / "build"
    configure = [
        cmake,
        "-S",
        str(EXAMPLE),
        "-B",
        str(build),
        f"-DCMAKE_PREFIX_PATH={cmake_dir}",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    ninja = shutil.which("ninja")
    if ninja is not None:
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    out = run(configure, timeout=300)
    assert f"megalith {megalith.__version__} from" in out, out

    run([cmake, "--build", str(build), "--parallel", "2"], timeout=600)
    exe = build / "adamw_demo"
    assert exe.is_file(), f"no {exe} after the build"

    # No Python on the library path: the executable finds libmegalith_core by its RPATH.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "MEGALITH_SIMD")}
    out = run([str(exe)], timeout=300, env=env)
    assert "adamw_demo: OK" in out, out
    assert "SIMD level:" in out
    assert "simd_level_active" in out  # build_info() printed
    assert "MISMATCH" not in out
