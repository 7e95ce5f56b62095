"""The depth ablation's figures, and the one palette every figure of the study uses (the notebook imports it too).

A scheme has one colour everywhere (``SCHEME_COLOURS``); its warm-up-off variant (CaiT's variant b for ReZero and
SkipInit) keeps the colour with a dashed line and open markers. Accuracy figures show every seed as a point, the
mean over converged seeds as a line and its t-based 95% confidence interval as a bar; a diverged run is an ``x`` on
the bottom edge, never part of the mean. Depth axes have ticks at the measured depths. Heat maps are drawn with
nearest interpolation (one cell per evaluation, nothing in between) and one colour scale per figure. Titles are
given by the caller and name the protocol, rate(s), steps and data split (``depth_ablation_reports.describe``).
"""
from __future__ import annotations

import math
import textwrap

import sweep

SCHEME_COLOURS = {
    "none": "#7f7f7f",                 # grey: no scaling
    "layerscale": "#1f77b4",           # blue
    "layerscale_eps0.1": "#17becf",    # cyan: LayerScale with ε = 0.1 at every depth
    "scalar": "#ff7f0e",               # orange
    "rezero": "#2ca02c",               # green
    "skipinit": "#d62728",             # red
    "scalar_zero": "#9467bd",          # purple
}
OTHER_COLOUR = "#000000"


def colour(scheme: str) -> str:
    """The scheme's colour in every figure of the study (black for a scheme the palette does not know)."""
    return SCHEME_COLOURS.get(scheme, OTHER_COLOUR)


def label(scheme: str, warmup: bool) -> str:
    return scheme if warmup else f"{scheme} (no warm-up)"


def style(warmup: bool) -> dict:
    """Line and marker style of a column: solid and filled with warm-up, dashed and open without."""
    return {"linestyle": "-" if warmup else "--", "markerfacecolor": None if warmup else "none"}


def wrap(title: str, width: int = 95) -> str:
    """A long title over several lines."""
    return textwrap.fill(title, width)


def _finish(fig, ax, path, legend=True):
    if legend:
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    sweep.pyplot().close(fig)


NOT_CONVERGED_MARK = "†"
CONFOUNDED_MARK = "‡"


def cell_marks(not_converged=frozenset(), confounded=frozenset()) -> dict:
    """``{(depth, (scheme, warm-up)): "†", "‡" or "†‡"}``: each marked cell's marks."""
    marks = {}
    for cells, mark in ((not_converged, NOT_CONVERGED_MARK), (confounded, CONFOUNDED_MARK)):
        for cell in cells:
            marks[cell] = marks.get(cell, "") + mark
    return marks


def plot_accuracy_vs_depth(records: list[dict], columns, accuracy, path: str, *, title: str, ylabel: str,
                           not_converged=frozenset(), confounded=frozenset()) -> None:
    """``accuracy(record)`` (%) against depth, one colour per scheme: each seed a small point (slightly spread
    sideways), the mean over converged seeds joined by a line with its 95% t-interval, diverged runs an ``x`` at
    the bottom, on 0–100%. When every converged run lies above 50%, a second panel shows them again with the
    accuracy axis spanning only them, so differences of a point between trained columns can be seen. ``columns``
    are the (scheme, warm-up) pairs in legend order. A cell ``(depth, (scheme, warm-up))`` in ``not_converged``
    (it fails the convergence check) is marked † beside its mean, one in ``confounded`` (it ran only on machine
    kinds no other column used) ‡; an interval the axis cuts off is marked with a triangle at the edge it crosses
    (``clipped_intervals``), each explained in the legend."""
    plt = sweep.pyplot()
    zoom_from, zoom_to = zoom_limits(records, accuracy)
    if zoom_from >= 50:
        fig, (full, zoom) = plt.subplots(1, 2, figsize=(11, 4.4))
    else:
        (fig, full), zoom = plt.subplots(figsize=(7, 4.2)), None
    depths = sorted({r["depth"] for r in records})
    any_diverged = any(r["diverged"] for r in records)
    for ax in (full, zoom) if zoom else (full,):
        _draw_runs_and_means(ax, records, columns, accuracy, depths, mark_diverged=ax is full,
                             marks=cell_marks(not_converged, confounded))
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.minorticks_off()
        ax.set_xlabel("depth (blocks)")
    full.set_ylim(0, 100)
    full.set_ylabel(ylabel)
    if zoom:
        full.set_title("every run (diverged at 0)", fontsize=8)
        zoom.set_ylim(zoom_from, zoom_to)
        if zoom_to > 100:
            zoom.axhline(100, color="black", linewidth=0.6, linestyle=":")
            zoom.text(0.01, 100, " 100% (an interval above it: one seed far below the others)", fontsize=6,
                      va="bottom", transform=zoom.get_yaxis_transform())
        zoom.set_title("converged runs, accuracy axis zoomed to them (same data)", fontsize=8)
        fig.suptitle(wrap(title, 150), fontsize=7)
    else:
        full.set_title(wrap(title), fontsize=7)
    if any_diverged:
        full.scatter([], [], marker="x", color="black", label="diverged run (at 0)")
    clipped = [_mark_clipped(ax, records, columns, accuracy, depths) for ax in ((full, zoom) if zoom else (full,))]
    if any(clipped):
        full.scatter([], [], marker="^", color="black", s=14,
                     label="95% interval clipped by the axis (▲ beyond the top, ▼ below the bottom)")
    if not_converged:
        full.plot([], [], " ", label=f"{NOT_CONVERGED_MARK} cell fails the convergence check "
                                     f"(rule written after the results)")
    if confounded:
        full.plot([], [], " ", label=f"{CONFOUNDED_MARK} cell ran only on machine kinds no other column used")
    _finish(fig, full, path)


