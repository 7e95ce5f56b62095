"""Will each committed pod recipe fit, and how fast can it run? Every recipe compiled for its stated target by the
target's own compiler on this machine (``plan.compile_for``): per-chip HBM used against what the compiler allows,
FLOPs per step, the step-time range from the compiled step (lower and upper bound, the dominant term), collective
bytes per step, compile time, and which programs were compiled (``programs``: each step's ``program_sha256``); and
its train step compiled again with the other layer layout (scanned ↔ unrolled: memory and lower bound), the choice
``--fit`` weighs.

    python benchmarks/compile_recipes.py [--only ID ...] [--jobs N] [--out FILE]
    python benchmarks/compile_recipes.py --docs benchmarks/results/compile_recipes_<cpu>_<date>.json

Writes ``benchmarks/results/compile_recipes_<cpu>_<date>.json`` and prints the markdown table of docs/multihost.md
("Will it fit?"). Compiles are CPU work, one recipe per process (``--jobs`` at a time); nothing runs on an
accelerator.
``RECIPES`` are the commands of docs/multihost.md and the ``configs/imagenet_*.py`` recipes, each with the target it is
written for. ``tests/test_pod_recipes.py`` holds the newest record to them: each recipe's train step lowered today must
be the program the record compiled (the same ``program_sha256``), so a change to a recipe's program fails the suite
until this is rerun; one recipe is also compiled there and must give its record's numbers.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
import time
from layerscale_jax.train.config import validate_experiment_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Recipe:
    id: str
    config: str                      # configs/NAME.py[:arg]
    target: str
    overrides: tuple[str, ...] = ()  # --config.X=V as the docs write them
    kinds: tuple[str, ...] = ()      # collective kinds the compiled train step must contain (besides a gradient
                                     # reduction, all-reduce or reduce-scatter, which every recipe has)
    where: str = ""                  # where the recipe is written

    @property
    def command(self) -> str:
        return " ".join(["python -m layerscale_jax.train --config", self.config, *self.overrides,
                         "--compile_for", self.target])


RECIPES = (
    Recipe("deit3_b_v5e-256", "configs/imagenet_deit3.py:variant=B", "v5e-256", kinds=("all-reduce",),
           where="configs/imagenet_deit3.py (mesh data=1, fsdp=-1)"),
    Recipe("deit3_b_v5e-32_pod_command", "configs/imagenet_deit3.py:variant=B", "v5e-32",
           ("--config.train.mesh.data=-1", "--config.train.mesh.fsdp=8"), kinds=("all-gather", "all-reduce"),
           where="docs/multihost.md, a TPU pod slice"),
    Recipe("deit3_b_2xv5e-256_multislice", "configs/imagenet_deit3.py:variant=B", "2xv5e-256",
           ("--config.train.mesh.dcn_data=2", "--config.train.mesh.data=1", "--config.train.mesh.fsdp=-1",
            "--config.model.scan_layers=True"),
           kinds=("all-reduce",), where="docs/multihost.md, Multi-slice meshes"),
    Recipe("cait_s36_v4-128", "configs/imagenet_cait.py:variant=s36", "v4-128", kinds=("all-gather", "all-reduce"),
           where="configs/imagenet_cait.py"),
    Recipe("mae_b_v5p-128", "configs/imagenet_mae.py:variant=B", "v5p-128", kinds=("all-gather", "all-reduce"),
           where="configs/imagenet_mae.py"),
)
# Deliberately too big: DeiT III-H/14 at the recipe's batch on 16 v5e chips (the --fit example of the docs).
OVERSIZE = Recipe("deit3_h_v5e-16_oversize", "configs/imagenet_deit3.py:variant=H", "v5e-16",
                  where="docs/multihost.md, Will it fit? (--fit example)")


def load(recipe: Recipe):
    """The recipe's config, loaded and overridden as the command line would."""
    from layerscale_jax.train.__main__ import parse_command_line
    parsed = parse_command_line(["--config", recipe.config, *recipe.overrides, "--compile_for", recipe.target])
    return parsed["config"].value


def compile_row(recipe: Recipe) -> dict:
    """The recipe's report as a dict (``CompileReport.to_json``), or its one-line error when it does not fit."""
    from layerscale_jax.plan.compile_for import DoesNotFit, compile_for, train_step_sha256
    from layerscale_jax.train.config import with_overrides
    start = time.perf_counter()
    row = {"id": recipe.id, "command": recipe.command, "where": recipe.where, "target": recipe.target}
    config = load(recipe)
    experiment = validate_experiment_config(config)
    try:
        report = compile_for(experiment, recipe.target)
        print(report.format(), file=sys.stderr, flush=True)
        row.update(report.to_json(), text=report.format())
        flipped = {"model.scan_layers": not config.model.scan_layers}
        other = compile_for(validate_experiment_config(with_overrides(config, flipped)), recipe.target,
                            check_fit=False, eval_step=False)
        row["other_layout"] = {"overrides": flipped, "fits": other.fits, "peak_bytes_per_chip": other.peak_bytes,
                               "step_time_lower_bound_s": other.bound_seconds,
                               "step_time_upper_bound_s": other.upper_seconds}
    except DoesNotFit as err:
        row.update(fits=False, error=str(err), programs={"train": train_step_sha256(experiment, recipe.target)})
    row["wall_s"] = time.perf_counter() - start
    return row


def run_worker(recipe: Recipe) -> dict:
    """``compile_row`` in a fresh process (libtpu's compiles hold their memory until the process ends)."""
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", "--only", recipe.id],
                            capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")})
    if result.returncode:
        raise RuntimeError(f"{recipe.id}: {result.stderr[-3000:]}")
    row = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"{recipe.id}: " + (f"{row['peak_bytes_per_chip'] / 2 ** 30:.2f} GiB per chip" if row["fits"]
                              else row["error"]), flush=True)
    return row


