"""The main job's test accuracy per seed on this machine: the numbers README and docs quote, with their CPU.

    python experiments/main_job.py                       # seeds 0, 1, 2 → experiments/results/main_job/<cpu>/
    python experiments/main_job.py --seeds 0 1 2 3 4 --report

Each seed trains ``configs/digits_layerscale.py:seed=S`` exactly as README's main-job command does (in this process,
one workdir per seed under ``runs/main_job/``), through ``sweep.run``: a record per seed in
``experiments/results/main_job/<cpu kind>/runs/seed<S>.json`` (test accuracy, train time, the machine and its load),
skipped when it exists, so a stopped run continues. ``table.md`` beside it lists every seed. Float32 rounding
differs between CPU kinds (XLA compiles for the machine), hence one folder per kind; on one machine a seed gives the
same accuracy at any load (``docs/reliability.md``).
"""
from __future__ import annotations

if __name__ == "__main__":   # before any allocation: a malloc keeping XLA's buffers (layerscale_jax/runtime/malloc.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import argparse
import dataclasses
import os
import re

from layerscale_jax.train.config import validate_experiment_config

import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_layerscale.py")
OUT = os.path.join(ROOT, "experiments", "results", "main_job")
WORKDIRS = os.path.join(ROOT, "runs", "main_job")


@dataclasses.dataclass(frozen=True)
class Seed:
    seed: int

    @property
    def run_id(self) -> str:
        return f"seed{self.seed}"


def cpu_folder() -> str:
    """``amd-epyc``-style folder name of this machine's CPU model."""
    from layerscale_jax.bench.timing import machine_info
    cpu = machine_info()["cpu"].lower()
    cpu = re.sub(r"\(r\)|\(tm\)|\bprocessor\b|\bcpu\b|@.*|\d+-core", " ", cpu)
    return "-".join(cpu.split()) or "unknown-cpu"


def train(spec: Seed, workdir_root: str = WORKDIRS) -> dict:
    from layerscale_jax.train.config import load_config
    from layerscale_jax.train.loop import train_and_evaluate

    workdir = os.path.join(workdir_root, f"{cpu_folder()}_seed{spec.seed}")
    results = train_and_evaluate(validate_experiment_config(load_config(f"{CONFIG}:seed={spec.seed}")), workdir)
    return {"run_id": spec.run_id, "seed": spec.seed, "test_accuracy": results["test_accuracy"],
            "test_examples": results["test_examples"], "train_seconds": results["train_seconds"],
            "seconds": results["train_seconds"], "diverged": False, "workdir": os.path.relpath(workdir, ROOT)}


def write_table(records: list[dict], path: str) -> str:
    rows = [[r["seed"], f"{100 * r['test_accuracy']:.2f}", f"{int(r['test_examples'])}", f"{r['train_seconds']:.1f}",
             r["machine"]["cpu"], " / ".join(f"{x:.1f}" for x in r["machine"]["load_average_start"][:1]
                                              + r["machine"]["load_average"][:1])]
            for r in sorted(records, key=lambda r: r["seed"])]
    text = ("Main job (`configs/digits_layerscale.py`), test accuracy per seed; written by "
            "`python experiments/main_job.py`.\n\n"
            + sweep.markdown_table(["seed", "test accuracy (%)", "test images", "train seconds", "CPU",
                                    "load average at start / end"], rows))
    with open(path, "w") as f:
        f.write(text)
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--report", action="store_true", help="only rewrite table.md from the records")
    args = parser.parse_args(argv)
    out = os.path.join(OUT, cpu_folder())
    if args.report:
        records = sweep.load_records(out)
    else:
        records = sweep.run([Seed(s) for s in args.seeds], train, out,
                            outcome=lambda r: f"test accuracy {100 * r['test_accuracy']:.2f}%")
    print(write_table(records, os.path.join(out, "table.md")))


if __name__ == "__main__":
    main()
