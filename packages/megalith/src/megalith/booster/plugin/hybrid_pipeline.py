"""The pipeline part of HybridParallelPlugin (pp_size > 1), on megalith_pipeline.

Settings are checked when the plugin is made (before any collective). boost() cuts
the (already tensor-parallel) model into stages with megalith_pipeline.Pipeline
over the mesh's pp axis; a step is Booster.execute_pipeline, which runs every
micro-batch's forward and backward in the schedule's order. Data parallelism is
the pipeline's own gradient average over the dp axis (zero_stage 0) or
megalith_zero's stage 1 over dp, driven through its no_sync (zero_stage 1).
bf16 and fp16 are torch.autocast around the schedule; fp16 multiplies each
micro-batch's loss by the optimizer's loss scale before its backward.

The loss: ColossalAI calls criterion(outputs, micro_batch). A transformers model is cut
by its family's policy (tensor_parallel/policies/<family>_stages.py): its micro-batch's
model inputs (the batch's tensors its forward takes, labels included) go through the
stages and its head runs the model's own forward, so `outputs` is the model's own output
type (CausalLMOutputWithPast, SequenceClassifierOutput, Seq2SeqLMOutput, ...) with the
model's own .loss: `lambda outputs, inputs: outputs.loss` works unchanged. Other models
(megalith.models, an nn.Sequential) take the batch's input ids; when the last stage gives
logits, criterion gets them as `outputs.logits`, and `outputs.loss` is the causal-LM loss
of the micro-batch's "labels" (shifted by one, -100 ignored; on vocabulary-parallel
logits when parallel_output keeps them so).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from ..wrappers import ModelWrapper

# ColossalAI's pp_style names, and the ones megalith_pipeline uses, to its schedules.
PP_STYLES = {
    "1f1b": "1f1b",
    "interleaved": "interleaved",
    "zbv": "zb-v",
    "zb-v": "zb-v",
    "zb-h1": "zb-h1",
    "gpipe": "gpipe",
}


@dataclass(frozen=True)
class PipelineSettings:
    pp_size: int
    schedule: str
    chunks: int
    num_microbatches: int | None
    microbatch_size: int | None

    @classmethod
    def check(
        cls,
        pp_size: int,
        pp_style: str,
        num_model_chunks: int,
        num_microbatches: int | None,
        microbatch_size: int | None,
    ) -> PipelineSettings:
        if not isinstance(pp_size, int) or isinstance(pp_size, bool) or pp_size < 1:
            raise ValueError(f"HybridParallelPlugin: pp_size must be an int >= 1, got {pp_size!r}")
        style = str(pp_style).lower()
        if style not in PP_STYLES:
            raise ValueError(
                f"HybridParallelPlugin: pp_style={pp_style!r}; expected one of "
                + ", ".join(repr(k) for k in PP_STYLES)
            )
        schedule = PP_STYLES[style]
        if schedule == "interleaved":
            if num_model_chunks < 2:
                raise ValueError(
                    f"HybridParallelPlugin: pp_style='interleaved' needs num_model_chunks >= 2, "
                    f"got {num_model_chunks}"
                )
        elif schedule == "zb-v":
            if num_model_chunks not in (1, 2):  # ColossalAI asks for 2; 1 is the default
                raise ValueError(
                    f"HybridParallelPlugin: pp_style='zbv' runs 2 model chunks per rank, got "
                    f"num_model_chunks={num_model_chunks}"
                )
            num_model_chunks = 2
        elif num_model_chunks != 1:
            raise ValueError(
                f"HybridParallelPlugin: pp_style={pp_style!r} runs one model chunk per rank, got "
                f"num_model_chunks={num_model_chunks}; use pp_style='interleaved' or 'zbv'"
            )
        if pp_size > 1 and (num_microbatches is None) == (microbatch_size is None):
            raise ValueError(
                "HybridParallelPlugin: with pp_size > 1 give exactly one of num_microbatches "
                f"and microbatch_size (got {num_microbatches!r} and {microbatch_size!r})"
            )
        for name, value in (
            ("num_microbatches", num_microbatches),
            ("microbatch_size", microbatch_size),
        ):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"HybridParallelPlugin: {name} must be an int >= 1, got {value!r}")
        return cls(pp_size, schedule, num_model_chunks, num_microbatches, microbatch_size)

    def microbatches(self, batch_size: int) -> int:
        """The micro-batch count for a batch of batch_size samples."""
        if self.num_microbatches is not None:
            return self.num_microbatches
        if batch_size % self.microbatch_size:
            raise ValueError(
                f"HybridParallelPlugin: batch size {batch_size} is not a multiple of "
                f"microbatch_size={self.microbatch_size}"
            )
        return batch_size // self.microbatch_size


def stage_balance(num_layers_per_stage: list[int], layers: int) -> list[int]:
    """ColossalAI's num_layers_per_stage (decoder layers per virtual stage) as
    megalith_pipeline's stage sizes: the embedding joins the first stage, the head the last."""
    extra = layers - sum(num_layers_per_stage)
    if extra != 2 or min(num_layers_per_stage, default=0) < 0:
        raise ValueError(
            f"HybridParallelPlugin: num_layers_per_stage={num_layers_per_stage} sums to "
            f"{sum(num_layers_per_stage)}, but the model has {layers - 2} blocks (between its "
            "embedding and its head); give one count per virtual stage summing to the blocks"
        )
    sizes = list(num_layers_per_stage)
    sizes[0] += 1
    sizes[-1] += 1
    return sizes


