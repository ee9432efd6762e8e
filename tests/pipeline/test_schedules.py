"""Schedules and the simulator, without ranks: every pass once, on its stage's rank, in an
order that completes; bubbles as theory says; memory bounds; errors that name the numbers."""

from __future__ import annotations

import pytest

from megalith_pipeline import (
    SCHEDULES,
    Action,
    PassTimes,
    Schedule,
    ScheduleDeadlock,
    make_schedule,
    simulate,
    theory_bubble_1f1b,
)


@pytest.mark.parametrize("name", SCHEDULES)
def test_every_count_gives_a_complete_order(name):
    for pp in range(1, 6):
        for m in range(1, 11):
            s = make_schedule(name, pp, m)  # simulates: raises if the order cannot complete
            kinds = 3 if name.startswith("zb-") else 2
            assert sum(len(o) for o in s.orders) == kinds * m * s.num_stages
            for r, order in enumerate(s.orders):
                assert all(s.rank_of(a.stage) == r for a in order)
                for kind in "FBIW":  # micro-batches in ascending order through every channel
                    for stage in s.stages_of(r):
                        mbs = [a.mb for a in order if a.kind == kind and a.stage == stage]
                        assert mbs == sorted(mbs)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_the_theory(name):
    for pp in (2, 3, 4, 8):
        for m in (1, 3, pp, 2 * pp, 4 * pp + 1):
            t = simulate(make_schedule(name, pp, m), PassTimes(forward=1.0, backward=2.0))
            assert t.bubble_fraction == pytest.approx(theory_bubble_1f1b(pp, m))
            assert t.makespan == pytest.approx(3.0 * (m + pp - 1))


def test_interleaved_bubble_shrinks_by_the_chunk_count():
    for pp in (2, 4):
        for v in (2, 3):
            for m in (pp, 2 * pp, 4 * pp):
                t = simulate(make_schedule("interleaved", pp, m, chunks=v), PassTimes(1.0, 2.0))
                assert t.bubble_fraction == pytest.approx((pp - 1) / (v * m + pp - 1))


def test_zb_h1_bubble_is_a_third_of_1f1b():
    """F = I = W: ZB-H1 idles (pp - 1)(F + I - W) per rank where 1F1B idles (pp - 1)(F + I + W)."""
    times = PassTimes(forward=1.0, backward=2.0, backward_input=1.0, backward_weight=1.0)
    for pp in (2, 3, 4, 8):
        for m in (pp, 2 * pp, 3 * pp + 1):
            t = simulate(make_schedule("zb-h1", pp, m), times)
            assert t.makespan == pytest.approx(3 * m + (pp - 1))
            one = simulate(make_schedule("1f1b", pp, m), times)
            idle = t.makespan - 3 * m
            assert idle == pytest.approx((one.makespan - 3 * m) / 3)


def test_zb_v_halves_zb_h1_bubble_at_the_same_activation_memory():
    """ZB-V's V placement (rank r holds stages r and 2pp-1-r, the loss on rank 0) with each
    chunk pass taking half a stage pass: about half of ZB-H1's bubble once m >= pp."""
    whole = PassTimes(forward=1.0, backward=2.0)
    half = PassTimes(forward=0.5, backward=1.0)
    for pp in (2, 3, 4, 8):
        v = make_schedule("zb-v", pp, 2 * pp)
        assert v.placement == (*range(pp), *reversed(range(pp))) and v.last_rank == 0
        h1 = simulate(make_schedule("zb-h1", pp, 2 * pp), whole).bubble_fraction
        bubble = simulate(v, half).bubble_fraction
        assert bubble < 0.6 * h1, (pp, bubble, h1)
        for r, order in enumerate(v.orders):  # chunk activations: at most 2pp halves = pp wholes
            assert _live(order, "F", "I") <= 2 * pp, (pp, r)


def _live(order: tuple[Action, ...], start: str, end: str) -> int:
    live = peak = 0
    for a in order:
        live += a.kind == start
        live -= a.kind == end
        peak = max(peak, live)
    return peak


def test_memory_bounds():
    pp, m = 4, 12
    for r, order in enumerate(make_schedule("1f1b", pp, m).orders):
        assert _live(order, "F", "B") == pp - r  # 1F1B's activations in flight
    for r, order in enumerate(make_schedule("zb-h1", pp, m).orders):
        assert _live(order, "F", "I") <= pp - r  # the same bound until the input gradient
        assert _live(order, "I", "W") <= pp  # weight passes waiting
    assert _live(make_schedule("gpipe", pp, m).orders[0], "F", "B") == m


def test_timeline_text_and_per_stage_times():
    s = make_schedule("1f1b", 2, 3)
    t = simulate(s, [PassTimes(1, 2), PassTimes(2, 4)])  # the second stage twice as slow
    text = t.render(width=60)
    lines = text.splitlines()
    assert lines[0].startswith("1f1b (pp 2, 3 micro-batches") and "bubble" in lines[0]
    assert lines[1].startswith("rank 0 |F0") and lines[2].startswith("rank 1 |.")
    assert all(len(line) == len(lines[1]) for line in lines[1:])
    # stage 1 is busy from 1 to 19, then stage 0 runs its last backward
    assert t.makespan == pytest.approx(1 + 3 * 6 + 2)
    slow = simulate(s, PassTimes(1, 2, comm=0.5))
    assert slow.makespan == pytest.approx(14.0)  # 12 without; four hops on the critical path
    inter = simulate(make_schedule("interleaved", 2, 2)).render(width=120)
    assert "f0" in inter and "b0" in inter  # chunk 1 in lower case


def test_bad_counts_name_the_numbers():
    with pytest.raises(ValueError, match="num_microbatches=0"):
        make_schedule("1f1b", 4, 0)
    with pytest.raises(ValueError, match="pp=0"):
        make_schedule("gpipe", 0, 4)
    with pytest.raises(ValueError, match=r"'1f1b' runs one stage per rank, got chunks=2"):
        make_schedule("1f1b", 2, 4, chunks=2)
    with pytest.raises(ValueError, match="chunks=0"):
        make_schedule("interleaved", 2, 4, chunks=0)
    with pytest.raises(ValueError, match="unknown pipeline schedule 'pipedream'"):
        make_schedule("pipedream", 2, 4)
    assert make_schedule("ZB_H1", 2, 2).name == "zb-h1"


def test_an_order_that_cannot_complete_is_refused():
    # Rank 1 wants micro-batch 1's backward before micro-batch 0 has arrived.
    orders = (
        (Action("F", 0, 0), Action("B", 0, 0)),
        (Action("B", 1, 0), Action("F", 1, 0)),
    )
    bad = Schedule("custom", 2, 1, 1, (0, 1), orders)
    with pytest.raises(ScheduleDeadlock, match=r"rank 0 at B\(0,0\), rank 1 at B\(1,0\)"):
        simulate(bad)
    missing = Schedule("custom", 2, 1, 1, (0, 1), (orders[0], (Action("F", 1, 0),)))
    with pytest.raises(ValueError, match="each pass once"):
        simulate(missing)


def test_command_line_prints_the_timeline(capsys):
    from megalith_pipeline.__main__ import main

    main(["--schedule", "zb-h1", "--pp", "4", "--microbatches", "8", "--width", "60"])
    out = capsys.readouterr().out
    assert "rank 3 |" in out and "bubble 0.1111" in out and "= 0.2727" in out
