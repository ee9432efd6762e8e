"""Checks that share the equivalence tests' process groups: the project's reference models
(through their pipeline_parts()), eval_step, forward, loss on every rank, balance="time"."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import megalith.models as mm
from megalith_comm import p2p
from megalith_pipeline import Pipeline, as_layers

from . import models
from .checks import RTOL, SGD, _pairs, close


@dataclass(frozen=True)
class Extra:
    name: str
    pp: int


def reference_models(rank: int, pp: int) -> dict:
    """GPT (tied head) and Llama from megalith.models, cut by their own pipeline_parts();
    "lazy": built on the meta device, only this rank's stages materialised."""
    worst = 0.0
    cases = [
        ("gpt-tiny", "1f1b", False),
        ("gpt-tiny", "zb-h1", True),
        ("gpt-tiny", "interleaved", False),
        ("llama-tiny", "gpipe", True),
    ]
    for preset, schedule, lazy in cases:
        kw = dict(seed=0, vocab_size=64, d_model=32, n_heads=2, d_ff=64, n_layers=2 * pp)
        ref = mm.create(preset, device="cpu", **kw)
        model = mm.create(preset, device="meta" if lazy else "cpu", **kw)
        ids = torch.randint(0, 64, (2 * pp + 1, 16), generator=torch.Generator().manual_seed(pp))
        ref_loss = ref(ids, labels=ids).loss
        ref_loss.backward()
        pipe = Pipeline(model, num_microbatches=pp, schedule=schedule, loss_fn=mm.causal_lm_loss)
        if lazy:
            for stage in pipe.module:
                stage.to_empty(device="cpu")
            model.init_weights(0)
        loss = pipe.step(ids, ids)
        if pipe.is_last:
            worst = max(worst, close(loss, ref_loss.detach()))
        opt, ref_opt = SGD(list(pipe.module.parameters())), SGD(list(ref.parameters()))
        pairs = _pairs(pipe, as_layers(ref))
        for name, p, q in pairs:
            err = close(p.grad, q.grad)
            assert err <= RTOL, f"{preset} {schedule} pp {pp}: grad of {name}: {err:.2e}"
            worst = max(worst, err)
        opt.step()
        ref_opt.step()
        for name, p, q in pairs:
            assert close(p.detach(), q.detach()) <= RTOL, (
                f"{preset} {schedule}: {name} after the step"
            )
    return {"worst": worst}


def eval_and_forward(rank: int, pp: int) -> dict:
    torch.set_num_threads(1)
    ref, model = models.mlp(8), models.mlp(8)
    x, y = torch.randn(10, 4), torch.randn(10, 3)
    lf = torch.nn.functional.mse_loss
    pipe = Pipeline(
        model, num_microbatches=3, schedule="interleaved", loss_fn=lf, loss_on_all_ranks=True
    )
    with torch.no_grad():
        want_out = ref(x)
        want = lf(want_out, y)
    got = pipe.eval_step(x, y)
    assert close(got, want) <= RTOL, (got, want)  # on every rank (loss_on_all_ranks)
    assert all(p.grad is None for p in pipe.module.parameters())
    outs = pipe.forward(x)
    if pipe.is_last:
        assert close(torch.cat(outs), want_out) <= RTOL
    else:
        assert outs is None
    loss = pipe.step(x, y)
    assert close(loss, want) <= RTOL  # every rank
    # inputs only where the first stage is, targets only where the loss is; shapes cached:
    # after the first step, only data crosses the channels
    pipe = Pipeline(models.mixed(8), num_microbatches=4, schedule="1f1b", loss_fn=lf)
    x8, y8 = torch.randn(8, 4), torch.randn(8, 3)
    for step in range(2):
        before = dict(p2p.STATS)
        loss = pipe.step(x8 if pipe.is_first else None, y8 if pipe.is_last else None)
        sent = p2p.STATS["metadata_sent"] - before["metadata_sent"]
        if step == 1:
            assert sent == 0, f"metadata sent again on rank {rank}"
    with torch.no_grad():
        want = lf(models.mixed(8)(x8), y8)
    if pipe.is_last:
        assert close(loss, want) <= RTOL
    # balance by measured time: a collective average, so every rank cuts the same way
    timed = Pipeline(models.mlp(8), num_microbatches=2, balance="time", sample=x[:5], loss_fn=lf)
    assert sum(timed.partition.sizes) == 8
    return {"sizes": timed.partition.sizes, "loss": got.item()}


def run_extra(rank: int, extra: Extra) -> dict:
    return {"reference_gpt": reference_models, "eval_and_forward": eval_and_forward}[extra.name](
        rank, extra.pp
    )
