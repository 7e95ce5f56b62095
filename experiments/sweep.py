"""A grid of training runs as a resumable sweep, and what to say about its results: the machinery a study in
``experiments/`` shares (the depth ablation and the fine-tuning comparison use it).

A study defines its runs (``specs``: any objects with a unique ``run_id``) and how to train one (``train(spec) ->
record``, a JSON-able dict). ``run`` trains each spec whose record ``OUT/runs/<run_id>.json`` does not exist yet,
writing the record atomically when the run ends, so a stopped sweep continues where it stopped and a finished run is
never trained twice. A run that diverges is an outcome, not an error: ``train`` returns its record with
``diverged=True`` and the tables count it. ``shard(specs, "i/n")`` gives one machine of ``n`` its share of the grid
(a SLURM array task, one of several hosts); their ``OUT/runs/`` folders merged (copied together, or read together
with ``load_records(dir1, dir2, ...)``) are the whole sweep's records.

Statistics over the seeds of a cell: mean, sample standard deviation and the t-based 95% confidence interval of the
mean, ``mean ± t_{0.975, n−1} · s / √n`` (``summarise``); Welch's unequal-variance t-test between two cells
(``welch``: ``t = (m_a − m_b) / √(s_a²/n_a + s_b²/n_b)`` with Welch–Satterthwaite degrees of freedom, two-sided p).
Tables are markdown (``markdown_table``, ``mean_std_cell``); ``pyplot`` gives matplotlib for files. Choosing on
validation and reporting on test (rate bracketing, convergence, split discipline, CI tables and Welch comparisons)
is ``validation_protocol.py``'s.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import statistics
import time
from typing import Callable, Iterable, Sequence

from layerscale_jax.bench.timing import machine_info

# ---------------------------------------------------------------------------------------------------------------
# Records and the resumable, shardable run loop
# ---------------------------------------------------------------------------------------------------------------


def record_path(out: str, run_id: str) -> str:
    """Where the record of run ``run_id`` of the sweep in ``out`` lives."""
    return os.path.join(out, "runs", run_id + ".json")


def load_records(*outs: str) -> list[dict]:
    """Every finished run's record under ``OUT/runs/`` of each of ``outs`` (several: the shards of one sweep, run on
    different machines), sorted by file name. Two different records under one run id are an error naming it."""
    by_name: dict[str, dict] = {}
    for out in outs:
        runs_dir = os.path.join(out, "runs")
        if not os.path.isdir(runs_dir):
            continue
        for name in sorted(os.listdir(runs_dir)):
            if not name.endswith(".json"):
                continue
            with open(os.path.join(runs_dir, name)) as f:
                record = json.load(f)
            if name in by_name and by_name[name] != record:
                raise ValueError(f"two different records of run {name[:-5]!r} (one in {runs_dir}): merge the shards "
                                 "of one sweep only")
            by_name[name] = record
    return [by_name[name] for name in sorted(by_name)]


def write_json_atomically(path: str, obj) -> None:
    """Write ``obj`` as JSON so that ``path`` is either absent or complete (a kill mid-write leaves no record)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def save_json(path: str, obj) -> None:
    """``write_json_atomically``, creating ``path``'s folder first (a stage's outputs such as ``rates.json``)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json_atomically(path, obj)


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (1 ≤ i ≤ n) → ``(i, n)``; anything else is a ``ValueError`` naming the value."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard={text!r} must be i/n, e.g. 1/4 (this machine's share of n)") from None
    if not 1 <= index <= count:
        raise ValueError(f"--shard={text!r} must have 1 ≤ i ≤ n")
    return index, count


def shard(specs: Sequence, which: str | tuple[int, int] | None) -> list:
    """Shard ``i/n`` of ``specs``: every n-th spec from the i-th on, so each shard gets a similar mix of the grid's
    order (e.g. cheap runs and every seed early). ``None``: all of them."""
    if which is None:
        return list(specs)
    index, count = parse_shard(which) if isinstance(which, str) else which
    return list(specs[index - 1::count])


def format_seconds(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def run(specs: Sequence, train: Callable[[object], dict], out: str, *, cost: Callable[[object], float] = lambda s: 1.0,
        outcome: Callable[[dict], str] | None = None, log=print) -> list[dict]:
    """Train every spec without a record in ``out`` (finished runs are skipped, also one another process records
    while this one works), printing progress and an ETA.

    ``train(spec)`` returns the run's record, which must hold ``seconds`` (its wall time) and ``diverged``; ``run``
    adds ``cpu_seconds``, the process's CPU time over the run (all its threads; unlike ``seconds`` it leaves out
    time the process was stopped or waiting for a core), ``started_utc`` (when it started), ``code``
    (``code_version``: the git commit it ran and whether the checkout differed from it) and ``machine``: what it ran
    on (CPU model, threads, the cores it was allowed, its nice value, accelerator, versions) and the load average at
    its start and end (``layerscale_jax.bench.timing.machine_info``), so a number in a record names its code and
    machine. The ETA
    assumes a run's time is proportional to ``cost(spec)`` (e.g. the depth) and extrapolates from the runs trained
    in this session. ``outcome(record)`` is the log's word on a finished run (default: ``DIVERGED`` or ``done``)."""
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    todo = [s for s in specs if not os.path.exists(record_path(out, s.run_id))]
    done_before = len(specs) - len(todo)
    log(f"{len(specs)} runs in the grid, {done_before} already finished, {len(todo)} to train")
    seconds_done, cost_done = 0.0, 0.0
    cost_left = sum(cost(s) for s in todo)
    for i, spec in enumerate(todo):
        if os.path.exists(record_path(out, spec.run_id)):        # another process (a shard) finished it meanwhile
            cost_left -= cost(spec)
            log(f"[{done_before + i + 1}/{len(specs)} runs done] {spec.run_id}: recorded by another process")
            continue
        load_at_start = [round(x, 2) for x in os.getloadavg()]
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        cpu_start = time.process_time()
        record = train(spec)
        record["cpu_seconds"] = time.process_time() - cpu_start
        record["started_utc"], record["code"] = started, code_version()
        record["machine"] = {**machine_info(), "load_average_start": load_at_start,
                             "cpu_affinity": sorted(os.sched_getaffinity(0)), "nice": os.nice(0)}
        write_json_atomically(record_path(out, spec.run_id), record)
        seconds_done += record["seconds"]
        cost_done += cost(spec)
        cost_left -= cost(spec)
        eta = cost_left * seconds_done / cost_done if cost_done > 0 else math.nan
        said = "DIVERGED" if record["diverged"] else (outcome(record) if outcome else "done")
        log(f"[{done_before + i + 1}/{len(specs)} runs done] {spec.run_id}: {said} in {record['seconds']:.1f} s"
            f" | ETA {format_seconds(eta)}")
    return load_records(out)


