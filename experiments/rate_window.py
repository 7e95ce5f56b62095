"""A pre-registered test of CaiT's shared-recipe claim where accuracy is off the ceiling: the usable rate window.

CaiT (Touvron et al. 2021, §3) argues that LayerScale lets a deep ViT train under the recipe a shallow one uses. At
each column's own validation rate the depth ablation's final stage put every column at 95–98.5% test accuracy,
where 5 seeds resolve about one point. Away from its best rate a column can fall far: in the rate sweep (seed 0,
post hoc) plain pre-norm at depth 48 fell to 77.9% validation accuracy at 2e-2, LayerScale stayed at 97.2–98.9%
from 5e-3 to 2e-2. This test asks it on new seeds, with the runs, endpoints, statistics and decision rule
fixed in this file and committed before the first run (``PREREGISTRATION``; ``results/rate_window/
preregistration.md`` is written from it and a changed design is refused):

    python experiments/rate_window.py                 # train what is missing (resumable), then the report + figure
    python experiments/rate_window.py --shard 1/2     # one machine's (or one core's) share; no report
    python experiments/rate_window.py --report        # report.md and window.png from the finished runs only

Each run is the depth ablation's rate-stage run (``depth_ablation_runs.make_config``, protocol ``rates``: train
without the 285 validation images → validation). The window of a column at a depth for one seed (``window_size``):

    W = #{rates r : run r did not diverge and 100 · (c_best − c_r) ≤ N}

with ``c_r`` the validation images run r got right (integer counts, ``correct_images``), ``c_best`` the most any
non-diverged run of that seed got, N = 285 validation images: "within 1 point of the column's best".
"""
from __future__ import annotations

if __name__ == "__main__":   # before any allocation: a malloc keeping XLA's buffers (layerscale_jax/runtime/malloc.py)
    from layerscale_jax.runtime import reexec_with_fast_malloc
    reexec_with_fast_malloc()

import dataclasses
import math
import os
import statistics
import sys
from collections.abc import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cait_claims  # noqa: E402  (Welch / Fisher per comparison, Holm per family, the outcome rule)
import depth_ablation_runs as da  # noqa: E402  (the rate stage's runs: config, training, records)
import sweep  # noqa: E402  (records, resume, shards, machines, statistics)

OUT = os.path.join(da.ROOT, "experiments", "results", "rate_window")
RATES = (2e-3, 5e-3, 1e-2, 2e-2, 5e-2)
SHARED_RATES = (1e-2, 2e-2)            # endpoints 2 and 3: accuracy at these rates
RATE_ORDER = SHARED_RATES + (5e-3, 2e-3, 5e-2)   # the order the runs of a seed are trained in
DEEP = 48
SHALLOW = 6
DEPTHS = (SHALLOW, DEEP)
SEEDS = (5, 6, 7)                      # new: rate sweep 0, final stage 0-4, rate-stability test 1-3
SCHEDULE_STEPS = 2000                  # the converged budget (budget.json)
VALIDATION_IMAGES = 285                # depth_ablation_protocol.validation_images(); a test checks the two agree
WINDOW_POINTS = 1.0
COLUMNS = da.COLUMNS
REFERENCE = da.REFERENCE               # LayerScale with CaiT's ε, with warm-up
ALPHA = cait_claims.ALPHA
POWER = 0.8
SIMULATION_DRAWS = 20_000              # post hoc: the Monte Carlo draws behind each detectable difference
ENDPOINTS = ("window",) + tuple(f"accuracy at {r:g}" for r in SHARED_RATES)

# The cost arithmetic that chose depth 48 over 96: committed final-stage records (2,000-step runs, ``cpu_seconds``),
# mean per depth on the machine kind closest to this one (AMD EPYC whose generation was not recorded yet) and on
# the others; a test recomputes them from the records.
COST_KIND = ("AMD EPYC", None, None)
COST_SECONDS = {6: 50.8, 48: 423.5, 96: 803.1}
SESSION_CPU_HOURS = 1.9                # one core, niced, 17:15-19:15 UTC: what this test gets per session here
RUNS_PER_DEPTH = len(COLUMNS) * len(RATES) * len(SEEDS)


def detectable_in_sds(n: int, alpha: float, power: float = POWER) -> float:
    """The difference (in seed standard deviations) a two-sided t-test of ``n`` against ``n`` seeds with equal
    SDs detects with probability ``power`` at level ``alpha``: (t_{1−α/2, 2n−2} + t_{power, 2n−2}) · √(2/n)."""
    return sweep.detectable_difference(1.0, 1.0, n, n, alpha, power)


