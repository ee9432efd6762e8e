"""Pipeline stages of transformers' T5 models: T5ForConditionalGeneration, T5Model,
T5EncoderModel, T5ForTokenClassification (stages.py says how a head runs the model's own
forward).

Layers: [encoder embed, encoder blocks..., bridge, decoder blocks..., head] with a decoder,
[encoder embed, encoder blocks..., head] without. The position bias the first block of a
stack computes (its relative attention bias, plus the mask) travels with the hidden states
to the stack's later blocks, as T5Stack passes it on; so does the cross-attention bias in
the decoder. The bridge ends the encoder (final norm, dropout) and starts the decoder
(decoder_input_ids, or labels shifted right as the model does); the encoder's output then
travels with the decoder's hidden states. The head ends the decoder and runs the model's
forward with `encoder` and `decoder` given (`transformer` for T5ForTokenClassification).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .stages import Held, check_cover, shape_proxy


def _bidirectional(config: Any, proxy: Any, mask: Any, encoder: Any = None) -> Any:
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(
        config=config, inputs_embeds=proxy, attention_mask=mask, encoder_hidden_states=encoder
    )


def _decoder_ids(inputs: dict[str, Any]) -> Any:
    ids = inputs.get("decoder_input_ids")
    return ids if ids is not None else inputs.get("labels")


class T5Embed(nn.Module):
    def __init__(self, stack: nn.Module) -> None:
        super().__init__()
        self.embed_tokens, self.dropout = stack.embed_tokens, stack.dropout

    def forward(self, inputs: dict[str, Any]) -> dict[str, Any]:
        hidden = self.dropout(self.embed_tokens(inputs["input_ids"]))
        return {"hidden": hidden, "inputs": inputs, "bias": None}


class T5EncoderStage(nn.Module):
    def __init__(self, block: nn.Module, config: Any) -> None:
        super().__init__()
        self.block = block
        object.__setattr__(self, "config", config)

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        inputs, hidden = x["inputs"], x["hidden"]
        mask = _bidirectional(
            self.config, shape_proxy(inputs, hidden), inputs.get("attention_mask")
        )
        hidden, bias, _ = self.block(hidden, mask, x["bias"], None, None, None, cache=None)
        return {**x, "hidden": hidden, "bias": bias}


class T5Bridge(nn.Module):
    """The encoder's end and the decoder's start."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        enc, dec = model.encoder, model.decoder
        self.final_layer_norm, self.enc_dropout = enc.final_layer_norm, enc.dropout
        self.embed_tokens, self.dropout = dec.embed_tokens, dec.dropout
        object.__setattr__(self, "model", model)

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        inputs = x["inputs"]
        encoded = self.enc_dropout(self.final_layer_norm(x["hidden"]))
        ids = inputs.get("decoder_input_ids")
        if ids is None:
            if inputs.get("labels") is None:
                raise ValueError(
                    f"pipeline: {type(self.model).__name__} needs decoder_input_ids or labels "
                    "in the batch"
                )
            ids = self.model._shift_right(inputs["labels"])
        hidden = self.dropout(self.embed_tokens(ids))
        return {
            "hidden": hidden, "inputs": inputs, "encoded": encoded, "bias": None,
            "cross_bias": None, "decoder_ids": ids,
        }  # fmt: skip


class T5DecoderStage(nn.Module):
    def __init__(self, block: nn.Module, config: Any) -> None:
        super().__init__()
        self.block = block
        object.__setattr__(self, "config", config)

    def forward(self, x: dict[str, Any]) -> dict[str, Any]:
        from transformers.masking_utils import create_causal_mask

        inputs, hidden, encoded = x["inputs"], x["hidden"], x["encoded"]
        ids = x["decoder_ids"]
        proxy = hidden.new_empty(ids.shape[0], ids.shape[1], 1)
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=proxy,
            attention_mask=inputs.get("decoder_attention_mask"),
            cache=None,
        )
        cross_mask = _bidirectional(self.config, proxy, inputs.get("attention_mask"), encoded)
        hidden, bias, cross = self.block(
            hidden, mask, x["bias"], encoded, cross_mask, x["cross_bias"], cache=None
        )
        return {**x, "hidden": hidden, "bias": bias, "cross_bias": cross}


class T5Head(Held):
    def __init__(self, model: nn.Module, stack: nn.Module, trunk_names: tuple[str, ...]):
        super().__init__(model, trunk_names, skip=("shared",))
        self.final_layer_norm, self.dropout = stack.final_layer_norm, stack.dropout
        self.decoder = "decoder" in trunk_names

    def forward(self, x: dict[str, Any]) -> Any:
        from transformers.modeling_outputs import (
            BaseModelOutput,
            BaseModelOutputWithPastAndCrossAttentions,
        )

        last = self.dropout(self.final_layer_norm(x["hidden"]))
        if not self.decoder:  # a T5Stack's own output type
            out = BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=last)
            return self.run_model(x["inputs"], **dict.fromkeys(self.trunk_names, out))
        encoded = BaseModelOutput(last_hidden_state=x["encoded"])
        decoded = BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=last)
        return self.run_model(x["inputs"], encoder=encoded, decoder=decoded)


def t5_stages(model: nn.Module) -> tuple[nn.Module, list[nn.Module], nn.Module]:
    owner = getattr(model, "transformer", model)  # T5ForTokenClassification wraps an encoder
    enc = owner.encoder
    embed = T5Embed(enc)
    blocks: list[nn.Module] = [T5EncoderStage(b, enc.config) for b in enc.block]
    dec = getattr(model, "decoder", None)
    if dec is None:
        head = T5Head(model, enc, ("transformer",) if owner is not model else ("encoder",))
    else:
        blocks.append(T5Bridge(model))
        blocks += [T5DecoderStage(b, dec.config) for b in dec.block]
        head = T5Head(model, dec, ("encoder", "decoder"))
    check_cover(model, [embed, *blocks, head])
    return embed, blocks, head
