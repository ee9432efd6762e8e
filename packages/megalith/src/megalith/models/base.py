"""What both decoders share: the forward through (embedding, blocks, head), the
causal-LM loss, the activation-checkpointing switch and the pipeline view.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .config import ModelConfig

IGNORE_INDEX = -100


class CausalLMOutput(NamedTuple):
    """What forward returns when given labels; out[0] and out.loss are the loss, as in transformers."""

    loss: torch.Tensor
    logits: torch.Tensor


def causal_lm_loss(
    logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """Mean cross-entropy of logits[:, t] against labels[:, t + 1], in fp32.

    Labels equal to ignore_index (-100) do not count, as in transformers.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"labels must have the shape of input_ids: logits {tuple(logits.shape)} "
            f"need labels {tuple(logits.shape[:-1])}, got {tuple(labels.shape)}"
        )
    # Shift the labels, not the logits: slicing the logits would copy all of them.
    targets = F.pad(labels[:, 1:], (0, 1), value=ignore_index).to(logits.device)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=ignore_index
    )


class Block(nn.Module):
    """A decoder block: hidden [batch, seq, d_model] -> hidden, same shape.

    `activation_checkpointing = True` recomputes the block's activations in
    backward (torch.utils.checkpoint, non-reentrant) instead of storing them.
    """

    activation_checkpointing: bool = False

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.block_forward, hidden, use_reentrant=False)
        return self.block_forward(hidden)

    def block_forward(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class LMHead(nn.Module):
    """The final norm and the vocabulary projection: hidden -> logits (the pipeline's last part)."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


class CausalLM(nn.Module):
    """A decoder-only language model; subclasses build the modules under the
    names transformers uses and say how each parameter is initialised.
    """

    config: ModelConfig
    lm_head: nn.Linear
    # Parameter name -> the name of the parameter it shares storage with.
    tied_weights: dict[str, str]

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.tied_weights = {}

    # -- structure ------------------------------------------------------------
    # Each part is looked up when asked for, never cached, so a module swapped in
    # later (a tensor-parallel embedding, a wrapped block) is the one that runs.

    @property
    def blocks(self) -> nn.ModuleList:
        raise NotImplementedError

    @property
    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids -> hidden: what embedding_part() computes, without building a module."""
        raise NotImplementedError

    def embedding_part(self) -> nn.Module:
        """A module over the model's own embedding modules: input_ids -> hidden."""
        raise NotImplementedError

    def head_part(self) -> LMHead:
        return LMHead(self.final_norm, self.lm_head)

    def pipeline_parts(self) -> tuple[nn.Module, list[nn.Module], nn.Module]:
        """(embedding, blocks, head), the model cut where a pipeline may cut it.

        embedding(input_ids [B, S] int64) -> hidden [B, S, d_model];
        each block(hidden) -> hidden; head(hidden) -> logits [B, S, vocab_size].
        forward() computes head(blocks[-1](...blocks[0](embedding(ids)))) with the
        same operations, then causal_lm_loss(logits, labels). The parts hold the
        model's own modules, so their parameters are the model's; see the
        package docstring for tied weights and per-stage materialisation.
        """
        return self.embedding_part(), list(self.blocks), self.head_part()

    def tie_weights(self) -> None:
        """Makes tied parameters one Parameter again (to_empty and .to() can untie them)."""
        for name, source in self.tied_weights.items():
            owner, _, attr = name.rpartition(".")
            setattr(self.get_submodule(owner), attr, self.get_parameter(source))

    # -- running --------------------------------------------------------------

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None
    ) -> torch.Tensor | CausalLMOutput:
        """logits [B, S, vocab_size]; with labels, CausalLMOutput(loss, logits).

        The loss is the shifted causal-LM loss (causal_lm_loss): logits at t
        predict labels at t + 1, so labels may simply be input_ids.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        hidden = self.embed(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        logits = self.lm_head(self.final_norm(hidden))
        if labels is None:
            return logits
        return CausalLMOutput(causal_lm_loss(logits, labels), logits)

    def set_activation_checkpointing(
        self, enabled: bool = True, blocks: list[int] | None = None
    ) -> None:
        """Turns activation checkpointing on or off for every block, or for the listed ones."""
        chosen = range(len(self.blocks)) if blocks is None else blocks
        for index in chosen:
            self.blocks[index].activation_checkpointing = enabled

    # -- initialisation -------------------------------------------------------

    def init_rule(self, name: str) -> tuple[str, float]:
        """How the parameter with this (model-level) name starts:
        ("normal", std), ("ones", 0.0) or ("zeros", 0.0).
        """
        raise NotImplementedError

    def init_weights(self, seed: int = 0) -> None:
        """Initialises every parameter not on the meta device; see megalith.models.init."""
        from .init import init_weights

        init_weights(self, seed)

    def to_hf_config(self) -> dict:
        """transformers' config.json content for this model, its dtype included."""
        dtype = next(self.parameters()).dtype
        return self.config.to_hf_config(dtype)