def _cost_hours(deep: int) -> float:
    return RUNS_PER_DEPTH * (COST_SECONDS[SHALLOW] + COST_SECONDS[deep]) / 3600


_COLUMN_LIST = ", ".join(da.column_label(s, w) for s, w in COLUMNS)
_OTHERS = len(COLUMNS) - 1
_TITLE = f"the usable rate window at depth {DEEP} (CaiT's shared-recipe claim off the ceiling)"
PREREGISTRATION = f"""# Pre-registration: {_TITLE}

Fixed before the first run of this test (`experiments/rate_window.py`, committed with this text; issue 37, item 6).

- **Question.** CaiT: LayerScale lets a deep ViT train under the recipe a shallow one uses. At each column's own
  validation rate every column reached 95–98.5% (final stage), on the ceiling. Off it, in the rate sweep (seed 0,
  post hoc): `none` at depth 48 fell to 77.9% validation accuracy at 2e-2, LayerScale stayed at 97.2–98.9% from
  5e-3 to 2e-2.
- **Hypothesis.** At depth {DEEP}, under one recipe, LayerScale's usable rate window is wider than each other
  column's, and at the shared rates {' and '.join(f'{r:g}' for r in SHARED_RATES)} its validation accuracy is higher.
- **Runs.** {len(COLUMNS)} columns ({_COLUMN_LIST}) × rates {', '.join(f'{r:g}' for r in RATES)} × new seeds
  {', '.join(map(str, SEEDS))} (the rate sweep used 0, the final stage 0–4, the rate-stability test 1–3) × depths
  {SHALLOW} and {DEEP}: {RUNS_PER_DEPTH * len(DEPTHS)} runs. Each is the rate stage's run (`depth_ablation.make_config`,
  protocol `rates`: trained on train without the {VALIDATION_IMAGES} validation images, evaluated on them; width 32,
  batch 64, {SCHEDULE_STEPS} steps, 10% warm-up where the column has it, cosine decay), evaluated every 400 steps;
  the endpoints use the last evaluation. No test-split image is evaluated. Runs may train on different machines
  (sessions end, shards move); each record names its CPU and load, and the report lists them.
- **Depth {DEEP}, not 96**, from the committed final-stage records' `cpu_seconds` (mean per 2,000-step run on the
  AMD EPYC kind whose generation was not yet recorded, the committed kind closest to this 2-core AMD EPYC family 25
  model 1): depth 6 {COST_SECONDS[6]:g} s, 48 {COST_SECONDS[48]:g} s, 96 {COST_SECONDS[96]:g} s. {RUNS_PER_DEPTH} runs
  per depth: depths 6 + 96 = {RUNS_PER_DEPTH} × ({COST_SECONDS[6]:g} + {COST_SECONDS[96]:g}) s =
  {_cost_hours(96):.1f} CPU-hours; 6 + 48 = {RUNS_PER_DEPTH} × ({COST_SECONDS[6]:g} + {COST_SECONDS[48]:g}) s =
  {_cost_hours(48):.1f} CPU-hours (diverged runs stop early; not counted). This machine gives the test one niced
  core, about {SESSION_CPU_HOURS:g} CPU-hours a session: 96 needs ≥ {math.ceil(_cost_hours(96) / SESSION_CPU_HOURS)}
  sessions, 48 ≥ {math.ceil(_cost_hours(48) / SESSION_CPU_HOURS)}. Depth 48 is deep in the study's sense (claims
  1–6 test 48 and 96) and off the ceiling in the sweep (`none` 77.9% at 2e-2).
- **Order.** Depth {DEEP} first: seed by seed, the rates in the order {', '.join(f'{r:g}' for r in RATE_ORDER)}
  (the shared rates first), every column at a rate before the next rate; depth {SHALLOW} after, in the same order.
  `--shard I/N` takes every N-th run. Records are committed as they finish.
- **Diverged runs.** A run whose loss or gradient norm turns non-finite stops at that step and is recorded as
  diverged; it is never rerun or replaced. It is outside the window (never usable). In the accuracy endpoints it is
  counted apart (not in the means) and enters through Fisher's exact test on the divergence counts.
- **Endpoint 1 (primary): the window.** Per column, depth and seed: W = the number of the {len(RATES)} rates whose
  run did not diverge and got c_r validation images right with 100 · (c_best − c_r) ≤ {VALIDATION_IMAGES}, c_best the
  most any non-diverged run of that column, depth and seed got right (within {WINDOW_POINTS:g} point of the
  column's best: at most 2 images below; 3 images are 1.05 points). Counts are round(accuracy × {VALIDATION_IMAGES}).
  A seed whose runs all diverged has W = 0. Only a seed with all {len(RATES)} runs finished has a W.
- **Endpoints 2 and 3.** Validation accuracy (%) at rate {SHARED_RATES[0]:g}, and at {SHARED_RATES[1]:g}.
- **Comparisons.** LayerScale against each of the {_OTHERS} other columns at depth {DEEP}: one family of {_OTHERS}
  comparisons per endpoint.
- **Statistics.** Endpoint 1: Welch's t-test on the {len(SEEDS)} per-seed W a side, two-sided, with the difference of
  means and its Welch–Satterthwaite 95% CI; when both sides' W are constant there is no test (the comparison is
  "not tested" and its values are shown). Endpoints 2–3 (`cait_claims.compare`): Welch's t-test on the accuracies
  of the runs that did not diverge (at least two a side), and, when a run diverged in either column, Fisher's exact
  test (two-sided) on the diverged counts. Holm's step-down correction over all tests of an endpoint's family,
  family-wise α = {ALPHA:g}.
- **Decision** (`cait_claims.evaluate`'s rule), per comparison: *as claimed* (LayerScale wider / higher / fewer
  divergences) when one of its tests is significant after Holm in that direction and none in the other; *against*
  in the opposite case; *mixed* with both; *not resolved* with neither. Per endpoint: **reproduced** (some
  comparison as claimed, none against), **not reproduced: contradicted / mixed / no difference resolved**. The
  finding is the list of columns LayerScale is resolved against, not the summary word. An endpoint is decided only
  when all of its depth-{DEEP} runs are finished; before that the report says "interim: not decided".
- **Power, stated before the runs.** {len(SEEDS)} seeds a side: Welch's two-sided test (about 4 df) detects with
  {POWER:.0%} probability a difference of {detectable_in_sds(len(SEEDS), ALPHA / _OTHERS):.1f} seed SDs at Holm's first
  step (α = {ALPHA:g}/{_OTHERS}) and {detectable_in_sds(len(SEEDS), ALPHA):.1f} at its last (α = {ALPHA:g}); only large
  effects resolve, and "not resolved" rules out nothing smaller. Fisher's two-sided test of 3 against 3 runs has
  smallest p = 0.1: divergence alone cannot decide a comparison; it is reported.
- **Descriptive, untested.** Depth {SHALLOW}: every window and accuracy, and each column's window change from depth
  {SHALLOW} to {DEEP}; accuracy at every rate; every seed's value; validation loss.
- **Not claimed either way.** Depth 96 or any other depth, widths, data sets, ImageNet; test accuracy.
"""


