"""The depth ablation's protocol (a depth ablation a reviewer would accept): which runs each stage trains and what
it chooses from them.

Every choice is made on the validation split (285 stratified training images held out; the models train on the
other 1,157); only final runs see the test split, trained on all 1,442 training images.

1. budget: the two best schemes at depths 24 and 96, one whole run per step count in ``BUDGET_STEPS``; the step
   count is the shortest from which no longer run ends higher by one binomial standard error of the validation
   accuracy (``vp.converged_budget``), in every cell.
2. rates: every column at every depth over ``RATE_LADDER_START``, extended along the 1-2-5 ladder until the best
   rate is strictly inside the swept range (at most ``MAX_EXTENSIONS`` more rates per cell).
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
BUDGET_SEEDS = (0,)
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
        name = f"{column_label(s, w)}, depth {d}"
        tolerances[name] = (tolerance if tolerance is not None
                            else vp.binomial_standard_error(runs[max(runs)], validation_images))
        cells[name] = vp.converged_budget(runs, tolerances[name])
    late = [f"{cell} (±{tolerances[cell]:.2f})" for cell, steps in cells.items() if steps is None]
    if late:
        raise ValueError(f"no shorter budget run ends within the tolerance of the longest for {late}; add a longer "
                         "run (--budget_steps)")
    return {"steps": max(cells.values()), "cells": cells, "tolerance_points": tolerances,
            "validation_images": validation_images,
            "finals": {f"{column_label(s, w)}, depth {d}": runs for (s, w, d), runs in sorted(finals.items())}}


def cell_records(records, scheme, warmup, depth):
    return [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == (scheme, warmup, depth)]


def rate_specs(records: list[dict], steps: int, columns=COLUMNS, depths=RATE_DEPTHS, seed: int = 0,
               start=RATE_LADDER_START, max_extensions=MAX_EXTENSIONS) -> list[RunSpec]:
    """Every run of the rate sweep the finished ``records`` call for (``swept_rates`` per column × depth):
    deterministic in the records, so a resumed sweep or another shard with the same records plans the same runs."""
    specs = [RunSpec(d, s, w, seed, lr, "rates", steps) for d in depths for s, w in columns
             for lr in vp.swept_rates(cell_records(records, s, w, d), start, max_extensions)]
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
