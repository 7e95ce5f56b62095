"""The depth ablation's reports from finished runs: the budget, the rate sweep (and where it stands), and the final
runs' tables, comparisons, CaiT's claims, test NLL, CSV and figures.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence

import cait_claims  # CaiT's claims as tests fixed before the final runs, and their verdicts
import depth_ablation_machines as machines  # which machine kinds trained which cells (post hoc)
import depth_ablation_plots as plots  # the study's figures and its palette
import sweep
import validation_protocol as vp
from depth_ablation_cost import cost_by_machine_kind
from depth_ablation_protocol import (FINAL_SEEDS, MAX_EXTENSIONS, RATE_DEPTHS, RATE_LADDER_START, best_learning_rates,
                                     budget_by_seed, budget_curves, budget_finals, cell_records, choose_budget,
                                     final_records, one_rate_missing, one_rate_sweep, rates_to_json, validation_images)
from depth_ablation_runs import (COLUMNS, DEPTHS, PROTOCOL_SIZING, RECIPE, REFERENCE, SCHEMES, RunSpec, column_label,
                                 load_records, make_config)

CSV_FIELDS = ("depth", "scheme", "branch_scaling", "epsilon", "warmup", "learning_rate", "seed",
              "final_test_accuracy", "best_test_accuracy", "final_train_loss", "diverged", "diverged_at_step",
              "steps", "seconds")


def write_csv(records: list[dict], path: str) -> None:
    sweep.write_csv(sorted(records, key=lambda r: (r["depth"], r["scheme"], not r["warmup"], r["learning_rate"],
                                                   r["seed"])), path, CSV_FIELDS)


def column_names(records: list[dict]) -> list[tuple[str, bool]]:
    """(scheme, warmup) columns in the order of ``SCHEMES``, warm-up-off columns after their scheme."""
    present = {(r["scheme"], r["warmup"]) for r in records}
    order = [s.name for s in SCHEMES]
    return sorted(present, key=lambda c: (order.index(c[0]) if c[0] in order else len(order), not c[1]))


def layout(records: list[dict]) -> vp.Layout:
    """The study's reports: depth × (scheme, warm-up) column (``column_names``), the final accuracy in %."""
    return vp.Layout("depth", lambda r: r["depth"], lambda r: (r["scheme"], r["warmup"]), column_names(records),
                     lambda c: column_label(*c), lambda r: 100 * vp.accuracy(r))


def describe(records: list[dict], protocol: str, rates: str) -> str:
    """A figure's or table's title: protocol, rate(s), steps and the splits (``train → evaluated``)."""
    steps = sorted({r["steps"] for r in records if not r["diverged"]} or {r["steps"] for r in records})
    r0 = records[0]
    splits = f"{r0.get('train_split', 'train')} → {r0.get('eval_split', 'test')}"
    return (f"{protocol}: {r0['dataset']} {splits}, {'/'.join(str(s) for s in steps)} steps, {rates}, "
            f"width {r0['embed_dim']}")


def write_figures(records: list[dict], report_dir: str, title: str, not_converged=frozenset()) -> dict[str, str]:
    """The accuracy-vs-depth figure (the ``not_converged`` cells and LayerScale's machine-confounded ones,
    ``depth_ablation_machines.confounded_cells``, marked) and, at the largest depth, loss curves
    (with the label-smoothing floor), scale heat map and branch ratios."""
    prefix = "test" if records[0].get("eval_split", "test") == "test" else "validation"
    paths = {"acc_vs_depth": os.path.join(report_dir, "acc_vs_depth.png")}
    plots.plot_accuracy_vs_depth(records, column_names(records), lambda r: 100 * vp.accuracy(r),
                                 paths["acc_vs_depth"], title=title,
                                 ylabel=f"final {prefix} accuracy (%): seeds, mean, 95% CI",
                                 not_converged=not_converged,
                                 confounded={(d, (s, w)) for s, w, d in machines.confounded_cells(records, REFERENCE)})
    deepest = max(r["depth"] for r in records)
    first = _first_seed(records, deepest)
    paths["loss_curves"] = os.path.join(report_dir, f"loss_curves_depth{deepest}.png")
    plots.plot_loss_curves(records, deepest, paths["loss_curves"], title=f"train loss, depth {deepest}; {title}",
                           floor=final_floor_and_images()[0])
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
    return [chosen[c] for c in column_names(records) if c in chosen]


