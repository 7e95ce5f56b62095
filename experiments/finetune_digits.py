"""MAE pre-training → fine-tuning on `digits`: layer decay vs none, LoRA, linear probe, and training from scratch.

    python experiments/finetune_digits.py            # resumable: finished runs are read back, not rerun

A digits-scale study (1,797 8×8 images, a depth-4 width-64 LayerScale ViT, 16 patches); what it shows about
ImageNet-scale fine-tuning is limited. Steps:

1. MAE pre-training of the encoder on the digits train split (``configs/digits_mae.py``, one run, seed 0).
2. Five fine-tuning variants at the same budget (``configs/digits_finetune.py``, ``--steps`` steps of batch 64),
   seeds 0, 1, 2 each: full fine-tuning with layer decay 0.75, full fine-tuning without layer decay, LoRA
   (rank 4 on qkv, proj, fc1, fc2; head trained), linear probe (head only), and the same classifier trained from
   scratch (random initialisation, no pre-training).

Writes ``experiments/results/finetune/``: ``results.json`` (every run: test accuracy, trainable and total
parameters, seconds), ``table.md`` (mean ± std over seeds), ``reconstructions.png`` (the MAE run's last
evaluation); the training workdirs (checkpoints) go to ``runs/finetune_digits/`` (git-ignored). Each run is a
training workdir, so an interrupted study continues where it stopped and a finished one is read back.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from layerscale_jax import lora as lora_lib  # noqa: E402
from layerscale_jax.optim.config import freeze_patterns  # noqa: E402
from layerscale_jax.train import finetune as finetune_lib  # noqa: E402
from layerscale_jax.train.config import load_config  # noqa: E402
from layerscale_jax.train.loop import build_model_fns, train_and_evaluate  # noqa: E402

OUT = os.path.join(ROOT, "experiments", "results", "finetune")
RUNS = os.path.join(ROOT, "runs", "finetune_digits")
VARIANTS = (   # name, config argument, pre-trained
    ("full, layer decay 0.75", "mode=full,layer_decay=0.75", True),
    ("full, no layer decay", "mode=full,layer_decay=1.0", True),
    ("LoRA r=4", "mode=lora,rank=4", True),
    ("linear probe", "mode=linear_probe", True),
    ("from scratch", "mode=scratch", False),
)


def parameter_counts(config) -> dict[str, int]:
    """Trainable and total parameters of the classifier the config builds (abstract: nothing allocated)."""
    _, abstract, _, _, _ = build_model_fns(config)
    optim_cfg = finetune_lib.optim_config(config, abstract)
    return lora_lib.parameter_counts(abstract, freeze_patterns(optim_cfg))


def run(config, workdir: str) -> dict:
    start = time.time()
    results = train_and_evaluate(config, workdir)
    return {**results, "wall_seconds": time.time() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mae_steps", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=600, help="fine-tuning steps (every variant)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--runs_dir", default=RUNS, help="training workdirs (checkpoints: large, git-ignored)")
    args = parser.parse_args()
    runs_dir = args.runs_dir
    os.makedirs(runs_dir, exist_ok=True)

    mae_dir = os.path.join(runs_dir, "mae")
    mae_config = load_config(os.path.join(ROOT, f"configs/digits_mae.py:steps={args.mae_steps},seed=0"))
    mae = run(mae_config, mae_dir)
    print(f"MAE pre-training: test reconstruction loss {mae['test_loss']:.4f}", flush=True)
    shutil.copyfile(os.path.join(mae_dir, "reconstructions.png"), os.path.join(args.out, "reconstructions.png"))

    records = []
    for name, arg, pretrained in VARIANTS:
        for seed in args.seeds:
            config = load_config(os.path.join(ROOT, f"configs/digits_finetune.py:{arg},steps={args.steps},seed={seed}"))
            if pretrained:
                config.train.init_from = mae_dir
            workdir = os.path.join(runs_dir, f"{arg.replace('=', '-').replace(',', '_')}_seed{seed}")
            result = run(config, workdir)
            counts = parameter_counts(config)
            records.append({"variant": name, "config": f"configs/digits_finetune.py:{arg},steps={args.steps},"
                                                      f"seed={seed}", "seed": seed, "pretrained": pretrained,
                            "test_accuracy": result["test_accuracy"], "test_loss": result["test_loss"],
                            "trainable_parameters": counts["trainable"], "total_parameters": counts["total"],
                            "train_seconds": result.get("train_seconds")})
            print(f"{name} seed {seed}: test accuracy {result['test_accuracy']:.4f}", flush=True)

    rows = ["| variant | test accuracy (%) mean ± std | seeds | trainable params | total params |",
            "|---|---|---|---|---|"]
    for name, _, _ in VARIANTS:
        mine = [r for r in records if r["variant"] == name]
        acc = 100 * np.array([r["test_accuracy"] for r in mine])
        rows.append(f"| {name} | {acc.mean():.2f} ± {acc.std(ddof=1) if len(acc) > 1 else 0.0:.2f} | "
                    f"{', '.join(f'{a:.2f}' for a in acc)} | {mine[0]['trainable_parameters']:,} | "
                    f"{mine[0]['total_parameters']:,} |")
    table = "\n".join(rows)
    command = (f"python experiments/finetune_digits.py --mae_steps {args.mae_steps} --steps {args.steps} "
               f"--seeds {' '.join(map(str, args.seeds))}")
    summary = {"command": command, "mae": {"config": f"configs/digits_mae.py:steps={args.mae_steps},seed=0",
                                           "test_reconstruction_loss": mae["test_loss"],
                                           "train_seconds": mae.get("train_seconds")},
               "finetune_steps": args.steps, "runs": records}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(f"Command: `{command}`\n\nMAE pre-training ({args.mae_steps} steps, seed 0): test masked-patch "
                f"reconstruction loss (normalised pixels) {mae['test_loss']:.4f}.\n"
                f"Fine-tuning: {args.steps} steps of batch 64 for every variant; test accuracy on the 355 test "
                f"images; std over seeds (ddof 1).\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