# ---------------------------------------------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------------------------------------------
def specs() -> list[da.RunSpec]:
    """Every run in the pre-registered order: depth 48 then 6; within a depth seed by seed; within a seed the shared
    rates first, then 5e-3, 2e-3, 5e-2; within a rate every column."""
    return [da.RunSpec(depth, scheme, warmup, seed, rate, "rates", SCHEDULE_STEPS)
            for depth in (DEEP, SHALLOW) for seed in SEEDS for rate in RATE_ORDER for scheme, warmup in COLUMNS]


def sizing() -> da.Sizing:
    """The rate stage's sizing: evaluations every 400 of the 2,000 steps."""
    return dataclasses.replace(da.PROTOCOL_SIZING, steps=SCHEDULE_STEPS)


def run(which_shard: str | None = None) -> list[dict]:
    return da.run_sweep(sweep.shard(specs(), which_shard), sizing(), OUT)


def finished_records(out: str = OUT) -> list[dict]:
    """The finished records of this test's runs (and of nothing else) under ``out``."""
    wanted = {s.run_id for s in specs()}
    return [r for r in sweep.load_records(out) if r["run_id"] in wanted]


# ---------------------------------------------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------------------------------------------
def correct_images(record: dict, images: int = VALIDATION_IMAGES) -> int:
    """The validation images a run got right: its final accuracy × ``images``, an integer (the accuracy is
    correct / images, so rounding recovers the count exactly)."""
    return round(record["final_val_accuracy"] * images)


def window_size(runs: Sequence[dict], images: int = VALIDATION_IMAGES, points: float = WINDOW_POINTS) -> int:
    """W of one column, depth and seed (module docstring): how many of ``runs`` did not diverge and got right at
    most ``points`` percent of ``images`` fewer images than the best of them (integer arithmetic: 100 · gap ≤
    points · images)."""
    counts = [correct_images(r, images) for r in runs if not r["diverged"]]
    return sum(100 * (max(counts) - c) <= points * images for c in counts) if counts else 0


def _runs(records, scheme, warmup, depth, seed=None, rate=None):
    return [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == (scheme, warmup, depth)
            and (seed is None or r["seed"] == seed) and (rate is None or math.isclose(r["learning_rate"], rate))]


def windows(records: Sequence[dict]) -> dict[tuple[str, bool, int, int], int]:
    """``{(scheme, warm-up, depth, seed): W}`` for every column, depth and seed whose runs at all ``RATES`` are
    finished."""
    out = {}
    for scheme, warmup in COLUMNS:
        for depth in DEPTHS:
            for seed in SEEDS:
                mine = _runs(records, scheme, warmup, depth, seed)
                if all(any(math.isclose(r["learning_rate"], rate) for r in mine) for rate in RATES):
                    out[(scheme, warmup, depth, seed)] = window_size(mine)
    return out


def _window_records(records: Sequence[dict]) -> list[dict]:
    """One pseudo-record per finished (column, depth, seed) holding its W, for ``cait_claims``' comparisons."""
    return [{"scheme": s, "warmup": w, "depth": d, "seed": k, "diverged": False, "window": size}
            for (s, w, d, k), size in windows(records).items()]


def claim(endpoint: str) -> cait_claims.Claim:
    statement = {"window": "wider usable rate window (W, rates within 1 point of the column's best)"}.get(
        endpoint, f"higher validation {endpoint}")
    comparisons = tuple(((*REFERENCE, DEEP), (s, w, DEEP)) for s, w in COLUMNS if (s, w) != REFERENCE)
    return cait_claims.Claim(endpoint, f"`layerscale` has a {statement} than each other column at depth {DEEP}",
                             comparisons)


def endpoint_records(records: Sequence[dict], endpoint: str) -> tuple[list[dict], object, int]:
    """The records an endpoint compares, the value it compares and how many depth-48 units it needs."""
    if endpoint == "window":
        return _window_records(records), (lambda r: r["window"]), len(COLUMNS) * len(SEEDS)
    rate = SHARED_RATES[ENDPOINTS.index(endpoint) - 1]
    mine = [r for r in records if math.isclose(r["learning_rate"], rate)]
    return mine, (lambda r: 100 * r["final_val_accuracy"]), len(COLUMNS) * len(SEEDS)


def analyse(records: Sequence[dict]) -> dict[str, tuple[cait_claims.ClaimResult, bool]]:
    """Per endpoint: ``cait_claims.evaluate``'s result on the depth-48 records (the pre-registered decision), each
    comparison's detectable difference by simulation (``simulate_detectable``, post hoc), and whether every
    depth-48 unit it needs is finished (only then is its verdict the decision)."""
    results = {}
    for endpoint in ENDPOINTS:
        mine, value, needed = endpoint_records(records, endpoint)
        deep = [r for r in mine if r["depth"] == DEEP]
        result = cait_claims.evaluate(deep, claim(endpoint), value, ALPHA)
        results[endpoint] = (simulate_detectable(result), len(deep) == needed)
    return results


def simulate_detectable(result: cait_claims.ClaimResult) -> cait_claims.ClaimResult:
    """``result`` with each comparison's ``detectable`` (Holm's α/m, α) by simulating Welch's test at its observed
    SDs and seeds (``cait_claims.simulated_detectable_pair``; m the family's tests) in place of the formula that
    takes the SDs as known (``cait_claims.simulate_detectable``). Post hoc: it states resolution and decides
    nothing."""
    return cait_claims.simulate_detectable(result, ALPHA, POWER, SIMULATION_DRAWS)


def formula_detectable(result: cait_claims.ClaimResult) -> list[tuple[float, float]]:
    """Each comparison's (α/m, α) detectable difference by ``cait_claims.detectable``'s formula (SDs known), in the
    order of ``result.comparisons`` (None-free: comparisons without an accuracy test are left out)."""
    tests = sum(len(c.tests()) for c in result.comparisons)
    return [cait_claims.detectable(c.spread, tests, ALPHA) for c in result.comparisons if c.spread]


def window_range(records: Sequence[dict]) -> int:
    """The largest difference of means the window endpoint can show: ``len(RATES) − 1`` = 4 rates when every seed
    has a run that did not diverge (then 1 ≤ W ≤ 5; W = 0 only when all of a seed's runs diverged, ``len(RATES)``
    then)."""
    return len(RATES) - (1 if all(w >= 1 for w in windows(records).values()) else 0)


def endpoint_range(records: Sequence[dict], endpoint: str) -> Callable[[cait_claims.Comparison], float]:
    """``limit(comparison)``: the largest difference of means a comparison of ``endpoint`` can show in the claimed
    direction. The window: ``window_range``, the same for every comparison. An accuracy (%):
    ``cait_claims.accuracy_headroom``, 100 minus the claimed-worse column's mean, as in the depth ablation's
    claims.md — LayerScale cannot be ahead by more than the other column has left to 100%."""
    if endpoint != "window":
        return cait_claims.accuracy_headroom
    limit = window_range(records)
    return lambda c: limit


def detectable_text(records: Sequence[dict], endpoint: str) -> Callable[[cait_claims.Comparison], str]:
    """``text(comparison)``: its detectable differences (α/m / α), each beyond ``endpoint_range`` written as "not
    detectable within the endpoint's range" rather than a difference the endpoint cannot show. An accuracy's as
    claims.md writes them (``cait_claims.detectable_cell``: then "(range r)", r that comparison's headroom); the
    window's without the range, ``window_range`` for every comparison, stated in the report's limits section."""
    if endpoint != "window":
        return cait_claims.detectable_cell
    limit = window_range(records)

    def text(c: cait_claims.Comparison) -> str:
        if not c.detectable:
            return "–"
        return " / ".join(f"{x:.2f}" if x <= limit else OUT_OF_RANGE for x in c.detectable)
    return text


OUT_OF_RANGE = cait_claims.OUT_OF_RANGE


def detectable_span(result: cait_claims.ClaimResult, limit: Callable[[cait_claims.Comparison], float]
                    ) -> tuple[str, int, int]:
    """``("a–b", k, n)``: the range of an endpoint's detectable differences (both levels, every comparison) that
    lie within their comparison's ``limit`` (``endpoint_range``), and how many of all ``n`` lie beyond it."""
    values = [(x, limit(c)) for c in result.comparisons if c.detectable for x in c.detectable]
    inside = [x for x, most in values if x <= most]
    span = (f"{min(inside):.2f}" + (f"–{max(inside):.2f}" if max(inside) > min(inside) else "")) if inside else "none"
    return span, len(values) - len(inside), len(values)


def binomial_se_points(accuracy: float, images: int = VALIDATION_IMAGES) -> float:
    """One evaluation's binomial standard error in points: ``100 · √(p (1 − p) / N)``, p = ``accuracy`` (0–1)."""
    return 100 * math.sqrt(accuracy * (1 - accuracy) / images)


def best_accuracy(records: Sequence[dict], depth: int = DEEP) -> float:
    """The mean, over every column and seed at ``depth``, of the accuracy (0–1) of that seed's best run: where the
    window's band is drawn."""
    best = [max(correct_images(r) for r in _runs(records, s, w, depth, k) if not r["diverged"]) / VALIDATION_IMAGES
            for s, w in COLUMNS for k in SEEDS if any(not r["diverged"] for r in _runs(records, s, w, depth, k))]
    return statistics.mean(best)


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------
def _comparison_rows(result: cait_claims.ClaimResult, values, detectable) -> list[list[str]]:
    rows = [[cait_claims._cell_name(c.worse), values(c.better), values(c.worse)]
            + cait_claims.comparison_cells(c, detectable) for c in result.comparisons]
    rows += [[cait_claims._cell_name(b), "–", "–", "no runs", "–", "–", "–", "–", "–", "–", "–", "not tested"]
             for _, b in result.missing]
    return rows


def _seed_values(records, endpoint):
    """``values(cell)``: every seed's value of ``cell`` (seed order), a diverged run as ``div``."""
    mine, value, _ = endpoint_records(records, endpoint)

    def values(cell):
        runs = sorted(_runs(mine, *cell), key=lambda r: r["seed"])
        return ", ".join("div" if r["diverged"] else f"{value(r):.{0 if endpoint == 'window' else 1}f}"
                         for r in runs) or "–"
    return values


def _accuracy_grid(records, depth) -> str:
    rows = []
    for scheme, warmup in COLUMNS:
        cells = []
        for rate in RATES:
            runs = sorted(_runs(records, scheme, warmup, depth, rate=rate), key=lambda r: r["seed"])
            cells.append(" / ".join("div" if r["diverged"] else f"{100 * r['final_val_accuracy']:.1f}" for r in runs)
                         or "–")
        ws = windows(records)
        cells.append(", ".join(str(ws[(scheme, warmup, depth, k)]) for k in SEEDS if (scheme, warmup, depth, k) in ws)
                     or "–")
        rows.append([da.column_label(scheme, warmup)] + cells)
    return sweep.markdown_table(["column"] + [f"{r:g}" for r in RATES] + ["W per seed"], rows)


def simulation_excess(analyses) -> tuple[float, float]:
    """The range over every comparison and level of simulated / formula detectable difference − 1: how much more
    the simulated Welch test needs than the formula says."""
    ratios = [sim / formula for result, _ in analyses.values()
              for c, pair in zip([c for c in result.comparisons if c.spread], formula_detectable(result))
              for sim, formula in zip(c.detectable, pair)]
    return min(ratios) - 1, max(ratios) - 1


def limits_section(records: Sequence[dict], analyses) -> str:
    """The window endpoint's limits, stated after the runs (post hoc; the pre-registered decision is unchanged):
    its band against one evaluation's binomial SE, what a uniformly poor column scores, the range W can differ
    by, and how much the simulated detectable differences exceed the formula's."""
    accuracy = best_accuracy(records)
    low, high = simulation_excess(analyses)
    window = [x for c in analyses["window"][0].comparisons if c.detectable for x in c.detectable]
    limit = window_range(records)
    beyond = sum(x > limit for x in window)
    return (f"\n## Limits of the window endpoint (post hoc)\n\nWritten after the runs; the pre-registered "
            f"decision above is unchanged.\n\n"
            f"- **Its band is narrower than the noise of one evaluation.** Within {WINDOW_POINTS:g} point is at most "
            f"{math.floor(WINDOW_POINTS * VALIDATION_IMAGES / 100)} of {VALIDATION_IMAGES} images; one evaluation's "
            f"binomial standard error at the seeds' best runs' mean accuracy at depth {DEEP}, "
            f"{100 * accuracy:.1f}%, is {binomial_se_points(accuracy):.2f} points (100 · √(p (1 − p) / N)), so "
            f"whether a rate falls inside the window is decided largely by which images a run happens to get "
            f"right.\n"
            f"- **It counts rates near the column's own best, not rates that train well.** A column equally poor "
            f"at every rate scores the widest window, {len(RATES)}.\n"
            f"- **It can differ by {limit:g} rates at most.** Every seed here has a run that did not diverge, so "
            f"1 ≤ W ≤ {len(RATES)}; {beyond} of the window's {len(window)} detectable differences lie beyond "
            f"{limit:g} and are given as \"{OUT_OF_RANGE}\".\n"
            f"- **The formula is optimistic.** Simulating Welch's test at the observed SDs needs "
            f"{100 * low:.0f}% to {100 * high:.0f}% more than the difference that the formula taking the SDs as "
            f"known (`sweep.detectable_difference`, behind the pre-registration's power statement) gives.\n")


def write_report(out: str = OUT, command: str = "python experiments/rate_window.py") -> str:
    """``report.md``: each endpoint's decision (or "interim: not decided") with every statistic, every seed's
    value, and the descriptive grids of both depths, from the finished records."""
    records = finished_records(out)
    parts = [f"# The usable rate window at depth {DEEP}: the pre-registered test\n\n"
             f"Command: `{command}`. Design, endpoints, statistics and decision rule were fixed before the first "
             f"run: [preregistration.md](preregistration.md). {len(records)} of {len(specs())} runs finished.\n\n"
             f"Per comparison (`cait_claims.compare`): Welch's t-test on the endpoint's values of the runs that did "
             f"not diverge (difference of means, Welch–Satterthwaite 95% CI, t, df) and, when a run diverged in "
             f"either column, Fisher's exact test on the divergence counts; Holm's correction over every test of "
             f"one endpoint's {_OTHERS} comparisons (family-wise α = {ALPHA:g}). A diverged run is `div`. "
             f"\"detectable\" (post hoc: added after the runs, a statement of resolution, not a rule; "
             f"`cait_claims.simulated_detectable`): the difference Welch's test detects with {POWER:.0%} "
             f"probability at the comparison's observed SDs and seeds, at Holm's strictest level α/m and at α, by "
             f"simulating the test ({SIMULATION_DRAWS:,} seeded draws) rather than by the formula that takes the "
             f"SDs as known; one beyond what the comparison can show in the claimed direction — for the window "
             f"the {window_range(records)} rates two windows can differ by, for an accuracy 100 minus the other "
             f"column's mean, as no run scores above 100% (`cait_claims.accuracy_headroom`, as in the depth "
             f"ablation's claims.md) — is \"{OUT_OF_RANGE}\", an accuracy's with that range. The limits of the "
             f"window endpoint are [below](#limits-of-the-window-endpoint-post-hoc).\n\n"
             f"![Each run's validation accuracy below its seed's best, per column, rate and depth; the window is the "
             f"band within {WINDOW_POINTS:g} point](window.png)\n"]
    analyses = analyse(records)
    for endpoint, (result, complete) in analyses.items():
        status = f"**{result.verdict}**" if complete else "**interim: not decided** (depth-48 runs missing)"
        header = ["LayerScale vs", "LayerScale per seed", "column per seed", "converged/runs",
                  "difference [95% CI]", "Welch t", "df", "p", "p (Holm)", "diverged (Fisher)",
                  f"detectable, {POWER:.0%} power (α/m / α)", "outcome"]
        rows = _comparison_rows(result, _seed_values(records, endpoint), detectable_text(records, endpoint))
        parts.append(f"\n## Endpoint: {endpoint} — {status}\n\n{result.claim.statement}.\n\n"
                     + sweep.markdown_table(header, rows))
    parts.append(limits_section(records, analyses))
    for depth in (DEEP, SHALLOW):
        parts.append(f"\n## Depth {depth}: validation accuracy (%) of every run, seeds {', '.join(map(str, SEEDS))} "
                     f"(descriptive)\n\n" + _accuracy_grid(records, depth))
    ws = windows(records)
    change = []
    for scheme, warmup in COLUMNS:
        shallow = [ws[(scheme, warmup, SHALLOW, k)] for k in SEEDS if (scheme, warmup, SHALLOW, k) in ws]
        deep = [ws[(scheme, warmup, DEEP, k)] for k in SEEDS if (scheme, warmup, DEEP, k) in ws]
        change.append([da.column_label(scheme, warmup), f"{statistics.mean(shallow):.2f}" if shallow else "–",
                       f"{statistics.mean(deep):.2f}" if deep else "–",
                       f"{statistics.mean(deep) - statistics.mean(shallow):+.2f}" if shallow and deep else "–"])
    parts.append(f"\n## The window from depth {SHALLOW} to {DEEP} (mean W over the finished seeds; descriptive)\n\n"
                 + sweep.markdown_table(["column", f"W @ {SHALLOW}", f"W @ {DEEP}", "change"], change))
    notes = " ".join(filter(None, (sweep.machines_note(records), sweep.compute_note(records))))
    text = "".join(parts) + (f"\n{notes}\n" if notes else "")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def points_below_best(records: Sequence[dict]) -> dict[str, float | None]:
    """``{run_id: 100 · (c_best − c_r) / N}`` for every finished run (None when it diverged): how far below its
    column, depth and seed's best run it fell, in points; the window is the runs at most ``WINDOW_POINTS`` below."""
    out = {}
    for r in records:
        mine = [correct_images(o) for o in _runs(records, r["scheme"], r["warmup"], r["depth"], r["seed"])
                if not o["diverged"]]
        out[r["run_id"]] = None if r["diverged"] else 100 * (max(mine) - correct_images(r)) / VALIDATION_IMAGES
    return out


def figure_axis(below: dict[str, float | None]) -> tuple[float, float]:
    """``window.png``'s linear axis of points below the seed's best: its top, the largest gap rounded up to 5
    points, and the row where diverged runs are drawn, apart above it (the axis is broken between the two)."""
    top = 5 * math.ceil(max([v for v in below.values() if v is not None] + [WINDOW_POINTS]) / 5)
    return top, top * 1.15