def write_budget_report(out: str, tolerance: float | None = None) -> dict[str, str]:
    """``budget.json`` (the chosen step count, each cell's converged length, final accuracies and tolerance),
    ``budget.md`` and ``budget.png`` from the budget runs in ``out``."""
    records = load_records(out)
    choice = choose_budget(records, validation_images(), tolerance)
    sweep.save_json(os.path.join(out, "budget.json"), choice)
    lengths = sorted({t for runs in choice["finals"].values() for t in runs})
    by_seed = {f"{column_label(s, w)}, depth {d}": runs for (s, w, d), runs in budget_by_seed(records).items()}

    def value(cell, t):
        if t not in choice["finals"][cell]:
            return "—"
        seeds = by_seed[cell][t]
        each = f" ({', '.join(f'{a:.1f}' for a in seeds.values())})" if len(seeds) > 1 else ""
        return f"{choice['finals'][cell][t]:.1f}{each}"
    rows = [[cell] + [value(cell, t) for t in lengths] + [f"{choice['tolerance_points'][cell]:.2f}",
                                                          choice["cells"][cell]] for cell in choice["finals"]]
    seeds = ", ".join(map(str, choice["seeds"])) + ("; in brackets each seed's, in that order"
                                                    if len(choice["seeds"]) > 1 else "")
    rate = ", ".join(sorted({f"{r['learning_rate']:g}" for r in records}))
    rule = ("one binomial standard error of the longest run's (mean) accuracy on the "
            f"{choice['validation_images']} validation images" if tolerance is None else f"{tolerance} points")
    with open(os.path.join(out, "budget.md"), "w") as f:
        f.write(f"Budget ({describe(records, 'budget', f'rate {rate}')}): one whole run per step count (its own "
                f"warm-up and cosine decay to zero), final validation accuracy (%, mean over seeds {seeds}). "
                "A cell has converged at the shortest step count from which no run shorter than the longest ends "
                f"a tolerance or more below the longest; tolerance: {rule}.\n\n"
                + sweep.markdown_table(["cell"] + [f"{t} steps" for t in lengths] + ["tolerance", "converged at"],
                                       rows)
                + f"\nChosen budget: **{choice['steps']} steps** (the largest).\n")
    rate_title = describe(records, "budget", f"rate {rate}")
    plots.plot_budget(budget_finals(records), budget_curves(records), choice["steps"],
                      os.path.join(out, "budget.png"), title=f"{rate_title}; chosen {choice['steps']} steps",
                      by_seed=budget_by_seed(records))
    return {"budget": os.path.join(out, "budget.json"), "budget_md": os.path.join(out, "budget.md"),
            "budget_figure": os.path.join(out, "budget.png")}