def _cells(records, columns, accuracy, depths):
    """``((scheme, warm-up), depth, x, converged accuracies)`` of every cell with a converged run, at the x offset
    ``_draw_runs_and_means`` draws it."""
    offsets = {c: (i - (len(columns) - 1) / 2) * 0.025 for i, c in enumerate(columns)}
    for column in columns:
        for depth in depths:
            values = [accuracy(r) for r in records
                      if (r["scheme"], r["warmup"], r["depth"]) == (*column, depth) and not r["diverged"]]
            if values:
                yield column, depth, depth * 2 ** offsets[column], values


def clipped_intervals(records, columns, accuracy, low: float, high: float) -> list[tuple]:
    """The cells ``((scheme, warm-up), depth, "low" | "high")`` whose 95% t-interval (``sweep.summarise``) reaches
    below ``low`` or beyond ``high``, the limits of an accuracy axis."""
    depths = sorted({r["depth"] for r in records})
    found = []
    for column, depth, _, values in _cells(records, columns, accuracy, depths):
        if len(values) > 1:
            s = sweep.summarise(values)
            found += [(column, depth, side) for side, out in (("low", s.ci_low < low), ("high", s.ci_high > high))
                      if out]
    return found


def _mark_clipped(ax, records, columns, accuracy, depths) -> bool:
    """A triangle at the axis edge where a cell's interval is cut off (``clipped_intervals`` on ``ax``'s limits);
    whether there was one."""
    low, high = sorted(ax.get_ylim())
    clipped = clipped_intervals(records, columns, accuracy, low, high)
    x_of = {(column, depth): x for column, depth, x, _ in _cells(records, columns, accuracy, depths)}
    for column, depth, side in clipped:
        ax.scatter([x_of[(column, depth)]], [high if side == "high" else low], marker="^" if side == "high" else "v",
                   s=30, color=colour(column[0]), clip_on=False, zorder=6)
    return bool(clipped)


def zoom_limits(records: list[dict], accuracy) -> tuple[float, float]:
    """The zoomed panel's accuracy axis: from a point below the lowest converged run to 100%, or above 100% when a
    cell's 95% interval reaches beyond it (one seed far below the others), so no interval is clipped."""
    cells = {}
    for r in records:
        if not r["diverged"]:
            cells.setdefault((r["scheme"], r["warmup"], r["depth"]), []).append(accuracy(r))
    low = max(math.floor(min((v for c in cells.values() for v in c), default=0)) - 1, 0)
    highest = max([100.0] + [sweep.summarise(c).ci_high for c in cells.values() if len(c) > 1])
    return low, (100.0 if highest <= 100 else math.ceil(highest * 2) / 2 + 0.5)


