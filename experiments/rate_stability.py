"""A pre-registered test of the depth ablation's post-hoc observation on LayerNorm and the stable rate range.

The observation (``experiments/results/depth_ablation_converged/rates/rates.md``, written after the runs were seen):
in the rate sweep at rate 2e-2, depths 48 and 96, seed 0, all 8 runs of the columns whose blocks have no LayerNorm
(ReZero, SkipInit, each with and without warm-up) diverged, none of the 8 runs of the columns that keep it. One seed,
columns and depths pooled, chosen for reporting after the fact — so it is tested here on new seeds, with the
hypothesis, the runs, the endpoint, the test and the decision rule fixed in this file and committed before the first
run (``PREREGISTRATION``; ``experiments/results/rate_stability/preregistration.md`` is written from it):

    python experiments/rate_stability.py                 # train what is missing (resumable), then write the report
    python experiments/rate_stability.py --shard 1/2     # one machine's (or one core's) share; no report
    python experiments/rate_stability.py --report        # the report from the finished runs only

Each run is the depth ablation's rate-stage run (``depth_ablation_runs.make_config``: digits, train without the
validation part, width 32, batch 64, 2,000-step schedule with 10% warm-up where on, cosine decay) at rate 2e-2, cut
after ``STOP_AFTER`` steps of that schedule: the endpoint is divergence, and every divergence at these depths in the
sweep came by step 618.
"""
from __future__ import annotations

if __name__ == "__main__":   # before any allocation: a malloc keeping XLA's buffers (layerscale_jax/runtime/malloc.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import dataclasses
import os
import sys
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cait_claims  # noqa: E402  (Fisher's exact test on divergence counts)
import depth_ablation_runs as da  # noqa: E402  (the rate stage's runs: config, training, records)
import sweep  # noqa: E402  (records, resume, shards, machines)

OUT = os.path.join(da.ROOT, "experiments", "results", "rate_stability")
RATE = 2e-2
DEPTHS = (48, 96)
SEEDS = (1, 2, 3)                     # new: the observation is seed 0's
SCHEDULE_STEPS = 2000                 # the converged budget (budget.json), as in the rate sweep
STOP_AFTER = 1000
NORM_FREE = (("rezero", True), ("rezero", False), ("skipinit", True), ("skipinit", False))
NORM_KEPT = (("none", True), ("layerscale", True))
ALPHA = 0.05

_TITLE = f"LayerNorm-free blocks diverge more often at rate {RATE:g}, depths {' and '.join(str(d) for d in DEPTHS)}"
PREREGISTRATION = f"""# Pre-registration: {_TITLE}

Fixed before the first run of this test (`experiments/rate_stability.py`, committed with this text).

- **Observation tested** (post hoc, from the rate sweep, seed 0): at rate {RATE:g} and depths 48 and 96, 8 of 8
  runs without the blocks' LayerNorm diverged, 0 of 8 with it.
- **Hypothesis**: under the same recipe, runs of columns whose blocks have no LayerNorm diverge more often than runs
  of columns that keep it.
- **Runs**: rate {RATE:g}; depths {', '.join(map(str, DEPTHS))}; new seeds {', '.join(map(str, SEEDS))} (each seed
  sets initialisation, data order and stochastic-depth keys); without LayerNorm: {', '.join(
    da.column_label(s, w) for s, w in NORM_FREE)}; with it: {', '.join(
    da.column_label(s, w) for s, w in NORM_KEPT)} (plain
  pre-norm and LayerScale with CaiT's ε, the study's two main columns; the other two of the sweep are left out for
  cost). {len(DEPTHS) * len(SEEDS) * len(NORM_FREE)} + {len(DEPTHS) * len(SEEDS) * len(NORM_KEPT)} runs. Everything
  else is the rate stage's run (`depth_ablation.make_config`, protocol `rates`, {SCHEDULE_STEPS}-step schedule).
- **Endpoint**: the run diverged — its loss or gradient norm turned non-finite — within the first {STOP_AFTER} steps of
  the {SCHEDULE_STEPS}-step schedule (runs stop there; in the sweep every divergence at these depths came by step
  618). Accuracy is recorded, not tested.
- **Test**: one-sided Fisher's exact test on the pooled counts (diverged / runs without LayerNorm against with it),
  alternative: without diverges more often. **Decision**: the observation is *confirmed* if p < {ALPHA:g} with every
  run finished, *not confirmed* otherwise. Per depth and per column counts are descriptive, untested.
- **Not claimed either way**: anything about other rates, depths, widths, datasets or ImageNet.
"""


def specs() -> list[da.RunSpec]:
    """Every run, seed by seed and depth by depth, the groups interleaved (free, kept, free, free, kept, free), so a
    partial test has both groups at every seed it reached and each of two shards gets one kept run of each depth."""
    (f1, f2, f3, f4), (k1, k2) = NORM_FREE, NORM_KEPT
    order = (f1, k1, f2, f3, k2, f4)
    return [da.RunSpec(d, s, w, seed, RATE, "rates", SCHEDULE_STEPS)
            for seed in SEEDS for d in DEPTHS for s, w in order]


def sizing() -> da.Sizing:
    """The rate stage's sizing (``depth_ablation_protocol.run_rate_sweep``): evaluations every 400 of the 2,000
    steps."""
    return dataclasses.replace(da.PROTOCOL_SIZING, steps=SCHEDULE_STEPS)


def run(which_shard: str | None = None) -> list[dict]:
    return da.run_sweep(sweep.shard(specs(), which_shard), sizing(), OUT,
                        overrides={"train.stop_after_steps": STOP_AFTER})


def norm_free(record: dict) -> bool:
    return (record["scheme"], record["warmup"]) in NORM_FREE


def verdict(records: Sequence[dict]) -> dict:
    """Counts, p and the pre-registered decision over ``records`` (this test's runs)."""
    free = [r["diverged"] for r in records if norm_free(r)]
    kept = [r["diverged"] for r in records if not norm_free(r)]
    p = (cait_claims.fisher_divergence(sum(free), len(free), sum(kept), len(kept), alternative="greater")
         if free and kept else float("nan"))
    complete = len(records) == len(specs())
    decision = ("confirmed" if p < ALPHA else "not confirmed") if complete else "not decided: runs missing"
    return {"free": (sum(free), len(free)), "kept": (sum(kept), len(kept)), "p": p, "complete": complete,
            "decision": decision}


