"""CaiT's depth claims as tests fixed before the final runs: the comparisons that decide each claim, their
statistics, and the rule that turns them into a verdict.

Written on 2026-12-02 while the rate sweep ran, before any final run existed (``git log`` dates this file), so the
rules were not fitted to the results they judge. ``depth_ablation.py --protocol final`` writes the verdicts to
``final/<protocol>/claims.md``, once per rate choice.

Each claim is a family of comparisons "cell A trains better than cell B", a cell being a column (scheme, warm-up)
at a depth; *deep* means the grid's two largest depths (48 and 96), *shallow* its smallest (6). From Touvron et
al., *Going deeper with Image Transformers* (CaiT, 2021), §3, Fig. 3 and Table 1:

1. A plain pre-norm ViT gets worse as it gets deeper: ``none`` shallow > ``none`` at each deep depth.
2. LayerScale keeps deep models training: ``layerscale`` > ``none`` at each deep depth.
3. A per-channel λ beats one scalar per branch: ``layerscale`` > ``scalar`` at each deep depth.
4. Schemes that remove the normalisation fall behind: ``layerscale`` > ``rezero`` (4a) and > ``skipinit`` (4b),
   each with and without warm-up (CaiT's variant b), at each deep depth.
5. ε has to shrink with depth: ``layerscale`` (CaiT's rule) > ``layerscale_eps0.1`` at each deep depth where the
   rule's ε is not 0.1 (depth > 18; below, the two columns are the same model).
6. Asked by this ablation, not claimed by CaiT: ReZero and SkipInit need warm-up — each with > without, at each
   deep depth.

Per comparison, over the final runs (seeds) of both cells:

- accuracy: Welch's t-test on the final test accuracy of the runs that did not diverge (at least two a side),
  reported with the difference of means and its Welch–Satterthwaite 95% confidence interval;
- divergence, only when a run diverged in either cell (otherwise the test's p is 1): Fisher's exact test on
  diverged / converged counts.

Within a claim, Holm's step-down correction over all its tests holds the family-wise error at ``ALPHA`` = 0.05. A
comparison is *as claimed* when one of its tests is significant after correction in the claimed direction (higher
accuracy, fewer divergences) and none in the other, *against* in the opposite case, *mixed* with both, *not
resolved* with neither. A claim is **reproduced** (some comparison as claimed, none against), **not reproduced:
contradicted** (some against, none as claimed), **not reproduced: mixed** (both), **not reproduced: no difference
resolved** (nothing significant; the intervals bound the difference the data allow), or **not tested** (no
comparison could be tested: its cells have no runs); while some of a claim's comparisons still lack runs (or, given
the protocol's seeds per cell, some of them) it has no verdict (**interim**: its Holm family is incomplete, the
tested rows are shown as they stand). Whether a reproduced
or failed claim is comparable with CaiT's ImageNet setting at all is the write-up's judgement
(experiments/README.md), not a rule here."""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Sequence

import sweep

ALPHA = 0.05
POWER = 0.8              # for the detectable difference stated next to every comparison (post hoc, not a rule)
SIMULATION_DRAWS = 20_000   # post hoc: the seeded Monte Carlo draws behind each detectable difference
DEEP_DEPTHS = 2          # how many of the grid's largest depths are "deep"

Cell = tuple  # (scheme, warmup, depth)


@dataclasses.dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    comparisons: tuple[tuple[Cell, Cell], ...]   # (cell claimed better, cell claimed worse)


