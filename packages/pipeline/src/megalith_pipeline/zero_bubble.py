"""ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with the
backward split into I (input gradients) and W (weight gradients).

Only I is on the critical path: the previous stage waits for its result. W can
run whenever the rank would otherwise idle. The order is found by playing the
step out with unit times (F = I = W, the paper's setting) and letting each rank,
whenever it is free, take the first of:

1. I of the next micro-batch, when its output gradient has arrived (it feeds the
   previous stage, so it never waits behind a W);
2. W, when more than pp - 1 weight passes are pending (bounds what they hold);
3. F of the next micro-batch, while fewer than pp - r micro-batches are between
   their F and their I (1F1B's bound on live activations, on rank r);
4. any pending W (this is what fills the bubbles);
5. nothing (wait).

With F = I = W this gives the paper's ZB-H1 bubble, (pp - 1)(F + I - W) per rank
instead of 1F1B's (pp - 1)(F + I + W): a third. A micro-batch waiting only for
its W holds the inputs of its weight gradients, not its whole activations. The
order found is then fixed: with other pass times it still completes (any order
that completed once respects every dependency), only the bubble changes.
"""

from __future__ import annotations

from .schedule import FORWARD, INPUT_GRAD, WEIGHT_GRAD, Action


def zb_h1_orders(pp: int, m: int) -> list[list[Action]]:
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, mb) -> finish time
    nf, nb, nw = [0] * pp, [0] * pp, [0] * pp  # next F, I and W micro-batch per rank
    free_at = [0] * pp
    orders: list[list[Action]] = [[] for _ in range(pp)]
    t = 0

    def finished(kind: str, s: int, mb: int) -> bool:
        return done.get((kind, s, mb), t + 1) <= t

    while any(w < m for w in nw):
        if t > 10 * pp * m + 10:  # cannot happen for valid rules; guards the loop
            raise RuntimeError(f"zb-h1: no order found for pp={pp}, m={m}")
        for r in range(pp):
            if free_at[r] > t:
                continue
            pending_w = nb[r] - nw[r]
            b_ready = (
                nb[r] < m
                and finished(FORWARD, r, nb[r])
                and (r == pp - 1 or finished(INPUT_GRAD, r + 1, nb[r]))
            )
            f_ready = (
                nf[r] < m and (r == 0 or finished(FORWARD, r - 1, nf[r])) and nf[r] - nb[r] < pp - r
            )
            if b_ready:
                action, nb[r] = Action(INPUT_GRAD, r, nb[r]), nb[r] + 1
            elif pending_w > pp - 1 or (pending_w and not f_ready):
                action, nw[r] = Action(WEIGHT_GRAD, r, nw[r]), nw[r] + 1
            elif f_ready:
                action, nf[r] = Action(FORWARD, r, nf[r]), nf[r] + 1
            else:
                continue
            orders[r].append(action)
            done[(action.kind, action.stage, action.mb)] = t + 1
            free_at[r] = t + 1
        t += 1
    return orders