def code_version() -> dict:
    """``{"commit": HEAD of this checkout, "modified": whether tracked files differ from it}`` (``None``s outside a
    git checkout): the code a record's run trained with."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        proc = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return proc.stdout.strip() if proc.returncode == 0 else None
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "modified": None if status is None else bool(status)}


def enable_compilation_cache(directory: str | None = None) -> None:
    """JAX's persistent compilation cache: the seeds of a cell (and a resumed sweep) reuse the compiled train,
    eval and diagnostics steps, which differ only in their data, not their program."""
    import jax
    directory = directory or os.path.join(os.path.expanduser("~"), ".cache", "layerscale_jax", "xla")
    if not jax.config.jax_compilation_cache_dir:
        os.makedirs(directory, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", directory)


def estimate_seconds(costs: dict[float, dict], xs: Sequence[float], steps: int, evals: int) -> float:
    """The wall time of runs at sizes ``xs`` (e.g. each run's depth) from ``costs[x]`` measured at a few sizes
    (``setup``, ``first_step``, ``per_step``, ``evaluations`` in seconds, of a run with one evaluation): Σ over runs
    of fixed cost + ``steps`` × per-step cost, both linear in x (least squares over the measured sizes; the fixed
    cost is setup + first step + ``evals`` evaluations, uncached compiles assumed)."""
    import numpy as np
    measured = np.array(sorted(costs), float)

    def fit(values):
        if len(measured) == 1:
            return 0.0, float(values[0])
        slope, intercept = np.polyfit(measured, values, 1)
        return float(slope), float(intercept)

    step_fit = fit([costs[x]["per_step"] for x in sorted(costs)])
    fixed_fit = fit([costs[x]["setup"] + costs[x]["first_step"] + costs[x]["evaluations"] * evals
                     for x in sorted(costs)])
    line = lambda f, x: max(f[0] * x + f[1], 0.0)  # noqa: E731
    return sum(line(fixed_fit, x) + steps * line(step_fit, x) for x in xs)


# ---------------------------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Summary:
    """The seeds of one cell: count, mean, sample standard deviation (ddof 1; 0 for one value) and the t-based
    confidence interval of the mean (``(mean, mean)`` for one value: no interval can be stated)."""
    n: int
    mean: float
    std: float
    ci_low: float
    ci_high: float


def summarise(values: Iterable[float], confidence: float = 0.95) -> Summary:
    """``Summary`` of ``values``: the CI is ``mean ± t_{(1+confidence)/2, n−1} · s / √n`` (Student's t)."""
    from scipy import stats

    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarise: no values")
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    if std == 0:                                   # one value, or all equal: scipy's interval needs a positive scale
        return Summary(len(values), mean, std, mean, mean)
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=std / math.sqrt(len(values)))
    return Summary(len(values), mean, std, float(low), float(high))


@dataclasses.dataclass(frozen=True)
class Welch:
    t: float
    dof: float
    p: float             # two-sided


def welch(a: Iterable[float], b: Iterable[float]) -> Welch:
    """Welch's t-test of equal means without assuming equal variances (at least two values in each)."""
    from scipy import stats

    a, b = [float(v) for v in a], [float(v) for v in b]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"welch: needs at least 2 values per group, got {len(a)} and {len(b)}")
    result = stats.ttest_ind(a, b, equal_var=False)
    return Welch(float(result.statistic), float(result.df), float(result.pvalue))


