"""The training loop of `megalith train`, run on every rank."""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import megalith_comm as comm
from megalith.strategy import Strategy

from . import auto, choices, finetune, pipeline_steps, state, tokenize
from . import compile as run_compile
from . import config as run_config
from . import corpus as text
from .generate import generate, one_line
from .mfu import Meter, format_mfu
from .mfu import meter as mfu_meter
from .plot import write_plot
from .progress import Metrics, Progress, human_bytes
from .tensorboard_log import TensorBoardLog


def _strategy(args: argparse.Namespace, device: torch.device) -> Strategy | None:
    """The run's Strategy (None for --plugin auto: the plan's, after boost); every rank
    fails here, before any collective, on options that cannot work."""
    try:
        finetune.resolve_model(args)
        choices.check(args)
        finetune.check(args)  # again: ranks torchrun started skip megalith train's checks
    except ValueError as e:
        raise SystemExit(f"megalith train: {e}") from None
    if auto.is_auto(args):
        try:
            auto.check_args(args)
        except ValueError as e:
            raise SystemExit(f"megalith train: {e}") from None
        return None
    try:
        strategy = Strategy.from_cli(
            args, default_precision="bf16" if device.type == "cuda" else "fp32"
        )
    except ValueError as e:
        raise SystemExit(f"megalith train: {e}") from None
    return strategy


def _swap_in(strategy: Strategy, run_dir: Path, name: str) -> Strategy:
    """NVMe offload without --swap-dir swaps under the run's directory, named after it."""
    offload = strategy.offload
    if offload is None or "nvme" not in offload.tier:
        return strategy
    return strategy.replace(
        offload=dataclasses.replace(
            offload,
            swap_dir=offload.swap_dir or str(run_dir / "swap"),
            run_name="".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name),
        )
    )


@dataclass
class Run:
    """What the loop of one rank works with."""

    args: argparse.Namespace
    strategy: Strategy
    booster: Any
    model: Any
    optimizer: Any
    scheduler: Any
    data: text.Corpus
    run_dir: Path
    n_params: int
    auto: Any = None  # --plugin auto: the AutoPlugin (its plan)
    meter: Meter | None = None  # rank 0: MFU's figures
    seq: int = 0  # tokens per sequence the model sees, plus the one predicted after them
    tokenizer: Any = None
    trainable: int | None = None  # --lora: the adapters' parameters


def _peak_bytes(model: Any) -> int:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    params = [p for p in model.parameters() if p.requires_grad]  # --lora: the adapters
    decay = [p for p in params if p.dim() >= 2]
    other = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


@torch.no_grad()
def _validate(
    model: Any,
    data: text.Corpus,
    args: argparse.Namespace,
    rank: int,
    device: torch.device,
    seq: int,
) -> float:
    total = torch.zeros((), dtype=torch.float64)
    pipelined = pipeline_steps.is_pipelined(model)
    for i in range(args.eval_batches):
        g = text.batch_generator(args.seed, i, rank, "val")
        ids = text.batch(data.val, args.batch_size, seq, g).to(device)
        if pipelined:
            total += pipeline_steps.eval_loss(model, ids)
        else:
            total += float(model(ids, labels=ids)[0])
    total /= args.eval_batches
    comm.all_reduce(total, op="avg")
    return float(total)


def train(args: argparse.Namespace) -> int:
    """Runs the job on this rank; returns the exit code (0)."""
    owns_comm = not comm.is_initialized()
    try:
        return _train(args)
    finally:
        if owns_comm and comm.is_initialized():
            comm.destroy()


