"""Pretrained checkpoints into models built without their weights (issue 19, item 1).

    from megalith.pretrained import from_pretrained, load_into
    model = from_pretrained("ckpt/llama")                          # megalith.models
    model = from_pretrained("ckpt/llama", library="transformers")  # a transformers model
    load_into(lazy_model, "ckpt/llama")                            # any module, meta or lazy

files.py  a safetensors checkpoint read tensor by tensor, without a memory map
names.py  which checkpoint tensor fills which model tensor (ties, a head's prefix)
load.py   load_into and from_pretrained
"""

from .files import CheckpointFiles
from .load import from_pretrained, load_into

__all__ = ["CheckpointFiles", "from_pretrained", "load_into"]
