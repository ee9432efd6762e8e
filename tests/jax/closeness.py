"""How close AdamW trained by megalith and by optax must be: in units of the learning rate.

The engine's fused AdamW and optax round differently in fp32 (and a data-parallel run
reduces the gradients in another order). Adam moves every entry by about lr a step
whatever the size of its gradient, so those roundings grow into fractions of lr, not of
the entry: over 20 steps of the test MLP (150 seeds) entries differed by up to 4e-4 lr,
which on a bias near 3e-3 is 3e-5 relative. A lost moment or step count moves entries by
whole lr's.
"""

from __future__ import annotations

import numpy as np

LR_FRACTION = 5e-3


def assert_adam_close(got, want, lr: float, what: str = "") -> None:
    np.testing.assert_allclose(
        np.asarray(got, np.float64),
        np.asarray(want, np.float64),
        rtol=0,
        atol=LR_FRACTION * lr,
        err_msg=what,
    )