class LMOutput:
    """What criterion gets from the last stage: logits, and the causal-LM loss of
    `labels` computed when first asked for (on vocabulary-parallel logits over `group`
    when given)."""

    def __init__(self, logits: torch.Tensor, labels: torch.Tensor | None, group: Any = None):
        self.logits = logits
        self._labels = labels
        self._group = group

    @property
    def loss(self) -> torch.Tensor:
        if self._labels is None:
            raise ValueError(
                "execute_pipeline: outputs.loss needs 'labels' in the batch; or compute the "
                "loss from outputs.logits in the criterion"
            )
        if self._group is not None:
            from megalith.tensor_parallel import vocab_parallel_causal_lm_loss

            return vocab_parallel_causal_lm_loss(self.logits, self._labels, self._group)
        logits = self.logits[:, :-1].float()
        target = self._labels[:, 1:].to(logits.device)
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
        )

    def __getitem__(self, key: str) -> Any:  # outputs["loss"], outputs["logits"]
        return getattr(self, key)


def model_inputs(batch: Any) -> Any:
    """What the first stage of a model cut by its own layout takes: input ids from a dict
    batch, else the batch itself."""
    if isinstance(batch, dict):
        if "input_ids" not in batch:
            raise ValueError(
                f"execute_pipeline: a dict batch needs 'input_ids' (got keys {sorted(batch)})"
            )
        return batch["input_ids"]
    if isinstance(batch, (tuple, list)):
        return batch[0]
    return batch


def loss_fn_for(
    criterion: Callable[..., torch.Tensor],
    loss_scale: float = 1.0,
    keep: list[Any] | None = None,
    logits_group: Any = None,
) -> Callable[[Any, Any], torch.Tensor]:
    """The pipeline's loss on the last stage: criterion(outputs, micro_batch), times the
    fp16 loss scale; `keep` collects each micro-batch's outputs (detached), in order."""

    def loss_fn(output: Any, micro_batch: Any) -> torch.Tensor:
        if isinstance(output, torch.Tensor) and output.dim() == 3:
            labels = micro_batch.get("labels") if isinstance(micro_batch, dict) else None
            output = LMOutput(output, labels, logits_group)
        if keep is not None:
            keep.append(_detached(output))
        loss = criterion(output, micro_batch)
        return loss if loss_scale == 1.0 else loss.float() * loss_scale

    return loss_fn


def _detached(output: Any) -> Any:
    if isinstance(output, LMOutput):
        return LMOutput(output.logits.detach(), output._labels, output._group)
    if isinstance(output, dict):  # a transformers ModelOutput keeps its type
        fields = {k: _detached(v) for k, v in output.items()}
        try:
            return type(output)(**fields)
        except TypeError:
            return fields
    return tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, output)


