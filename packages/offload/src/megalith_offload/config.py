"""OffloadConfig: where the optimizer states and fp32 masters of a ZeRO run live."""

from __future__ import annotations

import math
from dataclasses import dataclass

TIERS = ("host", "nvme", "host+nvme")
PLACEMENTS = ("static", "auto")
PARAM_TIERS = ("host", "nvme")
MASTER_TIERS = ("host", "nvme")
IO_BACKENDS = ("auto", "uring", "threads")


@dataclass(frozen=True)
class OffloadConfig:
    """Placement of fp32 master shards and optimizer states, validated on construction.

    The states' format is the optimizer's (HybridAdam(state_dtype="bf16"|"int8"), one
    place for every tier): host memory, swap files and the plan hold them at 2 or
    about 1 byte per value ([Note: lean chunk states] in megalith_core.optim.flat_states);
    visit_frac's device visits carry fp32 states only, so lean chunks stay on the host.

    tier: where offloaded chunks keep their optimizer states: "host" (pinned host
        memory when CUDA is there, pageable host memory otherwise) or "nvme" (files
        in a per-run swap directory, read back before a chunk's step and written
        after it; the next chunk's read overlaps the current chunk's step). The
        fp32 masters of offloaded chunks live in host memory on either tier, unless
        master_tier says "nvme".
        "host+nvme": each offloaded chunk's states in host memory while
        host_budget_bytes has room for them, on NVMe past it (the device, the host
        and the disk together hold the model).
    optim_frac: the fraction of chunks whose states are offloaded (ColossalAI's
        offload_optim_frac): 1.0 offloads all, 0.0 none (unless the budget asks).
    placement: "static" (the default): the chunks named by optim_frac and
        device_budget_bytes are offloaded for the whole run. "auto": the first step
        (the warm-up) runs with every chunk offloaded (static full offload; at ZeRO
        stage 3 the parameter shards too) while the non-model memory of the step is
        measured; afterwards the chunks that fit the device budget move back to the
        device tier, parameter shards first (see megalith_offload.auto).
    device_budget_bytes: static: at most this many bytes of masters and optimizer
        states stay on the device tier; chunks past it are offloaded too; None: no
        limit. auto: every byte the step uses on the device (working params, grads,
        gathered chunks, activations and other non-model memory, masters and states
        kept there); None: the GPU's total memory (required on CPU ranks, where it
        is a simulated device).
    headroom: auto: the fraction of device_budget_bytes kept free beyond the warm-up's
        measured peak (allocator fragmentation, steps whose activations differ).
    host_budget_bytes: at most this many bytes of host memory for offloaded
        masters and states (tier "host") or masters and NVMe staging buffers (tier
        "nvme"); enforced by the engine. None: no limit.
    swap_dir: the directory under which the per-run swap directory is made
        (tier "nvme"); None: the system's temporary directory.
    run_name: names the swap directory (megalith-swap-<run_name>-rank<r>-<id>).
    io_threads: threads of the engine's async file I/O (with io_backend "threads", or
        for the blocks io_uring does not take).
    io_backend: the engine's file I/O backend: "auto" (io_uring where the kernel allows
        it, threads otherwise; MEGALITH_IO_BACKEND overrides), "uring" or "threads".
    direct: use O_DIRECT where the filesystem allows it.
    param_frac: ZeRO stage 3: the fraction of chunks whose working-parameter shards live
        in (pinned) host memory instead of on the device (ColossalAI's
        offload_param_frac; the first chunks go). Each gather copies the shard up first
        (prefetching hides it); the host update writes the new values there directly.
        Only chunks whose optimizer states are offloaded can: the first
        ceil(param_frac * chunks) must be offloaded by optim_frac or the budget.
    param_tier: where those parameter shards live: "host" (above) or "nvme": in a
        file of the chunk's own beside its optimizer states' in the swap directory
        (needs tier "nvme" or "host+nvme"; with "host+nvme" these chunks keep their
        states on NVMe whatever the host budget). A gather reads the shard into one of
        a small ring of host staging buffers first (a prefetch starts the read early);
        the host update writes the new values back to the file.
    visit_frac: the fraction of host-tier chunks (working parameters on the device) that
        the device kernel updates, their masters and states streamed through a few
        device slots and back, so that the copy engines share the update with the host
        cores ([Note: visiting chunks] in megalith_zero/visit.py): every k-th such chunk,
        spread over the model. The slots, two of the largest chunk's master and states,
        come on top of device_budget_bytes. 0: the host updates every offloaded chunk.
        "auto": chosen after the first step from what it measured, the host kernel's
        seconds per parameter and the link's (see megalith_offload.auto.visit_frac_for).
    master_tier: where the fp32 masters of chunks whose states are on NVMe live: "host"
        (the default: host memory, 4 bytes per parameter there) or "nvme": in the
        chunk's states' file, ahead of the states, read and written with them around
        the chunk's step (DeepSpeed's ZeRO-Infinity keeps them there too). The host
        then holds only staging for those chunks, so the disk, not the host's RAM, bounds
        the model; each step moves 4 more bytes per parameter each way. Needs tier
        "nvme" or "host+nvme" (whose host chunks keep their masters in host memory).
    cpu_threads: host threads of the engine's CPU kernels for the offloaded update;
        None: MEGALITH_NUM_THREADS when set, else the CPUs this process may run on
        shared by the ranks of this host (LOCAL_WORLD_SIZE), one left for the thread
        driving the GPU when there are more than four. (torchrun sets
        OMP_NUM_THREADS=1, which would otherwise leave the update one thread.)
    """

    tier: str = "host"
    optim_frac: float = 1.0
    placement: str = "static"
    headroom: float = 0.1
    device_budget_bytes: int | None = None
    host_budget_bytes: int | None = None
    swap_dir: str | None = None
    run_name: str = "megalith"
    io_threads: int = 4
    io_backend: str = "auto"
    direct: bool = True
    param_frac: float = 0.0
    cpu_threads: int | None = None
    param_tier: str = "host"
    visit_frac: float | str = 0.0
    master_tier: str = "host"

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(
                f"OffloadConfig: tier={self.tier!r}; expected 'host', 'nvme' or 'host+nvme'"
            )
        if self.tier == "host+nvme" and self.host_budget_bytes is None:
            raise ValueError(
                "OffloadConfig: tier='host+nvme' needs host_budget_bytes: the host memory the "
                "optimizer states may fill before the rest go to NVMe"
            )
        frac = self.optim_frac
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise ValueError(f"OffloadConfig: optim_frac={frac!r}; expected 0 <= optim_frac <= 1")
        if not math.isfinite(frac):
            raise ValueError(f"OffloadConfig: optim_frac={frac!r}; expected a finite number")
        pf = self.param_frac
        if isinstance(pf, bool) or not isinstance(pf, (int, float)) or not 0 <= pf <= 1:
            raise ValueError(f"OffloadConfig: param_frac={pf!r}; expected 0 <= param_frac <= 1")
        if pf and self.placement == "auto":
            raise ValueError(
                f"OffloadConfig: param_frac={pf!r} with placement='auto'; automatic placement "
                "decides which parameter shards leave the device itself (at ZeRO stage 3; "
                "at stages 1 and 2 every rank keeps all parameters): leave param_frac at 0, "
                "or use placement='static' to choose it"
            )
        self._check_param_tier()
        if self.master_tier not in MASTER_TIERS:
            raise ValueError(
                f"OffloadConfig: master_tier={self.master_tier!r}; expected 'host' or 'nvme'"
            )
        if self.master_tier == "nvme" and self.tier == "host":
            raise ValueError(
                "OffloadConfig: master_tier='nvme' with tier='host'; masters go to NVMe only "
                "beside their chunk's optimizer states: use tier='nvme' (or 'host+nvme'), or "
                "master_tier='host'"
            )
        vf = self.visit_frac
        if vf != "auto" and (
            isinstance(vf, bool) or not isinstance(vf, (int, float)) or not 0 <= vf <= 1
        ):
            raise ValueError(
                f"OffloadConfig: visit_frac={vf!r}; expected 0 <= visit_frac <= 1 or 'auto'"
            )
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"OffloadConfig: placement={self.placement!r}; expected 'static' or 'auto'"
            )
        if self.placement == "auto" and frac != 1.0:
            raise ValueError(
                f"OffloadConfig: optim_frac={frac!r} with placement='auto'; the warm-up offloads "
                "every chunk and the budget decides what comes back (leave optim_frac at 1.0)"
            )
        h = self.headroom
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 1:
            raise ValueError(f"OffloadConfig: headroom={h!r}; expected 0 <= headroom < 1")
        for name in ("device_budget_bytes", "host_budget_bytes"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"OffloadConfig: {name}={value!r}; expected None or an int >= 0")
        if self.cpu_threads is not None and (
            isinstance(self.cpu_threads, bool)
            or not isinstance(self.cpu_threads, int)
            or self.cpu_threads < 1
        ):
            raise ValueError(
                f"OffloadConfig: cpu_threads={self.cpu_threads!r}; expected None or an int >= 1"
            )
        if self.io_threads < 1:
            raise ValueError(f"OffloadConfig: io_threads={self.io_threads}; expected >= 1")
        if self.io_backend not in IO_BACKENDS:
            raise ValueError(
                f"OffloadConfig: io_backend={self.io_backend!r}; expected 'auto', 'uring' or "
                "'threads'"
            )
        if not self.run_name or "/" in self.run_name:
            raise ValueError(
                f"OffloadConfig: run_name={self.run_name!r}; expected a non-empty name without '/'"
            )

    def _check_param_tier(self) -> None:
        if self.param_tier not in PARAM_TIERS:
            raise ValueError(
                f"OffloadConfig: param_tier={self.param_tier!r}; expected 'host' or 'nvme'"
            )
        if self.param_tier != "nvme":
            return
        if self.tier not in ("nvme", "host+nvme"):
            raise ValueError(
                f"OffloadConfig: param_tier='nvme' with tier={self.tier!r}; parameter shards "
                "go to NVMe only beside their chunk's optimizer states: use tier='nvme' (or "
                "'host+nvme'), or param_tier='host'"
            )
        if not self.param_frac:
            raise ValueError(
                "OffloadConfig: param_tier='nvme' with param_frac=0, which offloads no "
                "parameters: set param_frac (the fraction of chunks whose parameter shards "
                "go to NVMe), or leave param_tier at 'host'"
            )
