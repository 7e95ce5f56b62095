"""Depth ablation on `digits`: test accuracy vs depth for each residual-branch scaling (LayerScale and the schemes
it is compared with), like for like — same data, optimizer, steps and seeds; only `branch_scaling` changes.

    python experiments/depth_ablation.py --depths 6 12 24 --scalings none layerscale scalar rezero skipinit \
        --seeds 0 --out experiments/results/depth_ablation

Each run is `configs/digits_layerscale.py:depth=D,branch_scaling=S,seed=K` trained in its own workdir under
`OUT/runs/`; a finished run (its `results.json` exists) is not repeated, so the driver can be stopped and resumed.
Writes `OUT/results.json` (every run), `OUT/table.md` (mean test accuracy per depth × scaling) and `OUT/plot.png`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_layerscale.py")


def load_config(arg: str):
    spec = importlib.util.spec_from_file_location("digits_layerscale", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def run_one(out: str, depth: int, scaling: str, seed: int, steps: int | None) -> dict:
    from layerscale_jax.train import train_and_evaluate

    workdir = os.path.join(out, "runs", f"depth{depth}_{scaling}_seed{seed}")
    results_path = os.path.join(workdir, "results.json")
    if not os.path.exists(results_path):
        arg = f"depth={depth},branch_scaling={scaling},seed={seed}" + (f",steps={steps}" if steps else "")
        config = load_config(arg)
        config.train.checkpoint_every = 0
        train_and_evaluate(config, workdir)
    with open(results_path) as f:
        results = json.load(f)
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    return {"depth": depth, "branch_scaling": scaling, "seed": seed, "test_accuracy": results["test_accuracy"],
            "test_loss": results["test_loss"], "final_train_loss": losses[-1] if losses else None,
            "steps": results["steps"], "train_seconds": results["train_seconds"]}


def write_table(rows: list[dict], depths, scalings, path: str) -> str:
    lines = ["| depth | " + " | ".join(scalings) + " |", "|---|" + "---|" * len(scalings)]
    for depth in depths:
        cells = []
        for scaling in scalings:
            accs = [r["test_accuracy"] for r in rows if r["depth"] == depth and r["branch_scaling"] == scaling]
            if not accs:
                cells.append("–")
            elif len(accs) == 1:
                cells.append(f"{100 * accs[0]:.1f}")
            else:
                cells.append(f"{100 * statistics.mean(accs):.1f} ± {100 * statistics.stdev(accs):.1f}")
        lines.append(f"| {depth} | " + " | ".join(cells) + " |")
    table = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write("Test accuracy (%) on digits, mean ± std over seeds\n\n" + table)
    return table


def write_plot(rows: list[dict], depths, scalings, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for scaling in scalings:
        xs, ys = [], []
        for depth in depths:
            accs = [r["test_accuracy"] for r in rows if r["depth"] == depth and r["branch_scaling"] == scaling]
            if accs:
                xs.append(depth)
                ys.append(100 * statistics.mean(accs))
        ax.plot(xs, ys, marker="o", label=scaling)
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("digits: residual-branch scaling vs depth")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[6, 12, 24])
    parser.add_argument("--scalings", nargs="+", default=["none", "layerscale", "scalar", "rezero", "skipinit"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=None, help="override the config's step count")
    parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "depth_ablation"))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for depth in args.depths:
        for scaling in args.scalings:
            for seed in args.seeds:
                rows.append(run_one(args.out, depth, scaling, seed, args.steps))
                print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"command": " ".join(sys.argv), "runs": rows}, f, indent=2)
    print(write_table(rows, args.depths, args.scalings, os.path.join(args.out, "table.md")))
    write_plot(rows, args.depths, args.scalings, os.path.join(args.out, "plot.png"))


if __name__ == "__main__":
    main()