def _train(args: argparse.Namespace) -> int:
    from megalith import models
    from megalith.booster import Booster

    world = comm.init() if not comm.is_initialized() else comm.get_world()
    torch.manual_seed(args.seed)
    size = world.world_size
    device = world.device
    strategy = _strategy(args, device)
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", size)))
    )
    name = choices.run_name(args, strategy.plugin if strategy else "auto")
    run_dir = Path(args.out) / name
    try:  # every rank looks before rank 0 clears it
        choices.check_run_dir(args, run_dir)
    except ValueError as e:
        raise SystemExit(f"megalith train: {e}") from None
    comm.barrier()
    if args.overwrite and world.rank == 0:
        choices.clear_run_dir(run_dir)
    comm.barrier()
    if strategy is not None:
        strategy = _swap_in(strategy, run_dir, name)
    try:
        tokenizer = tokenize.load(args.tokenizer)
    except ValueError as e:
        raise SystemExit(f"megalith train: {e}") from None
    data = text.load(args.data, 20 * (args.seq_len + 1), tokenizer, args.text_field)

    # The plugin clips to --max-norm in step(); with offload and neither clipping nor fp16
    # it updates host chunks during backward.
    if strategy is None:
        precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
        plugin = auto.make_plugin(args, size, precision)
    else:
        plugin = strategy.make_plugin()
    booster = Booster(plugin=plugin)
    if args.from_pretrained is not None:
        model, context = finetune.build(args, booster)
        n_params = finetune.parameters(model)
        context = context or args.seq_len + 1
    else:
        overrides: dict[str, Any] = {"vocab_size": data.vocab}
        config = models.get_config(args.model)
        context = max(config.max_seq_len, args.seq_len)
        if config.max_seq_len < args.seq_len:
            overrides["max_seq_len"] = args.seq_len
        model = models.create(
            args.model,
            device=device,
            seed=args.seed,
            activation_checkpointing=args.activation_checkpointing,
            **overrides,
        )
        n_params = models.num_parameters(model)
    trainable = finetune.trainable(model) if args.lora is not None else None
    meter = _meter(model, args, strategy, size) if world.rank == 0 else None
    if args.compile:  # in place, before the plugin wraps it (checked in choices.check)
        run_compile.apply(model, args.compile)
    optimizer = choices.make_optimizer(args, _param_groups(model, args.weight_decay))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, choices.lr_factor(args))
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    planned = plugin if strategy is None else None
    strategy = strategy or plugin.strategy
    try:
        run = Run(
            args=args,
            strategy=strategy,
            booster=booster,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            data=data,
            run_dir=run_dir,
            n_params=n_params,
            auto=planned,
            meter=meter,
            # a window of seq_len + 1 tokens where the context takes it, else seq_len
            seq=args.seq_len if args.seq_len < context else args.seq_len - 1,
            tokenizer=tokenizer,
            trainable=trainable,
        )
        return _loop(run)
    finally:
        inner = getattr(optimizer, "zero_optimizer", None) or getattr(optimizer, "optim", None)
        close = getattr(inner, "close", None)
        if close is not None:  # removes an NVMe swap directory now, not at exit
            close()