def newest_record() -> str:
    """The path of the newest committed record (by the date in its name): the one the docs' tables show."""
    folder = os.path.join(REPO, "benchmarks", "results")
    names = [n for n in os.listdir(folder) if re.fullmatch(r"compile_recipes_.+_\d{4}-\d\d-\d\d\.json", n)]
    return os.path.join(folder, max(names, key=lambda n: (n[-15:-5], n)))


def cpu_slug() -> str:
    from layerscale_jax.bench.timing import cpu_model
    words = re.sub(r"\(.*?\)|@.*|cpu|processor", " ", cpu_model().lower()).split()
    return f"cpu{os.cpu_count()}-" + "-".join(words[:3])


def markdown(rows: list[dict]) -> str:
    """The table of README.md and docs/multihost.md: per chip and train step. A row recorded before the step-time
    range (no ``dominant_term``) shows "–" where it has no figure of this code's meaning."""
    lines = ["| recipe | target | mesh | per chip: batch, HBM used / allowed (GiB) | FLOPs / step | step time: "
             "lower–upper bound (MFU) | dominant | collectives / step (MiB) | other layout: GiB, lower bound | "
             "compile (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mesh = " × ".join(str(v) for v in r["mesh"].values())
        ranged = "dominant_term" in r
        other = r.get("other_layout")
        layout = "–" if other is None else ("unrolled" if other["overrides"]["model.scan_layers"] is False
                                            else "scanned")
        step = (f"{r['step_time_lower_bound_s'] * 1e3:.1f}–{r['step_time_upper_bound_s'] * 1e3:.1f} ms "
                f"({r['mfu_floor']:.2f}–{r['mfu_ceiling']:.2f}) | {r['dominant_term']} | "
                f"{sum(v['bytes'] for v in r['collectives'].values()) / 2 ** 20:,.0f}") if ranged else "– | – | –"
        allowed = f"{r['hbm_per_chip'] / 2 ** 30:.2f}" if ranged else "–"
        lines.append(f"| `{r['id']}` | {r['target']} | {mesh} | {r['per_chip_batch']}, "
                     f"{r['peak_bytes_per_chip'] / 2 ** 30:.2f} / {allowed} | {r['flops_per_step']:.2e} | {step} | "
                     + ("–" if other is None else f"{layout}: {other['peak_bytes_per_chip'] / 2 ** 30:.2f}"
                        f"{'' if other['fits'] else ' (does not fit)'}, "
                        f"{other['step_time_lower_bound_s'] * 1e3:.1f} ms")
                     + f" | {sum(r['compile_seconds'].values()):.0f} |")
    return "\n".join(lines)


PAGES = ("README.md", os.path.join("docs", "multihost.md"))


def note(name: str, record: dict) -> str:
    """The line under each table: which record, on what machine, under what load, by which command."""
    return (f"(`benchmarks/results/{name}`: {record['cpu_threads']}-thread {record['cpu']} "
            f"({record['cpu_family_model']}), {record['date']}, jax {record['jax']}, libtpu {record['libtpu']}, "
            f"{record['jobs']} recipe(s) at a time, load average {record['load_average_before'][0]:.1f} before and "
            f"{record['load_average_after'][0]:.1f} after; compile (s) is the train and eval steps together. "
            f"Command: `python benchmarks/compile_recipes.py --jobs {record['jobs']}`.)")


def write_docs(path: str) -> None:
    """Replace the recipe table and the line under it in README.md and docs/multihost.md with ``path``'s."""
    with open(path) as f:
        record = json.load(f)
    table = markdown([r for r in record["rows"] if r["fits"]])
    for page in PAGES:
        with open(os.path.join(REPO, page)) as f:
            text = f.read()
        text = re.sub(r"\| recipe \| target \| mesh \|[^\n]*\n(\|[^\n]*\n)+", lambda _: table + "\n", text, count=1)
        text = re.sub(r"\(`benchmarks/results/compile_recipes_[^\n]*\n",
                      lambda _: note(os.path.basename(path), record) + "\n", text, count=1)
        with open(os.path.join(REPO, page), "w") as f:
            f.write(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="recipe ids (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="recipes compiled at once, each in its own process")
    parser.add_argument("--out", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)   # one recipe, its row on stdout
    parser.add_argument("--docs", default="", help="compile nothing: write this record's table into README.md and "
                        "docs/multihost.md")
    args = parser.parse_args(argv)
    if args.docs:
        write_docs(args.docs)
        return 0
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, REPO)
    import jax

    from layerscale_jax.bench.timing import cpu_family_model, cpu_model, load_average

    chosen = [r for r in RECIPES + (OVERSIZE,) if not args.only or r.id in args.only]
    if args.worker:
        (recipe,) = chosen
        print(json.dumps(compile_row(recipe)), flush=True)
        return 0
    load_before = load_average()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run_worker, chosen))
    fitting = [r for r in rows if r["fits"]]
    print(markdown(fitting))
    stamp = datetime.date.today().isoformat()
    out = args.out or os.path.join(REPO, "benchmarks", "results", f"compile_recipes_{cpu_slug()}_{stamp}.json")
    with open(out, "w") as f:
        json.dump({"date": stamp, "cpu": cpu_model(), "cpu_family_model": cpu_family_model(),
                   "cpu_threads": os.cpu_count(), "jobs": args.jobs, "load_average_before": load_before,
                   "load_average_after": load_average(), "jax": jax.__version__,
                   "libtpu": _libtpu_version(), "rows": rows}, f, indent=1)
    print(f"written {out}")
    return 0


def _libtpu_version() -> str | None:
    from importlib import metadata
    try:
        return metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
