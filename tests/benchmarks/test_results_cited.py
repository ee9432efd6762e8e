"""benchmarks/results and benchmarks/device/logs: every file sits in a topic folder, is
named <date>_<machine>[_<variant>].<ext>, and is cited by a README of the repository; the
device scripts source setup.sh; no benchmark script or README names a machine path."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
NAME = re.compile(
    r"^\d{4}-\d{2}-\d{2}_(cpu\d*|h200|h200x\d+)(_[A-Za-z0-9_]+)?\.(md|txt|jsonl|json|png)$"
)


def tracked(*patterns: str) -> list[Path]:
    """The files git knows (tracked, or untracked and not ignored) under these pathspecs;
    outside a git checkout, every file matching them."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *patterns],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return sorted({ROOT / line for line in out.splitlines() if line})
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", "build", "venv", ".venv", "__pycache__", ".snap"}
        every = [
            f
            for f in ROOT.rglob("*")
            if f.is_file() and not skip.intersection(f.relative_to(ROOT).parts)
        ]
        return [
            f
            for f in every
            if any(
                fnmatch.fnmatch(str(f.relative_to(ROOT)), p)
                or f.relative_to(ROOT).is_relative_to(p)
                for p in patterns
            )
        ]


def result_files() -> list[Path]:
    files = tracked("benchmarks/results", "benchmarks/device/logs")
    return [f for f in files if f.name != ".gitignore" and f.exists()]


def readmes() -> str:
    docs = [f for f in tracked("*.md") if "README" in f.name and f.exists()]
    docs = [f for f in docs if not f.is_relative_to(BENCH / "results")]
    return "\n".join(f.read_text() for f in docs)


def test_results_are_in_topic_folders_and_named_by_date_and_machine():
    bad = []
    for f in result_files():
        rel = f.relative_to(BENCH)
        if len(rel.parts) != 3 or not NAME.match(f.name):
            bad.append(str(rel))
    assert not bad, f"not <topic>/<date>_<machine>[_<variant>].<ext>: {bad}"


def test_every_result_file_is_cited_by_a_readme():
    text = readmes()
    missing = [str(f.relative_to(ROOT)) for f in result_files() if f.name not in text]
    assert not missing, f"cited by no README (benchmarks/README.md lists them): {missing}"


def test_device_scripts_source_setup():
    scripts = [f for f in (BENCH / "device").glob("*.sh") if f.name != "setup.sh"]
    assert scripts
    for f in scripts:
        assert 'source "$(dirname "$0")/setup.sh"' in f.read_text(), f.name


def test_no_machine_paths_in_benchmark_scripts_and_readmes():
    pattern = re.compile(r"/work/|/tmp/cpubench|/root/|/home/")
    files = tracked("benchmarks/*.py", "benchmarks/*.sh", "benchmarks/*.md", "README.md")
    files += tracked("packages/*/README.md")
    bad = [
        f"{f.relative_to(ROOT)}:{n}"
        for f in files
        if f.exists() and not f.is_relative_to(BENCH / "results")
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not bad, f"machine paths (use $MEGALITH_SHARED, $OUT, $SCRATCH...): {bad}"
