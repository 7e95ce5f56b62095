"""XLA options the benchmarks start with, and the CPU options that were tried (see benchmarks/README.md).

XLA reads ``XLA_FLAGS`` once, when the backend starts, so ``python -m layerscale_jax.bench`` applies the defaults
before it touches a device. Flags already in ``XLA_FLAGS`` win; ``LAYERSCALE_BENCH_XLA_DEFAULTS=0`` turns the
defaults off (the ``xla_flags`` sweep does that to measure each option alone).
"""
from __future__ import annotations

import os

# Kept as default because they measurably helped the CPU train step (benchmarks/README.md has the numbers).
DEFAULT_CPU_FLAGS: tuple[str, ...] = ()

# What the ``xla_flags`` sweep tries, one at a time, against no flags at all (all exist in jaxlib 0.10.2).
CANDIDATE_CPU_FLAGS: dict[str, str] = {
    "baseline": "",
    "onednn": "--xla_cpu_use_onednn=true",
    "onednn_fusion_dot": "--xla_cpu_experimental_onednn_fusion_type=dot",
    "xnn_fusion_dot": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "ynn_fusion_dot": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "xnnpack": "--xla_cpu_use_xnnpack=true",
    "fast_math": "--xla_cpu_enable_fast_math=true",
    "no_thunk_runtime": "--xla_cpu_use_thunk_runtime=false",
}


def apply_default_xla_flags() -> None:
    if os.environ.get("LAYERSCALE_BENCH_XLA_DEFAULTS", "1") == "0" or not DEFAULT_CPU_FLAGS:
        return
    current = os.environ.get("XLA_FLAGS", "")
    present = {f.split("=")[0] for f in current.split()}
    extra = [f for f in DEFAULT_CPU_FLAGS if f.split("=")[0] not in present]
    os.environ["XLA_FLAGS"] = " ".join([current, *extra]).strip()
