"""Depth ablation: does a pre-norm ViT stop improving or fail as depth grows while LayerScale keeps training?

The CaiT paper (Touvron et al., "Going deeper with Image Transformers", 2021, §3 and Fig. 3) compares LayerScale,

    x'  = x  + diag(λ1) · SA(LN(x))
    x'' = x' + diag(λ2) · FFN(LN(x'))        λ initialised to ε (0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper)

with plain pre-norm, a per-branch scalar, ReZero and SkipInit (the last two also without warm-up: CaiT's variant b),
on the offline `digits` data, every hyper-parameter identical across columns except the one varied. The protocol
(``--protocol``, outputs under ``experiments/results/depth_ablation_converged/<stage>/``) selects on the validation
split only and reports test accuracy of final runs only:

    python experiments/depth_ablation.py --protocol budget   # step count: runs of each length (converged_budget)
    python experiments/depth_ablation.py --protocol rates    # rate per column × depth, bracketed (swept_rates)
    python experiments/depth_ablation.py --protocol final    # FINAL_SEEDS seeds at both rate choices, train → test

Each stage writes a run's record to ``<stage>/runs/<run id>.json`` when it ends and skips runs whose record exists,
so a stopped stage resumes; ``--shard I/N`` trains every N-th run from the I-th (one of N machines), and the same
command without ``--shard`` on the merged ``runs/`` folders trains what is missing and writes the outputs. A run
whose loss or gradient norm turns non-finite stops there, recorded with ``diverged=True``. Outputs: ``budget.json``
/ ``.md`` / ``budget.png``; ``rates.json`` / ``.md``; per final protocol (``per_depth``, ``one_rate``)
``table.md`` (mean and t-based 95% CI over converged runs, divergence counted apart), ``comparisons.md`` (Welch),
``claims.md`` / ``claims.png`` (CaiT's claims, verdicts by ``cait_claims``' rules), ``results.csv`` and the figures
of ``depth_ablation_plots``.

``--protocol early`` keeps the committed early-training grid reproducible (200 steps, ``SIZING``; depth ∈ {6, 12,
24, 48, 96} × ``DEFAULT_SCHEMES`` × seeds {0, 1, 2} plus warm-up off for `none` and `layerscale` at 48 and 96;
``--lr_sweep`` at depth 24 and ``--per_scheme_lr`` with rates chosen on *test* accuracy of seed 0 — superseded by
the protocol). ``--measure`` times runs and prints the protocol's estimate; ``--imagenet_commands`` prints the same
ablation at ImageNet scale. The runner and statistics are ``experiments/sweep.py``'s, the choices on validation
and the reports on test ``experiments/validation_protocol.py``'s, one run's training is
``experiments/classifier_run.py``'s (diagnostics from ``layerscale_jax.train.diagnostics`` at step 0 and every
evaluation).
"""
from __future__ import annotations

if __name__ == "__main__":   # before anything allocates: a malloc that keeps XLA's buffers (layerscale_jax/runtime.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cait_claims  # noqa: E402  (CaiT's claims as tests fixed before the final runs, and their verdicts)
import classifier_run  # noqa: E402  (one run: training, evaluations, diagnostics, divergence)
import depth_ablation_plots as plots  # noqa: E402  (the study's figures and its palette)
import sweep  # noqa: E402  (records, resume, shards, ETA, statistics, tables, plots)
import validation_protocol as vp  # noqa: E402  (split discipline, rate bracketing, convergence, CI and Welch tables)

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

# ---------------------------------------------------------------------------------------------------------------
# The protocol (issue: a depth ablation a reviewer would accept). Every choice is made on the validation split
# (285 stratified training images held out; the models train on the other 1,157); only final runs see the test
# split, trained on all 1,442 training images.
#   1. budget: the two best schemes at depths 24 and 96, one whole run per step count in BUDGET_STEPS; the step
#      count is the shortest from which no longer run ends higher by one binomial standard error of the validation
#      accuracy (``vp.converged_budget``), in every cell.
#   2. rates: every column at every depth over RATE_LADDER_START, extended along the 1-2-5 ladder until the best
#      rate is strictly inside the swept range (at most MAX_EXTENSIONS more rates per cell).
#   3. final: every column at every depth, FINAL_SEEDS seeds, (a) each at its best rate per depth and (b) each at
#      its one best rate for all depths.
# ---------------------------------------------------------------------------------------------------------------
SELECTION_SPLITS = ("train_without_validation", "validation")
FINAL_SPLITS = ("train", "test")
PROTOCOL_SPLITS = {"early": FINAL_SPLITS, "budget": SELECTION_SPLITS, "rates": SELECTION_SPLITS,
                   "final": FINAL_SPLITS}
PROTOCOL_SIZING = Sizing(embed_dim=32, num_heads=2, batch_size=64, steps=0, evals=5, log_every=10)
# Columns: (scheme, warm-up). ReZero and SkipInit also without warm-up: CaiT's variant (b) (Table 1).
COLUMNS = tuple((s, True) for s in DEFAULT_SCHEMES) + (("rezero", False), ("skipinit", False))
REFERENCE = ("layerscale", True)   # the column the comparisons test every other column against
BUDGET_COLUMNS = (("layerscale", True), ("skipinit", True))
BUDGET_DEPTHS = (24, 96)
BUDGET_STEPS = (500, 1000, 2000, 3000)   # candidate budgets: one whole run (warm-up, cosine to 0) per candidate
BUDGET_EVAL_EVERY = 100
BUDGET_RATE = 1e-2
BUDGET_SEEDS = (0,)
RATE_DEPTHS = DEPTHS
RATE_LADDER_START = (5e-3, 1e-2, 2e-2)    # the budget's rate and its ladder neighbours; bracketing extends
MAX_EXTENSIONS = 3
FINAL_SEEDS = (0, 1, 2, 3, 4)
CONVERGED_OUT = os.path.join(ROOT, "experiments", "results", "depth_ablation_converged")


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run. ``protocol`` fixes the splits (``PROTOCOL_SPLITS``): ``early`` is the committed 200-step grid,
    ``budget`` and ``rates`` select on validation, ``final`` reports test; ``steps`` 0 means the sizing's."""
    depth: int
    scheme: str
    warmup: bool
    seed: int
    learning_rate: float
    protocol: str = "early"
    steps: int = 0

    @property
    def run_id(self) -> str:
        base = (f"depth{self.depth}_{self.scheme}_warmup{'on' if self.warmup else 'off'}_lr{self.learning_rate:g}"
                f"_seed{self.seed}")
        return base if self.protocol == "early" else f"{self.protocol}_{base}_steps{self.steps}"


def grid(depths, schemes, seeds, learning_rate, warmup_off_depths) -> list[RunSpec]:
    """The default grid: every depth × scheme × seed with warm-up, plus warm-up off for ``WARMUP_OFF_SCHEMES`` at
    ``warmup_off_depths``. Seed by seed, and within a seed the cheapest runs first, so a partial sweep (one that a
    session's time limit cut short) already covers every depth × scheme cell with the first seeds.

    ``learning_rate`` is one rate shared by every scheme, or ``{scheme: rate}`` (``early_rates_chosen_on_test``)."""
    rate = learning_rate.__getitem__ if isinstance(learning_rate, dict) else (lambda scheme: learning_rate)
    runs = [RunSpec(d, s, True, k, rate(s)) for d in depths for k in seeds for s in schemes]
    runs += [RunSpec(d, s, False, k, rate(s)) for d in warmup_off_depths for k in seeds for s in schemes
             if s in WARMUP_OFF_SCHEMES]
    return sorted(runs, key=lambda r: (r.seed, r.depth, not r.warmup))


