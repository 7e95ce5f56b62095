"""What the depth ablation costs: timing runs on this machine (``--measure``) and the protocol's estimate from
them, the CPU time still to train by what finished runs took, and what a whole stage costs on each machine kind.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import sweep
from depth_ablation_protocol import (BUDGET_EVAL_EVERY, BUDGET_STEPS, FINAL_SEEDS, RATE_DEPTHS, RATE_LADDER_START,
                                     budget_specs)
from depth_ablation_runs import COLUMNS, DEPTHS, PROTOCOL_SIZING, RECIPE, RunSpec, Sizing, train_run

def measure(depths, sizing: Sizing, steps: int, log=print) -> dict[int, dict]:
    """Time one `layerscale` run of ``steps`` steps per depth at ``sizing``: setup (model init, diagnostics at
    step 0), the first step (its compilation), each later step, and the evaluations."""
    costs = {}
    for depth in depths:
        probe = dataclasses.replace(sizing, steps=steps, evals=1)
        timing = train_run(RunSpec(depth, "layerscale", True, 0, RECIPE["learning_rate"]), probe)["timing"]
        costs[depth] = timing
        log(f"depth {depth}: setup {timing['setup']:.1f} s, first step {timing['first_step']:.1f} s, "
            f"{1000 * timing['per_step']:.0f} ms per step, evaluations {timing['evaluations']:.1f} s")
    return costs


def estimate_sweep_seconds(costs: dict[int, dict], specs: list[RunSpec], sizing: Sizing) -> float:
    """``sweep.estimate_seconds`` of the grid from ``measure``'s costs per depth, each run ``sizing.steps`` steps
    with ``sizing.evals`` evaluations."""
    return sweep.estimate_seconds(costs, [s.depth for s in specs], sizing.steps, sizing.evals)


def protocol_estimate(costs: dict[int, dict], steps: int, rates_per_cell: float = len(RATE_LADDER_START) + 1) -> str:
    """The protocol's time on one process from ``measure``'s costs: the budget runs (one per length in
    BUDGET_STEPS and seed in BUDGET_SEEDS), a rate sweep of ``rates_per_cell`` runs per cell (the start ladder plus
    one extension on average), and both final protocols (assumed to share no run: an upper bound)."""
    budget = sum(sweep.estimate_seconds(costs, [s.depth for s in budget_specs() if s.steps == t], t,
                                        t // BUDGET_EVAL_EVERY) for t in BUDGET_STEPS)
    rate_depths = [d for d in RATE_DEPTHS for _ in COLUMNS] * int(math.ceil(rates_per_cell))
    rates = sweep.estimate_seconds(costs, rate_depths, steps, PROTOCOL_SIZING.evals)
    final_depths = [d for d in DEPTHS for _ in COLUMNS for _ in FINAL_SEEDS] * 2
    final = sweep.estimate_seconds(costs, final_depths, steps, PROTOCOL_SIZING.evals)
    f = sweep.format_seconds
    return (f"budget {f(budget)} ({len(budget_specs())} runs of {'/'.join(map(str, BUDGET_STEPS))} steps); rates "
            f"{f(rates)} ({len(rate_depths)} runs of {steps} steps); final {f(final)} (≤ {len(final_depths)} runs "
            f"of {steps} steps); total {f(budget + rates + final)}")


MACHINE_KIND_KEYS = ("cpu", "cpu_family_model", "malloc")   # what a run's CPU time depends on, as records name it


def this_machine_kind() -> dict:
    """This machine's ``MACHINE_KIND_KEYS`` as ``sweep.run`` records them (``machine_info``), without starting JAX."""
    from layerscale_jax.bench.timing import cpu_family_model, cpu_model
    from layerscale_jax.runtime import malloc_in_use
    return {"cpu": cpu_model(), "cpu_family_model": cpu_family_model(), "malloc": malloc_in_use()}


def remaining_cpu_hours(missing: Sequence[RunSpec], records: Sequence[dict],
                        machine: dict | None = None) -> tuple[float, int, bool] | None:
    """The CPU time ``missing`` runs will take, in hours; how many finished runs it was estimated from; and whether
    those ran on ``machine``'s kind. Each run
    the mean ``cpu_seconds`` of the finished ``records`` at its depth, or at a depth without one its depth × the
    finished runs' mean CPU time per block (a run's cost grows about linearly with depth). Where some finished runs
    ran on ``machine``'s kind (``MACHINE_KIND_KEYS``: CPU, its generation, malloc), only those count. None when no
    finished run has its CPU time."""
    measured = [r for r in records if "cpu_seconds" in r]
    same_kind = [r for r in measured if machine and all(r.get("machine", {}).get(k) == machine[k]
                                                         for k in MACHINE_KIND_KEYS)]
    measured = same_kind or measured
    if not measured:
        return None
    return _projected_cpu_seconds([s.depth for s in missing], measured) / 3600, len(measured), bool(same_kind)


def _projected_cpu_seconds(depths: Sequence[int], measured: Sequence[dict]) -> float:
    """Runs at ``depths``, each at the mean ``cpu_seconds`` of the ``measured`` records at its depth, or at a depth
    without one its depth × their mean CPU time per block."""
    by_depth = {}
    for r in measured:
        by_depth.setdefault(r["depth"], []).append(r["cpu_seconds"])
    per_block = sum(r["cpu_seconds"] / r["depth"] for r in measured) / len(measured)
    return sum(sum(by_depth[d]) / len(by_depth[d]) if d in by_depth else d * per_block for d in depths)


def cost_by_machine_kind(records: Sequence[dict], cores: int = 2) -> str:
    """What all of ``records`` would cost on one machine kind (``MACHINE_KIND_KEYS``): for each kind whose runs
    cover every depth of ``records``, every run at that kind's mean CPU time at its depth, in CPU-hours and in hours
    of a ``cores``-core machine running one shard per core. The sum over the runs' own machines
    (``sweep.compute_note``) mixes CPU generations and mallocs; this says what the grid costs on each of them.
    "" when no kind ran every depth."""
    kinds = {}
    for r in records:
        if "cpu_seconds" in r:
            kinds.setdefault(tuple(r.get("machine", {}).get(k) for k in MACHINE_KIND_KEYS), []).append(r)
    depths = sorted({r["depth"] for r in records})
    parts = []
    for (cpu, generation, malloc), runs in sorted(kinds.items(), key=lambda kind: -len(kind[1])):
        if sorted({r["depth"] for r in runs}) != depths:
            continue
        hours = _projected_cpu_seconds([r["depth"] for r in records], runs) / 3600
        name = ", ".join(filter(None, (cpu or "unknown CPU", generation))) + f", malloc {malloc or 'not recorded'}"
        parts.append(f"{name} (from its {len(runs)} runs): {hours:.1f} CPU-hours, ≈ {hours / cores:.1f} hours of "
                     f"{cores} cores with one shard per core")
    if not parts:
        return ""
    return (f"All {len(records)} runs on one machine kind, each at that kind's mean CPU time at its depth: "
            + "; ".join(parts) + ".")