def detectable_difference(sd_a: float, sd_b: float, n_a: int, n_b: int, alpha: float, power: float = 0.8) -> float:
    """The smallest difference of means a two-sided Welch test of ``n_a`` against ``n_b`` values detects with
    probability ``power`` at level ``alpha``, the samples' SDs taken as known (the usual approximation):
    ``(t_{1−α/2, ν} + t_{power, ν}) · √(s_a²/n_a + s_b²/n_b)``, ν the Welch–Satterthwaite degrees of freedom."""
    from scipy import stats

    va, vb = sd_a ** 2 / n_a, sd_b ** 2 / n_b
    if va + vb == 0:
        return 0.0
    dof = (va + vb) ** 2 / (va ** 2 / (n_a - 1) + vb ** 2 / (n_b - 1))
    return float(stats.t.ppf(1 - alpha / 2, dof) + stats.t.ppf(power, dof)) * math.sqrt(va + vb)


# ---------------------------------------------------------------------------------------------------------------
# Pre-registration
# ---------------------------------------------------------------------------------------------------------------
def write_preregistration(out: str, text: str, owner: str) -> str:
    """Write ``out/preregistration.md`` (``text``, the driver's ``owner``) before a pre-registered test's first run;
    once it exists, a ``text`` that differs from it is a ValueError: the runs would test something else than was
    registered, and a changed design is a new test, with its own folder."""
    path = os.path.join(out, "preregistration.md")
    if os.path.exists(path):
        with open(path) as f:
            if f.read() != text:
                raise ValueError(f"{path} differs from {owner}: the design changed after it was registered; a "
                                 f"changed design is a new test, with its own folder")
        return path
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


