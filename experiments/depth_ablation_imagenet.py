"""The depth ablation at ImageNet scale (``--imagenet_commands``): one multi-host training job per run, and its
cost from the DeiT paper's published training time or from a measured train step.
"""
from __future__ import annotations

import json
import os

from depth_ablation_runs import COLUMNS, ROOT, SCHEMES_BY_NAME

IMAGENET_DEPTHS = (12, 18, 24, 36)             # the depths of CaiT's Fig. 3 ablation on a DeiT-S-width ViT
IMAGENET_EPOCHS = 300
IMAGENET_CONFIG = "configs/imagenet_deit3.py"
# Cost source: the DeiT paper (Touvron et al. 2021, §5, "Training time"): DeiT-B, 300 epochs, 53 h on one node of
# 8 V100; Table 1: throughput DeiT-S 940 / DeiT-B 292 images/s (one V100). A DeiT-S-width block costs
# 53 h · (292 / 940) / 12 ≈ 1.37 node-hours at 300 epochs; compute scales linearly in depth.
DEIT_B_NODE_HOURS_300_EPOCHS = 53.0
DEIT_S_OVER_B_SPEED = 940 / 292


def imagenet_run_args(depth: int, column: tuple[str, bool], seed: int, workdir: str,
                      epochs: int = IMAGENET_EPOCHS) -> list[str]:
    """The arguments of ``python -m layerscale_jax.train`` for one run of the ImageNet-scale ablation: DeiT III-S
    (width 384, 6 heads; its recipe: LAMB, 3-Augment, Mixup/CutMix, ``configs/imagenet_deit3.py``) at ``depth``
    with the column's branch scaling and ε, warm-up off for CaiT's variant (b), every device on the ``fsdp`` axis
    (the config's mesh; add ``--config.train.mesh.data=<hosts>`` for data parallelism across hosts). It trains on
    ImageNet's train split and evaluates on its validation split (the numbers ImageNet papers report)."""
    scheme, warmup = column
    s = SCHEMES_BY_NAME[scheme]
    args = ["--distributed", f"--config={os.path.join(ROOT, IMAGENET_CONFIG)}:variant=S,epochs={epochs}",
            f"--workdir={workdir}", f"--config.model.depth={depth}",
            f"--config.model.branch_scaling={s.branch_scaling}", f"--config.model.init_values={s.init_values}",
            f"--config.train.seed={seed}"]
    if not warmup:
        args.append("--config.optim.warmup_steps=0")
    return args


def imagenet_commands(workdir_root: str, depths=IMAGENET_DEPTHS, columns=COLUMNS, seeds=(0,),
                      epochs: int = IMAGENET_EPOCHS) -> list[str]:
    """One shell command per run (cheapest first), each to be started on every host of the job (a TPU pod's
    workers, a SLURM job's nodes; ``--distributed`` finds the others)."""
    commands = []
    for depth in depths:
        for seed in seeds:
            for column in columns:
                run_id = f"depth{depth}_{column[0]}_warmup{'on' if column[1] else 'off'}_seed{seed}"
                args = imagenet_run_args(depth, column, seed, f"{workdir_root}/{run_id}", epochs)
                commands.append("python -m layerscale_jax.train " + " ".join(
                    a.replace(ROOT + os.sep, "") for a in args))
    return commands


def imagenet_node_hours(depths=IMAGENET_DEPTHS, columns=COLUMNS, seeds=(0,), epochs: int = IMAGENET_EPOCHS) -> float:
    """8×V100-node-hours of ``imagenet_commands``' runs, from the DeiT paper's published training time and
    throughputs (``DEIT_B_NODE_HOURS_300_EPOCHS``), linear in depth and epochs."""
    per_block = DEIT_B_NODE_HOURS_300_EPOCHS / DEIT_S_OVER_B_SPEED / 12 * epochs / 300
    return per_block * sum(depths) * len(columns) * len(seeds)


IMAGENET_TRAIN_IMAGES = 1_281_167


def read_step_measurement(path: str) -> dict:
    """A measured DeiT III-S/16 train step: the JSON object ``python -m layerscale_jax.bench train_step --model
    deit3_small_patch16_224 --json`` prints (``benchmarks/gpu_check.sh`` keeps it as ``s16_bf16.json``); the last
    line of ``path`` that starts with ``{``. Any other model or image size is a ValueError naming it."""
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    if not lines:
        raise ValueError(f"--imagenet_step_json={path}: no JSON object (the output of python -m layerscale_jax.bench "
                         "train_step --json)")
    step = json.loads(lines[-1])
    img_size = step.get("overrides", {}).get("img_size", 224)
    if step.get("model") != "deit3_small_patch16_224" or img_size != 224:
        raise ValueError(f"--imagenet_step_json={path}: model={step.get('model')!r}, img_size={img_size}; the "
                         "estimate needs deit3_small_patch16_224 at 224 px")
    return step


def imagenet_device_hours(step: dict, depths=IMAGENET_DEPTHS, columns=COLUMNS, seeds=(0,),
                          epochs: int = IMAGENET_EPOCHS) -> float:
    """Device-hours of ``imagenet_commands``' runs from a measured step (``read_step_measurement``) on one device:
    each run is ``epochs`` × 1,281,167 images at the measured images per second, linear in depth from the
    measured depth (12 unless overridden); data parallelism is assumed to keep each device's throughput (no input
    pipeline or collectives in the measurement, and AdamW where the recipe uses LAMB)."""
    measured_depth = step.get("overrides", {}).get("depth", 12)
    per_block = epochs * IMAGENET_TRAIN_IMAGES / step["img_per_s"] / 3600 / measured_depth
    return per_block * sum(depths) * len(columns) * len(seeds)
