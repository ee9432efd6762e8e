"""Runs N short `megalith train` runs and counts the ones that did not exit cleanly.

Issue 21 item 9: a run that had written everything sometimes ended with "terminate called
without an active exception" (rc 134), a thread still alive while the interpreter
finalised. Each run here trains a few steps on 2 CPU ranks (and saves a checkpoint), so
that every exit path runs: the ranks' megalith_comm teardown, the launcher's. A run is
clean when its rc is 0 and no process printed "terminate called" or "Fatal Python error".

    python tools/exit_stress.py --runs 300 --jobs 6 --out stress.jsonl
    python tools/exit_stress.py --runs 100 --lock /tmp/lpytest.lock   # a shared machine

Prints one line per unclean run (rc and the last lines of its output) and a summary
`exit stress: N runs, A aborts (rc 134 or terminate), F other failures`; exits 1 if any
run was unclean.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ABORT_WORDS = ("terminate called", "Fatal Python error")


def megalith_command() -> list[str]:
    """The `megalith` console script beside this Python, else its entry point through -c."""
    script = Path(sys.executable).parent / "megalith"
    if script.exists():
        return [str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from megalith.cli.main import main; sys.exit(main())",
    ]


def train_command(out: Path, name: str, steps: int) -> list[str]:
    return [
        *megalith_command(), "train",
        "--steps", str(steps), "--batch-size", "2", "--seq-len", "32",
        "--eval-every", str(steps), "--eval-batches", "1", "--save-every", str(steps),
        "--nproc", "2", "--out", str(out), "--name", name,
    ]  # fmt: skip


def one_run(i: int, root: Path, steps: int, lock: str | None, timeout: float) -> dict:
    cmd = train_command(root, f"run{i}", steps)
    if lock:
        cmd = ["flock", lock, *cmd]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = None, f"timed out after {timeout:g} s\n{exc.stdout or ''}{exc.stderr or ''}"
    aborted = rc in (134, -6) or any(w in text for w in ABORT_WORDS)
    shutil.rmtree(root / f"run{i}", ignore_errors=True)  # 10 MB a run: 300 would be 3 GB
    return {
        "run": i,
        "rc": rc,
        "abort": aborted,
        "clean": rc == 0 and not aborted,
        "seconds": round(time.monotonic() - start, 2),
        "tail": "" if rc == 0 and not aborted else text[-2000:],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lock", help="flock this file around each run (a shared machine)")
    ap.add_argument("--timeout", type=float, default=180.0, help="per run (s)")
    ap.add_argument("--out", help="append one json line per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="megalith-exit-stress-") as tmp:
        root = Path(tmp)
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = pool.map(
                lambda i: one_run(i, root, args.steps, args.lock, args.timeout), range(args.runs)
            )
            results = []
            for row in rows:
                results.append(row)
                if not row["clean"]:
                    print(f"run {row['run']}: rc {row['rc']}\n{row['tail']}", flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
    aborts = sum(r["abort"] for r in results)
    other = sum(not r["clean"] and not r["abort"] for r in results)
    print(
        f"exit stress: {len(results)} runs, {aborts} aborts (rc 134 or terminate), "
        f"{other} other failures",
        flush=True,
    )
    return 0 if aborts == 0 and other == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