def _draw_runs_and_means(ax, records, columns, accuracy, depths, mark_diverged: bool, marks=None) -> None:
    """``plot_accuracy_vs_depth``'s marks on one panel: per column each seed a point, the converged seeds' mean with
    its 95% t-interval (labelled for the legend on the panel that marks diverged runs), diverged runs an ``x`` at 0
    when ``mark_diverged``, each ``(depth, column)``'s marks (``cell_marks``) left of its mean."""
    offsets = {c: (i - (len(columns) - 1) / 2) * 0.025 for i, c in enumerate(columns)}
    for column in columns:
        scheme, warmup = column
        shift = 2 ** offsets[column]
        xs, means, lows, highs = [], [], [], []
        for depth in depths:
            mine = [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == (scheme, warmup, depth)]
            converged = [accuracy(r) for r in mine if not r["diverged"]]
            diverged = sum(r["diverged"] for r in mine)
            ax.scatter([depth * shift] * len(converged), converged, s=9, color=colour(scheme), alpha=0.45,
                       edgecolors="none" if warmup else colour(scheme),
                       facecolors=colour(scheme) if warmup else "none")
            if diverged and mark_diverged:
                ax.scatter([depth * shift] * diverged, [0.0] * diverged, marker="x", s=30, color=colour(scheme),
                           clip_on=False, zorder=5)
            if converged:
                s = sweep.summarise(converged)
                if (depth, column) in (marks or {}):
                    ax.annotate(marks[(depth, column)], (depth * shift, s.mean), xytext=(-16, -4),
                                textcoords="offset points", fontsize=14, fontweight="bold", color="black",
                                zorder=7)
                xs.append(depth * shift)
                means.append(s.mean)
                lows.append(s.mean - s.ci_low)
                highs.append(s.ci_high - s.mean)
        if xs:
            ax.errorbar(xs, means, yerr=[lows, highs], color=colour(scheme), marker="o", markersize=4, capsize=3,
                        linewidth=1.2, label=label(scheme, warmup) if mark_diverged else None, **style(warmup))


def plot_loss_curves(records: list[dict], depth: int, path: str, *, title: str, floor: float | None = None) -> None:
    """Train loss (mean per log interval) of every run at ``depth``, one line per seed, the scheme's colour; the
    label-smoothing ``floor`` (nats, ``validation_protocol.label_smoothing_floor``: the least loss a model can
    reach on smoothed targets) a dashed black line when given."""
    plt = sweep.pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    labelled = set()
    for r in sorted((r for r in records if r["depth"] == depth), key=lambda r: (r["scheme"], r["seed"])):
        key = (r["scheme"], r["warmup"])
        steps, losses = zip(*r["train_loss_curve"]) if r["train_loss_curve"] else ((), ())
        ax.plot(steps, losses, linewidth=1, color=colour(r["scheme"]), linestyle=style(r["warmup"])["linestyle"],
                label=None if key in labelled else label(*key))
        labelled.add(key)
    if floor is not None:
        ax.axhline(floor, color="black", linewidth=0.8, linestyle="--",
                   label=f"label-smoothing floor, {floor:.4f} nats")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss (mean over each log interval)")
    ax.set_title(wrap(title), fontsize=7)
    _finish(fig, ax, path)


def per_layer(evaluation: dict, depth: int, quantity: str) -> list[list[float | None]]:
    """``[[attn, mlp] per layer]`` of ``diag/blocks.<l>.<branch>.<quantity>`` (None when absent)."""
    return [[evaluation.get(f"diag/blocks.{layer}.{b}.{quantity}") for b in ("attn", "mlp")] for layer in range(depth)]


