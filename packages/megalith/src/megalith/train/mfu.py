"""MFU (model FLOPs utilisation) of `megalith train`: the model's training FLOPs per token
times the tokens per second, over the peak rate of all the ranks' devices.

FLOPs per token come from megalith.autoparallel's meta-device trace of one sequence
(forward and loss, every aten op priced; backward twice the forward, recompute not
counted, as MFU is defined), with 6 N as the fallback for a model the trace cannot take.
The peak: on a GPU the vendor's dense bf16 tensor rate by device name, else the machine
profile's (MEGALITH_PROFILE, `megalith calibrate`'s file, or a built-in of that device
name); on CPU ranks only a profile says (MEGALITH_PROFILE or the calibrated file), and
without one MFU is n/a rather than a guess.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

#: dense bf16 tensor-core FLOP/s by device-name fragment, most specific first
GPU_BF16_PEAK = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("MI300X", 1307e12),
)

BACKWARD_FACTOR = 2.0  # backward FLOPs per forward FLOP (weights' and inputs' gradients)


@dataclass(frozen=True)
class Meter:
    """flops_per_token: training FLOPs of one token; peak_flops: one device's peak rate
    (None: unknown); devices: how many devices the tokens/s is spread over."""

    flops_per_token: float
    flops_source: str
    peak_flops: float | None
    peak_source: str
    devices: int

    def of(self, tokens_per_s: float) -> float | None:
        """The fraction of the peak that tokens_per_s is (None when the peak is unknown)."""
        if self.peak_flops is None:
            return None
        return self.flops_per_token * tokens_per_s / (self.peak_flops * self.devices)

    def words(self, tokens_per_s: float) -> str:
        """The summary's line: "12.3% (5.15 MFLOP/token x 1,234 tokens/s over 2 x ...)"."""
        per_token = f"{self.flops_per_token / 1e6:,.2f} MFLOP/token ({self.flops_source})"
        mfu = self.of(tokens_per_s)
        if mfu is None:
            return f"n/a ({per_token}; {self.peak_source})"
        peak = f"{self.devices} x {_rate(self.peak_flops)} ({self.peak_source})"
        return f"{format_mfu(mfu)} ({per_token} x {tokens_per_s:,.0f} tokens/s over {peak})"


def _rate(flops: float) -> str:
    return f"{flops / 1e12:,.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:,.1f} GFLOP/s"


def format_mfu(mfu: float | None) -> str:
    return "n/a" if mfu is None else f"{100 * mfu:.1f}%"


def flops_per_token(model: torch.nn.Module, seq_len: int, precision: str) -> tuple[float, str]:
    """Training FLOPs of one token of a seq_len sequence, and where the figure came from."""
    try:
        from megalith.autoparallel.analysis import analyze

        analysis = analyze(model, seq_len, precision=precision)
        return (1 + BACKWARD_FACTOR) * analysis.fwd_flops / seq_len, "traced"
    except Exception:  # a model the meta trace cannot run: the dense-transformer rule
        n = sum(p.numel() for p in model.parameters())
        return 6.0 * n, "6N"


def gpu_peak(name: str) -> float | None:
    for fragment, peak in GPU_BF16_PEAK:
        if fragment.lower() in name.lower():
            return peak
    return None


def _profile(device_type: str, device_name: str):
    """The machine profile that speaks for this device (MEGALITH_PROFILE, then the
    calibrated file, then on a GPU a built-in measured on this device model), or None."""
    from megalith.autoparallel.profiles import builtin_profiles, default_profile_path, load_profile

    named = os.environ.get("MEGALITH_PROFILE")
    calibrated = default_profile_path()
    for where in [named] if named else [calibrated] if calibrated.is_file() else []:
        profile = load_profile(where)
        if profile.device == device_type:
            return profile
    if device_type == "cuda":
        for name in builtin_profiles():
            profile = load_profile(name)
            if profile.device == "cuda" and profile.device_name in device_name:
                return profile
    return None


def device_peak(device: torch.device) -> tuple[float | None, str]:
    """One device's peak FLOP/s and its source ("n/a: why" when unknown)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name)
        if peak is not None:
            return peak, f"{name} bf16 dense peak"
    else:
        name = "cpu"
    try:
        profile = _profile(device.type, name)
    except ValueError as e:  # MEGALITH_PROFILE names no profile: MFU is n/a, training goes on
        return None, str(e)
    if profile is None:
        return None, (
            f"no peak known for {name}: run `megalith calibrate` or set MEGALITH_PROFILE "
            "to a machine profile"
        )
    dtype = "bf16" if "bf16" in profile.matmul else "fp32"
    return max(profile.matmul[dtype].values()), f"profile {profile.name}, {dtype} matmul"


def meter(model: torch.nn.Module, seq_len: int, precision: str, devices: int) -> Meter:
    """The run's MFU meter, from the model before the Booster wraps or shards it."""
    device = next(model.parameters()).device
    if device.type == "meta":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    per_token, source = flops_per_token(model, seq_len, precision)
    peak, peak_source = device_peak(device)
    return Meter(per_token, source, peak, peak_source, devices)
