"""Builds the built-in AutoParallel profile `h200` (packages/megalith/src/megalith/
autoparallel/profiles/h200.json) from what was measured on the lent H200 boxes, plus
published NVLink figures for the group sizes no lent box had.

    python benchmarks/autoparallel/build_h200_profile.py MEASURED.json OUT.json

- Everything but the collectives: `megalith calibrate` on the one-GPU box (MEASURED.json,
  logged in benchmarks/results/autoparallel/<date>_h200_calibrate.txt).
- Collectives on 2 GPUs: the engine's NCCL path measured on nvidia-h200-x2
  (benchmarks/results/comm_gpu/2026-11-30_h200x2_world2_*.jsonl, path "megalith"), fitted
  to alpha-beta as calibrate fits its own points. send_recv and broadcast at 2 are derived
  from the 2-GPU all_gather (each rank sends half the buffer to the other), not measured.
- Collectives on 8 GPUs (PUBLISHED, not measured here): a bus bandwidth of 460 GB/s, the
  low end of the 460-480 GB/s nccl-tests all_reduce figure for 8x H100 SXM5 on NVLink-4
  with NVSwitch (alayanew's NCCL-tests guide, 2026-05-06; the H200 has the same NVLink-4).
  reduce_scatter and all_gather take the same per-link rate under the ring model of
  profiles.py. Latency: the 2-GPU fit's, kept (NCCL's low-latency protocols keep small
  messages near it; an assumption, marked as such in the profile's `measured` field).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from megalith.autoparallel.calibrate_comm import fit_alpha_beta
from megalith.autoparallel.profiles import ring_factor
from megalith.autoparallel.types import AlphaBeta, MachineProfile

ROOT = Path(__file__).resolve().parents[2]
MEASURED_2GPU = ROOT / "benchmarks/results/comm_gpu/2026-11-30_h200x2_world2_{op}.jsonl"
PUBLISHED_BUSBW_8 = 460e9
OPS = ("all_reduce", "reduce_scatter", "all_gather")


def two_gpu(op: str) -> AlphaBeta:
    rows = [
        json.loads(line)
        for line in MEASURED_2GPU.with_name(MEASURED_2GPU.name.format(op=op))
        .read_text()
        .splitlines()
    ]
    points = [
        (r["bytes"], r["time_us"] * 1e-6)
        for r in rows
        if r["path"] == "megalith" and r["bytes"] >= 1 << 16
    ]
    return fit_alpha_beta(points)


def main() -> int:
    measured, out = Path(sys.argv[1]), Path(sys.argv[2])
    data = json.loads(measured.read_text())
    table: dict[str, dict[str, dict[str, float]]] = {}
    for op in OPS:
        ab2 = two_gpu(op)
        ab8 = AlphaBeta(ab2.latency_s, PUBLISHED_BUSBW_8 / ring_factor(op, 8))
        table[op] = {"2": vars(ab2), "8": vars(ab8)}
    ag2 = AlphaBeta(**table["all_gather"]["2"])
    p2p = vars(AlphaBeta(ag2.latency_s, ag2.bandwidth / 2))
    table["send_recv"] = {"2": p2p}
    table["broadcast"] = {"2": p2p}
    data.update(
        name="h200",
        devices_per_node=8,
        collectives=table,
        measured=(
            data["measured"] + "; collectives: 2 GPUs measured on nvidia-h200-x2 "
            "(comm_gpu/2026-11-30_h200x2_world2_*.jsonl, engine NCCL), 8 GPUs PUBLISHED "
            "(460 GB/s busbw, nccl-tests 8x H100 SXM5 NVLink-4; latency assumed = 2-GPU fit); "
            "built by benchmarks/autoparallel/build_h200_profile.py"
        ),
    )
    profile = MachineProfile.from_json(data)  # validates the layout
    profile.save(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