def plot_scale_heatmap(runs: list[dict], depth: int, path: str, *, title: str) -> None:
    """log10 mean |λ| (|α|) per layer × branch (rows) at each evaluation (columns: one cell per evaluation, nearest
    interpolation), one panel per run, one colour scale for the whole figure. A scale of exactly 0 (ReZero and
    SkipInit at initialisation) has no logarithm and is drawn grey, as is an absent value."""
    import numpy as np
    plt = sweep.pyplot()
    runs = [r for r in runs if r["branch_scaling"] != "none"]
    grids = []
    for r in runs:
        values = np.array([[v if v is not None else np.nan for row in per_layer(e, depth, "scale") for v in row]
                           for e in r["evaluations"]], dtype=float).T                 # (2·depth, evaluations)
        with np.errstate(divide="ignore", invalid="ignore"):
            grids.append(np.where(values > 0, np.log10(values), np.nan))
    finite = np.concatenate([g[np.isfinite(g)] for g in grids]) if grids else np.array([])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 0.0)
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    n = max(len(runs), 1)
    fig, axes = plt.subplots(1, n, figsize=(2.6 * n + 1.2, 4.6), squeeze=False, layout="constrained")
    image = None
    for ax, r, values in zip(axes[0], runs, grids):
        steps = [e["step"] for e in r["evaluations"]]
        image = ax.imshow(values, aspect="auto", origin="lower", cmap=cmap, vmin=vmin, vmax=vmax,
                          interpolation="nearest")
        ax.set_xticks(range(len(steps)), [str(s) for s in steps], fontsize=6)
        ax.set_title(label(r["scheme"], r["warmup"]) + (" (diverged)" if r["diverged"] else ""), fontsize=7,
                     color=colour(r["scheme"]))
        ax.set_xlabel("evaluation step", fontsize=7)
    axes[0][0].set_ylabel("row 2l: block l attn, 2l+1: block l mlp", fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=list(axes[0]), label="log10 mean |scale| (grey: 0 or absent)")
    fig.suptitle(wrap(title, 170), fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_ratio_init_end(runs: list[dict], depth: int, path: str, *, title: str) -> None:
    """‖scaled branch‖ / ‖stream‖ per layer at step 0 (dotted) and at the run's last evaluation (solid; its step in
    the panel title), attention and MLP branches, one panel per run. A ratio of exactly 0 (a branch multiplier
    initialised to 0: ReZero, SkipInit) has no place on the log axis; the panel says so instead of drawing it."""
    plt = sweep.pyplot()
    n = max(len(runs), 1)
    fig, axes = plt.subplots(1, n, figsize=(2.8 * n, 3.8), squeeze=False, sharey=True, layout="constrained")
    for ax, r in zip(axes[0], runs):
        end = r["evaluations"][-1]
        zeros = []
        for evaluation, line, when in ((r["evaluations"][0], ":", "init"), (end, "-", "end")):
            rows = per_layer(evaluation, depth, "ratio")
            for b, (branch, shade) in enumerate((("attn", 1.0), ("mlp", 0.55))):
                values = [row[b] if row[b] is not None and row[b] > 0 else math.nan for row in rows]
                if any(row[b] == 0 for row in rows):
                    zeros.append(f"{branch} at {when}")
                ax.plot(range(depth), values, linestyle=line, color=colour(r["scheme"]), alpha=shade,
                        label=f"{branch}, {when}")
        if zeros:
            ax.text(0.02, 0.02, "exactly 0, not drawn (log axis):\n" + ", ".join(zeros), fontsize=6,
                    transform=ax.transAxes, va="bottom")
        ax.set_yscale("log")
        ax.set_title(f"{label(r['scheme'], r['warmup'])}, end = step {end['step']}"
                     + (" (diverged)" if r["diverged"] else ""), fontsize=7)
        ax.set_xlabel("block")
    axes[0][0].set_ylabel("‖scaled branch‖ / ‖stream‖")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(wrap(title, 170), fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget(finals: dict, curves: dict, chosen: int | None, path: str, *, title: str,
                by_seed: dict | None = None) -> None:
    """Left: final validation accuracy (%) of each budget cell's runs against their step count (``finals``:
    ``{(scheme, warmup, depth): {steps: mean acc}}``; ``by_seed``, ``{cell: {steps: {seed: acc}}}``, adds each
    seed's run as a small point when there are several), the chosen budget a vertical line. Right: the validation
    curve of each cell's longest run (``curves``: ``{(scheme, warmup, depth, steps): [(step, acc)]}``), whose middle
    is at a high learning rate: why the budget is read off whole runs. Solid: the deepest depth, dotted: the others."""
    plt = sweep.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    deepest = max(d for _, _, d in finals)
    for (scheme, warmup, depth), runs in sorted(finals.items(), key=lambda kv: (kv[0][2], kv[0][0])):
        line = dict(color=colour(scheme), linestyle="-" if depth == deepest else ":", marker="o", markersize=3,
                    label=f"{label(scheme, warmup)}, depth {depth}")
        left.plot(list(runs), list(runs.values()), **line)
        seeds = (by_seed or {}).get((scheme, warmup, depth), {})
        if any(len(each) > 1 for each in seeds.values()):
            points = [(t, a) for t, each in seeds.items() for a in each.values()]
            left.scatter(*zip(*points), color=colour(scheme), s=9, alpha=0.45, linewidths=0)
        longest = max(runs)
        steps, accs = zip(*curves[(scheme, warmup, depth, longest)])
        right.plot(steps, accs, **dict(line, markersize=1.5))
    if chosen:
        left.axvline(chosen, color="black", linewidth=0.8, label=f"chosen: {chosen} steps")
    left.set_xlabel("steps of the run (warm-up and cosine decay scaled to it)")
    left.set_ylabel("final validation accuracy (%)")
    right.set_xlabel("step (within the longest run)")
    right.set_ylabel("validation accuracy (%)")
    bottom = max(min(a for c in curves.values() for _, a in c[1:]) - 1, 0)
    right.set_ylim(bottom, 100)
    hidden = below_axis({c: curves[(*c, max(runs))] for c, runs in finals.items()}, bottom)
    if hidden:
        steps = sorted({s for s, _ in hidden})
        where = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}–{steps[-1]}"
        right.text(0.98, 0.02, f"axis cut at {bottom:.0f}%: {len(hidden)} evaluations of these curves lie below "
                               f"it,\nnot drawn ({where}, {min(a for _, a in hidden):.1f}–"
                               f"{max(a for _, a in hidden):.1f}%)",
                   transform=right.transAxes, ha="right", va="bottom", fontsize=7,
                   bbox=dict(facecolor="white", edgecolor="0.6", linewidth=0.5))
    left.legend(fontsize=6)
    fig.suptitle(wrap(title, 140), fontsize=7)
    _finish(fig, right, path, legend=False)


def below_axis(curves: dict, bottom: float) -> list[tuple[int, float]]:
    """Every ``(step, accuracy)`` of ``curves`` below ``bottom``: what a cut accuracy axis leaves out."""
    return [(step, a) for curve in curves.values() for step, a in curve if a < bottom]


def plot_claims(results, path: str, *, title: str, marks: dict | None = None) -> None:
    """Every comparison of ``cait_claims`` (``results``: its ``ClaimResult``s) as a row: the difference of mean
    accuracy (claimed better − claimed worse, points) with its Welch 95% interval, coloured as the claimed-worse
    column; a filled marker is significant after Holm's correction, an open one is not; a row without an accuracy
    test (fewer than two converged runs a side) gives its converged counts instead. Right of zero is the claimed
    direction; the right margin gives each comparison's outcome (accuracy and divergence tests together).
    ``marks``, ``{mark: (cells, meaning)}``: a comparison with a cell ``(scheme, warm-up, depth)`` in ``cells``
    gets ``mark`` after its label, and the caption says what it means (e.g. † a cell failing the convergence
    check, ‡ a machine confound)."""
    import cait_claims
    plt = sweep.pyplot()
    rows = [(r.claim.name, c, sum(len(d.tests()) for d in r.comparisons)) for r in results for c in r.comparisons]
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * max(len(rows), 1)))
    for y, (name, c, tests) in enumerate(rows):
        scheme, acc = c.worse[0], c.accuracy
        ax.text(1.01, y, c.outcome, transform=ax.get_yaxis_transform(), va="center", fontsize=6)
        if acc is None:
            ax.text(0, y, f"  no accuracy test ({c.runs} converged)", va="center", fontsize=6)
            continue
        significant = c.accuracy_p_holm < 0.05
        ax.plot(cait_claims.holm_interval(acc, tests), [y, y], color=colour(scheme), alpha=0.3, linewidth=5,
                solid_capstyle="butt")                                  # the interval at Holm's α/m
        ax.errorbar([acc.difference], [y], xerr=[[acc.difference - acc.ci_low], [acc.ci_high - acc.difference]],
                    fmt="o", color=colour(scheme), markersize=4, capsize=2,
                    markerfacecolor=colour(scheme) if significant else "white")
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_yticks(range(len(rows)))
    marks = marks or {}

    def marked(c):
        return "".join(f" {m}" for m, (cells, _) in marks.items() if {tuple(c.better), tuple(c.worse)} & set(cells))
    ax.set_yticklabels([f"{name}: {label(c.better[0], c.better[1])} @ {c.better[2]} vs "
                        f"{label(c.worse[0], c.worse[1])} @ {c.worse[2]}{marked(c)}" for name, c, _ in rows],
                       fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("difference of mean test accuracy, points (claimed better − worse); whiskers: Welch 95% CI "
                  "(unadjusted);\nwide pale bar: the interval at Holm's strictest level α/m (m the claim's tests); "
                  "filled marker: Holm-corrected p < 0.05\n(an open marker whose whiskers exclude 0 is significant "
                  "only before the correction; claims.md has every test)"
                  + "".join(f"\n{m} {meaning}" for m, (cells, meaning) in marks.items() if cells), fontsize=6)
    ax.set_title(wrap(title, 90), fontsize=7)
    _finish(fig, ax, path, legend=False)
