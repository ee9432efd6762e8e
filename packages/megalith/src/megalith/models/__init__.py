"""Reference models: GPT-2 and Llama decoders with transformers' parameter names.

Creating
    model = megalith.models.create("gpt-1.3b")            # meta device: no memory
    model = megalith.models.create("gpt-tiny", device="cpu", seed=0, vocab_size=256)
    megalith.models.materialize(model, device="cuda", seed=0)  # storage + init
    megalith.models.list_models()  # preset names; get_config(name, **overrides)

  Initialisation is deterministic per parameter (seeded by its name, drawn on
  the CPU): the same seed gives the same values on any device, and whether the
  whole model or only a part is materialised (init.py says how).

Running
    logits = model(input_ids)                      # [B, S, vocab]
    loss, logits = model(input_ids, labels=input_ids)   # shifted causal-LM loss
    model.set_activation_checkpointing(True)       # per block, non-reentrant

Counting (from the config alone, so a 70B model costs nothing to size)
    num_parameters(model_or_config), num_flop_parameters(...),
    flops_per_token(..., seq_len) = 6N + 12 * n_layers * d_model * seq_len,
    mfu(tokens_per_second, model_or_config, peak_flops, seq_len)

transformers
    model.state_dict() loads into GPT2LMHeadModel / LlamaForCausalLM as is (the
    same names; GPT-2's projections are stored [in, out] as its Conv1D does).
    model.to_hf_config() is their config.json; save_pretrained(model, dir) writes
    a directory that AutoModelForCausalLM.from_pretrained loads, and
    load_pretrained(dir) reads one back (gpt2 and plain-RoPE llama).

Pipeline partitioning
    embedding, blocks, head = model.pipeline_parts()

  - embedding(input_ids [B, S] int64) -> hidden [B, S, d_model]
    (GPT: token + position embeddings; Llama: token embeddings; RoPE is applied
    inside each block, which needs only hidden: positions are 0..S-1).
  - blocks: list of nn.Module, each hidden -> hidden, same shape and dtype, no
    other inputs or state; each keeps its activation_checkpointing flag.
  - head(hidden) -> logits [B, S, vocab] (final norm + lm_head). The loss is
    causal_lm_loss(logits, labels), shifted inside, so the last stage needs the
    labels of the whole micro-batch.
  forward() is exactly head(blocks[-1](... blocks[0](embedding(ids)))): a
  pipelined run does the same operations as the plain model. The parts hold
  the model's own modules: names in model.state_dict() stay the checkpoint
  names. With tied embeddings (every GPT preset, llama-1b) model.tied_weights
  maps "lm_head.weight" to the embedding's name: the first and last stage each
  hold a copy and must sum their gradients. For lazy per-stage creation: build
  on meta, call `part.to_empty(device=...)` on this stage's parts only, then
  model.init_weights(seed), which fills every non-meta parameter with the values
  the whole model would have.
"""

from .base import IGNORE_INDEX, Block, CausalLM, CausalLMOutput, LMHead, causal_lm_loss
from .config import GPTConfig, LlamaConfig, ModelConfig, config_from_dict
from .counting import flops_per_token, mfu, num_flop_parameters, num_parameters
from .factory import create
from .gpt import GPTLMHeadModel
from .hf import from_hf_config, hf_state_dict, load_pretrained, save_pretrained, to_hf_config
from .init import init_weights, materialize
from .llama import LlamaForCausalLM
from .presets import PRESETS, get_config, list_models

__all__ = [
    "IGNORE_INDEX",
    "PRESETS",
    "Block",
    "CausalLM",
    "CausalLMOutput",
    "GPTConfig",
    "GPTLMHeadModel",
    "LMHead",
    "LlamaConfig",
    "LlamaForCausalLM",
    "ModelConfig",
    "causal_lm_loss",
    "config_from_dict",
    "create",
    "flops_per_token",
    "from_hf_config",
    "get_config",
    "hf_state_dict",
    "init_weights",
    "list_models",
    "load_pretrained",
    "materialize",
    "mfu",
    "num_flop_parameters",
    "num_parameters",
    "save_pretrained",
    "to_hf_config",
]
