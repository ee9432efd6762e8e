"""Rank functions for test_hybrid_surface.py and test_hybrid_heads.py: HybridParallelPlugin
as a ColossalAI script drives it, against the plain model in one process."""

from __future__ import annotations

import copy
import sys
import warnings

import torch

VOCAB, SEQ, BATCH, CHOICES = 64, 8, 4, 2

HEADS = {
    "GPT2": [
        "GPT2Model", "GPT2LMHeadModel", "GPT2DoubleHeadsModel", "GPT2ForSequenceClassification",
        "GPT2ForTokenClassification", "GPT2ForQuestionAnswering",
    ],
    "Llama": ["LlamaModel", "LlamaForCausalLM", "LlamaForSequenceClassification"],
    "Bert": [
        "BertModel", "BertForPreTraining", "BertLMHeadModel", "BertForMaskedLM",
        "BertForSequenceClassification", "BertForTokenClassification",
        "BertForNextSentencePrediction", "BertForMultipleChoice", "BertForQuestionAnswering",
    ],
    "T5": ["T5Model", "T5ForConditionalGeneration", "T5EncoderModel", "T5ForTokenClassification"],
}  # fmt: skip


def build(name: str) -> torch.nn.Module:
    import transformers as tf

    family = next(f for f, names in HEADS.items() if name in names)
    labels = 2 if "QuestionAnswering" in name else 3
    common = dict(vocab_size=VOCAB, num_labels=labels)
    cfg = {
        "GPT2": dict(
            n_positions=SEQ, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, pad_token_id=0, summary_first_dropout=0.0, classifier_dropout=0.0,
            bos_token_id=1,
            eos_token_id=1,
        ),
        "Llama": dict(
            hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=SEQ, pad_token_id=0,
        ),
        "Bert": dict(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, is_decoder=name == "BertLMHeadModel",
        ),
        "T5": dict(
            d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
            relative_attention_num_buckets=8, decoder_start_token_id=0,
        ),
    }[family]  # fmt: skip
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = getattr(tf, f"{family}Config")(**common, **cfg)
        return getattr(tf, name)(config).train()