def write_report(out: str = OUT, command: str = "python experiments/rate_stability.py") -> str:
    """``report.md``: the decision, the pooled and per-cell counts and every run, from the finished records."""
    records = [r for r in sweep.load_records(out) if r["run_id"] in {s.run_id for s in specs()}]
    v = verdict(records)
    cells = []
    for depth in DEPTHS:
        for scheme, warmup in NORM_FREE + NORM_KEPT:
            mine = [r for r in records if (r["depth"], r["scheme"], r["warmup"]) == (depth, scheme, warmup)]
            cells.append([str(depth), da.column_label(scheme, warmup), "removed" if (scheme, warmup) in NORM_FREE else
                          "kept", f"{sum(r['diverged'] for r in mine)}/{len(mine)}",
                          ", ".join(str(r["diverged_at_step"]) for r in sorted(mine, key=lambda r: r["seed"])
                                    if r["diverged"]) or "—"])
    runs = [[r["run_id"], str(r["seed"]), "yes" if r["diverged"] else "no", str(r["diverged_at_step"] or "—"),
             str(r["steps"]), f"{100 * r['final_val_accuracy']:.1f}"]
            for r in sorted(records, key=lambda r: (r["seed"], r["depth"], r["scheme"], not r["warmup"]))]
    text = (f"# Rate stability without LayerNorm: the pre-registered test\n\n"
            f"Command: `{command}`. The hypothesis, runs, endpoint, test and decision rule were fixed before the "
            f"first run: [preregistration.md](preregistration.md).\n\n"
            f"**{v['decision']}** — {len(records)} of {len(specs())} runs finished. Diverged within {STOP_AFTER} "
            f"steps: without LayerNorm {v['free'][0]}/{v['free'][1]}, with it {v['kept'][0]}/{v['kept'][1]}; "
            f"one-sided Fisher's exact test p = {v['p']:.3g} (decision threshold {ALPHA:g}).\n\n"
            f"![Step at which each run diverged, per depth and column; a run that did not diverge at the right "
            f"edge](divergence.png)\n\n"
            f"Per depth and column (descriptive, untested):\n\n"
            + sweep.markdown_table(["depth", "column", "LayerNorm", "diverged/runs", "diverged at step"], cells)
            + f"\nEvery run (validation accuracy at its last step, {STOP_AFTER} unless it diverged):\n\n"
            + sweep.markdown_table(["run", "seed", "diverged", "at step", "steps", "val acc %"], runs)
            + "\n" + " ".join(filter(None, (sweep.machines_note(records), sweep.compute_note(records)))) + "\n")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def write_figure(out: str = OUT) -> str:
    """``divergence.png``: per depth a panel, per column a row, each seed's run a mark at the step it diverged
    (``x``; log axis) or at the right edge when it did not (``o``, at step ``STOP_AFTER``); the decision in the
    title."""
    import depth_ablation_plots as plots
    records = [r for r in sweep.load_records(out) if r["run_id"] in {s.run_id for s in specs()}]
    v = verdict(records)
    plt = sweep.pyplot()
    columns = NORM_FREE + NORM_KEPT
    fig, axes = plt.subplots(1, len(DEPTHS), figsize=(4.2 * len(DEPTHS), 3.4), sharey=True, squeeze=False,
                             layout="constrained")
    for ax, depth in zip(axes[0], DEPTHS):
        for y, (scheme, warmup) in enumerate(columns):
            for r in (r for r in records if (r["depth"], r["scheme"], r["warmup"]) == (depth, scheme, warmup)):
                x = r["diverged_at_step"] if r["diverged"] else STOP_AFTER
                ax.scatter([x], [y + (r["seed"] - 2) * 0.15], marker="x" if r["diverged"] else "o", s=28,
                           color=plots.colour(scheme), facecolors=None if r["diverged"] else "none")
                if not r["diverged"]:            # finite is not trained: its validation accuracy beside it
                    ax.text(x * 1.08, y + (r["seed"] - 2) * 0.15, f"{100 * r['final_val_accuracy']:.0f}%",
                            fontsize=5, va="center")
        ax.axhline(len(NORM_FREE) - 0.5, color="black", linewidth=0.6)
        ax.set_xscale("log")
        ax.set_xlim(5, STOP_AFTER * 2.2)
        ax.axvline(STOP_AFTER, color="black", linewidth=0.6, linestyle=":")
        ax.set_title(f"depth {depth}", fontsize=8)
        ax.set_xlabel(f"step (x: diverged; o: not by step {STOP_AFTER}, val. accuracy beside)", fontsize=7)
    axes[0][0].set_yticks(range(len(columns)),
                          [f"{da.column_label(s, w)} ({'no LN' if (s, w) in NORM_FREE else 'LN'})" for s, w in columns],
                          fontsize=7)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"Rate {RATE:g}, seeds {', '.join(map(str, SEEDS))} (one mark each, offset by seed): diverged "
                 f"without LayerNorm {v['free'][0]}/{v['free'][1]}, with it {v['kept'][0]}/{v['kept'][1]}; "
                 f"one-sided Fisher p = {v['p']:.2g} — {v['decision']}", fontsize=8)
    path = os.path.join(out, "divergence.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_preregistration(out: str = OUT) -> str:
    """Write ``preregistration.md`` before the first run; once it exists, a design that differs from it is a
    ValueError (``sweep.write_preregistration``)."""
    return sweep.write_preregistration(out, PREREGISTRATION, "rate_stability.PREREGISTRATION")


def report() -> str:
    text = write_report()
    write_figure()
    return text


def main(argv=None) -> None:
    sweep.registered_study_command(argv, __doc__.split("\n\n")[0], write_preregistration, run, report)


if __name__ == "__main__":
    main()
