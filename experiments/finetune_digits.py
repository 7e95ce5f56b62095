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
evaluation); the training workdirs (checkpoints) go to ``runs/finetune_digits/`` (git-ignored). The fine-tuning
runs are a sweep of ``experiments/sweep.py`` (records in ``runs/finetune_digits/records/runs/``): a finished run is
read back, an interrupted one continues from its workdir's last checkpoint; ``--report`` rewrites the outputs from
the records alone.
"""
from __future__ import annotations

if __name__ == "__main__":   # before any allocation: a malloc keeping XLA's buffers (layerscale_jax/runtime/malloc.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import argparse
import dataclasses
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sweep  # noqa: E402  (records, resume, ETA, statistics, tables)
from layerscale_jax import lora as lora_lib  # noqa: E402
from layerscale_jax.train import figures  # noqa: E402
from layerscale_jax.train import finetune as finetune_lib  # noqa: E402
from layerscale_jax.train.config import load_config, validate_experiment_config  # noqa: E402
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
RESULT_FIELDS = ("variant", "config", "seed", "pretrained", "test_accuracy", "test_loss", "trainable_parameters",
                 "total_parameters", "train_seconds")     # one run in results.json


@dataclasses.dataclass(frozen=True)
class FinetuneSpec:
    variant: str
    arg: str              # configs/digits_finetune.py's argument
    pretrained: bool
    seed: int
    steps: int

    @property
    def config_spec(self) -> str:
        return f"configs/digits_finetune.py:{self.arg},steps={self.steps},seed={self.seed}"

    @property
    def run_id(self) -> str:                      # also the name of its training workdir
        return f"{self.arg.replace('=', '-').replace(',', '_')}_seed{self.seed}"


def specs(steps: int, seeds) -> list[FinetuneSpec]:
    return [FinetuneSpec(name, arg, pretrained, seed, steps) for name, arg, pretrained in VARIANTS for seed in seeds]


def parameter_counts(config) -> dict[str, int]:
    """Trainable and total parameters of the classifier the config builds (abstract: nothing allocated)."""
    experiment = validate_experiment_config(config)
    _, abstract, _, _, _ = build_model_fns(experiment)
    return lora_lib.parameter_counts(abstract, finetune_lib.optim_settings(experiment, abstract).freeze)


def trivial_reconstruction_loss(config) -> float:
    """The MAE reconstruction loss of predicting each patch's own mean, on the config's eval split: in norm-pix
    units that prediction is 0, so a patch costs mean_j(t_j²) = ((P−1)/P) · var/(var + 1e-6) for a P-pixel patch
    (unbiased var, ``models.mae.pixel_targets``), and 0 for a constant patch. The masks are uniform with a fixed
    count per image, so the expected loss of an image is the mean over all its patches; returned: the mean over
    the split's images. The reference point for the MAE run's loss (not 1.0: constant background patches cost 0)."""
    import jax.numpy as jnp
    import numpy as np

    from layerscale_jax import data as data_lib
    from layerscale_jax.models.mae import pixel_targets

    per_image = []
    for batch in data_lib.make_eval_iterator(config.data, global_batch_size=config.train.eval_batch_size):
        target, _, _ = pixel_targets(jnp.asarray(batch["image"]), config.model.patch_size, True)
        loss = np.asarray(jnp.mean(target ** 2, axis=(1, 2)))             # (batch,): mean over patches and pixels
        per_image.extend(loss[np.asarray(batch["mask"], bool)].tolist())
    return float(np.mean(per_image))


def run(config, workdir: str) -> dict:
    start = time.time()
    results = train_and_evaluate(validate_experiment_config(config), workdir)
    return {**results, "wall_seconds": time.time() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mae_steps", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=600, help="fine-tuning steps (every variant)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=OUT)
    parser.add_argument("--runs_dir", default=RUNS, help="training workdirs (checkpoints: large, git-ignored)")
    parser.add_argument("--report", action="store_true", help="only rewrite the outputs from finished runs")
    parser.add_argument("--baseline", action="store_true",
                        help="only print the test reconstruction loss of predicting each patch's mean")
    parser.add_argument("--label_committed_figure", action="store_true",
                        help="only name the rows of, and title, OUT/reconstructions.png as committed before "
                             "reconstruction_png named its rows (nothing trained)")
    args = parser.parse_args()
    if args.label_committed_figure:
        path = os.path.join(args.out, "reconstructions.png")
        with open(path, "rb") as f:
            write_reconstructions(figures.label_grid_png(f.read(), title=reconstructions_title(args.mae_steps)),
                                  args.out)
        return
    if args.baseline:
        config = load_config(os.path.join(ROOT, "configs/digits_mae.py"))
        print(f"predicting each patch's mean: test masked-patch reconstruction loss "
              f"{trivial_reconstruction_loss(config):.4f} (normalised pixels, expectation over masks)")
        return
    runs_dir = args.runs_dir
    os.makedirs(runs_dir, exist_ok=True)

    mae_dir = os.path.join(runs_dir, "mae")
    mae_config = load_config(os.path.join(ROOT, f"configs/digits_mae.py:steps={args.mae_steps},seed=0"))
    if args.report:
        path = os.path.join(mae_dir, "results.json")
        if not os.path.exists(path):
            raise SystemExit(f"--report: the MAE run has not finished ({path} is missing); run without --report")
        with open(path) as f:
            mae = json.load(f)
    else:
        mae = run(mae_config, mae_dir)
    print(f"MAE pre-training: test reconstruction loss {mae['test_loss']:.4f}", flush=True)
    with open(os.path.join(mae_dir, "reconstructions.png"), "rb") as f:
        write_reconstructions(figures.title_png(f.read(), reconstructions_title(args.mae_steps)), args.out)

    def train(spec: FinetuneSpec) -> dict:
        config = load_config(os.path.join(ROOT, spec.config_spec))
        if spec.pretrained:
            config.train.init_from = mae_dir
        result = run(config, os.path.join(runs_dir, spec.run_id))
        counts = parameter_counts(config)
        return {"variant": spec.variant, "config": spec.config_spec, "seed": spec.seed, "pretrained": spec.pretrained,
                "test_accuracy": result["test_accuracy"], "test_loss": result["test_loss"],
                "trainable_parameters": counts["trainable"], "total_parameters": counts["total"],
                "train_seconds": result.get("train_seconds"), "run_id": spec.run_id,
                "seconds": result["wall_seconds"], "diverged": not math.isfinite(result["test_loss"])}

    grid = specs(args.steps, args.seeds)
    if not args.report:
        sweep.run(grid, train, os.path.join(runs_dir, "records"),
                  outcome=lambda r: f"test accuracy {r['test_accuracy']:.4f}")
    by_id = {r["run_id"]: r for r in sweep.load_records(os.path.join(runs_dir, "records"))}
    missing = [spec.run_id for spec in grid if spec.run_id not in by_id]
    if missing:
        raise SystemExit(f"no finished record of run(s) {missing} under {runs_dir}/records; run without --report")
    write_outputs([by_id[spec.run_id] for spec in grid], mae, args.out, args.mae_steps, args.steps, args.seeds)


def reconstructions_title(mae_steps: int) -> str:
    """``reconstructions.png``'s title: the run (``configs/digits_mae.py`` at ``mae_steps``, seed 0), how many test
    digits (``tasks.RECONSTRUCTION_IMAGES``) and which share of their patches the encoder saw (1 − mask ratio)."""
    from layerscale_jax.train.tasks import RECONSTRUCTION_IMAGES
    config = load_config(os.path.join(ROOT, f"configs/digits_mae.py:steps={mae_steps},seed=0"))
    return (f"MAE ({mae_steps} steps, seed 0): {RECONSTRUCTION_IMAGES} test digits, "
            f"{1 - config.model.mask_ratio:.0%} of patches seen")


def write_reconstructions(png: bytes, out: str) -> str:
    """``out/reconstructions.png`` (the MAE run's figure, titled, rows named)."""
    path = os.path.join(out, "reconstructions.png")
    with open(path, "wb") as f:
        f.write(png)
    return path


def write_outputs(records: list[dict], mae: dict, out: str, mae_steps: int, steps: int, seeds) -> str:
    """``results.json`` (every run) and ``table.md`` (mean ± std over seeds per variant) in ``out``; returns the
    table."""
    rows = []
    for name, _, _ in VARIANTS:
        mine = [r for r in records if r["variant"] == name]
        acc = [100 * r["test_accuracy"] for r in mine]
        rows.append([name, sweep.mean_std_cell(acc, digits=2) if len(acc) > 1 else f"{acc[0]:.2f} ± 0.00",
                     ", ".join(f"{a:.2f}" for a in acc), f"{mine[0]['trainable_parameters']:,}",
                     f"{mine[0]['total_parameters']:,}"])
    table = sweep.markdown_table(["variant", "test accuracy (%) mean ± std", "seeds", "trainable params",
                                  "total params"], rows).rstrip("\n")
    command = (f"python experiments/finetune_digits.py --mae_steps {mae_steps} --steps {steps} "
               f"--seeds {' '.join(map(str, seeds))}")
    summary = {"command": command, "mae": {"config": f"configs/digits_mae.py:steps={mae_steps},seed=0",
                                           "test_reconstruction_loss": mae["test_loss"],
                                           "train_seconds": mae.get("train_seconds")},
               "finetune_steps": steps, "runs": [{k: r[k] for k in RESULT_FIELDS} for r in records]}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "table.md"), "w") as f:
        f.write(f"Command: `{command}`\n\nMAE pre-training ({mae_steps} steps, seed 0): test masked-patch "
                f"reconstruction loss (normalised pixels) {mae['test_loss']:.4f}.\n"
                f"Fine-tuning: {steps} steps of batch 64 for every variant; test accuracy on the 355 test "
                f"images; std over seeds (ddof 1).\n\n{table}\n")
    print(table)
    return table


if __name__ == "__main__":
    main()