def merge_outputs(outputs: list[Any]) -> Any:
    """The micro-batches' outputs as one batch's: tensors concatenated along dim 0, in
    LMOutput, dicts (ModelOutput too), tuples and lists alike."""
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim():
            return torch.cat(outputs)
        # a per-micro-batch scalar (a loss): the batch's mean
        return torch.stack(outputs).float().mean() if first.is_floating_point() else outputs[-1]
    if isinstance(first, LMOutput):
        labels = [o._labels for o in outputs]
        return LMOutput(
            torch.cat([o.logits for o in outputs]),
            None if any(x is None for x in labels) else torch.cat(labels),
            first._group,
        )
    if isinstance(first, dict):
        merged = {k: merge_outputs([o[k] for o in outputs]) for k in first}
        try:
            return type(first)(**merged)
        except TypeError:
            return merged
    if isinstance(first, (tuple, list)):
        return type(first)(merge_outputs(list(parts)) for parts in zip(*outputs))
    return outputs  # anything else: the micro-batches' values, in order


class PipelineModel(ModelWrapper):
    """This rank's stages (`module`) and the pipeline that runs them."""

    def __init__(
        self, pipe: Any, settings: PipelineSettings, precision: str, mesh: Any, whole: Any
    ):
        super().__init__(pipe.module)
        self.pipe = pipe
        self.settings = settings
        self.precision = precision
        self.mesh = mesh
        self.whole = whole  # the model as given (names for checkpoints); stages alias it
        self.zero_no_sync: Callable | None = None  # megalith_zero's, under zero_stage 1
        self.last_outputs: Any = None
        self.uses_parts = False  # cut by a policy's pipeline_parts: stages take a dict
        self.logits_group: Any = None  # vocabulary-parallel logits (parallel_output)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            "HybridParallelPlugin with pp_size > 1: a model split into pipeline stages runs "
            "through booster.execute_pipeline(data_iter, model, criterion, optimizer), not model(...)"
        )

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.precision == "fp32":
            yield
            return
        device = self.pipe.channels.device.type
        dtype = torch.float16 if self.precision == "fp16" else torch.bfloat16
        with torch.autocast(device_type=device, dtype=dtype):
            yield

    def step(
        self,
        batch: Any,
        criterion: Callable,
        no_sync: Callable | None,
        loss_scale: float = 1.0,
        keep_outputs: bool = False,
        sum_ties: bool = True,
    ) -> torch.Tensor:
        """Forward and backward of the batch through every stage; the loss on every rank.
        fp16: each micro-batch's loss is multiplied by loss_scale before its backward (the
        optimizer unscales); the loss returned is the unscaled one. keep_outputs: the last
        stage's outputs of the whole batch go to `last_outputs` (None on other ranks)."""
        from megalith.tensor_parallel.lora import peft_base
        from megalith.tensor_parallel.policies.stages import model_inputs as stage_inputs

        pipe = self.pipe
        device = pipe.channels.device
        if self.uses_parts:  # the inputs the stages' (a peft model's base model's) forward takes
            whole = peft_base(self.whole)
            inputs = {k: v.to(device) for k, v in stage_inputs(whole, batch).items()}
            n = inputs["input_ids"].shape[0]
        else:
            inputs = model_inputs(batch)
            n = inputs.shape[0] if isinstance(inputs, torch.Tensor) else len(inputs)
            inputs = inputs.to(device) if isinstance(inputs, torch.Tensor) else inputs
        pipe.set_num_microbatches(self.settings.microbatches(n))
        kept: list[Any] | None = [] if keep_outputs else None
        pipe.loss_fn = pipe.executor.loss_fn = loss_fn_for(
            criterion, loss_scale, kept, self.logits_group
        )
        with self.autocast():
            loss = pipe.step(inputs, batch, no_sync=no_sync, sum_ties=sum_ties)
        self.last_outputs = merge_outputs(kept) if kept else None
        return loss if loss is None or loss_scale == 1.0 else loss / loss_scale