def early_rates_chosen_on_test(lr_sweep_dir: str, schemes) -> dict[str, float]:
    """The early grid's per-scheme rates, as they were chosen (kept to reproduce the committed early tables): the
    highest final *test* accuracy of seed 0 at depth 24 among the runs that did not diverge (ties: the lower
    rate). The protocol chooses on validation instead: ``best_learning_rates``."""
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
    steps = spec.steps or sizing.steps
    config = load_digits_config(f"seed={spec.seed}")
    if dataset != "digits":
        config.data = default_data_config(dataset)
        if data_dir:
            config.data.data_dir = data_dir
    if dataset == "digits":                      # other datasets: their own train and test (or validation) splits
        config.data.train_split, config.data.eval_split = PROTOCOL_SPLITS[spec.protocol]
    from layerscale_jax.data import get_dataset_info
    info = get_dataset_info(config.data)
    patch = 2 if info.image_size <= 8 else max(info.image_size // 8, 1)
    config.model = model_section(
        "deit3_small_patch16_224", img_size=info.image_size, patch_size=patch, in_chans=info.channels,
        num_classes=info.num_classes, embed_dim=sizing.embed_dim, num_heads=sizing.num_heads, depth=spec.depth,
        branch_scaling=scheme.branch_scaling, init_values=scheme.init_values,
        drop_path_rate=RECIPE["drop_path_rate"], global_pool="avg", scan_layers=True)
    config.optim.learning_rate = spec.learning_rate
    config.optim.warmup_steps = int(round(RECIPE["warmup_fraction"] * steps)) if spec.warmup else 0
    config.train.steps = steps
    config.train.batch_size = sizing.batch_size
    config.train.seed = spec.seed
    config.train.log_every = sizing.log_every
    config.train.eval_every = max(steps // sizing.evals, 1)
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
        "run_id": spec.run_id, "protocol": spec.protocol, "depth": spec.depth, "scheme": spec.scheme,
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
                     cost=lambda spec: spec.depth, log=log,
                     outcome=lambda r: f"{r.get('eval_split', 'test')} acc {vp.accuracy(r):.4f}")


# ---------------------------------------------------------------------------------------------------------------
# The protocol: budget → rates → final
# ---------------------------------------------------------------------------------------------------------------
def budget_specs(columns=BUDGET_COLUMNS, depths=BUDGET_DEPTHS, seeds=BUDGET_SEEDS, steps=BUDGET_STEPS,
                 rate=BUDGET_RATE) -> list[RunSpec]:
    """One run per candidate step count in ``steps`` (each with its own warm-up and cosine decay), cheapest first."""
    return [RunSpec(d, s, w, k, rate, "budget", t) for t in sorted(steps) for k in seeds for d in depths
            for s, w in columns]


def budget_sizing(sizing: Sizing, steps: int, eval_every: int) -> Sizing:
    """``sizing`` for budget runs: ``steps`` steps with an evaluation every ``eval_every``."""
    if steps % eval_every:
        raise ValueError(f"--budget_steps={steps} must be a multiple of --budget_eval_every={eval_every}")
    return dataclasses.replace(sizing, steps=steps, evals=steps // eval_every)


def _budget_records(records: list[dict]) -> list[dict]:
    """The budget runs, checked: validation only; a diverged budget run is an error (its final accuracy cannot
    say when training converges: choose a lower --budget_rate)."""
    vp.require_validation(records, "--protocol budget")
    diverged = [r["run_id"] for r in records if r["diverged"]]
    if diverged:
        raise ValueError(f"budget runs diverged: {diverged}; choose a lower --budget_rate")
    return records


def budget_finals(records: list[dict]) -> dict[tuple[str, bool, int], dict[int, float]]:
    """``{(scheme, warm-up, depth): {steps: final validation accuracy %}}``, the mean over each run length's seeds."""
    cells: dict = {}
    for r in _budget_records(records):
        cells.setdefault((r["scheme"], r["warmup"], r["depth"]), {}).setdefault(r["steps"], []).append(
            100 * vp.accuracy(r))
    return {cell: {t: sum(a) / len(a) for t, a in sorted(runs.items())} for cell, runs in cells.items()}


def budget_curves(records: list[dict]) -> dict[tuple[str, bool, int, int], list[tuple[int, float]]]:
    """``{(scheme, warm-up, depth, steps): [(step, validation accuracy %)]}``: each run length's validation curve,
    the mean over its seeds."""
    return vp.mean_validation_curves(_budget_records(records),
                                     lambda r: (r["scheme"], r["warmup"], r["depth"], r["steps"]))


def choose_budget(records: list[dict], validation_images: int, tolerance: float | None = None) -> dict:
    """The step count of the rate and final runs: per cell, ``vp.converged_budget`` over its runs of each length
    with a tolerance of one binomial standard error of the longest run's accuracy on ``validation_images`` images
    (``tolerance``: a fixed number of points instead); the budget is the largest cell's (every cell has converged
    by then). A cell that no shorter run comes close to is a ValueError naming it (add a longer --budget_steps)."""
    finals = budget_finals(records)
    if not finals:
        raise ValueError("--protocol budget: no finished budget runs")
    cells, tolerances = {}, {}
    for (s, w, d), runs in sorted(finals.items()):
        name = f"{_label(s, w)}, depth {d}"
        tolerances[name] = (tolerance if tolerance is not None
                            else vp.binomial_standard_error(runs[max(runs)], validation_images))
        cells[name] = vp.converged_budget(runs, tolerances[name])
    late = [f"{cell} (±{tolerances[cell]:.2f})" for cell, steps in cells.items() if steps is None]
    if late:
        raise ValueError(f"no shorter budget run ends within the tolerance of the longest for {late}; add a longer "
                         "run (--budget_steps)")
    return {"steps": max(cells.values()), "cells": cells, "tolerance_points": tolerances,
            "validation_images": validation_images,
            "finals": {f"{_label(s, w)}, depth {d}": runs for (s, w, d), runs in sorted(finals.items())}}


def _cell_records(records, scheme, warmup, depth):
    return [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == (scheme, warmup, depth)]


def rate_specs(records: list[dict], steps: int, columns=COLUMNS, depths=RATE_DEPTHS, seed: int = 0,
               start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS) -> list[RunSpec]:
    """Every run of the rate sweep the finished ``records`` call for (``swept_rates`` per column × depth):
    deterministic in the records, so a resumed sweep or another shard with the same records plans the same runs."""
    specs = [RunSpec(d, s, w, seed, lr, "rates", steps) for d in depths for s, w in columns
             for lr in vp.swept_rates(_cell_records(records, s, w, d), start, max_extensions)]
    return sorted(specs, key=lambda r: (r.depth, r.learning_rate, r.scheme, not r.warmup))


def run_rate_sweep(out: str, steps: int, columns=COLUMNS, depths=RATE_DEPTHS, which_shard=None,
                   sizing: Sizing = PROTOCOL_SIZING, start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS,
                   log=print, **run_kwargs) -> list[dict]:
    """Train the rate sweep round by round (``rate_specs``) until no cell needs another rate. With a shard, a
    round ends when this shard's share is done; the shards' records merged, the next command plans the next
    round."""
    sizing = dataclasses.replace(sizing, steps=steps)
    while True:
        specs = rate_specs(load_records(out), steps, columns, depths, start=start, max_extensions=max_extensions)
        mine = sweep.shard(specs, which_shard)
        if all(os.path.exists(record_path(out, s)) for s in mine):
            return load_records(out)
        run_sweep(mine, sizing, out, log=log, **run_kwargs)


def best_learning_rates(records: list[dict], images: int, columns=COLUMNS, depths=RATE_DEPTHS,
                        start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS) -> dict:
    """The rates the final runs use, from a finished rate sweep (validation only, ``images`` validation images):
    ``per_depth[(scheme, warm-up, depth)]``: each cell's ``best_rate``; ``one_rate[(scheme, warm-up)]``: the rate
    swept at every depth with the most validation images right summed over the depths (integer counts,
    ``vp.correct_images``), a diverged run counting 0 (ties: the lower rate); ``bracketed[...]``: whether the cell's
    best rate is strictly inside its swept range; ``tie_at_edge[...]``: whether an edge rate of the cell's sweep got
    as many images right as the best (inside only by the tie rule); ``one_rate_bracketed[(scheme, warm-up)]``:
    whether the one rate is strictly inside the rates swept at every depth. A cell whose sweep is unfinished, or
    whose runs all diverged, is a ValueError naming it."""
    vp.require_validation(records, "best_learning_rates")
    per_depth, bracketed, one_rate, tie_at_edge, one_rate_bracketed = {}, {}, {}, {}, {}
    for scheme, warmup in columns:
        by_depth = {}
        for depth in depths:
            mine = _cell_records(records, scheme, warmup, depth)
            wanted = vp.swept_rates(mine, start, max_extensions)
            have = [r for r in mine if any(math.isclose(r["learning_rate"], x) for x in wanted)]
            if len(have) < len(wanted):
                raise ValueError(f"rate sweep of {_label(scheme, warmup)} at depth {depth} is unfinished "
                                 f"({len(have)}/{len(wanted)} runs); run --protocol rates again")
            best = vp.best_rate(have)
            if best is None:
                raise ValueError(f"every rate of {_label(scheme, warmup)} at depth {depth} diverged: {wanted}")
            per_depth[(scheme, warmup, depth)] = best
            bracketed[(scheme, warmup, depth)] = wanted[0] < best < wanted[-1]
            by_depth[depth] = {r["learning_rate"]: (0 if r["diverged"] else vp.correct_images(r, images))
                               for r in have}
            counts = by_depth[depth]
            edges = [lr for lr in counts if math.isclose(lr, wanted[0]) or math.isclose(lr, wanted[-1])]
            tie_at_edge[(scheme, warmup, depth)] = bracketed[(scheme, warmup, depth)] and any(
                counts[lr] == counts[best] for lr in edges)
        common = set.intersection(*(set(v) for v in by_depth.values()))
        one_rate[(scheme, warmup)] = max(sorted(common), key=lambda lr: (sum(v[lr] for v in by_depth.values()),
                                                                         -lr))
        one_rate_bracketed[(scheme, warmup)] = min(common) < one_rate[(scheme, warmup)] < max(common)
    return {"per_depth": per_depth, "one_rate": one_rate, "bracketed": bracketed, "tie_at_edge": tie_at_edge,
            "one_rate_bracketed": one_rate_bracketed}


def final_specs(rates: dict, steps: int, depths=DEPTHS, seeds=FINAL_SEEDS, columns=COLUMNS) -> list[RunSpec]:
    """Both final protocols' runs (each column at its best rate per depth, and at its one rate for all depths),
    every seed; a run both protocols need is trained once. The per-depth choice's runs come first, then those only
    the one-rate choice needs (so a stopped stage has one choice complete as early as possible), each part seed by
    seed, cheapest first."""
    specs, per_depth = {}, set()
    for scheme, warmup in columns:
        for depth in depths:
            own = rates["per_depth"][(scheme, warmup, depth)]
            for lr in (own, rates["one_rate"][(scheme, warmup)]):
                for seed in seeds:
                    spec = RunSpec(depth, scheme, warmup, seed, lr, "final", steps)
                    specs[spec.run_id] = spec
                    if lr == own:
                        per_depth.add(spec.run_id)
    return sorted(specs.values(), key=lambda r: (r.run_id not in per_depth, r.seed, r.depth, r.scheme, not r.warmup,
                                                 r.learning_rate))


def final_records(records: list[dict], rates: dict, which: str) -> list[dict]:
    """The final runs of protocol ``which``: ``per_depth`` (each column at its best rate per depth) or
    ``one_rate`` (each at its one rate for all depths)."""
    def wanted(r):
        key = (r["scheme"], r["warmup"])
        lr = rates["per_depth"].get(key + (r["depth"],)) if which == "per_depth" else rates["one_rate"].get(key)
        return lr is not None and math.isclose(r["learning_rate"], lr)
    return [r for r in records if r.get("protocol") == "final" and wanted(r)]


def rates_to_json(rates: dict) -> dict:
    """``best_learning_rates`` with string keys (``"scheme|warmup|depth"``) for ``rates.json``."""
    key = lambda k: "|".join(str(x) for x in k)  # noqa: E731
    return {part: {key(k): v for k, v in table.items()} for part, table in rates.items()}


def rates_from_json(obj: dict) -> dict:
    def key(text):
        parts = text.split("|")
        return (parts[0], parts[1] == "True") + tuple(int(p) for p in parts[2:])
    return {part: {key(k): v for k, v in table.items()} for part, table in obj.items()}


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


def layout(records: list[dict]) -> vp.Layout:
    """The study's reports: depth × (scheme, warm-up) column (``_column_names``), the final accuracy in %."""
    return vp.Layout("depth", lambda r: r["depth"], lambda r: (r["scheme"], r["warmup"]), _column_names(records),
                     lambda c: _label(*c), lambda r: 100 * vp.accuracy(r))


def describe(records: list[dict], protocol: str, rates: str) -> str:
    """A figure's or table's title: protocol, rate(s), steps and the splits (``train → evaluated``)."""
    steps = sorted({r["steps"] for r in records if not r["diverged"]} or {r["steps"] for r in records})
    r0 = records[0]
    splits = f"{r0.get('train_split', 'train')} → {r0.get('eval_split', 'test')}"
    return (f"{protocol}: {r0['dataset']} {splits}, {'/'.join(str(s) for s in steps)} steps, {rates}, "
            f"width {r0['embed_dim']}")


def write_figures(records: list[dict], report_dir: str, title: str) -> dict[str, str]:
    """The accuracy-vs-depth figure and, at the largest depth, loss curves, scale heat map and branch ratios."""
    prefix = "test" if records[0].get("eval_split", "test") == "test" else "validation"
    paths = {"acc_vs_depth": os.path.join(report_dir, "acc_vs_depth.png")}
    plots.plot_accuracy_vs_depth(records, _column_names(records), lambda r: 100 * vp.accuracy(r),
                                 paths["acc_vs_depth"], title=title,
                                 ylabel=f"final {prefix} accuracy (%): seeds, mean, 95% CI")
    deepest = max(r["depth"] for r in records)
    first = _first_seed(records, deepest)
    paths["loss_curves"] = os.path.join(report_dir, f"loss_curves_depth{deepest}.png")
    plots.plot_loss_curves(records, deepest, paths["loss_curves"], title=f"train loss, depth {deepest}; {title}")
    paths["scale_heatmap"] = os.path.join(report_dir, f"scale_heatmap_depth{deepest}.png")
    plots.plot_scale_heatmap(first, deepest, paths["scale_heatmap"],
                             title=f"branch scale per block, depth {deepest}, lowest seed; {title}")
    paths["ratio_init_end"] = os.path.join(report_dir, f"ratio_init_end_depth{deepest}.png")
    plots.plot_ratio_init_end(first, deepest, paths["ratio_init_end"],
                              title=f"branch-to-stream ratio at init and end, depth {deepest}, lowest seed; {title}")
    return paths


def _first_seed(records: list[dict], depth: int) -> list[dict]:
    """The lowest seed's run of each column at ``depth``, in column order."""
    chosen = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        if r["depth"] == depth:
            chosen.setdefault((r["scheme"], r["warmup"]), r)
    return [chosen[c] for c in _column_names(records) if c in chosen]


def validation_images() -> int:
    """The size of the digits validation split the selection runs evaluate."""
    from layerscale_jax.data import get_dataset_info
    return get_dataset_info(make_config(budget_specs()[0], PROTOCOL_SIZING).data).num_test


def write_budget_report(out: str, tolerance: float | None = None) -> dict[str, str]:
    """``budget.json`` (the chosen step count, each cell's converged length, final accuracies and tolerance),
    ``budget.md`` and ``budget.png`` from the budget runs in ``out``."""
    records = load_records(out)
    choice = choose_budget(records, validation_images(), tolerance)
    sweep.save_json(os.path.join(out, "budget.json"), choice)
    lengths = sorted({t for runs in choice["finals"].values() for t in runs})
    rows = [[cell] + [f"{runs[t]:.1f}" if t in runs else "—" for t in lengths]
            + [f"{choice['tolerance_points'][cell]:.2f}", choice["cells"][cell]]
            for cell, runs in choice["finals"].items()]
    rate = ", ".join(sorted({f"{r['learning_rate']:g}" for r in records}))
    rule = ("one binomial standard error of the longest run's accuracy on the "
            f"{choice['validation_images']} validation images" if tolerance is None else f"{tolerance} points")
    with open(os.path.join(out, "budget.md"), "w") as f:
        f.write(f"Budget ({describe(records, 'budget', f'rate {rate}')}): one whole run per step count (its own "
                "warm-up and cosine decay to zero), final validation accuracy (%, mean over seeds). A cell has "
                "converged at the shortest step count from which no run shorter than the longest ends "
                f"a tolerance or more below the longest; tolerance: {rule}.\n\n"
                + sweep.markdown_table(["cell"] + [f"{t} steps" for t in lengths] + ["tolerance", "converged at"],
                                       rows)
                + f"\nChosen budget: **{choice['steps']} steps** (the largest).\n")
    rate_title = describe(records, "budget", f"rate {rate}")
    plots.plot_budget(budget_finals(records), budget_curves(records), choice["steps"],
                      os.path.join(out, "budget.png"), title=f"{rate_title}; chosen {choice['steps']} steps")
    return {"budget": os.path.join(out, "budget.json"), "budget_md": os.path.join(out, "budget.md"),
            "budget_figure": os.path.join(out, "budget.png")}


def rates_status(records: list[dict], columns=COLUMNS, depths=RATE_DEPTHS, start=RATE_LADDER_START,
                 max_extensions=MAX_EXTENSIONS) -> str:
    """Where the rate sweep stands, per column × depth: every finished rate with its validation accuracy (or
    "div."), and what the cell still needs (``swept_rates``) or how it ended: bracketed, at the edge after the
    last allowed extension, or every run diverged. Nothing is trained."""
    rows, open_cells = [], 0
    for depth in depths:
        for scheme, warmup in columns:
            mine = _cell_records(records, scheme, warmup, depth)
            wanted = vp.swept_rates(mine, start, max_extensions)
            runs = sorted(mine, key=lambda r: r["learning_rate"])
            missing = [lr for lr in wanted if not any(math.isclose(lr, r["learning_rate"]) for r in mine)]
            best = vp.best_rate(mine) if mine and not missing else None
            state = (f"needs {', '.join(f'{lr:g}' for lr in missing)}" if missing else
                     "every rate diverged" if best is None else
                     f"bracketed: {best:g}" if wanted[0] < best < wanted[-1] else
                     f"**edge: {best:g}** (after {len(wanted) - len(start)} extensions)")
            open_cells += bool(missing)
            rows.append([_label(scheme, warmup), depth, ", ".join(
                f"{r['learning_rate']:g}: {'div.' if r['diverged'] else f'{100 * vp.accuracy(r):.1f}'}"
                for r in runs) or "–", state])
    return (f"Rate sweep: {len(records)} runs finished, {open_cells} of {len(rows)} cells still need runs.\n\n"
            + sweep.markdown_table(["column", "depth", "finished rates: validation accuracy (%)", "state"], rows))


def write_rates_report(out: str, validation_images: int, columns=COLUMNS, depths=RATE_DEPTHS, **sweep_kwargs
                       ) -> dict[str, str]:
    """``rates.json`` (``best_learning_rates``), ``rates.md`` (per column × depth: swept range, best rate, bracketed,
    its validation accuracy and its lead over the next-best rate against the binomial standard error of that
    accuracy on ``validation_images`` images, the resolution of the choice; the one rate per column) and
    ``results.csv`` from the rate sweep in ``out``."""
    records = load_records(out)
    rates = best_learning_rates(records, validation_images, columns, depths, **sweep_kwargs)
    sweep.save_json(os.path.join(out, "rates.json"), rates_to_json(rates))
    rows, unresolved = [], 0
    for (scheme, warmup, depth), lr in rates["per_depth"].items():
        mine = _cell_records(records, scheme, warmup, depth)
        swept = sorted(r["learning_rate"] for r in mine)
        at_best = [r for r in mine if math.isclose(r["learning_rate"], lr)][0]
        best = 100 * vp.accuracy(at_best)
        runner_up = max((100 * vp.accuracy(r) for r in mine if r is not at_best and not r["diverged"]), default=None)
        resolution = vp.binomial_standard_error(best, validation_images)
        within_se = runner_up is not None and best - runner_up < resolution
        unresolved += within_se
        lead = "–" if runner_up is None else f"{best - runner_up:.1f}" + (" (< SE)" if within_se else "")
        rows.append([_label(scheme, warmup), depth, f"{swept[0]:g} … {swept[-1]:g} ({len(swept)})", f"{lr:g}",
                     ("yes, by the tie rule" if rates["tie_at_edge"][(scheme, warmup, depth)] else "yes")
                     if rates["bracketed"][(scheme, warmup, depth)] else "**no (edge)**",
                     f"{best:.1f}", lead, sum(r["diverged"] for r in mine)])
    common = {c: sorted(set.intersection(*({r["learning_rate"] for r in _cell_records(records, *c, d)}
                                           for d in depths))) for c in rates["one_rate"]}
    one = [[_label(*c), f"{lr:g}", f"{common[c][0]:g} … {common[c][-1]:g}",
            "yes" if rates["one_rate_bracketed"][c] else "**no (edge)**"] for c, lr in rates["one_rate"].items()]
    with open(os.path.join(out, "rates.md"), "w") as f:
        f.write(f"Rates ({describe(records, 'rate sweep', 'seed 0')}), chosen on final validation accuracy. "
                f"{sweep.machines_note(records)} Compute: {sweep.compute_note(records)}\n\n"
                f"Resolution of the choice: in {unresolved} of {len(rows)} cells the best rate leads the next-best "
                f"by less than one binomial standard error of its validation accuracy on {validation_images} "
                f"images (100·√(p(1−p)/n), about 1 point at 97%), marked \"< SE\": there one seed cannot tell "
                f"the two rates apart.\n\n"
                + sweep.markdown_table(["column", "depth", "swept (runs)", "best rate", "bracketed",
                                        "val acc at best (%)", "lead over next-best rate (points)",
                                        "diverged runs"], rows)
                + "\nOne rate for all depths (the most validation images right summed over the depths, a diverged "
                  "run counting 0; ties: the lower rate), and whether it is inside the rates swept at every "
                  "depth — at an edge, a rate beyond might be better at some depth, untested:\n\n"
                + sweep.markdown_table(["column", "rate", "swept at every depth", "bracketed"], one)
                + divergence_by_rate(records, sorted(depths)[-2:]))
    sweep.write_csv(sorted(records, key=lambda r: (r["depth"], r["scheme"], not r["warmup"], r["learning_rate"])),
                    os.path.join(out, "results.csv"), RATE_CSV_FIELDS)
    return {"rates": os.path.join(out, "rates.json"), "rates_md": os.path.join(out, "rates.md")}


NORMALISATION_FREE = ("rezero", "skipinit")     # the schemes without the blocks' LayerNorm (``SCHEMES``)


def divergence_by_rate(records: Sequence[dict], depths: Sequence[int]) -> str:
    """Per swept rate, the diverged runs at ``depths`` of the columns that keep the blocks' LayerNorm against those
    that remove it (``NORMALISATION_FREE``, with and without warm-up), with Fisher's exact test on the counts — a
    description of the sweep's runs written after they were seen (one seed, cells of several columns and depths
    pooled), not one of the claims fixed before the final runs; "" without runs at ``depths``."""
    rows = []
    for lr in sorted({r["learning_rate"] for r in records}):
        at = [r for r in records if math.isclose(r["learning_rate"], lr) and r["depth"] in depths]
        kept = [r["diverged"] for r in at if r["scheme"] not in NORMALISATION_FREE]
        free = [r["diverged"] for r in at if r["scheme"] in NORMALISATION_FREE]
        if not kept or not free:
            continue
        p = cait_claims.fisher_divergence(sum(free), len(free), sum(kept), len(kept)) if any(kept + free) else 1.0
        rows.append([f"{lr:g}", f"{sum(kept)}/{len(kept)}", f"{sum(free)}/{len(free)}", f"{p:.3g}"])
    if not rows:
        return ""
    present = {r["scheme"] for r in records}

    def names(free):
        return ", ".join(f"`{s.name}`" for s in SCHEMES if s.name in present and (s.name in NORMALISATION_FREE) == free)
    return (f"\nDiverged runs per rate at depth {' and '.join(str(d) for d in depths)}, LayerNorm kept "
            f"({names(False)}) against removed ({names(True)}, with and without warm-up), Fisher's exact test "
            f"(two-sided). Post hoc: a description of these runs written "
            f"after they were seen (seed 0; columns and depths pooled), not one of the claims fixed before the "
            f"final runs; tested since on new seeds by a pre-registered rule: "
            f"[rate_stability/report.md](../../rate_stability/report.md).\n\n"
            + sweep.markdown_table(["rate", "LayerNorm kept: diverged/runs", "removed: diverged/runs", "Fisher p"],
                                   rows))


RATE_CSV_FIELDS = ("depth", "scheme", "warmup", "learning_rate", "seed", "final_val_accuracy", "diverged",
                   "diverged_at_step", "steps", "seconds")
FINAL_PROTOCOLS = {"per_depth": "each column at its best validation rate per depth",
                   "one_rate": "each column at its one best validation rate for all depths"}


def write_final_report(out: str, rates: dict, depths: Sequence[int], command: str | None = None,
                       planned: int | None = None) -> dict[str, str]:
    """For each final protocol (``FINAL_PROTOCOLS``), in ``out/<protocol>/``: ``table.md`` (mean and 95% CI over
    converged runs, divergence counted apart), ``comparisons.md`` (LayerScale vs each column per depth, Welch),
    ``claims.md`` and ``claims.png`` (CaiT's claims on the grid's ``depths``, judged by the rules of ``cait_claims``),
    ``results.csv`` and the figures. With fewer finished runs than the ``planned`` runs of a rate choice, every
    output of that choice says so in its title ("INCOMPLETE: k of n runs finished"), so an interim report cannot
    pass for the study's."""
    paths = {}
    every = load_records(out)
    for which, words in FINAL_PROTOCOLS.items():
        records = final_records(every, rates, which)
        if not records:
            continue
        report_dir = os.path.join(out, which)
        os.makedirs(report_dir, exist_ok=True)
        title = describe(records, "final", words)
        if planned is not None and len(records) < planned:
            title = f"INCOMPLETE: {len(records)} of {planned} runs finished — {title}"
        head = (title + (f"\n\nCommand: `{command}`" if command else "") + f"\n\n{sweep.machines_note(records)} "
                f"The final stage, both rate choices' runs together: {sweep.compute_note(every)} "
                f"{cost_by_machine_kind(every)}".rstrip())
        paths[f"{which}/convergence"] = os.path.join(report_dir, "convergence.md")
        not_converged = vp.write_convergence(records, paths[f"{which}/convergence"], "Convergence, " + head,
                                             layout(records), *final_floor_and_images())
        paths[f"{which}/table"] = os.path.join(report_dir, "table.md")
        vp.write_ci_table(records, paths[f"{which}/table"], "Final test accuracy (%), " + head, layout(records),
                          not_converged)
        paths[f"{which}/comparisons"] = os.path.join(report_dir, "comparisons.md")
        vp.write_comparisons(records, paths[f"{which}/comparisons"], "LayerScale against each column, " + head,
                             layout(records), REFERENCE)
        paths[f"{which}/nll"] = os.path.join(report_dir, "nll.md")
        write_nll(records, paths[f"{which}/nll"], "Test NLL, " + head, layout(records), depths)
        paths[f"{which}/claims"] = os.path.join(report_dir, "claims.md")
        claims = cait_claims.write_claims(records, paths[f"{which}/claims"], "CaiT's claims, " + head,
                                          layout(records).value, depths)
        paths[f"{which}/claims_figure"] = os.path.join(report_dir, "claims.png")
        figure_title = f"{title}. {sweep.machines_note(records)}"      # a figure names its CPUs and load, too
        plots.plot_claims(claims, paths[f"{which}/claims_figure"], title=f"CaiT's claims: {figure_title}")
        paths[f"{which}/csv"] = os.path.join(report_dir, "results.csv")
        write_csv(records, paths[f"{which}/csv"])
        paths.update({f"{which}/{k}": v for k, v in write_figures(records, report_dir, figure_title).items()})
    if not paths:
        raise FileNotFoundError(f"no finished final runs under {os.path.join(out, 'runs')}")
    return paths


def test_nll(record: dict) -> float:
    """The run's final test negative log-likelihood (nats per image, hard labels: ``classifier_run``'s
    ``test_loss`` at its last evaluation)."""
    return record["evaluations"][-1]["test_loss"]


def write_nll(records: list[dict], path: str, title: str, layout_: vp.Layout, depths: Sequence[int]) -> str:
    """``nll.md``, a post-hoc continuous endpoint (chosen after the runs, so no claim rests on it): per cell the
    mean [95% CI] of the final test NLL over converged runs, and at the grid's deep depths (``cait_claims``'
    ``DEEP_DEPTHS``) LayerScale against every other column — difference of means (LayerScale − column: negative
    is LayerScale better), Welch–Satterthwaite 95% CI, Welch p and Holm's correction over those comparisons."""
    vp.require_reportable(records)
    table = sweep.markdown_table([layout_.row_header] + [layout_.label(c) for c in layout_.columns], (
        [row] + [vp.ci_cell(layout_.cell(records, row, c), test_nll, 3) for c in layout_.columns]
        for row in layout_.rows(records)))
    deep = sorted(depths)[-cait_claims.DEEP_DEPTHS:]
    found = []
    for depth in deep:
        ref = [test_nll(r) for r in layout_.cell(records, depth, REFERENCE) if not r["diverged"]]
        for column in layout_.columns:
            other = [test_nll(r) for r in layout_.cell(records, depth, column) if not r["diverged"]]
            if column != REFERENCE and len(ref) >= 2 and len(other) >= 2:
                found.append((depth, column, cait_claims.welch_difference(ref, other)))
    holm = cait_claims.holm([d.p for _, _, d in found])
    rows = [[depth, layout_.label(column), f"{d.difference:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}]",
             f"{d.p:.3g}", f"{q:.3g}"] for (depth, column, d), q in zip(found, holm)]
    text = (f"{title}\n\n**Post hoc** (chosen after the runs; no claim rests on it): the final test negative "
            f"log-likelihood, nats per image on hard labels — a continuous endpoint that still moves where accuracy "
            f"sits at the ceiling.\n\n" + table
            + f"\nmean [95% CI] over the runs that did not diverge (Student's t).\n\nLayerScale against each "
              f"column at depths {', '.join(map(str, deep))}: LayerScale − column (negative: LayerScale lower NLL), "
              f"Welch–Satterthwaite 95% CI, Welch p, Holm over these {len(found)} comparisons.\n\n"
            + sweep.markdown_table(["depth", "column", "difference (nats) [95% CI]", "p", "p (Holm)"], rows))
    with open(path, "w") as f:
        f.write(text)
    return text


def final_floor_and_images() -> tuple[float, int]:
    """The final runs' label-smoothing floor (nats) and test images (the convergence check's inputs)."""
    from layerscale_jax.data import get_dataset_info
    config = make_config(RunSpec(DEPTHS[0], "none", True, 0, RECIPE["learning_rate"], "final", 1), PROTOCOL_SIZING)
    info = get_dataset_info(config.data)
    return vp.label_smoothing_floor(config.data.label_smoothing, info.num_classes), info.num_test


EARLY_LABEL = ("early training (200 steps ≈ 9 epochs; rates selected on test accuracy of seed 0 at depth 24 — "
               "superseded by the validation protocol once run)")


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
        own = f", each scheme at its own learning rate ({per_scheme})" if per_scheme else ""
        head = f"{EARLY_LABEL.capitalize()}{own}" + (f"\n\nCommand: `{command}`" if command else "")
        write_table(sweep, paths["table"], f"Final test accuracy (%) on {sweep[0]['dataset']}, mean ± std over "
                                           f"seeds, a diverged run counted with the accuracy of its last finite "
                                           f"parameters (table_ci.md: mean and 95% CI over converged runs). {head}")
        paths["table_ci"] = os.path.join(report_dir, "table_ci.md")
        vp.write_ci_table(sweep, paths["table_ci"], f"Final test accuracy (%). {head}", layout(sweep))
        paths["comparisons"] = os.path.join(report_dir, "comparisons.md")
        vp.write_comparisons(sweep, paths["comparisons"], f"LayerScale against each column. {head}", layout(sweep),
                             REFERENCE)
        rate_words = (f"each scheme at its own rate ({per_scheme})" if per_scheme
                      else f"shared rate {rates:g}" if isinstance(rates, float) else "rates as recorded")
        paths.update(write_figures(sweep, report_dir, describe(sweep, EARLY_LABEL, rate_words)))
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


# ---------------------------------------------------------------------------------------------------------------
# The same study at ImageNet scale: one multi-host training job per run
# ---------------------------------------------------------------------------------------------------------------
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


def _steps_from_budget(out: str, steps: int | None) -> int:
    """``--steps``, else the step count ``--protocol budget`` chose (``OUT/budget/budget.json``)."""
    if steps is not None:
        return steps
    path = os.path.join(out, "budget", "budget.json")
    if not os.path.exists(path):
        raise ValueError(f"--steps not given and no {path}: run --protocol budget first (or pass --steps)")
    with open(path) as f:
        return int(json.load(f)["steps"])


def _load_rates(out: str) -> dict:
    path = os.path.join(out, "rates", "rates.json")
    if not os.path.exists(path):
        raise ValueError(f"no {path}: run --protocol rates first")
    with open(path) as f:
        return rates_from_json(json.load(f))


def run_protocol(protocol: str, out: str, *, steps: int | None = None, columns=COLUMNS, depths=None, seeds=None,
                 which_shard=None, report_only: bool = False, budget=None, budget_columns=BUDGET_COLUMNS,
                 sizing: Sizing = PROTOCOL_SIZING,
                 rate_start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS, tolerance: float | None = None,
                 command: str | None = None, log=print) -> dict[str, str]:
    """One stage of the protocol into ``out/<protocol>/`` (``budget``, ``rates``, ``final``): train what is missing
    (``which_shard``: this machine's share only, then stop), then write the stage's outputs from every finished
    record. ``budget``: ``(steps, eval_every, rate)`` of the ``budget_columns`` runs (those of them in
    ``columns``); ``tolerance``: the budget criterion's points (default: the validation resolution). Returns
    ``{what: path}`` (empty for a shard)."""
    stage = os.path.join(out, protocol)
    if protocol == "budget":
        b_steps, every, rate = budget or (BUDGET_STEPS, BUDGET_EVAL_EVERY, BUDGET_RATE)
        b_columns = [c for c in budget_columns if c in columns]
        if not b_columns:
            raise ValueError(f"--schemes leaves none of the budget columns {[_label(*c) for c in budget_columns]}")
        specs = budget_specs(b_columns, depths or BUDGET_DEPTHS, seeds or BUDGET_SEEDS, b_steps, rate)
        if not report_only:
            for t in sorted(set(b_steps)):
                run_sweep(sweep.shard([s for s in specs if s.steps == t], which_shard),
                          budget_sizing(sizing, t, every), stage, log=log)
    elif protocol == "rates":
        steps = _steps_from_budget(out, steps)
        if not report_only:
            run_rate_sweep(stage, steps, columns, depths or RATE_DEPTHS, which_shard, sizing, rate_start,
                           max_extensions, log=log)
    elif protocol == "final":
        steps = _steps_from_budget(out, steps)
        rates = _load_rates(out)
        specs = final_specs(rates, steps, depths or DEPTHS, seeds or FINAL_SEEDS, columns)
        if not report_only:
            run_sweep(sweep.shard(specs, which_shard), dataclasses.replace(sizing, steps=steps), stage, log=log)
    else:
        raise ValueError(f"--protocol={protocol!r} must be budget, rates or final")
    if which_shard is not None:
        log(f"shard {which_shard} finished; with every shard's {os.path.join(stage, 'runs')} copied together, run "
            "the same command without --shard (it trains what is missing and writes the outputs)")
        return {}
    if protocol == "budget":
        return write_budget_report(stage, tolerance)
    if protocol == "rates":
        return write_rates_report(stage, validation_images(), columns, depths or RATE_DEPTHS, start=rate_start,
                                  max_extensions=max_extensions)
    planned = len(columns) * len(depths or DEPTHS) * len(seeds or FINAL_SEEDS)     # per rate choice
    return write_final_report(stage, rates, depths or DEPTHS, command, planned)


MACHINE_KIND_KEYS = ("cpu", "cpu_family_model", "malloc")   # what a run's CPU time depends on, as records name it


def this_machine_kind() -> dict:
    """This machine's ``MACHINE_KIND_KEYS`` as ``sweep.run`` records them (``machine_info``), without starting JAX."""
    from layerscale_jax.bench.timing import cpu_family_model, cpu_model
    from layerscale_jax.runtime import malloc_in_use
    return {"cpu": cpu_model(), "cpu_family_model": cpu_family_model(), "malloc": malloc_in_use()}


def remaining_cpu_hours(missing: Sequence[RunSpec], records: Sequence[dict],
                        machine: dict | None = None) -> tuple[float, int, bool] | None:
    """The CPU time ``missing`` runs will take, in hours; how many finished runs it was estimated from; and whether
    those ran on ``machine``'s kind. Each run
    the mean ``cpu_seconds`` of the finished ``records`` at its depth, or at a depth without one its depth × the
    finished runs' mean CPU time per block (a run's cost grows about linearly with depth). Where some finished runs
    ran on ``machine``'s kind (``MACHINE_KIND_KEYS``: CPU, its generation, malloc), only those count. None when no
    finished run has its CPU time."""
    measured = [r for r in records if "cpu_seconds" in r]
    same_kind = [r for r in measured if machine and all(r.get("machine", {}).get(k) == machine[k]
                                                         for k in MACHINE_KIND_KEYS)]
    measured = same_kind or measured
    if not measured:
        return None
    return _projected_cpu_seconds([s.depth for s in missing], measured) / 3600, len(measured), bool(same_kind)


def _projected_cpu_seconds(depths: Sequence[int], measured: Sequence[dict]) -> float:
    """Runs at ``depths``, each at the mean ``cpu_seconds`` of the ``measured`` records at its depth, or at a depth
    without one its depth × their mean CPU time per block."""
    by_depth = {}
    for r in measured:
        by_depth.setdefault(r["depth"], []).append(r["cpu_seconds"])
    per_block = sum(r["cpu_seconds"] / r["depth"] for r in measured) / len(measured)
    return sum(sum(by_depth[d]) / len(by_depth[d]) if d in by_depth else d * per_block for d in depths)


def cost_by_machine_kind(records: Sequence[dict], cores: int = 2) -> str:
    """What all of ``records`` would cost on one machine kind (``MACHINE_KIND_KEYS``): for each kind whose runs
    cover every depth of ``records``, every run at that kind's mean CPU time at its depth, in CPU-hours and in hours
    of a ``cores``-core machine running one shard per core. The sum over the runs' own machines
    (``sweep.compute_note``) mixes CPU generations and mallocs; this says what the grid costs on each of them.
    "" when no kind ran every depth."""
    kinds = {}
    for r in records:
        if "cpu_seconds" in r:
            kinds.setdefault(tuple(r.get("machine", {}).get(k) for k in MACHINE_KIND_KEYS), []).append(r)
    depths = sorted({r["depth"] for r in records})
    parts = []
    for (cpu, generation, malloc), runs in sorted(kinds.items(), key=lambda kind: -len(kind[1])):
        if sorted({r["depth"] for r in runs}) != depths:
            continue
        hours = _projected_cpu_seconds([r["depth"] for r in records], runs) / 3600
        name = ", ".join(filter(None, (cpu or "unknown CPU", generation))) + f", malloc {malloc or 'not recorded'}"
        parts.append(f"{name} (from its {len(runs)} runs): {hours:.1f} CPU-hours, ≈ {hours / cores:.1f} hours of "
                     f"{cores} cores with one shard per core")
    if not parts:
        return ""
    return (f"All {len(records)} runs on one machine kind, each at that kind's mean CPU time at its depth: "
            + "; ".join(parts) + ".")


def stage_status(protocol: str, out: str, columns=COLUMNS, depths=None, seeds=None, steps=None) -> str:
    """``--status``: the rate sweep's ``rates_status``; for the budget and final stages the runs finished out of
    those the stage plans, and the first few still to train."""
    stage = os.path.join(out, protocol)
    records = load_records(stage) if os.path.isdir(os.path.join(stage, "runs")) else []
    if protocol == "rates":
        return rates_status(records, columns, depths or RATE_DEPTHS)
    if protocol == "budget":
        specs = budget_specs([c for c in BUDGET_COLUMNS if c in columns], depths or BUDGET_DEPTHS,
                             seeds or BUDGET_SEEDS)
    else:
        specs = final_specs(_load_rates(out), _steps_from_budget(out, steps), depths or DEPTHS, seeds or FINAL_SEEDS,
                            columns)
    missing = [s for s in specs if not os.path.exists(record_path(stage, s))]
    text = f"{protocol}: {len(specs) - len(missing)} of {len(specs)} runs finished"
    if missing:
        text += f"; next: {', '.join(s.run_id for s in missing[:3])}" + (" …" if len(missing) > 3 else "")
        machine = this_machine_kind()
        estimate = remaining_cpu_hours(missing, records, machine)
        if estimate is not None:
            (hours, based_on, same_kind), cores = estimate, len(os.sched_getaffinity(0))
            kind = ", ".join(str(machine[k]) for k in MACHINE_KIND_KEYS)
            which = (f"the {based_on} finished runs on this machine's kind ({kind})" if same_kind
                     else f"all {based_on} finished runs (none on this machine's kind: {kind})")
            text += (f"\nstill to train: ≈ {hours:.1f} CPU-hours by the CPU time per depth of {which} "
                     f"(≈ {hours / cores:.1f} hours with one shard per core on this machine's {cores} cores)")
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--protocol", choices=("budget", "rates", "final", "early"),
                        help="budget → rates → final: the study (selection on validation, test for final runs "
                             "only); early: the committed 200-step grid (rates chosen on test)")
    parser.add_argument("--out", default=None, help=f"default: {os.path.relpath(CONVERGED_OUT, ROOT)} "
                                                    "(early: experiments/results/depth_ablation)")
    parser.add_argument("--depths", type=int, nargs="+", default=None)
    parser.add_argument("--schemes", nargs="+", default=None, choices=sorted(SCHEMES_BY_NAME),
                        help="only these schemes' columns (with and without warm-up)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=None,
                        help="rates/final: steps per run (default: OUT/budget/budget.json); early: override "
                             f"SIZING.steps ({SIZING.steps})")
    parser.add_argument("--budget_steps", type=int, nargs="+", default=list(BUDGET_STEPS),
                        help="candidate step counts of the budget stage, one whole run each")
    parser.add_argument("--budget_eval_every", type=int, default=BUDGET_EVAL_EVERY)
    parser.add_argument("--budget_rate", type=float, default=BUDGET_RATE)
    parser.add_argument("--report", action="store_true", help="only rewrite the outputs from finished runs")
    parser.add_argument("--status", action="store_true",
                        help="print where the stage stands (runs finished and still to train; rates: each cell's "
                             "finished rates and what it needs) and stop; nothing is trained or written")
    parser.add_argument("--shard", default=None, metavar="I/N",
                        help="train only shard I of N of the stage (one machine of N); copy the shards' runs/ "
                             "folders together and rerun without --shard")
    early = parser.add_argument_group("--protocol early (the committed 200-step grid)")
    early.add_argument("--learning_rate", type=float, default=RECIPE["learning_rate"],
                       help="the rate shared by every scheme")
    early.add_argument("--per_scheme_lr", action="store_true",
                       help="each scheme at its rate from the early --lr_sweep (chosen on test accuracy)")
    early.add_argument("--dataset", default="digits", help="digits, or any prepared TFDS image dataset by name")
    early.add_argument("--data_dir", default=None)
    early.add_argument("--quick", action="store_true", help=f"tiny grid in minutes: depths {QUICK_DEPTHS}, "
                                                             f"{QUICK_SIZING.steps} steps, width "
                                                             f"{QUICK_SIZING.embed_dim}, seed 0")
    early.add_argument("--lr_sweep", action="store_true",
                       help=f"every scheme at depth {LR_SWEEP_DEPTH}, lr in {LR_SWEEP_RATES}, seed 0")
    parser.add_argument("--imagenet_commands", default=None, metavar="WORKDIR_ROOT",
                        help=f"print the ImageNet-scale ablation's commands (DeiT III-S at depths {IMAGENET_DEPTHS}, "
                             "every column, --seeds, one multi-host job each; --shard I/N: this share) and its "
                             "cost, then stop")
    parser.add_argument("--imagenet_step_json", default=None, metavar="PATH",
                        help="with --imagenet_commands: also the cost from a measured DeiT III-S/16 step (the JSON "
                             "of python -m layerscale_jax.bench train_step --json, e.g. benchmarks/gpu_check.sh's "
                             "s16_bf16.json)")
    parser.add_argument("--measure", type=int, nargs="*", default=None, metavar="DEPTH",
                        help="time one run per depth (default 6 24 96) of --steps steps (default 40) and print "
                             "the protocol's estimate for --steps final steps")
    args = parser.parse_args(argv)
    try:
        which_shard = sweep.parse_shard(args.shard) if args.shard else None
        for field in ("depths", "seeds"):
            values = getattr(args, field)
            if values is not None and any(v < 1 if field == "depths" else v < 0 for v in values):
                raise ValueError(f"--{field}={values}: depths must be ≥ 1 and seeds ≥ 0")
        for field in ("steps", "budget_eval_every"):
            value = getattr(args, field)
            if value is not None and value < 1:
                raise ValueError(f"--{field}={value} must be ≥ 1")
        bad = [t for t in args.budget_steps if t < 1 or t % args.budget_eval_every]
        if bad:
            raise ValueError(f"--budget_steps={bad}: each must be a positive multiple of --budget_eval_every="
                             f"{args.budget_eval_every}")
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if args.protocol is None and args.measure is None and not args.imagenet_commands:
        parser.error("one of --protocol, --measure or --imagenet_commands is required")
    command = "python experiments/depth_ablation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.measure is not None:
        return _measure_command(args)
    if args.imagenet_commands:
        columns = tuple(c for c in COLUMNS if args.schemes is None or c[0] in args.schemes)
        depths, seeds = tuple(args.depths or IMAGENET_DEPTHS), tuple(args.seeds or (0,))
        commands = imagenet_commands(args.imagenet_commands, depths, columns, seeds)
        print("\n".join(sweep.shard(commands, which_shard)))
        print(f"# {len(commands)} runs of {IMAGENET_EPOCHS} epochs: about "
              f"{imagenet_node_hours(depths, columns, seeds):,.0f} node-hours of 8 V100 (DeiT paper's training time "
              f"and throughputs, linear in depth)", file=sys.stderr)
        if args.imagenet_step_json:
            try:
                step = read_step_measurement(args.imagenet_step_json)
            except (ValueError, OSError) as err:
                raise SystemExit(f"error: {err}") from None
            print(f"# measured here ({args.imagenet_step_json}: {step.get('dtype')}, batch {step.get('batch')}, "
                  f"{step['img_per_s']:,.0f} images/s on one device): about "
                  f"{imagenet_device_hours(step, depths, columns, seeds):,.0f} device-hours (linear in depth; "
                  "model step only, per-device throughput assumed kept across devices)", file=sys.stderr)
        return
    if args.protocol == "early":
        if args.status:
            raise SystemExit("error: --status is for --protocol budget, rates or final (the early grid's records: "
                             "experiments/results/depth_ablation/runs/)")
        return _early(args, which_shard, command)
    columns = tuple(c for c in COLUMNS if args.schemes is None or c[0] in args.schemes)
    if args.status:
        try:
            print(stage_status(args.protocol, args.out or CONVERGED_OUT, columns,
                               tuple(args.depths) if args.depths else None,
                               tuple(args.seeds) if args.seeds is not None else None, args.steps))
        except (ValueError, FileNotFoundError) as err:
            raise SystemExit(f"error: {err}") from None
        return
    try:
        paths = run_protocol(args.protocol, args.out or CONVERGED_OUT, steps=args.steps, columns=columns,
                             depths=tuple(args.depths) if args.depths else None,
                             seeds=tuple(args.seeds) if args.seeds is not None else None, which_shard=which_shard,
                             report_only=args.report, command=command,
                             budget=(tuple(args.budget_steps), args.budget_eval_every, args.budget_rate))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    for what, path in paths.items():
        print(f"{what}: {path}")


def _measure_command(args) -> None:
    sweep.enable_compilation_cache()
    probe_steps = min(args.steps or 40, 40)
    costs = measure(args.measure or [6, 24, 96], PROTOCOL_SIZING, steps=probe_steps)
    final_steps = args.steps or 1000
    print("per step: " + ", ".join(f"depth {d} {1000 * c['per_step']:.0f} ms" for d, c in costs.items()))
    print(protocol_estimate(costs, final_steps))


def protocol_estimate(costs: dict[int, dict], steps: int, rates_per_cell: float = len(RATE_LADDER_START) + 1) -> str:
    """The protocol's time on one process from ``measure``'s costs: the budget runs (one per length in
    BUDGET_STEPS), a rate sweep of ``rates_per_cell`` runs per cell (the start ladder plus one extension on
    average), and both final protocols (assumed to share no run: an upper bound)."""
    budget = sum(sweep.estimate_seconds(costs, [s.depth for s in budget_specs() if s.steps == t], t,
                                        t // BUDGET_EVAL_EVERY) for t in BUDGET_STEPS)
    rate_depths = [d for d in RATE_DEPTHS for _ in COLUMNS] * int(math.ceil(rates_per_cell))
    rates = sweep.estimate_seconds(costs, rate_depths, steps, PROTOCOL_SIZING.evals)
    final_depths = [d for d in DEPTHS for _ in COLUMNS for _ in FINAL_SEEDS] * 2
    final = sweep.estimate_seconds(costs, final_depths, steps, PROTOCOL_SIZING.evals)
    f = sweep.format_seconds
    return (f"budget {f(budget)} ({len(budget_specs())} runs of {'/'.join(map(str, BUDGET_STEPS))} steps); rates "
            f"{f(rates)} ({len(rate_depths)} runs of {steps} steps); final {f(final)} (≤ {len(final_depths)} runs "
            f"of {steps} steps); total {f(budget + rates + final)}")


def _early(args, which_shard, command) -> None:
    """The committed early-training grid (``--protocol early``): the shared-rate grid, ``--lr_sweep`` (rates chosen
    on test accuracy of seed 0 at depth 24) and ``--per_scheme_lr``."""
    out = args.out or os.path.join(ROOT, "experiments", "results", "depth_ablation")
    sizing = QUICK_SIZING if args.quick else SIZING
    if args.steps is not None:
        sizing = dataclasses.replace(sizing, steps=args.steps)
    rates = args.learning_rate
    if args.per_scheme_lr:
        rates = early_rates_chosen_on_test(os.path.join(out, "lr_sweep"), tuple(args.schemes or DEFAULT_SCHEMES))
        print("learning rate per scheme (from the early lr sweep, chosen on test): " + json.dumps(rates))
    if not args.report:
        schemes = tuple(args.schemes or DEFAULT_SCHEMES)
        if args.lr_sweep:
            specs = lr_sweep_grid(schemes, (args.depths or [LR_SWEEP_DEPTH])[0], LR_SWEEP_RATES)
        else:
            depths = tuple(args.depths or (QUICK_DEPTHS if args.quick else DEPTHS))
            seeds = tuple(args.seeds if args.seeds is not None else ((0,) if args.quick else SEEDS))
            specs = grid(depths, schemes, seeds, rates, sorted(depths)[-2:])
        stage = os.path.join(out, "lr_sweep") if args.lr_sweep else out
        run_sweep(sweep.shard(specs, which_shard), sizing, stage, args.dataset, args.data_dir)
        if which_shard:
            print(f"shard {args.shard} finished; with every shard's {os.path.join(stage, 'runs')} copied together, "
                  "--report writes the outputs")
            return
    report_dir = os.path.join(out, "per_scheme_lr") if args.per_scheme_lr else None
    for what, path in write_reports(out, command, lr_sweep=args.lr_sweep, rates=rates,
                                    report_dir=report_dir).items():
        print(f"{what}: {path}")


if __name__ == "__main__":
    main()