def _loop(run: Run) -> int:
    args, booster, model, optimizer = run.args, run.booster, run.model, run.optimizer
    scheduler, data, run_dir = run.scheduler, run.data, run.run_dir
    world = comm.get_world()
    rank, size, device = world.rank, world.world_size, world.device

    start = 0
    if args.resume:
        found = state.find_intact(run_dir if args.resume == "auto" else Path(args.resume))
        if found is None:
            raise SystemExit(
                f"megalith train: --resume: no complete checkpoint under {args.resume if args.resume != 'auto' else run_dir}"
            )
        start = int(state.load(booster, model, optimizer, scheduler, found)["step"])
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        if run.auto is not None:
            auto.write_plan(run_dir, run.auto)
        run_config.save(run_dir, args)
    metrics = Metrics(run_dir / "metrics.jsonl", rank == 0)
    metrics.truncate_after(start)
    board = TensorBoardLog(run_dir, start) if args.tensorboard and rank == 0 else None
    if rank == 0:
        print(
            f"megalith train: {args.model} ({run.n_params / 1e6:.2f} M params{_lora_words(run)}) on {size} "
            f"{device.type} rank(s), plugin {_plugin_words(run)}"
            + _offload_words(run)
            + f", {run.strategy.precision}; {data.name}: {len(data.train) / 1e6:.2f} MB train, "
            f"unigram baseline {data.unigram_nats:.3f} nats"
            + _batch_words(args, size)
            + (f"; resumed at step {start}" if start else ""),
            flush=True,
        )
    bar = Progress(args.steps, start) if rank == 0 else None
    accum = args.grad_accum
    tokens_per_step = args.batch_size * args.seq_len * size * accum
    # each data-parallel rank feeds its share of the global batch (all ranks but under tp/sp)
    dp_rank, dp = booster.plugin.dp_rank_size
    per_rank = args.batch_size * size // dp
    pipelined = pipeline_steps.is_pipelined(model)  # a pp > 1 plan: execute_pipeline
    last_val = float("nan")
    ckpt_path = None
    stopped = None
    t_run = time.perf_counter()
    for step in range(start + 1, args.steps + 1):
        ids = text.batch(
            data.train,
            per_rank * accum,
            run.seq,
            text.batch_generator(args.seed, step, dp_rank, "train"),
        )
        ids = ids.to(device)
        t0 = time.perf_counter()
        logged = torch.zeros((), dtype=torch.float64)
        if pipelined:
            logged = pipeline_steps.train_step(booster, model, optimizer, ids, accum)
        # equal micro-batches: the mean of their mean losses is the whole batch's
        for i, micro in enumerate([] if pipelined else ids.chunk(accum)):
            with _no_sync(booster, model, optimizer) if i < accum - 1 else nullcontext():
                loss = model(micro, labels=micro)[0] / accum
                booster.backward(loss, optimizer)
            logged += loss.detach().double().cpu()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        comm.all_reduce(logged, op="avg")
        dt = time.perf_counter() - t0
        row = {
            "step": step,
            "loss": float(logged),
            "lr": scheduler.get_last_lr()[0],
            "step_s": dt,
            "tokens_per_s": tokens_per_step / dt,
            "peak_bytes": _peak_bytes(model),
        }
        row.update(_grad_norm_and_mfu(optimizer, run.meter, row["tokens_per_s"]))
        if args.max_time is not None and _out_of_time(args.max_time, t_run):
            stopped = f"--max-time {args.max_time:g} s reached after step {step}"
        if step % args.eval_every == 0 or step == args.steps or stopped:
            last_val = _validate(model, data, args, dp_rank, device, run.seq)
            row["val_loss"] = last_val
            _print_sample(run, step, bar)
        metrics.write(row)
        if board:
            board.write(row)
        if bar:
            bar.update(
                step,
                {
                    "loss": f"{row['loss']:.3f}",
                    "val": f"{last_val:.3f}",
                    "tok/s": f"{row['tokens_per_s']:.0f}",
                    "step": f"{dt * 1e3:.0f}ms",
                    "mem": human_bytes(row["peak_bytes"]),
                    "mfu": format_mfu(row.get("mfu")),
                },
            )
        if args.save_every and (step % args.save_every == 0 or step == args.steps or stopped):
            ckpt_path = state.save(
                booster,
                model,
                optimizer,
                scheduler,
                run_dir / "checkpoints",
                step,
                {"args": {k: v for k, v in vars(args).items() if k != "func"}},
                use_async=not getattr(args, "sync_save", False),
                keep_last=args.keep_last,
            )
        if stopped or (args.stop_after is not None and step == args.stop_after):
            break
    state.wait_saves()  # the last checkpoint is complete (and any failure named) first
    if board:
        board.close()
    if args.lora is not None:
        finetune.save_adapter(booster, model, run_dir, args)
    if bar:
        bar.close()
    if rank == 0:
        _summary(run, metrics, ckpt_path, time.perf_counter() - t_run, _offloaded(model), stopped)
    return 0


