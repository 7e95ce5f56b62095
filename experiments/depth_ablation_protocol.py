"""The depth ablation's protocol (a depth ablation a reviewer would accept): which runs each stage trains and what
it chooses from them.

Every choice is made on the validation split (285 stratified training images held out; the models train on the
other 1,157); only final runs see the test split, trained on all 1,442 training images.

1. budget: the two best schemes at depths 24 and 96, one whole run per step count in ``BUDGET_STEPS`` and seed in
   ``BUDGET_SEEDS``; the step count is the shortest from which no longer run ends higher, in the mean over the
   seeds, by one binomial standard error of the validation accuracy (``vp.converged_budget``), in every cell.
2. rates: every column at every depth over ``RATE_LADDER_START``, extended along the 1-2-5 ladder until the best
   rate is strictly inside the swept range (at most ``MAX_EXTENSIONS`` more rates per cell); then each column's one
   rate for all depths, extended the same way at every depth until it is strictly inside (``one_rate_sweep``).
3. final: every column at every depth, ``FINAL_SEEDS`` seeds, (a) each at its best rate per depth and (b) each at
   its one best rate for all depths.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os

import sweep
import validation_protocol as vp
from depth_ablation_runs import (COLUMNS, DEPTHS, PROTOCOL_SIZING, ROOT, RunSpec, Sizing, column_label, load_records,
                                 make_config, record_path, run_sweep)

BUDGET_COLUMNS = (("layerscale", True), ("skipinit", True))
BUDGET_DEPTHS = (24, 96)
BUDGET_STEPS = (500, 1000, 2000, 3000)   # candidate budgets: one whole run (warm-up, cosine to 0) per candidate
BUDGET_EVAL_EVERY = 100
BUDGET_RATE = 1e-2
BUDGET_SEEDS = (0, 1, 2)   # seed 0 chose the budget first; seeds 1-2 pre-registered 2026-12-05 (experiments/README)
RATE_DEPTHS = DEPTHS
RATE_LADDER_START = (5e-3, 1e-2, 2e-2)    # the budget's rate and its ladder neighbours; bracketing extends
MAX_EXTENSIONS = 3
FINAL_SEEDS = (0, 1, 2, 3, 4)
CONVERGED_OUT = os.path.join(ROOT, "experiments", "results", "depth_ablation_converged")


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


def budget_by_seed(records: list[dict]) -> dict[tuple[str, bool, int], dict[int, dict[int, float]]]:
    """``{(scheme, warm-up, depth): {steps: {seed: final validation accuracy %}}}``."""
    cells: dict = {}
    for r in _budget_records(records):
        cells.setdefault((r["scheme"], r["warmup"], r["depth"]), {}).setdefault(r["steps"], {})[r["seed"]] = (
            100 * vp.accuracy(r))
    return {cell: {t: dict(sorted(by_seed.items())) for t, by_seed in sorted(runs.items())}
            for cell, runs in sorted(cells.items())}


def budget_finals(records: list[dict]) -> dict[tuple[str, bool, int], dict[int, float]]:
    """``{(scheme, warm-up, depth): {steps: final validation accuracy %}}``, the mean over each run length's seeds;
    a cell whose run lengths do not all have the same seeds is a ValueError naming it (a mean over other seeds
    is not comparable)."""
    finals = {}
    for (s, w, d), runs in budget_by_seed(records).items():
        seeds = {t: sorted(by_seed) for t, by_seed in runs.items()}
        if len({tuple(v) for v in seeds.values()}) > 1:
            raise ValueError(f"budget cell {column_label(s, w)}, depth {d} has different seeds per run length "
                             f"(steps: seeds {seeds}); train the missing runs (--protocol budget --seeds …)")
        finals[(s, w, d)] = {t: sum(by_seed.values()) / len(by_seed) for t, by_seed in runs.items()}
    return finals


def budget_curves(records: list[dict]) -> dict[tuple[str, bool, int, int], list[tuple[int, float]]]:
    """``{(scheme, warm-up, depth, steps): [(step, validation accuracy %)]}``: each run length's validation curve,
    the mean over its seeds."""
    return vp.mean_validation_curves(_budget_records(records),
                                     lambda r: (r["scheme"], r["warmup"], r["depth"], r["steps"]))


def choose_budget(records: list[dict], validation_images: int, tolerance: float | None = None) -> dict:
    """The step count of the rate and final runs: per cell, ``vp.converged_budget`` over its runs of each length
    (the mean over their seeds, ``budget_finals``) with a tolerance of one binomial standard error of the longest
    run's (mean) accuracy on ``validation_images`` images (``tolerance``: a fixed number of points instead); the
    budget is the largest cell's (every cell has converged by then). A cell that no shorter run comes close to is a
    ValueError naming it (add a longer --budget_steps)."""
    finals = budget_finals(records)
    if not finals:
        raise ValueError("--protocol budget: no finished budget runs")
    cells, tolerances = {}, {}
    for (s, w, d), runs in sorted(finals.items()):
        name = f"{column_label(s, w)}, depth {d}"
        tolerances[name] = (tolerance if tolerance is not None
                            else vp.binomial_standard_error(runs[max(runs)], validation_images))
        cells[name] = vp.converged_budget(runs, tolerances[name])
    late = [f"{cell} (±{tolerances[cell]:.2f})" for cell, steps in cells.items() if steps is None]
    if late:
        raise ValueError(f"no shorter budget run ends within the tolerance of the longest for {late}; add a longer "
                         "run (--budget_steps)")
    return {"steps": max(cells.values()), "cells": cells, "tolerance_points": tolerances,
            "validation_images": validation_images, "seeds": sorted({r["seed"] for r in records}),
            "finals": {f"{column_label(s, w)}, depth {d}": runs for (s, w, d), runs in sorted(finals.items())}}


def cell_records(records, scheme, warmup, depth):
    return [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == (scheme, warmup, depth)]


def rate_specs(records: list[dict], steps: int, columns=COLUMNS, depths=RATE_DEPTHS, seed: int = 0,
               start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS, images: int | None = None) -> list[RunSpec]:
    """Every run of the rate sweep the finished ``records`` call for: each cell's own sweep (``swept_rates`` per
    column × depth), then each column's one-rate bracketing (``one_rate_sweep``; ``images``: the validation split's
    size, default ``validation_images()``). Deterministic in the records, so a resumed sweep or another shard with
    the same records plans the same runs."""
    images = validation_images() if images is None else images
    specs = {RunSpec(d, s, w, seed, lr, "rates", steps) for d in depths for s, w in columns
             for lr in vp.swept_rates(cell_records(records, s, w, d), start, max_extensions)}
    for s, w in columns:
        specs |= {RunSpec(d, s, w, seed, lr, "rates", steps) for d in depths
                  for lr in one_rate_sweep(records, s, w, depths, images, start, max_extensions)[0]}
    return sorted(specs, key=lambda r: (r.depth, r.learning_rate, r.scheme, not r.warmup))


def _run_at(runs: list[dict], rate: float) -> dict | None:
    return next((r for r in runs if math.isclose(r["learning_rate"], rate)), None)


def one_rate_sweep(records: list[dict], scheme: str, warmup: bool, depths, images: int,
                   start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS) -> tuple[list[float], float | None]:
    """The rates a column's one rate for all depths is chosen from, and the choice: ``(rates, choice)``.

    The rates start as those every depth's own sweep has (``vp.swept_rates``). The choice is the rate with the
    most validation images right summed over the depths (``vp.correct_images`` of ``images``; a diverged run
    counts 0; ties: the lower rate). While it is the lowest (highest) of the rates, the next rate down (up) the
    1-2-5 ladder joins them — to be trained at every depth that lacks it —, at most ``max_extensions`` times: the
    one rate is bracketed at every depth, or left at an edge after the last extension. ``choice`` is None while a
    run is missing (and the rates are ``[]`` while a depth's own sweep is unfinished)."""
    by_depth = {}
    for depth in depths:
        mine = cell_records(records, scheme, warmup, depth)
        wanted = vp.swept_rates(mine, start, max_extensions)
        if any(_run_at(mine, lr) is None for lr in wanted):
            return [], None
        by_depth[depth] = (mine, wanted)
    first = by_depth[depths[0]][1]
    rates = [lr for lr in first if all(any(math.isclose(lr, x) for x in wanted) for _, wanted in by_depth.values())]
    for extension in range(max_extensions + 1):
        runs = {lr: [_run_at(mine, lr) for mine, _ in by_depth.values()] for lr in rates}
        if any(r is None for at in runs.values() for r in at):
            return rates, None
        right = {lr: sum(0 if r["diverged"] else vp.correct_images(r, images) for r in at)
                 for lr, at in runs.items()}
        choice = max(rates, key=lambda lr: (right[lr], -lr))
        if extension == max_extensions or rates[0] < choice < rates[-1]:
            return rates, choice
        rates = [vp.ladder(rates[0], -1)] + rates if choice == rates[0] else rates + [vp.ladder(rates[-1], +1)]


def one_rate_missing(records: list[dict], scheme: str, warmup: bool, depths, rates) -> dict[str, list[int]]:
    """For each of a column's one-rate ``rates`` (``one_rate_sweep``), the depths with no run at it yet:
    ``{"2e-2": [24, 48], ...}``, every rate listed (an empty list: trained at every depth)."""
    return {f"{lr:g}": [d for d in depths if _run_at(cell_records(records, scheme, warmup, d), lr) is None]
            for lr in rates}


def run_rate_sweep(out: str, steps: int, columns=COLUMNS, depths=RATE_DEPTHS, which_shard=None,
                   sizing: Sizing = PROTOCOL_SIZING, start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS,
                   log=print, **run_kwargs) -> list[dict]:
    """Train the rate sweep round by round (``rate_specs``) until no cell needs another rate. With a shard, a
    round ends when this shard's share is done; the shards' records merged, the next command plans the next
    round."""
    sizing, images = dataclasses.replace(sizing, steps=steps), validation_images()
    while True:
        specs = rate_specs(load_records(out), steps, columns, depths, start=start, max_extensions=max_extensions,
                           images=images)
        mine = sweep.shard(specs, which_shard)
        if all(os.path.exists(record_path(out, s)) for s in mine):
            return load_records(out)
        run_sweep(mine, sizing, out, log=log, **run_kwargs)


def best_learning_rates(records: list[dict], images: int, columns=COLUMNS, depths=RATE_DEPTHS,
                        start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS) -> dict:
    """The rates the final runs use, from a finished rate sweep (validation only, ``images`` validation images):
    ``per_depth[(scheme, warm-up, depth)]``: each cell's ``best_rate``; ``one_rate[(scheme, warm-up)]``: the rate
    swept at every depth with the most validation images right summed over the depths (integer counts,
    ``vp.correct_images``), a diverged run counting 0 (ties: the lower rate), bracketed by ``one_rate_sweep``;
    ``one_rate_swept[(scheme, warm-up)]``: the rates it was chosen from; ``bracketed[...]``: whether the cell's
    best rate is strictly inside its swept range; ``tie_at_edge[...]``: whether an edge rate of the cell's sweep got
    as many images right as the best (inside only by the tie rule); ``one_rate_bracketed[(scheme, warm-up)]``:
    whether the one rate is strictly inside the rates swept at every depth. A cell or one-rate sweep that is
    unfinished, or a cell whose runs all diverged, is a ValueError naming it."""
    vp.require_validation(records, "best_learning_rates")
    per_depth, bracketed, one_rate, tie_at_edge, one_rate_bracketed, one_rate_swept = {}, {}, {}, {}, {}, {}
    for scheme, warmup in columns:
        for depth in depths:
            mine = cell_records(records, scheme, warmup, depth)
            wanted = vp.swept_rates(mine, start, max_extensions)
            have = [r for r in mine if any(math.isclose(r["learning_rate"], x) for x in wanted)]
            if len(have) < len(wanted):
                raise ValueError(f"rate sweep of {column_label(scheme, warmup)} at depth {depth} is unfinished "
                                 f"({len(have)}/{len(wanted)} runs); run --protocol rates again")
            best = vp.best_rate(have)
            if best is None:
                raise ValueError(f"every rate of {column_label(scheme, warmup)} at depth {depth} diverged: {wanted}")
            per_depth[(scheme, warmup, depth)] = best
            bracketed[(scheme, warmup, depth)] = wanted[0] < best < wanted[-1]
            counts = {r["learning_rate"]: (0 if r["diverged"] else vp.correct_images(r, images)) for r in have}
            edges = [lr for lr in counts if math.isclose(lr, wanted[0]) or math.isclose(lr, wanted[-1])]
            tie_at_edge[(scheme, warmup, depth)] = bracketed[(scheme, warmup, depth)] and any(
                counts[lr] == counts[best] for lr in edges)
        swept, choice = one_rate_sweep(records, scheme, warmup, depths, images, start, max_extensions)
        if choice is None:
            missing = one_rate_missing(records, scheme, warmup, depths, swept)
            raise ValueError(f"the one-rate sweep of {column_label(scheme, warmup)} is unfinished (needs "
                             + ", ".join(f"{lr} at depths {ds}" for lr, ds in missing.items() if ds)
                             + "); run --protocol rates again")
        one_rate[(scheme, warmup)] = choice
        one_rate_swept[(scheme, warmup)] = swept
        one_rate_bracketed[(scheme, warmup)] = swept[0] < choice < swept[-1]
    return {"per_depth": per_depth, "one_rate": one_rate, "bracketed": bracketed, "tie_at_edge": tie_at_edge,
            "one_rate_bracketed": one_rate_bracketed, "one_rate_swept": one_rate_swept}


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


def validation_images() -> int:
    """The size of the digits validation split the selection runs evaluate."""
    from layerscale_jax.data import get_dataset_info
    return get_dataset_info(make_config(budget_specs()[0], PROTOCOL_SIZING).data).num_test


def steps_from_budget(out: str, steps: int | None) -> int:
    """``--steps``, else the step count ``--protocol budget`` chose (``OUT/budget/budget.json``)."""
    if steps is not None:
        return steps
    path = os.path.join(out, "budget", "budget.json")
    if not os.path.exists(path):
        raise ValueError(f"--steps not given and no {path}: run --protocol budget first (or pass --steps)")
    with open(path) as f:
        return int(json.load(f)["steps"])


def load_rates(out: str) -> dict:
    path = os.path.join(out, "rates", "rates.json")
    if not os.path.exists(path):
        raise ValueError(f"no {path}: run --protocol rates first")
    with open(path) as f:
        return rates_from_json(json.load(f))