def cait_claims(depths: Sequence[int]) -> tuple[Claim, ...]:
    """The claims of the module docstring on a grid of ``depths``."""
    from layerscale_jax.layers.scaling import cait_init_value

    shallow = min(depths)
    deep = sorted(d for d in depths if d > shallow)[-DEEP_DEPTHS:]
    where = ", ".join(str(d) for d in deep)

    def layerscale_vs(scheme, warmups=(True,), at=deep):
        return tuple((("layerscale", True, d), (scheme, w, d)) for w in warmups for d in at)

    both = "with and without warm-up"
    return (
        Claim("1", f"A plain pre-norm ViT gets worse with depth: `none` at depth {shallow} > `none` at depth {where} "
                   "(CaiT §3, Fig. 3)", tuple((("none", True, shallow), ("none", True, d)) for d in deep)),
        Claim("2", f"LayerScale keeps deep models training: `layerscale` > `none` at depth {where} (CaiT §3, Fig. 3)",
              layerscale_vs("none")),
        Claim("3", f"A per-channel λ beats one scalar per branch: `layerscale` > `scalar` at depth {where} (CaiT §3)",
              layerscale_vs("scalar")),
        Claim("4a", f"Removing the normalisation falls behind: `layerscale` > `rezero` ({both}, CaiT's variant b) at "
                    f"depth {where} (CaiT §3, Table 1)", layerscale_vs("rezero", (True, False))),
        Claim("4b", f"Removing the normalisation falls behind: `layerscale` > `skipinit` ({both}, CaiT's variant b) "
                    f"at depth {where} (CaiT §3, Table 1)", layerscale_vs("skipinit", (True, False))),
        Claim("5", "ε has to shrink with depth: `layerscale` (CaiT's ε rule) > `layerscale_eps0.1` at depth "
                   + (", ".join(str(d) for d in deep if cait_init_value(d) != 0.1) or "– (none deeper than 18)")
                   + " (CaiT §3; depth ≤ 18 is the same model)",
              layerscale_vs("layerscale_eps0.1", at=[d for d in deep if cait_init_value(d) != 0.1])),
        Claim("6", f"Not CaiT's: ReZero and SkipInit need warm-up: each with > without, at depth {where}",
              tuple(((s, True, d), (s, False, d)) for s in ("rezero", "skipinit") for d in deep)),
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order: sorted ascending, the i-th smallest (from 0) times
    ``m − i``, made non-decreasing, capped at 1. (Not statsmodels' ``multipletests``: it would be the only user of
    statsmodels, pandas and patsy, for these six lines.)"""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


@dataclasses.dataclass(frozen=True)
class Difference:
    """Mean of A minus mean of B with its Welch–Satterthwaite confidence interval, and Welch's test."""
    difference: float
    ci_low: float
    ci_high: float
    t: float
    dof: float
    p: float


def welch_difference(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Difference:
    """``mean(a) − mean(b) ± t_{(1+confidence)/2, ν} · √(s_a²/n_a + s_b²/n_b)``, ν the Welch–Satterthwaite degrees
    of freedom, with ``sweep.welch``'s t and two-sided p. Both samples constant: no test (ValueError)."""
    from scipy import stats

    se = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    if se == 0:
        raise ValueError("welch_difference: both samples are constant, no test")
    test = sweep.welch(a, b)
    half = float(stats.t.ppf((1 + confidence) / 2, test.dof)) * se
    d = statistics.mean(a) - statistics.mean(b)
    return Difference(d, d - half, d + half, test.t, test.dof, test.p)


def holm_interval(difference: Difference, tests: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The interval at Holm's strictest level α/m (m = ``tests``, the family's tests; Bonferroni's simultaneous
    interval): ``d ± t_{1−α/(2m), ν} · se`` with ``se = (ci_high − ci_low) / (2 · t_{0.975, ν})``. What the
    corrected family can rule out; the unadjusted 95% interval is narrower and rules out more than the family's
    error rate backs."""
    from scipy import stats

    se = (difference.ci_high - difference.ci_low) / 2 / float(stats.t.ppf(0.975, difference.dof))
    half = float(stats.t.ppf(1 - alpha / 2 / tests, difference.dof)) * se
    return difference.difference - half, difference.difference + half


def fisher_divergence(diverged_a: int, n_a: int, diverged_b: int, n_b: int, alternative: str = "two-sided") -> float:
    """p of Fisher's exact test that A and B diverge equally often; ``alternative="greater"``: one-sided, against
    A diverging more often."""
    from scipy import stats
    table = [[diverged_a, n_a - diverged_a], [diverged_b, n_b - diverged_b]]
    return float(stats.fisher_exact(table, alternative=alternative).pvalue)


@dataclasses.dataclass
class Comparison:
    better: Cell                  # as claimed
    worse: Cell
    runs: str                     # "converged/runs vs converged/runs"
    accuracy: Difference | None   # None: fewer than two converged runs a side
    divergence: tuple[int, int, float] | None   # (diverged A, diverged B, Fisher p); None: no run diverged
    spread: tuple[float, float, int, int] | None = None   # (SD of A, SD of B, n A, n B) of the converged runs
    accuracy_p_holm: float | None = None
    divergence_p_holm: float | None = None
    outcome: str = "not tested"
    detectable: tuple[float, float] | None = None   # (Holm's α/m, α), post hoc: set by ``simulate_detectable``
    worse_mean: float | None = None   # mean of the claimed-worse cell's converged runs (with ``spread``)

    def tests(self) -> list[float]:
        return ([self.accuracy.p] if self.accuracy else []) + ([self.divergence[2]] if self.divergence else [])


def compare(records: list[dict], better: Cell, worse: Cell, value) -> Comparison | None:
    """The two cells' runs compared (``value(record)``: accuracy in %); None when a cell has no run."""
    def cell(c):
        return [r for r in records if (r["scheme"], r["warmup"], r["depth"]) == tuple(c)]
    a_runs, b_runs = cell(better), cell(worse)
    if not a_runs or not b_runs:
        return None
    a = [value(r) for r in a_runs if not r["diverged"]]
    b = [value(r) for r in b_runs if not r["diverged"]]
    accuracy = None
    if len(a) >= 2 and len(b) >= 2:
        try:
            accuracy = welch_difference(a, b)
        except ValueError:
            accuracy = None
    k_a, k_b = len(a_runs) - len(a), len(b_runs) - len(b)
    divergence = (k_a, k_b, fisher_divergence(k_a, len(a_runs), k_b, len(b_runs))) if k_a or k_b else None
    spread = (statistics.stdev(a), statistics.stdev(b), len(a), len(b)) if accuracy else None
    return Comparison(better, worse, f"{len(a)}/{len(a_runs)} vs {len(b)}/{len(b_runs)}", accuracy, divergence,
                      spread, worse_mean=statistics.mean(b) if accuracy else None)


def detectable(spread: tuple[float, float, int, int], tests: int, alpha: float = ALPHA, power: float = POWER
               ) -> tuple[float, float]:
    """The difference of means (points) a comparison's Welch test detects with probability ``power`` at the
    observed SDs and sizes (``sweep.detectable_difference``), at Holm's strictest level α/``tests`` (the smallest p
    of the family) and at its loosest, α. The formula takes the SDs as known, which makes it optimistic at a few
    seeds: the reports state ``simulate_detectable``'s instead, and ``rate_window`` sets the two side by side."""
    return (sweep.detectable_difference(*spread, alpha / tests, power),
            sweep.detectable_difference(*spread, alpha, power))


def _welch_draws(spread: tuple[float, float, int, int], alpha: float, draws: int, seed: int):
    """``(mean_a, mean_b, critical)`` per draw at δ = 0 (``simulated_power``'s draws): a δ shifts ``mean_a`` only, so
    one set serves every δ of a search."""
    import numpy as np
    from scipy import stats

    sd_a, sd_b, n_a, n_b = spread
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, sd_a, (draws, n_a)), rng.normal(0, sd_b, (draws, n_b))
    va, vb = a.var(axis=1, ddof=1) / n_a, b.var(axis=1, ddof=1) / n_b
    dof = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    critical = stats.t.ppf(1 - alpha / 2, dof) * np.sqrt(va + vb)
    return a.mean(axis=1), b.mean(axis=1), critical


def _rejected_share(delta: float, welch_draws) -> float:
    import numpy as np

    mean_a, mean_b, critical = welch_draws
    return float(np.mean(np.abs(delta + mean_a - mean_b) > critical))


def simulated_power(delta: float, spread: tuple[float, float, int, int], alpha: float, draws: int = SIMULATION_DRAWS,
                    seed: int = 0) -> float:
    """The share of ``draws`` simulated pairs of samples — ``n_a`` values ~ N(δ, s_a²) against ``n_b`` ~ N(0, s_b²),
    ``spread = (s_a, s_b, n_a, n_b)`` — in which Welch's two-sided test rejects at ``alpha``: reject when
    ``|x̄_a − x̄_b| > t_{1−α/2, ν̂} · √(ŝ_a²/n_a + ŝ_b²/n_b)``, ν̂ and ŝ from each draw (Welch–Satterthwaite).
    Seeded (``seed``): the same draws for every δ, so power is compared on common random numbers."""
    return _rejected_share(delta, _welch_draws(spread, alpha, draws, seed))


def simulated_detectable(spread: tuple[float, float, int, int], alpha: float, power: float = POWER,
                         draws: int = SIMULATION_DRAWS, seed: int = 0) -> float:
    """The smallest difference of means δ with ``simulated_power(δ) ≥ power`` (bisection to 0.001 points between
    0 and 100 formula-sized steps, ``sweep.detectable_difference``): the detectable difference without the
    formula's assumption that the SDs are known, which makes it optimistic at a few seeds. 0 when both SDs are 0.
    The draws are made once and shared by every δ the bisection tries (the same numbers ``simulated_power`` draws
    for each)."""
    if spread[0] == spread[1] == 0:
        return 0.0
    welch_draws = _welch_draws(spread, alpha, draws, seed)
    low, high = 0.0, 100 * sweep.detectable_difference(*spread, alpha, power)
    while high - low > 1e-3:
        middle = (low + high) / 2
        low, high = (low, middle) if _rejected_share(middle, welch_draws) >= power else (middle, high)
    return high


def simulated_detectable_pair(spread: tuple[float, float, int, int], tests: int, alpha: float = ALPHA,
                              power: float = POWER, draws: int = SIMULATION_DRAWS) -> tuple[float, float]:
    """``simulated_detectable`` at Holm's strictest level α/``tests`` and at its loosest, α (``detectable``'s
    pair, by simulation)."""
    return (simulated_detectable(spread, alpha / tests, power, draws),
            simulated_detectable(spread, alpha, power, draws))


@dataclasses.dataclass
class ClaimResult:
    claim: Claim
    comparisons: list[Comparison]
    missing: list[tuple[Cell, Cell]]
    verdict: str


def evaluate(records: list[dict], claim: Claim, value, alpha: float = ALPHA,
             runs_per_cell: int | None = None) -> ClaimResult:
    """``claim``'s comparisons on ``records``, Holm-corrected over the claim's tests, and its verdict (docstring)."""
    comparisons, missing = [], []
    for better, worse in claim.comparisons:
        c = compare(records, better, worse, value)
        if c is None:
            missing.append((better, worse))
        else:
            comparisons.append(c)
    family = [p for c in comparisons for p in c.tests()]
    adjusted = iter(holm(family))
    for c in comparisons:
        c.accuracy_p_holm = next(adjusted) if c.accuracy else None
        c.divergence_p_holm = next(adjusted) if c.divergence else None
        signs = []
        if c.accuracy and c.accuracy_p_holm < alpha:
            signs.append(1 if c.accuracy.difference > 0 else -1)
        if c.divergence and c.divergence_p_holm < alpha:
            signs.append(1 if c.divergence[0] < c.divergence[1] else -1)
        c.outcome = ("not tested" if not c.tests() else "not resolved" if not signs else
                     "mixed" if len(set(signs)) > 1 else "as claimed" if signs[0] > 0 else "against")
    outcomes = {c.outcome for c in comparisons}

    def cell_runs(cell):
        return sum((r["scheme"], r["warmup"], r["depth"]) == tuple(cell) for r in records)

    complete = [pair for pair in claim.comparisons
                if min(cell_runs(pair[0]), cell_runs(pair[1])) >= (runs_per_cell or 1)]
    if not any(c.tests() for c in comparisons):
        verdict = "not tested"
    elif len(complete) < len(claim.comparisons):   # Holm's family is not complete yet: no verdict on part of it
        verdict = f"interim: {len(complete)} of {len(claim.comparisons)} comparisons have all their runs"
    elif "mixed" in outcomes or {"as claimed", "against"} <= outcomes:
        verdict = "not reproduced: mixed"
    elif "as claimed" in outcomes:
        verdict = "reproduced"
    elif "against" in outcomes:
        verdict = "not reproduced: contradicted"
    else:
        verdict = "not reproduced: no difference resolved"
    return ClaimResult(claim, comparisons, missing, verdict)


def simulate_detectable(result: ClaimResult, alpha: float = ALPHA, power: float = POWER,
                        draws: int = SIMULATION_DRAWS) -> ClaimResult:
    """``result`` with each comparison's ``detectable`` (Holm's α/m, α) by simulating Welch's test at its observed
    SDs and seeds (``simulated_detectable_pair``, seeded: the same numbers every time; m the family's tests). Post
    hoc: it states resolution — a "not reproduced" rules out nothing much smaller than this — and decides nothing."""
    tests = sum(len(c.tests()) for c in result.comparisons)
    for c in result.comparisons:
        c.detectable = simulated_detectable_pair(c.spread, tests, alpha, power, draws) if c.spread else None
    return result


def accuracy_headroom(c: Comparison) -> float:
    """The largest difference of test accuracies (points) the comparison can show in the claimed direction:
    ``100 − x̄_worse``, x̄_worse the claimed-worse cell's mean over its converged runs. The claim is
    μ_better − μ_worse > 0 with μ_better ≤ 100 (no run scores above 100%), so μ_better − μ_worse ≤ 100 − μ_worse;
    μ_worse is unknown and its observed mean stands in for it (a plug-in bound, as the SDs of the simulation are). A
    detectable difference beyond it is a difference this endpoint cannot show: "not detectable within the
    endpoint's range". (The opposite direction, the claimed-worse cell ahead, is bounded by 100 − x̄_better; a
    claim asks about its own direction.)"""
    return 100.0 - c.worse_mean


OUT_OF_RANGE = "not detectable within the endpoint's range"


def _cell_name(cell: Cell) -> str:
    scheme, warmup, depth = cell
    return f"`{scheme}`{'' if warmup else ' (no warm-up)'} @ {depth}"


def _p(p: float | None) -> str:
    return "–" if p is None else f"{p:.3g}"


def detectable_cell(c: Comparison) -> str:
    """``"a / b"``: the detectable difference at Holm's α/m and at α, each beyond the claimed direction's range
    (``accuracy_headroom``) written as ``OUT_OF_RANGE`` followed once by the range, "(range r)"; "–" without an
    accuracy test."""
    if not c.detectable:
        return "–"
    limit = accuracy_headroom(c)
    text = " / ".join(f"{x:.2f}" if x <= limit else OUT_OF_RANGE for x in c.detectable)
    return text + (f" (range {limit:.2f})" if max(c.detectable) > limit else "")


def comparison_cells(c: Comparison, detectable_text=detectable_cell) -> list[str]:
    """One comparison's table cells: converged/runs, difference [95% CI], Welch t, df, p, p (Holm), the divergence
    counts with Fisher's p, the detectable difference (α/m / α, ``detectable_text``) and the outcome."""
    acc, div = c.accuracy, c.divergence
    return [c.runs, f"{acc.difference:+.2f} [{acc.ci_low:+.2f}, {acc.ci_high:+.2f}]" if acc else "–",
            f"{acc.t:.2f}" if acc else "–", f"{acc.dof:.1f}" if acc else "–", _p(acc.p if acc else None),
            _p(c.accuracy_p_holm),
            f"{div[0]} vs {div[1]}: p {_p(div[2])}, Holm {_p(c.divergence_p_holm)}" if div else "none diverged",
            detectable_text(c), c.outcome]


METHOD = (f"Per comparison: Welch's t-test on the final test accuracy of the converged runs (difference of means, "
          f"Welch–Satterthwaite 95% CI, t, df), and when a run diverged in either cell, Fisher's exact test on the "
          f"divergence counts; Holm's correction over every test of a claim (family-wise α = {ALPHA}). Rules fixed "
          f"before any final run: experiments/cait_claims.py. \"detectable\" (added after the runs, a statement of "
          f"resolution, not a rule): the difference the Welch test detects with {POWER:.0%} probability at the "
          f"comparison's observed SDs and seeds, at Holm's strictest level α/m (m the claim's tests) and at α, by "
          f"simulation of Welch's test at the observed SDs (post hoc; {SIMULATION_DRAWS:,} seeded draws, "
          f"`cait_claims.simulated_detectable`) rather than by the formula that takes the SDs as known; one larger "
          f"than the claimed difference can be — 100 minus the claimed-worse cell's mean accuracy, as no run scores "
          f"above 100% — is \"{OUT_OF_RANGE}\", with that range.")


DETECTABLE_HEADER = (f"detectable, {POWER:.0%} power (α/m / α), by simulation of Welch's test at the observed SDs "
                     f"(post hoc)")


def _comparison_name(better: Cell, worse: Cell, marked: frozenset, mark: str) -> str:
    """``"`a` @ 48 vs `b` @ 48"``, followed by ``mark`` when either cell is in ``marked``."""
    return f"{_cell_name(better)} vs {_cell_name(worse)}" + (f" {mark}" if {better, worse} & marked else "")


def write_claims(records: list[dict], path: str, title: str, value, depths: Sequence[int],
                 runs_per_cell: int | None = None, marked: frozenset = frozenset(), mark: str = "‡"
                 ) -> list[ClaimResult]:
    """``claims.md``: per claim its verdict, then its comparisons with every statistic that decided it. The claims
    are those of the planned grid's ``depths``, not of the depths that have finished runs, so an interim report
    judges the pre-registered comparisons (those without runs: "not tested"); a claim one of whose comparisons has
    fewer than ``runs_per_cell`` runs (the protocol's seeds) in a cell is interim. A comparison with a cell in
    ``marked`` carries ``mark`` (the title explains it, e.g. a machine confound)."""
    results = [simulate_detectable(evaluate(records, claim, value, runs_per_cell=runs_per_cell))
               for claim in cait_claims(depths)]
    parts = [f"{title}\n\n{METHOD}\n\n",
             sweep.markdown_table(["claim", "verdict"], ([f"{r.claim.name}. {r.claim.statement}", f"**{r.verdict}**"]
                                                         for r in results))]
    for r in results:
        rows = []
        for c in r.comparisons:
            rows.append([_comparison_name(c.better, c.worse, marked, mark)] + comparison_cells(c))
        rows += [[_comparison_name(a, b, marked, mark), "no runs", "–", "–", "–", "–", "–", "–", "–", "not tested"]
                 for a, b in r.missing]
        parts.append(f"\n### Claim {r.claim.name}: {r.verdict}\n\n{r.claim.statement}.\n\n" + sweep.markdown_table(
            ["comparison (claimed better vs worse)", "converged/runs", "difference of means, points [95% CI]",
             "Welch t", "df", "p", "p (Holm)", "diverged runs (Fisher)",
             DETECTABLE_HEADER, "outcome"], rows))
    with open(path, "w") as f:
        f.write("".join(parts))
    return results