def rates_status(records: list[dict], columns=COLUMNS, depths=RATE_DEPTHS, start=RATE_LADDER_START,
                 max_extensions=MAX_EXTENSIONS, images: int | None = None) -> str:
    """Where the rate sweep stands, per column × depth: every finished rate with its validation accuracy (or
    "div."), and what the cell still needs (``swept_rates``) or how it ended: bracketed, at the edge after the
    last allowed extension, or every run diverged; then each column's one-rate bracketing (``one_rate_sweep``;
    ``images``: the validation split's size, default ``validation_images()``). Nothing is trained."""
    images = validation_images() if images is None else images
    rows, open_cells = [], 0
    for depth in depths:
        for scheme, warmup in columns:
            mine = cell_records(records, scheme, warmup, depth)
            wanted = vp.swept_rates(mine, start, max_extensions)
            runs = sorted(mine, key=lambda r: r["learning_rate"])
            missing = [lr for lr in wanted if not any(math.isclose(lr, r["learning_rate"]) for r in mine)]
            best = vp.best_rate(mine) if mine and not missing else None
            state = (f"needs {', '.join(f'{lr:g}' for lr in missing)}" if missing else
                     "every rate diverged" if best is None else
                     f"bracketed: {best:g}" if wanted[0] < best < wanted[-1] else
                     f"**edge: {best:g}** (after {len(wanted) - len(start)} extensions)")
            open_cells += bool(missing)
            rows.append([column_label(scheme, warmup), depth, ", ".join(
                f"{r['learning_rate']:g}: {'div.' if r['diverged'] else f'{100 * vp.accuracy(r):.1f}'}"
                for r in runs) or "–", state])
    one = []
    for scheme, warmup in columns:
        swept, choice = one_rate_sweep(records, scheme, warmup, depths, images, start, max_extensions)
        need = one_rate_missing(records, scheme, warmup, depths, swept)
        one.append([column_label(scheme, warmup),
                    "waits for its cells' sweeps" if not swept else
                    "needs " + ", ".join(f"{lr} at depths {', '.join(map(str, ds))}" for lr, ds in need.items() if ds)
                    if choice is None else
                    f"bracketed: {choice:g}" if swept[0] < choice < swept[-1] else f"**edge: {choice:g}**"])
    return (f"Rate sweep: {len(records)} runs finished, {open_cells} of {len(rows)} cells still need runs.\n\n"
            + sweep.markdown_table(["column", "depth", "finished rates: validation accuracy (%)", "state"], rows)
            + "\nOne rate for all depths (`one_rate_sweep`):\n\n"
            + sweep.markdown_table(["column", "state"], one))


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
        mine = cell_records(records, scheme, warmup, depth)
        swept = sorted(r["learning_rate"] for r in mine)
        at_best = [r for r in mine if math.isclose(r["learning_rate"], lr)][0]
        best = 100 * vp.accuracy(at_best)
        runner_up = max((100 * vp.accuracy(r) for r in mine if r is not at_best and not r["diverged"]), default=None)
        resolution = vp.binomial_standard_error(best, validation_images)
        within_se = runner_up is not None and best - runner_up < resolution
        unresolved += within_se
        lead = "–" if runner_up is None else f"{best - runner_up:.1f}" + (" (< SE)" if within_se else "")
        rows.append([column_label(scheme, warmup), depth, f"{swept[0]:g} … {swept[-1]:g} ({len(swept)})", f"{lr:g}",
                     ("yes, by the tie rule" if rates["tie_at_edge"][(scheme, warmup, depth)] else "yes")
                     if rates["bracketed"][(scheme, warmup, depth)] else "**no (edge)**",
                     f"{best:.1f}", lead, sum(r["diverged"] for r in mine)])
    def images_right(column, lr):
        runs = [r for d in depths for r in cell_records(records, *column, d) if math.isclose(r["learning_rate"], lr)]
        return sum(0 if r["diverged"] else vp.correct_images(r, validation_images) for r in runs)
    one = [[column_label(*c), f"{lr:g}", ", ".join(f"{x:g}: {images_right(c, x)}" for x in rates["one_rate_swept"][c]),
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
                + f"\nOne rate for all depths (the most of the {len(depths)} × {validation_images} validation "
                  "images right summed over the depths, a diverged run counting 0; ties: the lower rate), chosen "
                  "from the rates swept at every depth; while it was the lowest (highest) of them, the next rate "
                  "down (up) the ladder was trained at every depth (`one_rate_sweep`), until it is strictly inside "
                  "— or at an edge after the last extension allowed, where a rate beyond might be better:\n\n"
                + sweep.markdown_table(["column", "rate", "swept at every depth: images right", "bracketed"], one)
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
TWIN = ("layerscale_eps0.1", True)   # REFERENCE's column with ε = 0.1: one model with it where CaiT's rule gives 0.1
FINAL_PROTOCOLS = {"per_depth": "each column at its best validation rate per depth",
                   "one_rate": "each column at its one best validation rate for all depths"}


def write_final_report(out: str, rates: dict, depths: Sequence[int], command: str | None = None,
                       planned: int | None = None) -> dict[str, str]:
    """For each final protocol (``FINAL_PROTOCOLS``), in ``out/<protocol>/``: ``table.md`` (mean and 95% CI over
    converged runs, divergence counted apart), ``comparisons.md`` (LayerScale vs each column per depth, Welch),
    ``claims.md`` and ``claims.png`` (CaiT's claims on the grid's ``depths``, judged by the rules of ``cait_claims``),
    ``results.csv`` and the figures. With fewer finished runs than the ``planned`` runs of a rate choice, every
    output of that choice says so in its title ("INCOMPLETE: k of n runs finished"), so an interim report cannot
    pass for the study's. Where LayerScale ran only on machine kinds no other column used, every output of that
    choice says so under its title (``depth_ablation_machines.confound_note``) and claims.md marks the comparisons
    it touches."""
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
        confound = machines.confound_note(records, REFERENCE, TWIN, layout(records).value)
        head = (title + (f"\n\nCommand: `{command}`" if command else "") + f"\n\n{sweep.machines_note(records)} "
                f"The final stage, both rate choices' runs together: {sweep.compute_note(every)} "
                f"{cost_by_machine_kind(every)}".rstrip() + (f"\n\n{confound}" if confound else ""))
        paths[f"{which}/convergence"] = os.path.join(report_dir, "convergence.md")
        not_converged = vp.write_convergence(records, paths[f"{which}/convergence"], "Convergence, " + head,
                                             layout(records), *final_floor_and_images())
        paths[f"{which}/table"] = os.path.join(report_dir, "table.md")
        confounded = {(depth, (scheme, warmup)) for scheme, warmup, depth in
                      machines.confounded_cells(records, REFERENCE)}
        vp.write_ci_table(records, paths[f"{which}/table"], "Final test accuracy (%), " + head, layout(records),
                          not_converged, confounded)
        paths[f"{which}/comparisons"] = os.path.join(report_dir, "comparisons.md")
        vp.write_comparisons(records, paths[f"{which}/comparisons"], "LayerScale against each column, " + head,
                             layout(records), REFERENCE)
        paths[f"{which}/nll"] = os.path.join(report_dir, "nll.md")
        write_nll(records, paths[f"{which}/nll"], "Test NLL, " + head, layout(records), depths)
        paths[f"{which}/claims"] = os.path.join(report_dir, "claims.md")
        claims = cait_claims.write_claims(records, paths[f"{which}/claims"], "CaiT's claims, " + head,
                                          layout(records).value, depths, runs_per_cell=len(FINAL_SEEDS),
                                          marked=machines.confounded_cells(records, REFERENCE))
        paths[f"{which}/claims_figure"] = os.path.join(report_dir, "claims.png")
        figure_title = f"{title}. {sweep.machines_note(records)}"      # a figure names its CPUs and load, too
        marks = {vp.NOT_CONVERGED: ({(*column, depth) for depth, column in not_converged},
                                    "a cell fails the convergence check (rule written after the results)"),
                 "‡": (machines.confounded_cells(records, REFERENCE),
                       "LayerScale's cell ran only on machine kinds no other column used (claims.md)")}
        plots.plot_claims(claims, paths[f"{which}/claims_figure"], title=f"CaiT's claims: {figure_title}",
                          marks=marks)
        paths[f"{which}/csv"] = os.path.join(report_dir, "results.csv")
        write_csv(records, paths[f"{which}/csv"])
        paths.update({f"{which}/{k}": v
                      for k, v in write_figures(records, report_dir, figure_title, not_converged).items()})
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