def _print_sample(run: Run, step: int, bar: Progress | None) -> None:
    """Collective (a sharded model's forward): greedy text after the start of the
    validation text, one line on rank 0."""
    n = run.args.sample_tokens
    if n == 0 or pipeline_steps.is_pipelined(run.model):  # no rank holds the whole model
        return
    prompt = [int(t) for t in run.data.val[: min(16, run.seq)]]
    run.model.eval()
    try:
        new = generate(run.model, prompt, n, context=run.seq + 1, device=comm.get_world().device)
    finally:
        run.model.train()
    if comm.get_world().rank == 0:
        decode = run.tokenizer.decode
        line = f"  sample @ {step}: {one_line(decode(prompt), 40)} >> {one_line(decode(new), 80)}"
        if bar is not None and bar.tty:
            line = "\r" + line.ljust(120)
        print(line, flush=True)


def _meter(model: Any, args: argparse.Namespace, strategy: Strategy | None, size: int) -> Any:
    """MFU's figures from the model as built (before the plugin wraps or shards it)."""
    default = "bf16" if torch.cuda.is_available() else "fp32"
    precision = strategy.precision if strategy else args.precision or default
    return mfu_meter(model, args.seq_len, precision, size)


def _grad_norm_and_mfu(optimizer: Any, meter: Any, tokens_per_s: float) -> dict[str, float]:
    """The step's metrics row entries "grad_norm" (the norm the plugin's step saw) and
    "mfu", each where it is known."""
    out: dict[str, float] = {}
    get = getattr(optimizer, "get_grad_norm", None)
    try:
        norm = get() if get is not None else None
    except (NotImplementedError, RuntimeError):
        norm = None
    if norm is not None:
        out["grad_norm"] = float(norm)
    fraction = meter.of(tokens_per_s) if meter is not None else None
    if fraction is not None:
        out["mfu"] = fraction
    return out


def _no_sync(booster: Any, model: Any, optimizer: Any) -> Any:
    """--grad-accum's micro-batches but the last: gradients stay local where the plugin
    can (one reduction per step); otherwise each backward reduces, with the same sum."""
    try:
        return booster.no_sync(model, optimizer)
    except NotImplementedError:
        return nullcontext()


def _out_of_time(max_time: float, t_run: float) -> bool:
    """Collective: whether any rank has trained --max-time seconds (all stop together)."""
    flag = torch.tensor(float(time.perf_counter() - t_run >= max_time), dtype=torch.float64)
    comm.all_reduce(flag, op="max")
    return bool(flag)


def _batch_words(args: argparse.Namespace, size: int) -> str:
    """ "; batch 4 x 2 ranks x grad accum 3 = 24 sequences of 128 tokens": the global batch."""
    accum = f" x grad accum {args.grad_accum}" if args.grad_accum > 1 else ""
    total = args.batch_size * size * args.grad_accum
    return (
        f"; batch {args.batch_size} x {size} rank(s){accum} = {total} sequences of "
        f"{args.seq_len} tokens, {args.optimizer}, lr {args.lr:g} {args.lr_schedule}"
    )


def _lora_words(run: Run) -> str:
    if run.trainable is None:
        return ""
    return f", LoRA r {run.args.lora}: {run.trainable / 1e6:.3f} M trained"


def _plugin_words(run: Run) -> str:
    return f"auto -> {run.strategy.plugin}" if run.auto is not None else run.strategy.plugin


def _offload_words(run: Run) -> str:
    """ " (offload nvme, masters on nvme)": --offload's word and where the masters went."""
    offload = run.strategy.offload
    if offload is None:
        return ""
    masters = ", masters on nvme" if offload.master_tier == "nvme" else ""
    word = offload.tier if run.args.offload == "none" else run.args.offload  # auto's choice
    return f" (offload {word}{masters})"


