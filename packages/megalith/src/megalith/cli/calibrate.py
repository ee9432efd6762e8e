"""`megalith calibrate`: measure this machine for the AutoParallel planner.

    megalith calibrate [--out FILE] [--quick] [--nproc N] [--device auto|cuda|cpu]

Prints a table of what it measured (megalith.autoparallel.calibrate says what and how)
and writes the profile JSON, by default to ~/.cache/megalith/profile-<host>.json, which
`load_profile(path)` and a cluster file's "profile" read back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "calibrate",
        help="measure this machine (matmul, attention, memory, Adam, PCIe, disk, collectives)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--out", type=Path, help="profile JSON to write")
    parser.add_argument("--quick", action="store_true", help="fewer sizes: under a minute")
    parser.add_argument("--nproc", type=int, help="ranks for the collectives (default: GPUs, or 2)")
    parser.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    parser.add_argument("--disk-dir", help="folder for the disk test file (default: temp)")
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from megalith.autoparallel.calibrate import calibrate, format_profile
    from megalith.autoparallel.profiles import default_profile_path

    def log(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    try:
        profile = calibrate(args.device, args.quick, args.nproc, args.disk_dir, log=log)
    except ValueError as err:
        print(f"megalith calibrate: error: {err}", file=sys.stderr)
        return 2
    out = args.out or default_profile_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    profile.save(out)
    print(format_profile(profile))
    print(f"wrote {out}")
    return 0
