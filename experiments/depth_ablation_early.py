"""The early-training grid (``--protocol early``), kept to reproduce its committed tables: 200 steps at ``SIZING``,
depth × scheme × seed with one shared rate (``--learning_rate``), a rate sweep at depth 24 (``--lr_sweep``) and
each scheme at the rate that sweep chose on *test* accuracy of seed 0 (``--per_scheme_lr``) — superseded by the
protocol, which chooses on validation (``depth_ablation_protocol``).
"""
from __future__ import annotations

import math
import os

import sweep
import validation_protocol as vp
from depth_ablation_reports import column_names, describe, layout, write_csv, write_figures
from depth_ablation_runs import REFERENCE, SCHEMES, RunSpec, Sizing, column_label, load_records

# Default: width 32 (2 heads), 200 steps of batch 64 (~9 epochs of the 1,442 digits training images), scanned
# layers (compile time flat in depth). Sized from measurements on the 2-core development CPU (experiments/
# README.md has them) to fit the default grid in about 3 h; re-time with `--measure` and change `steps` here.
SIZING = Sizing(embed_dim=32, num_heads=2, batch_size=64, steps=200, evals=4, log_every=10)
QUICK_SIZING = Sizing(embed_dim=16, num_heads=2, batch_size=32, steps=24, evals=2, log_every=4)
QUICK_DEPTHS = (2, 4)
SEEDS = (0, 1, 2)
WARMUP_OFF_SCHEMES = ("none", "layerscale")          # warm-up on vs off, at the two largest depths
LR_SWEEP_DEPTH = 24
LR_SWEEP_RATES = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2)


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


def _cell(records: list[dict]) -> str:
    """Final test accuracy (%) of a cell's seeds, mean ± std, diverged runs counted (and averaged in)."""
    return sweep.mean_std_cell([100 * r["final_test_accuracy"] for r in records], sum(r["diverged"] for r in records))


def write_table(records: list[dict], path: str, title: str) -> str:
    columns = column_names(records)
    depths = sorted({r["depth"] for r in records})
    table = sweep.markdown_table(["depth"] + [column_label(*c) for c in columns], (
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
    mixed = {column_label(*c): sorted(v) for c, v in mixed.items() if len(v) > 1}
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
