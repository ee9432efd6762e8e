"""`megalith env`: one screen saying what megalith was built with and what it finds here.

In the spirit of `ds_report` and `colossalai check -i`: the megalith install, the
engine build (compiler, SIMD levels, CUDA, the file I/O backend it picks here), the
CPU, NCCL, PyTorch and the sub-packages. Every probe is wrapped, so one that fails prints
"unavailable: <why>" instead of a traceback and the rest of the report still
appears. `megalith env --json` prints the same report as one JSON object:
{section: {key: value}}.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Section = dict[str, Any]
Report = dict[str, Section]

SUBPACKAGES = ("comm", "zero", "pipeline", "offload")
NCCL_SONAME = "libnccl.so.2"
NCCL_FIX = "pip install nvidia-nccl-cu13"
# CPU flags (as /proc/cpuinfo spells them) that decide which engine kernels can run.
X86_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
ARM_FLAGS = ("asimd", "asimdhp", "sve", "sve2", "bf16")


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "env",
        help="report the megalith build and what it finds on this machine",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(render(report))
    return 0


# -- probing -----------------------------------------------------------------


def unavailable(exc: BaseException) -> str:
    return f"unavailable: {type(exc).__name__}: {exc}"


def probe(fn: Callable[[], Any]) -> Any:
    """fn(), or "unavailable: <why>" when it raises."""
    try:
        return fn()
    except Exception as exc:
        return unavailable(exc)


def collect() -> Report:
    """Runs every section; a section that raises becomes {"error": "unavailable: ..."}."""
    sections: dict[str, Callable[[], Section]] = {
        "megalith": megalith_section,
        "build": build_section,
        "cpu": cpu_section,
        "cuda": cuda_section,
        "nccl": nccl_section,
        "torch": torch_section,
        "packages": packages_section,
    }
    report: Report = {}
    for name, fn in sections.items():
        try:
            report[name] = fn()
        except Exception as exc:
            report[name] = {"error": unavailable(exc)}
    return report


def megalith_section() -> Section:
    import megalith
    import megalith_core

    def engine_file() -> str:
        return str(importlib.import_module("megalith_core._engine").__file__)

    return {
        "version": megalith.__version__,
        "location": str(Path(megalith.__file__).resolve().parent),
        "core": f"{megalith_core.__version__} ({Path(megalith_core.__file__).resolve().parent})",
        "engine": probe(engine_file),
        "cmake_dir": probe(megalith_core.get_cmake_dir),
    }


# build_info() keys shown in the build section, in this order; any other key the
# engine reports follows them, except cuda_* keys, which go to the cuda section.
_BUILD_KEYS = (
    "version",
    "cxx_compiler",
    "cxx_flags",
    "build_type",
    "simd_levels_compiled",
    "simd_level_best",
    "simd_level_active",
    "threads",
)
_CUDA_KEYS = ("cuda_compiled", "cuda_archs", "cuda_status")


def build_section() -> Section:
    import megalith

    info = megalith.build_info()
    section: Section = {
        key: info.get(key, "unavailable: not in build_info()") for key in _BUILD_KEYS
    }
    if os.environ.get("MEGALITH_SIMD"):
        section["simd_level_active"] += f" (MEGALITH_SIMD={os.environ['MEGALITH_SIMD']})"
    for key, value in info.items():
        if key not in section and not key.startswith("cuda_"):
            section[key] = value
    section["io_backend"] = probe(_io_backend)
    return section


def _io_backend() -> str:
    """The backend a default AsyncIO takes here: "uring", or "threads" and why not io_uring."""
    from megalith import _engine

    picked = _engine.io.AsyncIO(threads=1).backend
    env = os.environ.get("MEGALITH_IO_BACKEND")
    if env:
        return f"{picked} (MEGALITH_IO_BACKEND={env})"
    why = _engine.io.uring_unavailable_reason().split("; use the thread backend")[0]
    return f"{picked} ({why})" if picked == "threads" and why else picked


def cpu_section() -> Section:
    flags = probe(_cpu_flags)
    relevant = ARM_FLAGS if platform.machine().lower() in ("aarch64", "arm64") else X86_FLAGS
    section: Section = {
        "model": probe(_cpu_model),
        "machine": platform.machine() or "unknown",
        "cpus_usable": probe(lambda: len(os.sched_getaffinity(0))),
    }
    if isinstance(flags, str):  # the probe failed
        section["flags"] = flags
    else:
        section["flags"] = " ".join(f for f in relevant if f in flags) or "none"
        section["flags_missing"] = " ".join(f for f in relevant if f not in flags) or "none"
    return section


def _cpuinfo() -> list[str]:
    return Path("/proc/cpuinfo").read_text().splitlines()


def _cpu_model() -> str:
    if sys.platform.startswith("linux"):
        for line in _cpuinfo():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware"):
                return value.strip()
    return platform.processor() or "unknown"


def _cpu_flags() -> set[str]:
    if not sys.platform.startswith("linux"):
        raise OSError(f"CPU flags are read from /proc/cpuinfo, which {sys.platform} lacks")
    for line in _cpuinfo():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    raise OSError("/proc/cpuinfo has no flags line")


def cuda_section() -> Section:
    import megalith

    info = megalith.build_info()
    section: Section = {
        key: info.get(key, "unavailable: not in build_info()") for key in _CUDA_KEYS
    }
    section.update((k, v) for k, v in info.items() if k.startswith("cuda_") and k not in section)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        section["CUDA_VISIBLE_DEVICES"] = visible
    return section


# -- NCCL --------------------------------------------------------------------
# [Note: finding NCCL]
# The engine loads NCCL at run time with dlopen, so one build serves machines
# with and without it. It looks where this report looks, in this order: the
# nvidia-nccl-cu13 wheel (site-packages/nvidia/nccl/lib, or nvidia/cu13/lib, the
# layout of some CUDA 13 wheels), the CUDA toolkit ($CUDA_HOME, $CUDA_PATH,
# /usr/local/cuda/lib64), then the dynamic linker's cache (ldconfig -p).


def nccl_candidates() -> list[tuple[str, Path]]:
    """(where, path) pairs to try, in order; the paths may not exist."""
    candidates: list[tuple[str, Path]] = []
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for sub in ("nccl", "cu13"):
            candidates.append(("nvidia-nccl-cu13 wheel", Path(root, sub, "lib", NCCL_SONAME)))
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append((f"${var}", Path(os.environ[var], "lib64", NCCL_SONAME)))
    candidates.append(("CUDA toolkit", Path("/usr/local/cuda/lib64", NCCL_SONAME)))
    return candidates


def _ldconfig_nccl() -> Path | None:
    ldconfig = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if ldconfig is None:
        return None
    out = subprocess.run(
        [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
    ).stdout
    for line in out.splitlines():
        # "	libnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2"
        name, _, path = line.partition("=>")
        if name.strip().split(" ")[0] == NCCL_SONAME and path.strip():
            return Path(path.strip())
    return None


def find_nccl() -> tuple[str, Path] | None:
    for where, path in nccl_candidates():
        if path.is_file():
            return where, path
    path = _ldconfig_nccl()
    return ("ldconfig", path) if path else None


def nccl_version(path: Path) -> str:
    lib = ctypes.CDLL(str(path))
    code = ctypes.c_int()
    rc = lib.ncclGetVersion(ctypes.byref(code))
    if rc != 0:
        raise RuntimeError(f"ncclGetVersion returned {rc}")
    v = code.value
    # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before.
    major, rest = divmod(v, 10000) if v >= 10000 else divmod(v, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_section() -> Section:
    found = find_nccl()
    if found is None:
        return {"library": f"not found: {NCCL_FIX}"}
    where, path = found
    return {"library": str(path), "found_in": where, "version": probe(lambda: nccl_version(path))}


# -- PyTorch and the sub-packages ------------------------------------------------


def torch_section() -> Section:
    try:
        import torch
    except ModuleNotFoundError:
        return {"version": "not installed: pip install torch"}
    section: Section = {
        "version": torch.__version__,
        "location": str(Path(torch.__file__).resolve().parent),
        "cuda": probe(lambda: torch.version.cuda or "none (CPU build)"),
    }

    def gpus() -> str | list[str]:
        count = torch.cuda.device_count()
        if count == 0:
            return "none"
        return [f"{i}: {torch.cuda.get_device_name(i)}" for i in range(count)]

    section["gpus"] = probe(gpus)
    return section


def packages_section() -> Section:
    section: Section = {}
    for name in SUBPACKAGES:
        dist = f"megalith-{name}"

        def describe(dist: str = dist, module: str = f"megalith_{name}") -> str:
            try:
                version = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                return f"not installed: pip install {dist}"
            spec = importlib.util.find_spec(module)
            where = Path(spec.origin).parent if spec and spec.origin else "not importable"
            return f"{version} ({where})"

        section[f"megalith_{name}"] = probe(describe)
    return section


# -- rendering -----------------------------------------------------------------


def render(report: Report) -> str:
    lines = [f"megalith environment (python {platform.python_version()}, {sys.executable})"]
    for name, section in report.items():
        lines.append("")
        lines.append(f"[{name}]")
        width = max((len(key) for key in section), default=0)
        for key, value in section.items():
            # Keys read as words, except where they are names (module names, variables).
            label = key if name == "packages" or not key.islower() else key.replace("_", " ")
            if isinstance(value, list):
                value = ("\n" + " " * (width + 5)).join(map(str, value)) if value else "none"
            lines.append(f"  {label:<{width}} : {value}")
    return "\n".join(lines)