def write_figure(out: str = OUT) -> str:
    """``window.png``: a panel per column; each run a mark at its rate and its points below its seed's best
    (``points_below_best``) on a linear axis (equal steps are equal distances), depth 48 filled right of the rate,
    depth 6 open left of it, seeds offset; a diverged run an ``x`` on a separate row past a break in the axis
    (``figure_axis``); the window (within ``WINDOW_POINTS``) shaded and one evaluation's binomial standard error
    at the best runs' accuracy a dotted line; each panel titled with its per-seed W at both depths."""
    import depth_ablation_plots as plots
    records = finished_records(out)
    below, ws = points_below_best(records), windows(records)
    top, diverged_row = figure_axis(below)
    se = binomial_se_points(best_accuracy(records))
    plt = sweep.pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(11, 6.2), sharex=True, sharey=True, layout="constrained")
    for ax, (scheme, warmup) in zip(axes.flat, COLUMNS):
        ax.axhspan(0, WINDOW_POINTS, color="0.85", zorder=0)
        ax.axhline(se, color="black", linewidth=0.6, linestyle=":", zorder=1)
        ax.axhspan(top, (top + diverged_row) / 2, color="white", zorder=2)
        ax.axhline(top * 1.04, color="0.4", linewidth=0.6, linestyle=(0, (4, 3)), zorder=2)   # the axis break
        colour = plots.colour(scheme)
        for depth, filled in ((SHALLOW, False), (DEEP, True)):
            for r in _runs(records, scheme, warmup, depth):      # depth 6 left of the rate, 48 right; seeds spread
                x = r["learning_rate"] * (1.13 if filled else 0.88) * 1.05 ** (r["seed"] - SEEDS[1])
                y = diverged_row if below[r["run_id"]] is None else below[r["run_id"]]
                ax.scatter([x], [y], s=18, marker="x" if r["diverged"] else "o", color=colour, zorder=3,
                           facecolors=(colour if filled else "none") if not r["diverged"] else None, linewidths=0.9)
        title = [da.column_label(scheme, warmup)]
        for depth in (DEEP, SHALLOW):
            seeds = [str(ws[(scheme, warmup, depth, k)]) for k in SEEDS if (scheme, warmup, depth, k) in ws]
            title.append(f"W@{depth}: {', '.join(seeds) or '–'}")
        ax.set_title(f"{title[0]}\n{title[1]}; {title[2]}", fontsize=8)
        ax.set_xscale("log")
        ax.set_xticks(RATES, [f"{r:g}" for r in RATES], fontsize=7)
        ax.minorticks_off()
        ax.set_ylim(-0.5, diverged_row + top * 0.06)
        ticks = list(range(0, int(top) + 1, 5 if top <= 30 else 10))
        ax.set_yticks(ticks + [diverged_row], [str(t) for t in ticks] + ["diverged"], fontsize=7)
        ax.tick_params(axis="y", labelleft=True)
    axes[0][0].invert_yaxis()                      # shared: best at the top, diverged at the bottom
    for ax in axes[:, 0]:
        ax.set_ylabel("points below the seed's best (linear)", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel("learning rate", fontsize=8)
    decided = {e: (r.verdict if complete else "interim") for e, (r, complete) in analyse(records).items()}
    seeds = ", ".join(map(str, SEEDS))
    fig.suptitle(plots.wrap(f"Validation accuracy below each seed's best run (seeds {seeds}, offset; "
                 f"filled, right of each rate: depth {DEEP}; open, left: depth {SHALLOW}; x, past the dashed break: "
                 f"diverged). Shaded: within {WINDOW_POINTS:g} point, the window; dotted: one evaluation's binomial "
                 f"SE, {se:.2f} points at {100 * best_accuracy(records):.1f}% on {VALIDATION_IMAGES} images — the "
                 f"band is narrower than the noise. {len(records)} of {len(specs())} runs.", 175) + "\n"
                 + "; ".join(f"{e}: {v}" for e, v in decided.items()), fontsize=8)
    path = os.path.join(out, "window.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_preregistration(out: str = OUT) -> str:
    return sweep.write_preregistration(out, PREREGISTRATION, "rate_window.PREREGISTRATION")


def report() -> str:
    write_figure()
    return write_report()


def main(argv=None) -> None:
    sweep.registered_study_command(argv, __doc__.split("\n\n")[0], write_preregistration, run, report)


if __name__ == "__main__":
    main()
