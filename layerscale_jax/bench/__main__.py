"""``python -m layerscale_jax.bench SUBCOMMAND ...`` — see ``python -m layerscale_jax.bench -h``.

Subcommands:
  train_step   one training step: img/s, step time, FLOPs, FLOP/s, MFU, peak memory, compile time [vs timm];
               with --config configs/X.py[:ARGS], the trainer's own step vs the model-only step
  optimizer    the trainer's optimizer update vs plain AdamW + clipping, against depth (both layouts)
  profile      where the train step's time goes, per XLA operation (from jax.profiler's trace)
  matmul       the matmul peak (the MFU denominator) of this device, float32 and bfloat16
  depth        compile time and step time against depth, with and without scan
  memory       peak memory against depth for each remat policy (a fresh subprocess per configuration)
  layerscale   LayerScale against ``none`` at equal shapes
  ablation     the depth-ablation model (8×8×1 digits, width 64, depth 6 and 24, batch 128) vs timm
  seeds        several seeds in one vmapped step against the same seeds one after another
  pipeline     the digits input pipeline against the ablation train step
  xla_options  the train step compiled under XLA CPU compiler options, timed interleaved
  page_faults  the train step with and without glibc's huge-page malloc (layerscale_jax/runtime.py)
  all          the whole CPU suite → benchmarks/results/<machine>_<date>.json
"""
from __future__ import annotations

import sys

from layerscale_jax.runtime import reexec_with_huge_page_malloc

# Before anything allocates: huge pages for XLA's per-step CPU buffers (see layerscale_jax/runtime.py).
reexec_with_huge_page_malloc()

from layerscale_jax.bench.cli import main  # noqa: E402
from layerscale_jax.cli import run_cli  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_cli(main))                  # user errors: one line, exit status 2 (layerscale_jax/cli.py)