def registered_study_command(argv, description: str, register: Callable[[], object],
                             train: Callable[[str | None], object], report: Callable[[], str]) -> None:
    """The command line of a pre-registered study: ``--shard I/N`` trains shard I of N and writes no report,
    ``--report`` only writes the report from the finished runs, neither trains everything missing then reports.
    ``register()`` writes the pre-registration first (a design that differs from the committed one is refused);
    a bad ``--shard`` or a changed design is one ``error:`` line and exit status 2."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--shard", default=None, metavar="I/N", help="train only shard I of N; no report")
    parser.add_argument("--report", action="store_true", help="only write the report from the finished runs")
    args = parser.parse_args(argv)
    try:
        if args.shard:
            parse_shard(args.shard)
        register()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if not args.report:
        train(args.shard)
    if not args.shard:
        print(report())


# ---------------------------------------------------------------------------------------------------------------
# Tables and plots
# ---------------------------------------------------------------------------------------------------------------
def diverged_note(diverged: int, n: int) -> str:
    return f" ({diverged}/{n} diverged)" if diverged else ""


def mean_std_cell(values: Sequence[float], diverged: int = 0, digits: int = 1) -> str:
    """``"mean ± std"`` (one value: the value; none: ``–``), then ``(k/n diverged)`` when k > 0."""
    if not values:
        return "–"
    s = summarise(values)
    text = f"{s.mean:.{digits}f}" if s.n == 1 else f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"
    return text + diverged_note(diverged, len(values))


def write_csv(records: Iterable[dict], path: str, fields: Sequence[str]) -> None:
    """One row per record (in the given order), the columns ``fields``."""
    import csv
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for r in records:
            writer.writerow({k: r[k] for k in fields})


def machines_note(records: Sequence[dict]) -> str:
    """Where ``records`` ran: each CPU model (with its generation, ``family F model M``, where recorded) with its
    number of runs (most first), the malloc each ran with where recorded (``layerscale_jax.runtime``: it changes
    the time, not the numbers), and the range of the 1-minute load average at the runs' starts (``run`` records
    them); "" when no record names its machine."""
    machines = [r["machine"] for r in records if r.get("machine")]
    if not machines:
        return ""
    counts = collections.Counter(", ".join(filter(None, (m.get("cpu", "unknown CPU"), m.get("cpu_family_model"))))
                                 for m in machines)
    mallocs = collections.Counter(m["malloc"] for m in machines if m.get("malloc"))
    loads = [m["load_average_start"][0] for m in machines if m.get("load_average_start")]

    def runs(n):
        return f"{n} run{'s' if n > 1 else ''}"
    cpus = ", ".join(f"{cpu} ({runs(n)})" for cpu, n in counts.most_common())
    unrecorded = len(machines) - sum(mallocs.values())
    malloc = "; malloc " + ", ".join([f"{name} ({runs(n)})" for name, n in mallocs.most_common()]
                                     + [f"not recorded ({runs(unrecorded)})"] * (unrecorded > 0)) if mallocs else ""
    return f"Trained on {cpus}{malloc}" + (f"; 1-minute load at the runs' starts {min(loads):.2f}–{max(loads):.2f}"
                                           if loads else "") + "."


def compute_note(records: Sequence[dict]) -> str:
    """What ``records`` cost: their number and the sum of each run's CPU time (``cpu_seconds``, the process's CPU
    time over all its threads, which leaves out pauses); a record from before ``cpu_seconds`` existed counts its wall
    ``seconds`` instead, pauses included, and the note says how many did."""
    def runs(n):
        return f"{n} run{'s' if n > 1 else ''}"
    cpu = [r["cpu_seconds"] for r in records if "cpu_seconds" in r]
    wall = [r["seconds"] for r in records if "cpu_seconds" not in r and "seconds" in r]
    if not cpu:
        return (f"{runs(len(wall))} took {sum(wall) / 3600:.1f} hours of wall time in total (recorded before their "
                f"CPU time was; pauses included)." if wall else "")
    note = (f"{runs(len(cpu) + len(wall))} took {(sum(cpu) + sum(wall)) / 3600:.1f} CPU-hours in total (the sum of "
            f"each run's process CPU time")
    if wall:
        note += (f"; {runs(len(wall))} recorded before that was measured count{'' if len(wall) > 1 else 's'} "
                 f"{sum(wall) / 3600:.1f} hours of wall time, pauses included")
    return note + ")."


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table (``|---|`` under the header), ending in a newline."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt
