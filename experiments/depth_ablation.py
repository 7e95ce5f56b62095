"""Depth ablation: does a pre-norm ViT stop improving or fail as depth grows while LayerScale keeps training?

The CaiT paper (Touvron et al., "Going deeper with Image Transformers", 2021, §3 and Fig. 3) compares LayerScale,

    x'  = x  + diag(λ1) · SA(LN(x))
    x'' = x' + diag(λ2) · FFN(LN(x'))        λ initialised to ε (0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper)

with plain pre-norm, a per-branch scalar, ReZero and SkipInit. This driver trains every cell of

    depth ∈ {6, 12, 24, 48, 96} × scheme ∈ SCHEMES × seed ∈ {0, 1, 2}            (warm-up on)
    + warm-up off for `none` and `layerscale` at the two largest depths

on the offline `digits` data (or any prepared TFDS image dataset: ``--dataset NAME``), with every hyper-parameter
identical across schemes except the one varied (``SIZING`` and ``RECIPE`` below). Default (about 2 h on the idle
2-core development CPU, 4.6 h measured while it was shared at load 7–8; re-time with ``--measure`` and change
``SIZING.steps`` if it predicts more than 3 h):

    python experiments/depth_ablation.py --out experiments/results/depth_ablation

``--quick`` runs a tiny grid in minutes (to check the pipeline); ``--lr_sweep`` trains every scheme at one depth over
``LR_SWEEP_RATES`` into ``OUT/lr_sweep/`` (how the shared learning rate is chosen); ``--per_scheme_lr`` then trains the
grid with each scheme at its own best rate from that sweep, its runs beside the shared-rate ones in ``OUT/runs/`` (a
scheme whose best rate is the shared one reuses them) and its outputs in ``OUT/per_scheme_lr/``. Each run's record is
written to ``OUT/runs/<run id>.json`` when it ends; a run whose record exists is skipped, so the driver resumes across
sessions. A run whose loss or gradient norm turns non-finite stops there and is recorded with ``diverged=True``.
``--shard I/N`` trains only every N-th run from the I-th (one of N machines); the shards' ``OUT/runs/`` folders
copied together are the whole grid's records (``--report`` then writes the outputs). The runner, statistics, tables
and the accuracy plot are ``experiments/sweep.py``'s, one run's training is ``experiments/classifier_run.py``'s.

Outputs (regenerated from all finished records at the end, or alone with ``--report``):
``results.csv`` (one row per run), ``table.md`` (mean ± std test accuracy per depth × scheme),
``acc_vs_depth.png``, ``loss_curves_depth<D>.png`` (largest depth), ``scale_heatmap_depth<D>.png`` (mean |λ| or
|α| per layer × branch over training), ``ratio_init_end_depth<D>.png`` (‖scaled branch‖/‖stream‖ per layer at
init and at the end).

Per-run diagnostics come from ``layerscale_jax.train.diagnostics`` at step 0 and at every evaluation
(``evaluation_record`` below is the function to call from a train loop).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import classifier_run  # noqa: E402  (one run: training, evaluations, diagnostics, divergence)
import sweep  # noqa: E402  (records, resume, shards, ETA, statistics, tables, plots)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "digits_layerscale.py")

DEPTHS = (6, 12, 24, 48, 96)
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A column of the ablation: a branch scaling and how its ε is chosen ("auto": the CaiT rule)."""
    name: str
    branch_scaling: str
    init_values: float | str = "auto"


SCHEMES = (
    Scheme("none", "none"),
    Scheme("layerscale", "layerscale", "auto"),          # CaiT's ε rule
    Scheme("layerscale_eps0.1", "layerscale", 0.1),      # ε = 0.1 at every depth
    Scheme("scalar", "scalar", "auto"),                  # one α per branch, the same ε rule
    Scheme("rezero", "rezero"),                          # one α per block, α = 0, no LayerNorm
    Scheme("skipinit", "skipinit"),                      # one α per branch, α = 0, no normalisation
    Scheme("scalar_zero", "scalar_zero"),                # one α per branch, α = 0, LayerNorm kept (not in default)
)
SCHEMES_BY_NAME = {s.name: s for s in SCHEMES}
DEFAULT_SCHEMES = ("none", "layerscale", "layerscale_eps0.1", "scalar", "rezero", "skipinit")
WARMUP_OFF_SCHEMES = ("none", "layerscale")          # warm-up on vs off, at the two largest depths


@dataclasses.dataclass(frozen=True)
class Sizing:
    """How big each run is: the one place to re-tune the sweep's cost (see ``--measure``)."""
    embed_dim: int
    num_heads: int
    batch_size: int
    steps: int
    evals: int               # evaluations (with diagnostics) per run, evenly spaced; plus the diagnostics at step 0
    log_every: int


# Default: width 32 (2 heads), 200 steps of batch 64 (~9 epochs of the 1,442 digits training images), scanned
# layers (compile time flat in depth). Sized from measurements on the 2-core development CPU (experiments/
# README.md has them) to fit the default grid in about 3 h; re-time with `--measure` and change `steps` here.
SIZING = Sizing(embed_dim=32, num_heads=2, batch_size=64, steps=200, evals=4, log_every=10)
QUICK_SIZING = Sizing(embed_dim=16, num_heads=2, batch_size=32, steps=24, evals=2, log_every=4)
QUICK_DEPTHS = (2, 4)

# Shared optimisation recipe (configs/digits_layerscale.py's, except the learning rate, which `--lr_sweep` chose,
# and the warm-up, scaled to the shorter run).
RECIPE = dict(learning_rate=1e-2, warmup_fraction=0.1, drop_path_rate=0.05)
LR_SWEEP_DEPTH = 24
LR_SWEEP_RATES = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    depth: int
    scheme: str
    warmup: bool
    seed: int
    learning_rate: float

    @property
    def run_id(self) -> str:
        return (f"depth{self.depth}_{self.scheme}_warmup{'on' if self.warmup else 'off'}_lr{self.learning_rate:g}"
                f"_seed{self.seed}")


def grid(depths, schemes, seeds, learning_rate, warmup_off_depths) -> list[RunSpec]:
    """The default grid: every depth × scheme × seed with warm-up, plus warm-up off for ``WARMUP_OFF_SCHEMES`` at
    ``warmup_off_depths``. Seed by seed, and within a seed the cheapest runs first, so a partial sweep (one that a
    session's time limit cut short) already covers every depth × scheme cell with the first seeds.

    ``learning_rate`` is one rate shared by every scheme, or ``{scheme: rate}`` (``best_learning_rates``)."""
    rate = learning_rate.__getitem__ if isinstance(learning_rate, dict) else (lambda scheme: learning_rate)
    runs = [RunSpec(d, s, True, k, rate(s)) for d in depths for k in seeds for s in schemes]
    runs += [RunSpec(d, s, False, k, rate(s)) for d in warmup_off_depths for k in seeds for s in schemes
             if s in WARMUP_OFF_SCHEMES]
    return sorted(runs, key=lambda r: (r.seed, r.depth, not r.warmup))


def best_learning_rates(lr_sweep_dir: str, schemes) -> dict[str, float]:
    """Each scheme's rate from a finished ``--lr_sweep``: the highest final test accuracy among the runs that did
    not diverge (ties: the lower rate)."""
    records = load_records(lr_sweep_dir)
    best = {}
    for scheme in schemes:
        runs = [r for r in records if r["scheme"] == scheme and not r["diverged"]]
        if not runs:
            raise FileNotFoundError(f"--per_scheme_lr: no finished, non-diverged --lr_sweep run of scheme {scheme!r} "
                                    f"under {lr_sweep_dir}; run --lr_sweep first")
        best[scheme] = max(runs, key=lambda r: (r["final_test_accuracy"], -r["learning_rate"]))["learning_rate"]
    return best


def lr_sweep_grid(schemes, depth, rates, seed=0) -> list[RunSpec]:
    return [RunSpec(depth, s, True, seed, lr) for lr in rates for s in schemes]


# ---------------------------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------------------------
def load_digits_config(arg: str):
    spec = importlib.util.spec_from_file_location("digits_layerscale", CONFIG)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def make_config(spec: RunSpec, sizing: Sizing, dataset: str = "digits", data_dir: str | None = None):
    """The full experiment config of one run: the digits recipe, the sizing, the scheme, and the dataset."""
    from layerscale_jax.data.config import default_data_config
    from layerscale_jax.train.config import model_section

    scheme = SCHEMES_BY_NAME[spec.scheme]
    config = load_digits_config(f"seed={spec.seed}")
    if dataset != "digits":
        config.data = default_data_config(dataset)
        if data_dir:
            config.data.data_dir = data_dir
    from layerscale_jax.data import get_dataset_info
    info = get_dataset_info(config.data)
    patch = 2 if info.image_size <= 8 else max(info.image_size // 8, 1)
    config.model = model_section(
        "deit3_small_patch16_224", img_size=info.image_size, patch_size=patch, in_chans=info.channels,
        num_classes=info.num_classes, embed_dim=sizing.embed_dim, num_heads=sizing.num_heads, depth=spec.depth,
        branch_scaling=scheme.branch_scaling, init_values=scheme.init_values,
        drop_path_rate=RECIPE["drop_path_rate"], global_pool="avg", scan_layers=True)
    config.optim.learning_rate = spec.learning_rate
    config.optim.warmup_steps = int(round(RECIPE["warmup_fraction"] * sizing.steps)) if spec.warmup else 0
    config.train.steps = sizing.steps
    config.train.batch_size = sizing.batch_size
    config.train.seed = spec.seed
    config.train.log_every = sizing.log_every
    config.train.eval_every = max(sizing.steps // sizing.evals, 1)
    config.train.checkpoint_every = 0
    config.train.nonfinite = "skip"            # a non-finite step is an outcome (diverged), never an exception
    return config


def train_run(spec: RunSpec, sizing: Sizing, dataset: str = "digits", data_dir: str | None = None,
              overrides: dict | None = None) -> dict:
    """Train one run and return its record: the spec's fields, then ``classifier_run.train_classifier``'s (scalars,
    the train-loss curve, evaluations with diagnostics; a non-finite step ends the run as ``diverged``).

    ``overrides`` (``{"optim.learning_rate": 1e30, ...}``) are applied to the config last (tests, what-ifs).
    """
    config = make_config(spec, sizing, dataset, data_dir)
    for dotted, value in (overrides or {}).items():
        section, field = dotted.split(".", 1)
        config[section][field] = value
    result = classifier_run.train_classifier(config)
    return {
        "run_id": spec.run_id, "depth": spec.depth, "scheme": spec.scheme,
        "branch_scaling": SCHEMES_BY_NAME[spec.scheme].branch_scaling,
        "epsilon": _epsilon(spec), "warmup": spec.warmup, "warmup_steps": config.optim.warmup_steps,
        "seed": spec.seed, "learning_rate": config.optim.learning_rate, "dataset": config.data.name,
        "embed_dim": sizing.embed_dim, "batch_size": sizing.batch_size, **result,
    }


def _epsilon(spec: RunSpec) -> float | None:
    from layerscale_jax.layers.scaling import resolve_init_value
    scheme = SCHEMES_BY_NAME[spec.scheme]
    if scheme.branch_scaling == "none":
        return None
    return resolve_init_value(scheme.branch_scaling, scheme.init_values, spec.depth)


# ---------------------------------------------------------------------------------------------------------------
# The sweep: resumable, with progress
# ---------------------------------------------------------------------------------------------------------------
def record_path(out: str, spec: RunSpec) -> str:
    return sweep.record_path(out, spec.run_id)


def load_records(out: str) -> list[dict]:
    return sweep.load_records(out)


def run_sweep(specs: list[RunSpec], sizing: Sizing, out: str, dataset: str = "digits", data_dir: str | None = None,
              overrides: dict | None = None, log=print) -> list[dict]:
    """Train every spec without a record in ``out`` (``sweep.run``: finished runs are skipped, a diverged run is
    recorded as such), printing progress and an ETA that assumes a run's cost grows linearly in depth (measured:
    ``--measure``)."""
    sweep.enable_compilation_cache()
    return sweep.run(specs, lambda spec: train_run(spec, sizing, dataset, data_dir, overrides), out,
                     cost=lambda spec: spec.depth, outcome=lambda r: f"test acc {r['final_test_accuracy']:.4f}",
                     log=log)


# ---------------------------------------------------------------------------------------------------------------
# Reports: CSV, markdown table, plots
# ---------------------------------------------------------------------------------------------------------------
CSV_FIELDS = ("depth", "scheme", "branch_scaling", "epsilon", "warmup", "learning_rate", "seed",
              "final_test_accuracy", "best_test_accuracy", "final_train_loss", "diverged", "diverged_at_step",
              "steps", "seconds")


def write_csv(records: list[dict], path: str) -> None:
    sweep.write_csv(sorted(records, key=lambda r: (r["depth"], r["scheme"], not r["warmup"], r["learning_rate"],
                                                   r["seed"])), path, CSV_FIELDS)


def _cell(records: list[dict]) -> str:
    """Final test accuracy (%) of a cell's seeds, mean ± std, diverged runs counted (and averaged in)."""
    return sweep.mean_std_cell([100 * r["final_test_accuracy"] for r in records], sum(r["diverged"] for r in records))


def _column_names(records: list[dict]) -> list[tuple[str, bool]]:
    """(scheme, warmup) columns in the order of ``SCHEMES``, warm-up-off columns after their scheme."""
    present = {(r["scheme"], r["warmup"]) for r in records}
    order = [s.name for s in SCHEMES]
    return sorted(present, key=lambda c: (order.index(c[0]) if c[0] in order else len(order), not c[1]))


def _label(scheme: str, warmup: bool) -> str:
    return scheme if warmup else f"{scheme} (no warm-up)"


def write_table(records: list[dict], path: str, title: str) -> str:
    columns = _column_names(records)
    depths = sorted({r["depth"] for r in records})
    table = sweep.markdown_table(["depth"] + [_label(*c) for c in columns], (
        [depth] + [_cell([r for r in records if r["depth"] == depth and (r["scheme"], r["warmup"]) == c])
                   for c in columns] for depth in depths))
    with open(path, "w") as f:
        f.write(title + "\n\n" + table)
    return table


def write_lr_table(records: list[dict], path: str, command: str | None = None) -> str:
    schemes = [s for s in (x.name for x in SCHEMES) if any(r["scheme"] == s for r in records)]
    rates = sorted({r["learning_rate"] for r in records})
    table = sweep.markdown_table(["learning rate"] + schemes, (
        [f"{lr:g}"] + [_cell([r for r in records if r["learning_rate"] == lr and r["scheme"] == s]) for s in schemes]
        for lr in rates))
    depth = records[0]["depth"] if records else "?"
    with open(path, "w") as f:
        f.write(f"Final test accuracy (%) at depth {depth} per learning rate (seed 0)\n\n"
                + (f"Command: `{command}`\n\n" if command else "") + table)
    return table


def plot_accuracy_vs_depth(records: list[dict], path: str) -> None:
    sweep.plot_errorbars(
        [sweep.Series(_label(scheme, warmup),
                      {d: [100 * r["final_test_accuracy"] for r in records
                           if r["depth"] == d and r["scheme"] == scheme and r["warmup"] == warmup]
                       for d in sorted({r["depth"] for r in records})}, "-" if warmup else "--")
         for scheme, warmup in _column_names(records)],
        path, xlabel="depth (blocks)", ylabel="final test accuracy (%), mean ± std over seeds",
        title="residual-branch scaling vs depth")


def plot_loss_curves(records: list[dict], depth: int, path: str) -> None:
    plt = sweep.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    colours = {}
    for r in sorted((r for r in records if r["depth"] == depth), key=lambda r: (r["scheme"], r["seed"])):
        key = (r["scheme"], r["warmup"])
        steps, losses = zip(*r["train_loss_curve"]) if r["train_loss_curve"] else ((), ())
        line, = ax.plot(steps, losses, linestyle="-" if r["warmup"] else "--", linewidth=1,
                        color=colours.get(key), label=None if key in colours else _label(*key))
        colours.setdefault(key, line.get_color())
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (mean over each log interval)")
    ax.set_title(f"train loss at depth {depth} (one line per seed)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _per_layer(evaluation: dict, depth: int, quantity: str):
    """``[[attn, mlp] per layer]`` of ``diag/blocks.<l>.<branch>.<quantity>`` (None when absent)."""
    rows = []
    for layer in range(depth):
        rows.append([evaluation.get(f"diag/blocks.{layer}.{b}.{quantity}") for b in ("attn", "mlp")])
    return rows


def _first_seed(records: list[dict], depth: int) -> list[dict]:
    chosen = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        if r["depth"] == depth and r["warmup"]:
            chosen.setdefault(r["scheme"], r)
    order = [s.name for s in SCHEMES]
    return [chosen[s] for s in sorted(chosen, key=order.index)]


def plot_scale_heatmap(records: list[dict], depth: int, path: str) -> None:
    """mean |λ| (|α|) per layer × branch (rows: layer l attn, layer l mlp) over the evaluations, one panel per
    scheme that has a scale (lowest seed)."""
    import numpy as np
    plt = sweep.pyplot()
    runs = [r for r in _first_seed(records, depth) if r["branch_scaling"] != "none"]
    fig, axes = plt.subplots(1, max(len(runs), 1), figsize=(3.2 * max(len(runs), 1), 4), squeeze=False)
    for ax, r in zip(axes[0], runs):
        steps = [e["step"] for e in r["evaluations"]]
        grid_ = np.array([[v if v is not None else np.nan for row in _per_layer(e, depth, "scale") for v in row]
                          for e in r["evaluations"]]).T                        # (2·depth, evaluations)
        image = ax.imshow(np.log10(np.maximum(grid_, 1e-8)), aspect="auto", origin="lower", cmap="viridis",
                          extent=(-0.5, len(steps) - 0.5, -0.5, 2 * depth - 0.5))
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=6)
        ax.set_title(r["scheme"], fontsize=8)
        ax.set_xlabel("step")
        ax.set_ylabel("layer × branch (2l: attn, 2l+1: mlp)", fontsize=7)
        fig.colorbar(image, ax=ax, label="log10 mean |scale|")
    fig.suptitle(f"branch scale per layer over training, depth {depth}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratio_init_end(records: list[dict], depth: int, path: str) -> None:
    """‖scaled branch‖ / ‖stream‖ per layer at step 0 and at the last evaluation, each branch, one panel per scheme."""
    plt = sweep.pyplot()
    runs = _first_seed(records, depth)
    fig, axes = plt.subplots(1, max(len(runs), 1), figsize=(3.2 * max(len(runs), 1), 3.6), squeeze=False,
                             sharey=True)
    for ax, r in zip(axes[0], runs):
        for evaluation, style in ((r["evaluations"][0], ":"), (r["evaluations"][-1], "-")):
            rows = _per_layer(evaluation, depth, "ratio")
            for b, branch in enumerate(("attn", "mlp")):
                values = [max(row[b], 1e-12) if row[b] is not None else float("nan") for row in rows]
                ax.plot(range(depth), values, linestyle=style, label=f"{branch}, step {evaluation['step']}")
        ax.set_yscale("log")
        ax.set_title(r["scheme"] + (" (diverged)" if r["diverged"] else ""), fontsize=8)
        ax.set_xlabel("layer")
    axes[0][0].set_ylabel("‖scaled branch‖ / ‖stream‖")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"branch-to-stream ratio at init and at the end, depth {depth}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def select_rates(records: list[dict], rates) -> list[dict]:
    """The records trained at ``rates``: one rate for every scheme, ``{scheme: rate}``, or None (all records).

    A table cell averages seeds; it must never average learning rates too, so a (scheme, warm-up) column left with
    runs at several rates is an error that names them."""
    if rates is not None:
        rate = rates.get if isinstance(rates, dict) else (lambda scheme: rates)
        records = [r for r in records if math.isclose(r["learning_rate"], rate(r["scheme"]) or math.nan)]
    mixed = {}
    for r in records:
        mixed.setdefault((r["scheme"], r["warmup"]), set()).add(r["learning_rate"])
    mixed = {_label(*c): sorted(v) for c, v in mixed.items() if len(v) > 1}
    if mixed:
        raise ValueError(f"runs at several learning rates in one column: {mixed}; choose them with --learning_rate "
                         f"or --per_scheme_lr")
    return records


def write_reports(out: str, command: str | None = None, lr_sweep: bool = False, rates=None,
                  report_dir: str | None = None) -> dict[str, str]:
    """The outputs of the grid's finished records in ``out`` (``lr_sweep``: of ``out/lr_sweep/``'s instead), each
    table headed by ``command``, the command that produced it; returns {what: path}.

    ``rates`` selects the grid's runs by learning rate (``select_rates``); ``report_dir`` (default ``out``) is where
    the grid's outputs go (``--per_scheme_lr`` writes to ``out/per_scheme_lr/`` from the same runs)."""
    lr_dir = os.path.join(out, "lr_sweep")
    sweep, lr_records = ([], load_records(lr_dir)) if lr_sweep else (select_rates(load_records(out), rates), [])
    if not sweep and not lr_records:
        raise FileNotFoundError(f"no finished runs under {os.path.join(lr_dir if lr_sweep else out, 'runs')}"
                                + (f" at learning rate(s) {rates}" if rates is not None and not lr_sweep else ""))
    paths = {}
    if sweep:
        report_dir = report_dir or out
        os.makedirs(report_dir, exist_ok=True)
        paths["csv"] = os.path.join(report_dir, "results.csv")
        write_csv(sweep, paths["csv"])
        paths["table"] = os.path.join(report_dir, "table.md")
        per_scheme = ", ".join(f"{s} {lr:g}" for s, lr in rates.items()) if isinstance(rates, dict) else None
        write_table(sweep, paths["table"], f"Final test accuracy (%) on {sweep[0]['dataset']}, mean ± std over "
                                           f"seeds" + (f", each scheme at its own learning rate ({per_scheme})"
                                                       if per_scheme else "")
                                           + (f"\n\nCommand: `{command}`" if command else ""))
        deepest = max(r["depth"] for r in sweep)
        paths["acc_vs_depth"] = os.path.join(report_dir, "acc_vs_depth.png")
        plot_accuracy_vs_depth(sweep, paths["acc_vs_depth"])
        paths["loss_curves"] = os.path.join(report_dir, f"loss_curves_depth{deepest}.png")
        plot_loss_curves(sweep, deepest, paths["loss_curves"])
        paths["scale_heatmap"] = os.path.join(report_dir, f"scale_heatmap_depth{deepest}.png")
        plot_scale_heatmap(sweep, deepest, paths["scale_heatmap"])
        paths["ratio_init_end"] = os.path.join(report_dir, f"ratio_init_end_depth{deepest}.png")
        plot_ratio_init_end(sweep, deepest, paths["ratio_init_end"])
    if lr_records:
        paths["lr_csv"] = os.path.join(lr_dir, "results.csv")
        write_csv(lr_records, paths["lr_csv"])
        paths["lr_table"] = os.path.join(lr_dir, "table.md")
        write_lr_table(lr_records, paths["lr_table"], command)
    return paths


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------
def measure(depths, sizing: Sizing, steps: int, log=print) -> dict[int, dict]:
    """Time one `layerscale` run of ``steps`` steps per depth at ``sizing``: setup (model init, diagnostics at
    step 0), the first step (its compilation), each later step, and the evaluations."""
    costs = {}
    for depth in depths:
        probe = dataclasses.replace(sizing, steps=steps, evals=1)
        timing = train_run(RunSpec(depth, "layerscale", True, 0, RECIPE["learning_rate"]), probe)["timing"]
        costs[depth] = timing
        log(f"depth {depth}: setup {timing['setup']:.1f} s, first step {timing['first_step']:.1f} s, "
            f"{1000 * timing['per_step']:.0f} ms per step, evaluations {timing['evaluations']:.1f} s")
    return costs


def estimate_sweep_seconds(costs: dict[int, dict], specs: list[RunSpec], sizing: Sizing) -> float:
    """``sweep.estimate_seconds`` of the grid from ``measure``'s costs per depth, each run ``sizing.steps`` steps
    with ``sizing.evals`` evaluations."""
    return sweep.estimate_seconds(costs, [s.depth for s in specs], sizing.steps, sizing.evals)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(ROOT, "experiments", "results", "depth_ablation"))
    parser.add_argument("--depths", type=int, nargs="+", default=None)
    parser.add_argument("--schemes", nargs="+", default=None, choices=sorted(SCHEMES_BY_NAME))
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--learning_rate", type=float, default=RECIPE["learning_rate"],
                        help="the rate shared by every scheme")
    parser.add_argument("--per_scheme_lr", action="store_true",
                        help="each scheme at its best rate from a finished --lr_sweep in OUT/lr_sweep")
    parser.add_argument("--steps", type=int, default=None, help=f"override SIZING.steps ({SIZING.steps})")
    parser.add_argument("--dataset", default="digits", help="digits, or any prepared TFDS image dataset by name")
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--quick", action="store_true", help=f"tiny grid in minutes: depths {QUICK_DEPTHS}, "
                                                              f"{QUICK_SIZING.steps} steps, width "
                                                              f"{QUICK_SIZING.embed_dim}, seed 0")
    parser.add_argument("--lr_sweep", action="store_true",
                        help=f"every scheme at depth {LR_SWEEP_DEPTH}, lr in {LR_SWEEP_RATES}, seed 0")
    parser.add_argument("--report", action="store_true", help="only rewrite the outputs from finished runs")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="train only shard I of N of the grid (one machine of N; merge their OUT/runs/ folders, "
                             "then --report)")
    parser.add_argument("--measure", type=int, nargs="*", default=None, metavar="DEPTH",
                        help="time one run per depth (default 6 24 96) at SIZING and print the sweep estimate")
    args = parser.parse_args(argv)
    for field in ("depths", "seeds"):
        values = getattr(args, field)
        if values is not None and any(v < 1 if field == "depths" else v < 0 for v in values):
            raise SystemExit(f"--{field}={values}: depths must be ≥ 1 and seeds ≥ 0")
    try:
        which_shard = sweep.parse_shard(args.shard) if args.shard else None
    except ValueError as err:
        raise SystemExit(str(err)) from None
    sizing = QUICK_SIZING if args.quick else SIZING
    if args.steps is not None:
        if args.steps < 1:
            raise SystemExit(f"--steps={args.steps} must be ≥ 1")
        sizing = dataclasses.replace(sizing, steps=args.steps)
    command = "python experiments/depth_ablation.py " + " ".join(sys.argv[1:] if argv is None else argv)

    if args.measure is not None:
        sweep.enable_compilation_cache()
        costs = measure(args.measure or [6, 24, 96], sizing, steps=min(sizing.steps, 40))
        specs = grid(DEPTHS, DEFAULT_SCHEMES, SEEDS, args.learning_rate, sorted(DEPTHS)[-2:])
        estimate = sweep.format_seconds(estimate_sweep_seconds(costs, specs, sizing))
        print(f"default grid: {len(specs)} runs of {sizing.steps} steps, estimated {estimate} (an upper bound: "
              f"seeds 1 and 2 reuse compiled programs)")
        return
    rates = args.learning_rate
    if args.per_scheme_lr:
        rates = best_learning_rates(os.path.join(args.out, "lr_sweep"), tuple(args.schemes or DEFAULT_SCHEMES))
        print("learning rate per scheme (from the lr sweep): " + json.dumps(rates))
    if not args.report:
        schemes = tuple(args.schemes or DEFAULT_SCHEMES)
        if args.lr_sweep:
            specs = lr_sweep_grid(schemes, (args.depths or [LR_SWEEP_DEPTH])[0], LR_SWEEP_RATES)
        else:
            depths = tuple(args.depths or (QUICK_DEPTHS if args.quick else DEPTHS))
            seeds = tuple(args.seeds if args.seeds is not None else ((0,) if args.quick else SEEDS))
            specs = grid(depths, schemes, seeds, rates, sorted(depths)[-2:])
        out = os.path.join(args.out, "lr_sweep") if args.lr_sweep else args.out
        run_sweep(sweep.shard(specs, which_shard), sizing, out, args.dataset, args.data_dir)
        if which_shard:
            print(f"shard {args.shard} finished; with every shard's {os.path.join(out, 'runs')} copied together, "
                  "--report writes the outputs")
            return
    report_dir = os.path.join(args.out, "per_scheme_lr") if args.per_scheme_lr else None
    for what, path in write_reports(args.out, command, lr_sweep=args.lr_sweep, rates=rates,
                                    report_dir=report_dir).items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    main()