def batch(name: str, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh random inputs for the head, padding in every second row where it has a mask."""
    if "DoubleHeads" in name or "MultipleChoice" in name:
        ids = torch.randint(1, VOCAB, (BATCH, CHOICES, SEQ), generator=gen)
        out = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        out["attention_mask"][1::2, :, -2:] = 0
        if "DoubleHeads" in name:
            out["mc_token_ids"] = torch.full((BATCH, CHOICES), SEQ - 3)
            out["mc_labels"] = torch.randint(0, CHOICES, (BATCH,), generator=gen)
            out["labels"] = ids.clone()
        else:
            out["labels"] = torch.randint(0, CHOICES, (BATCH,), generator=gen)
        return out
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=gen)
    mask = torch.ones_like(ids)
    mask[1::2, -3:] = 0
    out = {"input_ids": ids, "attention_mask": mask}
    if "SequenceClassification" in name and name.startswith(("GPT2", "Llama")):
        ids[1::2, -3:] = 0  # the pad token: the pooled position is the last real one
    lm = ("LMHeadModel", "CausalLM", "ConditionalGeneration", "MaskedLM", "PreTraining")
    if name.endswith(lm):
        out["labels"] = torch.where(mask.bool(), ids, -100)
    elif "SequenceClassification" in name or "NextSentence" in name:
        out["labels"] = torch.randint(0, 2, (BATCH,), generator=gen)
    elif "TokenClassification" in name:
        out["labels"] = torch.randint(0, 3, (BATCH, SEQ), generator=gen)
    elif "QuestionAnswering" in name:
        out["start_positions"] = torch.randint(0, SEQ, (BATCH,), generator=gen)
        out["end_positions"] = torch.randint(0, SEQ, (BATCH,), generator=gen)
    if name == "BertForPreTraining":
        out["next_sentence_label"] = torch.randint(0, 2, (BATCH,), generator=gen)
    if name.startswith("Bert"):
        out["token_type_ids"] = torch.randint(0, 2, (BATCH, SEQ), generator=gen)
    if name == "T5Model":
        out["decoder_input_ids"] = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
    return out


def criterion(outputs, inputs) -> torch.Tensor:
    """ColossalAI's pipeline criterion: the model's own loss, or (base models) a fixed
    projection of the last hidden states (a norm's output alone has a fixed mean square)."""
    loss = getattr(outputs, "loss", None)
    if loss is not None:
        return loss
    hidden = outputs.last_hidden_state
    probe = torch.linspace(-1.0, 1.0, hidden.shape[-1], device=hidden.device)
    return (hidden.float() @ probe).square().mean()


def close(errors: list[str], what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """DESIGN.md's fp32 tolerance, relative to the tensor's largest entry (a gradient that
    is exactly zero in theory is rounding noise in both runs)."""
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape:
        errors.append(f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
        return
    err = float((got - want).abs().max()) if got.numel() else 0.0
    tol = 1e-5 * float(want.abs().max()) + 1e-7 if want.numel() else 0.0
    if err > tol:
        errors.append(f"{what}: max error {err:.3g} > {tol:.3g}")


def head_case(rank: int, name: str, tp: int, pp: int) -> list[str]:
    """One optimizer-free step of the head under tp x pp against the plain model: the loss
    and every gradient (tp shards gathered, each rank's stages)."""
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin
    from megalith.tensor_parallel import gather_full

    ref = build(name)
    model = copy.deepcopy(ref)
    inputs = batch(name, torch.Generator().manual_seed(3))
    want = criterion(ref(**inputs), inputs)
    want.backward()
    kwargs = dict(num_microbatches=2) if pp > 1 else {}
    plugin = HybridParallelPlugin(tp_size=tp, pp_size=pp, parallel_output=False, **kwargs)
    booster = Booster(plugin=plugin)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, *_ = booster.boost(model, opt)
    errors: list[str] = []
    if pp > 1:
        out = booster.execute_pipeline(iter([inputs]), model, criterion, opt, return_outputs=True)
        loss = out["loss"]
        if (
            plugin.stage_manager.is_last_stage()
            and type(out["outputs"]).__name__ != type(ref(**inputs)).__name__
        ):
            errors.append(f"{name} pp{pp}: outputs are a {type(out['outputs']).__name__}")
    else:
        outputs = model(**inputs)
        loss = criterion(outputs, inputs)
        opt.backward(loss)
    close(errors, f"{name} tp{tp} pp{pp} loss", loss, want)
    ref_params = dict(ref.named_parameters())
    tp_group = plugin.mesh.group("tp")
    for pname, p in plugin.local_named_parameters(model).items():
        if p.grad is None and ref_params[pname].grad is None:
            continue
        if p.grad is None:
            errors.append(f"{name} tp{tp} pp{pp}: no gradient for {pname}")
            continue
        full = gather_full(p.grad, tp_group, getattr(p, "tp_spec", None))
        close(errors, f"{name} tp{tp} pp{pp} grad {pname}", full, ref_params[pname].grad)
    return errors


def heads_grid(rank: int, setting: tuple[str, int, int]) -> list[str]:
    import traceback

    torch.set_num_threads(1)
    try:
        return head_case(rank, *setting)
    except Exception as exc:  # every setting reports, not only the first to fail
        where = traceback.format_exc().strip().splitlines()[-4:]
        error = f"{setting}: {type(exc).__name__}: {exc} | {' / '.join(where)}"
        # A failed pipeline step can leave its peer to time out and the group broken, so the
        # grid's last barrier may fail before this value is returned: say it now too.
        print(f"rank {rank}: {error}", file=sys.stderr, flush=True)
        return [error]


def _gpt2() -> torch.nn.Module:
    return build("GPT2LMHeadModel")


def surface_case(rank: int) -> list[str]:
    """The plugin's attributes, parallel_output both ways, the boosted optimizer's surface
    and execute_pipeline's outputs, on 2 ranks (one process group for all of it)."""
    import torch.distributed as dist

    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin

    torch.set_num_threads(1)
    errors: list[str] = []
    gen = torch.Generator().manual_seed(9)
    inputs = batch("GPT2LMHeadModel", gen)
    ref = _gpt2()
    ref_out = ref(**inputs)

    # tp 2: ColossalAI's attributes and parallel_output
    for parallel_output in (True, False):
        plugin = HybridParallelPlugin(tp_size=2, parallel_output=parallel_output)
        model, *_ = Booster(plugin=plugin).boost(_gpt2())
        out = model(**inputs)
        close(errors, f"parallel_output={parallel_output} loss", out.loss, ref_out.loss)
        if parallel_output:
            half = ref_out.logits.chunk(2, dim=-1)[rank]
            close(errors, "vocabulary-parallel logits", out.logits, half)
        else:
            close(errors, "gathered logits", out.logits, ref_out.logits)
    sizes = (plugin.dp_size, plugin.tp_size, plugin.pp_size, plugin.sp_size)
    if sizes != (1, 2, 1, 1) or plugin.stage_manager is not None:
        errors.append(f"dp, tp, pp, sp = {sizes}; stage_manager {plugin.stage_manager}")
    if dist.get_world_size(plugin.tp_group) != 2 or dist.get_world_size(plugin.dp_group) != 1:
        errors.append("tp_group / dp_group sizes")
    if (
        plugin.pg_mesh.size(plugin.tp_axis) != 2
        or plugin.pg_mesh.coordinate(plugin.tp_axis) != rank
    ):
        errors.append(f"pg_mesh shape {plugin.pg_mesh.shape}")
    total = torch.ones(1)
    dist.all_reduce(total, group=plugin.tp_group)  # a script's own collective on the group
    if float(total) != 2 or not plugin.shard_config.enable_tensor_parallelism:
        errors.append("all_reduce over plugin.tp_group")
    if not (plugin.control_device() and plugin.support_no_sync() and plugin.control_precision()):
        errors.append("control_device / support_no_sync / control_precision")

    errors += optimizer_surface(rank)
    errors += pipeline_surface(rank, inputs, ref_out)
    return errors


def optimizer_surface(rank: int) -> list[str]:
    """dp 2 (tp 1): clipping by max_norm and get_grad_norm, clip_grad_by_value, an LR
    scheduler built on the user's optimizer before boost, state_dict / load_state_dict,
    zero_grad(set_to_none); the weights follow the plain model's."""
    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin

    errors: list[str] = []
    ref, model = _gpt2(), _gpt2()
    # SGD with momentum (a state to round-trip): Adam would blow the key bias's gradient,
    # zero in theory and rounding noise in both runs, up into unequal updates
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched_ref = torch.optim.lr_scheduler.LambdaLR(opt_ref, lambda s: 1.0 / (1 + s))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    plugin = HybridParallelPlugin(tp_size=1, max_norm=0.5)
    booster = Booster(plugin=plugin)
    model, opt, _, _, sched = booster.boost(model, opt, lr_scheduler=sched)
    gen = torch.Generator().manual_seed(4)
    for step in range(3):
        inputs = batch("GPT2LMHeadModel", gen)
        ref(**inputs).loss.backward()
        mine = {k: v.chunk(2)[rank] for k, v in inputs.items()}
        booster.backward(model(**mine).loss, opt)
        if step == 1:  # by value, as a script calls it before step()
            opt.clip_grad_by_value(1e-3)
            torch.nn.utils.clip_grad_value_(ref.parameters(), 1e-3)
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        opt.step()
        opt_ref.step()
        if step != 1:
            close(errors, f"get_grad_norm at step {step}", torch.tensor(opt.get_grad_norm()), norm)
        sched.step()
        sched_ref.step()
        if opt.param_groups[0]["lr"] != opt_ref.param_groups[0]["lr"]:
            errors.append(f"lr {opt.param_groups[0]['lr']} != {opt_ref.param_groups[0]['lr']}")
        opt.zero_grad(set_to_none=step != 0)
        opt_ref.zero_grad()
        has = [p.grad for p in model.parameters()]
        if step == 0 and any(g is None or g.abs().sum() != 0 for g in has):
            errors.append("zero_grad(set_to_none=False) left no zeroed gradients")
        if step == 1 and any(g is not None for g in has):
            errors.append("zero_grad() left gradients")
        if step == 1:  # the state round-trips
            state = copy.deepcopy(opt.state_dict())
            opt.load_state_dict(state)
    ref_params = dict(ref.named_parameters())
    for name, p in model.unwrap().named_parameters():
        close(errors, f"weight {name} after 3 steps", p, ref_params[name])
    return errors


def pipeline_surface(rank: int, inputs: dict, ref_out) -> list[str]:
    """pp 2 with sequence_parallelism_mode='all_to_all' but sequence parallelism off (bug
    4c: this was refused): stage_manager, pp_group and execute_pipeline's outputs."""
    import torch.distributed as dist

    from megalith.booster import Booster
    from megalith.booster.plugin import HybridParallelPlugin

    errors: list[str] = []
    plugin = HybridParallelPlugin(
        tp_size=1, pp_size=2, num_microbatches=2, sequence_parallelism_mode="all_to_all"
    )
    booster = Booster(plugin=plugin)
    model, opt, *_ = booster.boost(_gpt2(), torch.optim.SGD(_gpt2().parameters(), lr=0.1))
    sm = plugin.stage_manager
    if (sm.num_stages, sm.stage, sm.is_first_stage(), sm.is_last_stage()) != (
        2, rank, rank == 0, rank == 1,
    ):  # fmt: skip
        errors.append(f"stage_manager: {sm.num_stages} stages, stage {sm.stage}")
    if dist.get_world_size(plugin.pp_group) != 2 or sm.get_next_rank() != 1 - rank:
        errors.append("pp_group / next rank")
    out = booster.execute_pipeline(
        iter([inputs]), model, criterion, opt, return_loss=True, return_outputs=True
    )
    close(errors, "pipeline loss", out["loss"], ref_out.loss)
    outputs = out["outputs"]
    if sm.is_last_stage():
        if type(outputs).__name__ != type(ref_out).__name__:
            errors.append(f"pipeline outputs are a {type(outputs).__name__}")
        else:
            close(errors, "pipeline outputs.logits", outputs.logits, ref_out.logits)
    elif outputs is not None:
        errors.append("outputs on a rank without the last stage")
    return errors
