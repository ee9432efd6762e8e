"""ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024): the
zero-bubble schedule with two chunks per rank placed in a V.

The model is cut into 2 pp stages; rank r holds stage r and stage 2 pp - 1 - r.
A micro-batch goes down the ranks through the first chunks and comes back up
through the second: rank 0 holds both the first stage and the last (the loss),
and rank pp - 1 hands stage pp - 1's output to stage pp in memory. Backward runs
the V the other way, split into I and W as in ZB-H1.

The order is found as zero_bubble.py finds ZB-H1's, by playing the step out with
unit times per chunk pass and letting each free rank take the first of:

1. an I whose output gradient has arrived (the second chunk's first: it is nearer
   the loss, and the first chunk's I of the same micro-batch needs it anyway);
2. a W, when more than 2 pp - 1 are pending (bounds what they hold);
3. an F whose input has arrived (the second chunk's first), while fewer than
   2 pp chunk-activations are live on the rank: the activation memory of 1F1B's
   busiest rank (pp micro-batches of a whole stage), spread evenly over ranks;
4. any pending W (this is what fills the bubbles);
5. nothing (wait).

The order found is fixed and checked by the simulator like every other schedule.
"""

from __future__ import annotations

from .schedule import FORWARD, INPUT_GRAD, WEIGHT_GRAD, Action


def v_placement(pp: int) -> tuple[int, ...]:
    """Stage s on rank s for s < pp, on rank 2 pp - 1 - s after: a V over the ranks."""
    return tuple(range(pp)) + tuple(reversed(range(pp)))


def zb_v_orders(pp: int, m: int) -> list[list[Action]]:
    last = 2 * pp - 1
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) -> finish time
    nf = [0] * (2 * pp)  # next F micro-batch per stage
    ni = [0] * (2 * pp)  # next I micro-batch per stage
    pending_w: list[list[Action]] = [[] for _ in range(pp)]  # per rank, oldest first
    free_at = [0] * pp
    orders: list[list[Action]] = [[] for _ in range(pp)]
    t = 0

    def finished(kind: str, s: int, mb: int) -> bool:
        return done.get((kind, s, mb), t + 1) <= t

    def i_ready(s: int) -> bool:
        mb = ni[s]
        return (
            mb < nf[s]
            and finished(FORWARD, s, mb)
            and (s == last or finished(INPUT_GRAD, s + 1, mb))
        )

    def f_ready(s: int) -> bool:
        mb = nf[s]
        return mb < m and (s == 0 or finished(FORWARD, s - 1, mb))

    while any(len(orders[r]) < 3 * 2 * m for r in range(pp)):
        if t > 20 * pp * m + 20:  # cannot happen for valid rules; guards the loop
            raise RuntimeError(f"zb-v: no order found for pp={pp}, m={m}")
        for r in range(pp):
            if free_at[r] > t:
                continue
            second, first = last - r, r
            live = sum(nf[s] - ni[s] for s in (first, second))
            action = None
            for s in (second, first):
                if i_ready(s):
                    action = Action(INPUT_GRAD, s, ni[s])
                    ni[s] += 1
                    pending_w[r].append(Action(WEIGHT_GRAD, s, action.mb))
                    break
            if action is None and len(pending_w[r]) > 2 * pp - 1:
                action = pending_w[r].pop(0)
            if action is None and live < 2 * pp:
                for s in (second, first):
                    if f_ready(s):
                        action = Action(FORWARD, s, nf[s])
                        nf[s] += 1
                        break
            if action is None and pending_w[r]:
                action = pending_w[r].pop(0)
            if action is None:
                continue
            orders[r].append(action)
            done[(action.kind, action.stage, action.mb)] = t + 1
            free_at[r] = t + 1
        t += 1
    return orders