def _offloaded(model: Any) -> str | None:
    """Where this rank's offloaded training state is, from the ZeRO model's memory
    report: "host: master 1.2 MiB, optim_states 2.3 MiB, staging 4.0 MiB; nvme: ..."."""
    zmodel = getattr(model, "module", None)
    report = getattr(zmodel, "memory_report", None)
    if report is None:
        return None
    placement = getattr(zmodel, "placement", None)
    placed = ""
    if placement is not None and placement.room is not None:  # --offload auto
        chunks = sum(c.trainable for c in zmodel.chunks)
        placed = f"auto placement: {len(placement.moved)} of {chunks} chunks back on the device"
        if placement.params_moved:
            n = len(placement.params_moved)
            placed += f" (and {n} parameter shard{'' if n == 1 else 's'})"
    tiers: dict[str, dict[str, int]] = {}
    for key, usage in report().items():
        kind, at, tier = key.partition("@")
        if not at or not usage.current_bytes:
            continue
        kind = "staging" if "staging" in kind else kind
        kinds = tiers.setdefault(tier, {})
        kinds[kind] = kinds.get(kind, 0) + usage.current_bytes
    where = "; ".join(
        f"{tier}: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in kinds.items())
        for tier, kinds in tiers.items()
    )
    return "; ".join(x for x in (where, placed) if x) or None


def _summary(
    run: Run,
    metrics: Metrics,
    ckpt: Path | None,
    seconds: float,
    offloaded: str | None,
    stopped: str | None = None,
) -> None:
    args, data, run_dir = run.args, run.data, run.run_dir
    world = comm.get_world()
    rows = metrics.rows
    if not rows:
        return
    drawn = write_plot(run_dir / "curves.png", rows, f"megalith train: {run_dir.name}")
    steady = rows[min(5, len(rows) - 1) :]
    tok_s = sum(r["tokens_per_s"] for r in steady) / len(steady)
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    table = [
        ("model", f"{args.model}, {run.n_params / 1e6:.2f} M params" + _lora_words(run)),
        (
            "ranks",
            f"{world.world_size} x {world.device.type}, plugin {_plugin_words(run)}"
            + _offload_words(run),
        ),
        ("batch", _batch_words(args, world.world_size).removeprefix("; batch ")),
        ("steps", f"{rows[-1]['step']} ({seconds:.0f} s this session)"),
        *([("stopped", stopped)] if stopped else []),
        ("train loss", f"{rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f} nats"),
        (
            "val loss",
            f"{vals[-1]:.3f} nats ({text.bits(vals[-1]):.2f} bits/{data.unit})" if vals else "-",
        ),
        ("unigram baseline", f"{data.unigram_nats:.3f} nats"),
        (
            "tokens/s",
            f"{tok_s:,.0f} (step {sum(r['step_s'] for r in steady) / len(steady) * 1e3:.0f} ms)",
        ),
        *([("MFU", run.meter.words(tok_s))] if run.meter else []),
        ("peak memory / rank", human_bytes(max(r["peak_bytes"] for r in rows))),
        *(auto.summary_rows(run.auto, steady, world.device.type) if run.auto else []),
        *([("offloaded / rank", offloaded)] if offloaded else []),
        ("checkpoint", str(ckpt) if ckpt else "-"),
        *([("adapter", str(run_dir / "adapter"))] if args.lora is not None else []),
        ("metrics", str(run_dir / "metrics.jsonl")),
        *([("plan.json", str(run_dir / "plan.json"))] if run.auto else []),
        ("plot", f"{run_dir / 'curves.png'} ({drawn})"),
        *([("tensorboard", str(run_dir / "tensorboard"))] if args.tensorboard else []),
    ]
    width = max(len(k) for k, _ in table)
    print("\n".join(f"  {k.ljust(width)}  {v}" for k, v in table), flush=True)
