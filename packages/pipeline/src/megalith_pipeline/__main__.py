"""python -m megalith_pipeline: print a schedule's simulated timeline and bubble.

python -m megalith_pipeline --schedule zb-h1 --pp 4 --microbatches 8 [--forward 1
    --backward 2 --backward-input 1 --backward-weight 1 --comm 0 --chunks 2 --width 100]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .schedules import NAMES, make_schedule
from .simulator import PassTimes, simulate, theory_bubble_1f1b


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m megalith_pipeline", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--schedule", default="1f1b", help=f"one of {', '.join(NAMES)}")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=None, help="stages per rank (interleaved)")
    ap.add_argument("--forward", type=float, default=1.0)
    ap.add_argument("--backward", type=float, default=2.0)
    ap.add_argument("--backward-input", type=float, default=None)
    ap.add_argument("--backward-weight", type=float, default=None)
    ap.add_argument("--comm", type=float, default=0.0, help="latency of a message between ranks")
    ap.add_argument("--width", type=int, default=100)
    a = ap.parse_args(argv)
    schedule = make_schedule(a.schedule, a.pp, a.microbatches, a.chunks)
    times = PassTimes(a.forward, a.backward, a.backward_input, a.backward_weight, a.comm)
    timeline = simulate(schedule, times)
    print(timeline.render(a.width))
    print(
        f"bubble {timeline.bubble_fraction:.4f} (1F1B theory (p-1)/(m+p-1) = "
        f"{theory_bubble_1f1b(a.pp, a.microbatches):.4f})"
    )


if __name__ == "__main__":
    main()
