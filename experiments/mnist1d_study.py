"""The MNIST-1D depth study: a powered, pre-registered test of CaiT's claims off the ceiling (issue 46).

Design, endpoints, statistics and decision rules are fixed in this file (``PREREGISTRATION`` and the analysis
functions below) and committed before the first run; ``results/mnist1d_study/preregistration.md`` is written from
it and a changed design is refused.

    python experiments/mnist1d_study.py                 # train what is missing (resumable), then the report
    python experiments/mnist1d_study.py --shard 1/2     # whole blocks (seeds) of shard 1 of 2; no report
    python experiments/mnist1d_study.py --report        # report.md and study.png from the finished blocks only

A block is one seed: every column × every rate × both depths (32 runs), trained on one machine kind. Each shard
trains its blocks in seed order, and a block started on one machine kind is only continued on that kind
(``--shard`` skips a block begun elsewhere; the report lists such blocks).
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
from collections.abc import Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cait_claims  # noqa: E402  (Holm's step-down adjustment)
import mnist1d_pilot as pilot  # noqa: E402  (the pilot: size, rate grid, seed spread)
import mnist1d_runs as m1  # noqa: E402  (one run: config, training, record)
import power  # noqa: E402  (paired t-test power)
import sweep  # noqa: E402  (records, resume, tables, notes)

OUT = os.path.join(m1.ROOT, "experiments", "results", "mnist1d_study")
STAGE = "study"
COLUMNS = ("none", "layerscale", "layerscale_eps0.1", "scalar")
REFERENCE = "layerscale"
SHALLOW, DEEP = pilot.SHALLOW, pilot.DEEP
DEPTHS = (DEEP, SHALLOW)                  # the order a block trains them in
RATES = pilot.RATES                       # the fixed grid every seed trains
ALPHA, POWER, RESOLVE = pilot.ALPHA, pilot.POWER, pilot.RESOLVE_POINTS
def columns_at(depth: int) -> tuple[str, ...]:
    """The columns trained at ``depth``: at the shallow depth CaiT's rule gives ε = 0.1, so `layerscale_eps0.1` is
    `layerscale` itself and is not trained again."""
    return COLUMNS if depth != SHALLOW else tuple(c for c in COLUMNS if c != "layerscale_eps0.1")


# From the pilot's committed records (experiments/results/mnist1d_pilot/report.md; tests recompute every one).
NUM_TRAIN = 2000                      # stage 1's chosen size
PILOT_DIFFERENCE_SD = 8.98            # pooled SD of the per-seed differences `layerscale − none` (points)
PILOT_DF = 6
PILOT_RULE_SEEDS = 848                # what the pilot's rule asks for at that SD
PILOT_SD_BY_DEPTH = {SHALLOW: 2.51, DEEP: 12.45}     # the same SD at each depth
PILOT_DEEP_MEAN_DIFFERENCE = 21.92    # mean per-seed `layerscale − none` at depth 48 (points)
PILOT_LAYERSCALE_DEEP_SD = 1.17       # SD over seeds of `layerscale` at depth 48, the one deep cell that trained
PILOT_CPU_SECONDS = {SHALLOW: 25.5, DEEP: 175.7}     # mean CPU time of a pilot run per depth (one core)
BUDGET_CPU_HOURS = 15.0               # issue 46's budget for the study
# Assumed SD of a difference between two deep columns that both train (claims 3 and 5; not piloted): two cells of
# LayerScale's spread, independent: √2 · 1.17.
ASSUMED_DEEP_PAIR_SD = math.sqrt(2) * PILOT_LAYERSCALE_DEEP_SD


def block_cpu_seconds() -> float:
    return sum(PILOT_CPU_SECONDS[depth] * len(RATES) * len(columns_at(depth)) for depth in DEPTHS)


NUM_SEEDS = int(BUDGET_CPU_HOURS * 3600 // block_cpu_seconds())  # the most blocks within the budget
SEEDS = tuple(range(1, NUM_SEEDS + 1))


def comparisons_at_deep() -> list[tuple[str, str]]:
    """LayerScale (CaiT's ε) against each other column at the deep depth: claims 2, 5 and 3."""
    return [(REFERENCE, c) for c in COLUMNS if c != REFERENCE]


def detectable(sd: float, tests: int = 3, blocks_: int | None = None, step: float = 0.01) -> float:
    """The smallest difference (points, to ``step``) ``blocks_`` blocks (``NUM_SEEDS``) detect with 80% power in a
    paired two-sided t-test at α/``tests`` (Holm's strictest step), at the difference SD ``sd``."""
    d = step
    while power.paired_power(blocks_ or NUM_SEEDS, d, sd, ALPHA / tests) < POWER:
        d += step
    return round(d, 6)


def preregistration_text() -> str:
    runs_per_block = len(block_runs(1))
    deep_runs = len(RATES) * len(columns_at(DEEP))
    return f"""# Pre-registration: the MNIST-1D depth study (CaiT's claims off the ceiling, powered)

Fixed before the first run of this study (`experiments/mnist1d_study.py`, committed with this text and with its
analysis code; issue 46, item 3). The pilot it is sized from: `experiments/results/mnist1d_pilot/` (its rules were
committed before its runs).

- **Question.** CaiT (Touvron et al. 2021): plain pre-norm ViTs get worse with depth (claim 1); LayerScale beats
  plain pre-norm in deep models (claim 2), a per-channel λ beats one scalar per branch (claim 3), ε has to shrink
  with depth (claim 5: CaiT's rule beats ε = 0.1), and LayerScale lets a deep model train under the recipe a
  shallow one uses (shared recipe). On digits every column sat at 95–98.5% and nothing smaller than 0.6–6.6 points
  could be resolved; here accuracy is off the ceiling (the pilot: plain pre-norm 83% at depth {SHALLOW}), and what
  the registered blocks resolve is stated below, before the runs.
- **Data.** MNIST-1D (`layerscale_jax.data.mnist1d`, the package's generator at its defaults, seed 42):
  num_train = {NUM_TRAIN} (the pilot's choice), 1,000 validation and 10,000 test signals (the SE of one test
  accuracy is at most 0.5 points). Validation selects; test is reported, once, by the analysis below.
- **Model and recipe.** The pilot's: a ViT over 1-D patches of 4 samples, width {m1.EMBED_DIM}, {m1.NUM_HEADS} heads,
  scanned blocks, average pooling; batch 64, {m1.STEPS} AdamW steps, 10% warm-up, cosine decay, weight decay 0.05,
  clipping at 1, label smoothing 0.1, drop path 0.05, no augmentation. Every column the same except its scaling.
- **Columns.** `none` (plain pre-norm); `layerscale` (per-channel λ, CaiT's ε: 0.1 at depth {SHALLOW}, 1e-6 at
  {DEEP}); `layerscale_eps0.1` (ε = 0.1 at every depth: at depth {SHALLOW} it is `layerscale` itself and is not
  trained again); `scalar` (one α per branch, CaiT's ε rule). ReZero and SkipInit are not in this study (the
  budget; the digits study has them).
- **Depths** {SHALLOW} and {DEEP}. **Rates**: the grid {', '.join(f'{r:g}' for r in RATES)} (the pilot's), every
  seed trains every rate: the shared recipe is a factor, not a selection.
- **Blocks.** A block is one seed: every column × every rate × both depths ({runs_per_block} runs), trained on one
  machine kind (CPU model and generation), one run per core (`taskset`, one thread; niced), depth {DEEP} first,
  within a depth rate by rate, every column at a rate before the next. A block begun on one machine kind is
  finished on that kind only; a session on another kind starts new blocks (`seeds_to_train`). **Analysed**: the
  {NUM_SEEDS} complete single-kind blocks with the lowest seeds (seeds 1, 2, …; a block left unfinished on a kind
  that does not return is replaced by the next seed). A run that fails with an error (not a divergence) leaves no
  record and is trained again.
- **Seeds: {NUM_SEEDS} blocks, set by the budget, not by the pilot's rule** (a deviation, stated here before any
  run). The pilot's rule, on its pooled SD of per-seed differences `layerscale − none` in validation accuracy
  ({PILOT_DIFFERENCE_SD:.2f} points, {PILOT_DF} df), asks for {PILOT_RULE_SEEDS} seeds to resolve {RESOLVE:g} point
  at {POWER:.0%} power in a paired two-sided t-test at α = {ALPHA:g}/3. That SD is dominated by depth {DEEP}
  ({PILOT_SD_BY_DEPTH[DEEP]:.2f}; {PILOT_SD_BY_DEPTH[SHALLOW]:.2f} at depth {SHALLOW}), where plain pre-norm has not
  converged in {m1.STEPS} steps and trails LayerScale by 14–40 points. No budget here trains that many: the study
  takes the most blocks the issue's {BUDGET_CPU_HOURS:g} CPU-hours buy at the pilot's measured cost (a block ≈
  {block_cpu_seconds() / 3600:.2f} CPU-hours: depth {DEEP} {PILOT_CPU_SECONDS[DEEP]:g} s, depth {SHALLOW}
  {PILOT_CPU_SECONDS[SHALLOW]:g} s per run), **{NUM_SEEDS}**, and states what they resolve, with {POWER:.0%} power at
  α/3 (exact noncentral t, `power.paired_power`): claim 2 at depth {DEEP} at the pilot's SD there,
  **{detectable(PILOT_SD_BY_DEPTH[DEEP]):.2f} points** (the pilot's mean difference there:
  {PILOT_DEEP_MEAN_DIFFERENCE:+.1f}); the depth-{SHALLOW}
  family (α/2) at its SD, **{detectable(PILOT_SD_BY_DEPTH[SHALLOW], 2):.2f}**; claims 3 and 5 (two deep columns that
  both train; not piloted, SD assumed √2 × LayerScale's spread at depth {DEEP}, {PILOT_LAYERSCALE_DEEP_SD:.2f} →
  {ASSUMED_DEEP_PAIR_SD:.2f}) **{detectable(ASSUMED_DEEP_PAIR_SD):.2f}**. {RESOLVE:g} point is not resolvable at this
  budget; a "not resolved" rules out nothing much smaller than these. The report gives the observed SDs and what
  they detect.
- **Endpoints.** Primary: **test accuracy at each seed's validation-best rate** (per block, column and depth: the
  rate whose run got the most of the 1,000 validation signals right among its runs that did not diverge, ties to
  the lower rate; all diverged: the lowest rate). Secondary: test accuracy at each rate of the grid (the shared
  recipe); test NLL (cross-entropy) at the validation-best rate. Descriptive: validation accuracy, every seed's
  value, divergence counts, the validation-picked rates, machine kinds.
- **Comparisons and families.** At depth {DEEP}: `layerscale` − `none` (claim 2), − `layerscale_eps0.1` (claim 5),
  − `scalar` (claim 3): one family of 3 per endpoint (the primary; each rate's, which test the shared recipe; NLL,
  where lower is better). Claim
  1: `none` @ {SHALLOW} − `none` @ {DEEP} on the primary endpoint, alone. At depth {SHALLOW}: `layerscale` −
  `none`, − `scalar` on the primary endpoint, a family of 2 (secondary).
- **Statistics.** Paired over blocks: per block the difference of the two cells' values; two-sided paired t-test
  (n − 1 df), the mean difference with its t-based 95% CI; Holm's step-down correction within each family,
  family-wise α = {ALPHA:g}. No test and no analysis number is shown before the {NUM_SEEDS} blocks are complete.
- **Decision** per comparison: **as claimed** when Holm's p < {ALPHA:g} and the difference has the claimed sign
  (higher accuracy; lower NLL); **against** when Holm's p < {ALPHA:g} the other way; else **not resolved**, and
  then **equivalent within ±{RESOLVE:g}** when the (1 − 2α/m) t interval lies inside (−{RESOLVE:g}, +{RESOLVE:g})
  point. A claim is **reproduced** when its comparison on the primary endpoint is "as claimed".
- **Divergence.** A run whose loss or gradient turns non-finite stops (the step skipped) at the end of that
  logging window, is recorded as diverged and is never rerun. It enters every endpoint with the test accuracy of
  the state it stopped in (a failed recipe is a failed run); a sensitivity test leaves out the pairs holding a
  diverged run (its p is reported, not a decision). Divergence counts are reported per cell and rate.
- **Machines.** Every record holds its start time, code commit, CPU model and generation, cores allowed, nice
  value, malloc and load. The paired design compares columns within blocks, so a machine kind's effect cancels;
  the report lists each analysed block's kind, and, when kinds differ, the primary differences per kind
  (descriptive).
- **Convergence.** Not a rule of this study: the budget is fixed at {m1.STEPS} steps for every run; each run's
  validation curve (every {m1.EVAL_EVERY} steps) is kept and shown, no run is excluded on it.
- **Cost.** {runs_per_block} runs per block ({deep_runs} at depth {DEEP}), {NUM_SEEDS * runs_per_block} in all, about
  {NUM_SEEDS * block_cpu_seconds() / 3600:.1f} CPU-hours at the pilot's cost (2-core Intel Xeon family 6 model 207,
  one core per run); several sessions, committed as blocks finish.
- **Not claimed either way.** Depths other than {SHALLOW} and {DEEP}, other widths, ReZero/SkipInit, ImageNet: MNIST-1D
  is a 40-sample, 10-class toy; a difference here says what LayerScale does to optimisation in a deep, narrow
  ViT trained briefly, not what it does at ImageNet scale.
"""



# ---------------------------------------------------------------------------------------------------------------
# The runs
# ---------------------------------------------------------------------------------------------------------------
def block_runs(seed: int) -> list[m1.Run]:
    """One block in its training order: depth 48 then 6; within a depth the rates of the grid in order, every
    column at a rate before the next rate."""
    return [m1.Run(STAGE, depth, column, seed, rate, NUM_TRAIN)
            for depth in DEPTHS for rate in RATES for column in columns_at(depth)]


def all_runs(seeds: Sequence[int] = None) -> list[m1.Run]:
    return [r for s in (SEEDS if seeds is None else seeds) for r in block_runs(s)]


def machine_kind(record: dict) -> str:
    m = record.get("machine") or {}
    return ", ".join(filter(None, (m.get("cpu", "unknown CPU"), m.get("cpu_family_model"))))


def finished_records(out: str = OUT) -> list[dict]:
    wanted = {r.run_id for r in all_runs(range(1, 10 * max(NUM_SEEDS or 1, 1) + 1))}
    return [r for r in sweep.load_records(out) if r["run_id"] in wanted]


@dataclasses.dataclass(frozen=True)
class Block:
    seed: int
    records: tuple          # the finished runs of the block
    kinds: tuple            # the machine kinds they ran on

    @property
    def complete(self) -> bool:
        return len(self.records) == len(block_runs(self.seed)) and len(self.kinds) == 1


def blocks(records: Sequence[dict]) -> dict[int, Block]:
    by_seed: dict[int, list] = {}
    for r in records:
        by_seed.setdefault(r["seed"], []).append(r)
    return {s: Block(s, tuple(rs), tuple(sorted({machine_kind(r) for r in rs}))) for s, rs in sorted(by_seed.items())}


def analysed_blocks(records: Sequence[dict]) -> list[Block]:
    """The registered analysis unit: the ``NUM_SEEDS`` complete single-kind blocks with the lowest seeds."""
    return [b for b in blocks(records).values() if b.complete][:NUM_SEEDS]


# ---------------------------------------------------------------------------------------------------------------
# Endpoints
# ---------------------------------------------------------------------------------------------------------------
def _run(block: Block, depth: int, column: str, rate: float) -> dict:
    (record,) = [r for r in block.records if r["depth"] == depth and r["scheme"] == column
                 and math.isclose(r["learning_rate"], rate)]
    return record


def selected_rate(block: Block, depth: int, column: str) -> float:
    """The rate a seed's validation picks for a column and depth: the most validation signals right among its
    runs that did not diverge (ties: the lower rate); when every run diverged, the lowest rate."""
    runs = [_run(block, depth, column, rate) for rate in RATES]
    usable = [r for r in runs if not r["diverged"]]
    if not usable:
        return min(RATES)
    return max(usable, key=lambda r: (m1.validation_correct(r), -r["learning_rate"]))["learning_rate"]


def test_accuracy(record: dict) -> float:
    """Test accuracy (%) of the run's final state (a diverged run: the state it stopped in)."""
    return 100 * record["final_test_accuracy"]


def endpoint_value(block: Block, depth: int, column: str, endpoint: str) -> float:
    """``endpoint``: 'selected' (test accuracy at the seed's validation-best rate), 'nll' (test NLL there), or a
    grid rate's name (test accuracy at that rate)."""
    if endpoint in ("selected", "nll"):
        record = _run(block, depth, column, selected_rate(block, depth, column))
        return record["final_test_loss"] if endpoint == "nll" else test_accuracy(record)
    return test_accuracy(_run(block, depth, column, float(endpoint)))


def diverged(block: Block, depth: int, column: str, endpoint: str) -> bool:
    if endpoint in ("selected", "nll"):
        return _run(block, depth, column, selected_rate(block, depth, column))["diverged"]
    return _run(block, depth, column, float(endpoint))["diverged"]


@dataclasses.dataclass
class Paired:
    """A paired comparison over blocks: mean of ``a − b`` per block with its t interval, the paired t-test."""
    a: tuple                # (depth, column)
    b: tuple
    differences: list
    mean: float
    ci: tuple
    t: float
    p: float
    p_holm: float = math.nan
    excluded_diverged: int = 0      # pairs with a diverged run (kept in the primary test; the sensitivity drops them)
    p_without_diverged: float | None = None
    outcome: str = ""


def paired(values_a: Sequence[float], values_b: Sequence[float], a, b, confidence: float = 0.95) -> Paired:
    """Paired two-sided t-test of ``a − b`` and the ``confidence`` t interval of its mean (n − 1 df)."""
    from scipy import stats
    d = [x - y for x, y in zip(values_a, values_b)]
    n, mean = len(d), statistics.mean(d)
    sd = statistics.stdev(d)
    if sd == 0:
        return Paired(a, b, d, mean, (mean, mean), math.inf if mean else 0.0, 0.0 if mean else 1.0)
    se = sd / math.sqrt(n)
    t = mean / se
    p = float(2 * stats.t.sf(abs(t), n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * se
    return Paired(a, b, d, mean, (mean - half, mean + half), t, p)


def compare(blocks_: Sequence[Block], a: tuple, b: tuple, endpoint: str) -> Paired:
    """``a`` against ``b`` (each ``(depth, column)``) on ``endpoint`` over the blocks, with the sensitivity test
    that leaves out the pairs holding a diverged run (its p, when at least 2 pairs remain)."""
    va = [endpoint_value(k, *a, endpoint) for k in blocks_]
    vb = [endpoint_value(k, *b, endpoint) for k in blocks_]
    result = paired(va, vb, a, b)
    bad = [diverged(k, *a, endpoint) or diverged(k, *b, endpoint) for k in blocks_]
    result.excluded_diverged = sum(bad)
    if any(bad):
        kept = [i for i, x in enumerate(bad) if not x]
        if len(kept) >= 2:
            result.p_without_diverged = paired([va[i] for i in kept], [vb[i] for i in kept], a, b).p
    return result


def decide(results: list[Paired], alpha: float = ALPHA, claimed_sign: int = 1) -> list[Paired]:
    """Holm's step-down over the family; each comparison's outcome: 'as claimed' (adjusted p < α, the difference
    in the claimed direction), 'against' (adjusted p < α, the other direction), else 'not resolved', and then
    'equivalent within ±RESOLVE' when its (1 − 2α/m) interval lies inside (−RESOLVE, +RESOLVE)."""
    from scipy import stats
    adjusted = cait_claims.holm([r.p for r in results])
    m = len(results)
    for r, p in zip(results, adjusted):
        r.p_holm = p
        if p < alpha:
            r.outcome = "as claimed" if r.mean * claimed_sign > 0 else "against"
            continue
        n = len(r.differences)
        sd = statistics.stdev(r.differences)
        half = float(stats.t.ppf(1 - alpha / m, n - 1)) * sd / math.sqrt(n)
        inside = -RESOLVE < r.mean - half and r.mean + half < RESOLVE
        r.outcome = "not resolved" + (f"; equivalent within ±{RESOLVE:g}" if inside else "")
    return results


ENDPOINTS = ("selected",) + tuple(f"{r:g}" for r in RATES)


def analyse(records: Sequence[dict]) -> dict:
    """Every registered test on the analysed blocks: ``{"blocks", "families": {name: [Paired]}}``; an empty
    ``families`` until ``NUM_SEEDS`` complete blocks exist."""
    done = analysed_blocks(records)
    out = {"blocks": done, "families": {}}
    if len(done) < NUM_SEEDS:
        return out
    for endpoint in ENDPOINTS + ("nll",):
        family = [compare(done, (DEEP, a), (DEEP, b), endpoint) for a, b in comparisons_at_deep()]
        out["families"][f"depth {DEEP}: {endpoint}"] = decide(family, claimed_sign=-1 if endpoint == "nll" else 1)
    out["families"]["claim 1: none @ 6 vs @ 48"] = decide([compare(done, (SHALLOW, "none"), (DEEP, "none"),
                                                                   "selected")])
    shallow = [compare(done, (SHALLOW, REFERENCE), (SHALLOW, c), "selected")
               for c in COLUMNS if c not in (REFERENCE, "layerscale_eps0.1")]
    out["families"][f"depth {SHALLOW}: selected"] = decide(shallow)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Training: whole blocks, one machine kind each
# ---------------------------------------------------------------------------------------------------------------
def this_machine_kind() -> str:
    from layerscale_jax.bench.timing import cpu_family_model, cpu_model
    return machine_kind({"machine": {"cpu": cpu_model(), "cpu_family_model": cpu_family_model()}})


def seeds_to_train(records: Sequence[dict], kind: str) -> list[int]:
    """Seeds 1 … NUM_SEEDS, then one more seed for each block begun on another machine kind (which this kind
    leaves alone), so that NUM_SEEDS complete single-kind blocks can exist; the blocks begun on another kind are
    left out of the list."""
    elsewhere = {s for s, b in blocks(records).items() if b.kinds and kind not in b.kinds}
    seeds, candidate = [], 1
    while len(seeds) < NUM_SEEDS:
        if candidate not in elsewhere:
            seeds.append(candidate)
        candidate += 1
    return seeds


def train(which_shard: str | None, out: str = OUT, log=print) -> None:
    """Train shard ``i/n``'s blocks (the ``i``-th, ``i + n``-th, … of ``seeds_to_train``), block by block."""
    kind = this_machine_kind()
    seeds = sweep.shard(seeds_to_train(sweep.load_records(out), kind), which_shard)
    log(f"machine kind {kind}: blocks (seeds) {seeds}")
    for seed in seeds:
        m1.run_all(block_runs(seed), out, log=log)


# ---------------------------------------------------------------------------------------------------------------
# The report and the figure
# ---------------------------------------------------------------------------------------------------------------
FAMILY_CLAIMS = {REFERENCE: "", "none": "claim 2", "layerscale_eps0.1": "claim 5", "scalar": "claim 3"}


NLL_NOTE = ("\nNLL in nats, lower is better. The registered rule's band \"equivalent within ±1\" was written in "
            "accuracy points and is applied here as written: ±1 nat is no equivalence, so for NLL read it as "
            "\"not resolved\" only.\n")


def _cell(depth, column):
    return f"{column} @ {depth}"


def _family_table(family: list[Paired], decimals: int = 2) -> str:
    """One row per comparison, with the observed SD of its per-block differences and the difference that SD lets
    the blocks detect at 80% power at α/m (the registration's promise: "the report gives the observed SDs and what
    they detect"; descriptive, no decision uses them). ``decimals``: 2 for points, 3 for NLL's nats."""
    f = f"+.{decimals}f"
    rows = []
    for r in family:
        sd = statistics.stdev(r.differences)
        found = detectable(sd, len(family), len(r.differences), 10 ** -decimals) if sd else None
        power_note = f"{sd:.{decimals}f}; {found:.{decimals}f}" if sd else "0; –"
        sens = ("–" if r.p_without_diverged is None and not r.excluded_diverged else
                f"{r.excluded_diverged} pair(s); p = {r.p_without_diverged:.3g}" if r.p_without_diverged is not None
                else f"{r.excluded_diverged} pair(s); < 2 left")
        rows.append([f"{_cell(*r.a)} − {_cell(*r.b)}", FAMILY_CLAIMS.get(r.b[1], "") if r.a[0] == r.b[0] else
                     "claim 1", f"{r.mean:{f}} [{r.ci[0]:{f}}, {r.ci[1]:{f}}]", power_note, f"{r.t:.2f}",
                     f"{r.p:.3g}", f"{r.p_holm:.3g}", sens, r.outcome,
                     ", ".join(f"{x:+.{decimals - 1}f}" for x in r.differences)])
    return sweep.markdown_table(["comparison", "claim", "mean difference [95% CI]",
                                 "SD of the differences; detectable at 80% power (α/m)", "t", "p", "p (Holm)",
                                 "pairs with a diverged run; p without them", "outcome", "per block"], rows)


def _grid(done: Sequence[Block], depth: int) -> str:
    rows = []
    for column in columns_at(depth):
        cells = []
        for rate in RATES:
            runs = [_run(b, depth, column, rate) for b in done]
            values = [test_accuracy(r) for r in runs]
            k = sum(r["diverged"] for r in runs)
            cells.append(f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"
                         + (f" ({k} div)" if k else "") if len(values) > 1 else "–")
        picks = [selected_rate(b, depth, column) for b in done]
        cells.append(", ".join(f"{r:g}×{picks.count(r)}" for r in RATES if picks.count(r)))
        rows.append([column] + cells)
    return sweep.markdown_table(["column"] + [f"{r:g}" for r in RATES] + ["validation picks"], rows)


def _per_kind_table(family: list[Paired], done: Sequence[Block], kinds: dict) -> str:
    """The primary family's mean difference on each machine kind's blocks (descriptive)."""
    position = {b.seed: i for i, b in enumerate(done)}
    rows = [[f"{r.a[1]} − {r.b[1]}"] + [f"{statistics.mean(r.differences[position[s]] for s in seeds):+.2f} "
                                         f"({len(seeds)})" for seeds in kinds.values()] for r in family]
    return ("Primary differences per machine kind (mean over its blocks; descriptive):\n\n"
            + sweep.markdown_table(["comparison at depth 48"] + list(kinds), rows))


def write_report(out: str = OUT, command: str = "python experiments/mnist1d_study.py") -> str:
    records = finished_records(out)
    result = analyse(records)
    done = result["blocks"]
    all_blocks = blocks(records)
    parts = [f"# The MNIST-1D depth study: the pre-registered test\n\n"
             f"Command: `{command}`. Design, endpoints, statistics and decision rules were fixed before the first "
             f"run: [preregistration.md](preregistration.md). {len(records)} runs finished in {len(all_blocks)} "
             f"blocks, {sum(b.complete for b in all_blocks.values())} complete; the analysis takes the first "
             f"{NUM_SEEDS} complete single-kind blocks.\n"]
    if not result["families"]:
        parts.append(f"\n**Interim: not decided** ({len(done)} of {NUM_SEEDS} blocks complete). No test is run and "
                     "no number of the analysis is shown before the design's blocks are complete.\n")
    for name, family in result["families"].items():
        nll = name.endswith("nll")
        parts.append(f"\n## {name}\n\n" + _family_table(family, 3 if nll else 2) + (NLL_NOTE if nll else ""))
    if result["families"]:
        for depth in (DEEP, SHALLOW):
            parts.append(f"\n## Depth {depth}: test accuracy (%) at each rate, mean ± SD over the {len(done)} blocks "
                         f"(descriptive)\n\n" + _grid(done, depth))
        kinds = {}
        for b in done:
            kinds.setdefault(b.kinds[0], []).append(b.seed)
        parts.append("\n## Machine kinds of the analysed blocks\n\n" + "".join(
            f"- {kind}: seeds {', '.join(map(str, s))}\n" for kind, s in kinds.items()))
        if len(kinds) > 1:
            parts.append("\n" + _per_kind_table(result["families"][f"depth {DEEP}: selected"], done, kinds))
    unfinished = [b for b in all_blocks.values() if not b.complete]
    if unfinished:
        parts.append("\nBlocks not complete (not analysed): " + "; ".join(
            f"seed {b.seed}: {len(b.records)} of {len(block_runs(b.seed))} runs on {' + '.join(b.kinds)}"
            for b in unfinished) + ".\n")
    notes = " ".join(filter(None, (sweep.machines_note(records), sweep.compute_note(records))))
    text = "".join(parts) + (f"\n{notes}\n" if notes else "")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text


def write_figure(out: str = OUT) -> str | None:
    """``study.png``: test accuracy against the rate per column at each depth (every block a faint line, the mean
    bold, diverged runs as ``x``), and the primary family's paired differences with their 95% intervals."""
    import depth_ablation_plots as plots
    records = finished_records(out)
    result = analyse(records)
    if not result["families"]:
        return None
    done = result["blocks"]
    plt = sweep.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), layout="constrained")
    for ax, depth in zip(axes, DEPTHS):
        for column in columns_at(depth):
            colour = plots.colour(column)
            for b in done:
                runs = [_run(b, depth, column, rate) for rate in RATES]
                ax.plot(RATES, [test_accuracy(r) for r in runs], color=colour, alpha=0.15, lw=0.7)
                for rate, r in zip(RATES, runs):
                    if r["diverged"]:
                        ax.scatter([rate], [test_accuracy(r)], marker="x", color=colour, s=14)
            means = [statistics.mean(test_accuracy(_run(b, depth, column, rate)) for b in done) for rate in RATES]
            ax.plot(RATES, means, color=colour, lw=2, marker="o", ms=3, label=column,
                    ls="--" if column == "layerscale_eps0.1" else "-")     # else it hides `layerscale` below it
        ax.set_xscale("log")
        ax.set_xticks(RATES, [f"{r:g}" for r in RATES])
        ax.minorticks_off()
        ax.set_xlabel("learning rate (shared by every column)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"depth {depth}: {len(done)} blocks (faint), mean (bold), x diverged", fontsize=9)
        ax.legend(fontsize=7)
    ax = axes[2]
    family = result["families"][f"depth {DEEP}: selected"]
    for i, r in enumerate(family):
        ax.scatter(r.differences, [i] * len(r.differences), color="0.6", s=10)
        ax.errorbar([r.mean], [i], xerr=[[r.mean - r.ci[0]], [r.ci[1] - r.mean]], fmt="o", color="k", capsize=3)
    ax.axvline(0, color="0.3", lw=0.8)
    for x in (-RESOLVE, RESOLVE):
        ax.axvline(x, color="0.6", lw=0.8, ls=":")
    ax.set_yticks(range(len(family)), [f"− {r.b[1]}\n{r.outcome.replace('; ', ';\n')}" for r in family], fontsize=7)
    ax.set_xlabel(f"layerscale − other at depth {DEEP}, each seed's\nvalidation-best rate (points)")
    ax.set_title(f"primary: every block, mean, 95% CI; dotted ±{RESOLVE:g}", fontsize=9)
    path = os.path.join(out, "study.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


PREREGISTRATION = preregistration_text() if NUM_SEEDS else ""


def write_preregistration(out: str = OUT) -> str:
    if not PREREGISTRATION:
        raise ValueError("the study is not registered yet (the pilot's numbers are not in mnist1d_study.py)")
    return sweep.write_preregistration(out, PREREGISTRATION, "mnist1d_study.PREREGISTRATION")


def report() -> str:
    write_figure()
    return write_report()


def main(argv=None) -> None:
    sweep.registered_study_command(argv, __doc__.split("\n\n")[0], write_preregistration, train, report)


if __name__ == "__main__":
    main()
