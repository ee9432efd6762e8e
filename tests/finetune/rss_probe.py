"""Run as a fresh process (python -m tests.finetune.rss_probe DIR HOW): loads the
checkpoint in DIR and prints one JSON line with the host memory it took.

Peak resident memory is read from the kernel (VmHWM), reset just before the load by
writing 5 to /proc/self/clear_refs, so imports and model construction do not count."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def main(directory: str, how: str) -> None:
    import torch
    import transformers

    from megalith.lazy import LazyInitContext
    from megalith.pretrained import CheckpointFiles, load_into

    torch.set_num_threads(1)
    config = transformers.AutoConfig.from_pretrained(directory)
    with LazyInitContext():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    files = CheckpointFiles(directory)
    largest = max(e.end - e.begin for e in files.entries.values())
    Path("/proc/self/clear_refs").write_text("5")
    before = _status("VmRSS")
    if how == "megalith":
        load_into(model, directory)
    else:  # transformers' own load, for the comparison
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    peak = _status("VmHWM")
    kept = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    kept -= sum(
        p.numel() * p.element_size()
        for n, p in model.named_parameters(remove_duplicate=False)
        if n not in dict(model.named_parameters())
    )
    print(json.dumps({"grew": peak - before, "kept": kept, "largest_file_tensor": largest}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
