"""Which machine kinds trained which cells of the depth ablation, and what that does to a comparison (post hoc).

Training is not bit-reproducible across CPU kinds here (XLA compiles for the machine): one configuration and seed
gives the same accuracy on one kind and a different one on another. A comparison whose two cells ran on different
kinds therefore measures the machines as well as the schemes. This module reads each record's ``machine`` fields
(``cpu``, ``cpu_family_model``), finds the cells that ran only on kinds no other column used (``exclusive_depths``)
and the cells that are one model under two column names (``same_model_depths``: LayerScale and ε = 0.1 where
CaiT's rule gives ε = 0.1, at the same rate), whose seed-by-seed differences measure the machine effect directly
(``same_model_drift``). Written after the runs, from their records: a disclosure, not a rule.
"""
from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Sequence

Column = tuple  # (scheme, warmup)
CONFIG_FIELDS = ("branch_scaling", "epsilon", "warmup", "learning_rate", "depth", "seed")   # what makes one model


def machine_kind(record: dict) -> str:
    """``"AMD EPYC, family 25 model 1"``: the record's CPU and its generation (``"generation not recorded"`` for
    the early records without one)."""
    machine = record.get("machine", {})
    return f"{machine.get('cpu', 'unknown CPU')}, {machine.get('cpu_family_model') or 'generation not recorded'}"


def _column(record: dict) -> Column:
    return record["scheme"], record["warmup"]


def kinds_by_cell(records: Sequence[dict]) -> dict[tuple[str, bool, int], collections.Counter]:
    """``{(scheme, warm-up, depth): Counter(machine kind → runs)}``."""
    cells = collections.defaultdict(collections.Counter)
    for r in records:
        cells[(*_column(r), r["depth"])][machine_kind(r)] += 1
    return dict(cells)


def exclusive_depths(records: Sequence[dict], column: Column) -> dict[int, tuple[str, ...]]:
    """``{depth: kinds}`` for each depth at which every run of ``column`` ran on a kind that no run of any other
    column in ``records`` (at any depth) ran on: there, every comparison with ``column`` compares kinds too."""
    others = {machine_kind(r) for r in records if _column(r) != tuple(column)}
    found = {}
    for (scheme, warmup, depth), kinds in sorted(kinds_by_cell(records).items(), key=lambda kv: kv[0][2]):
        if (scheme, warmup) == tuple(column) and not set(kinds) & others:
            found[depth] = tuple(sorted(kinds))
    return found


def _config(record: dict) -> tuple:
    return tuple(record[k] for k in CONFIG_FIELDS)


def same_model_depths(records: Sequence[dict], a: Column, b: Column) -> list[int]:
    """The depths at which every run of ``a`` has a run of ``b`` of the same configuration (``CONFIG_FIELDS``:
    branch scaling, ε, warm-up, rate, depth, seed) and vice versa: there the two columns are one model."""
    depths = []
    for depth in sorted({r["depth"] for r in records}):
        runs_a = {_config(r) for r in records if _column(r) == tuple(a) and r["depth"] == depth}
        runs_b = {_config(r) for r in records if _column(r) == tuple(b) and r["depth"] == depth}
        if runs_a and runs_a == runs_b:
            depths.append(depth)
    return depths


@dataclasses.dataclass(frozen=True)
class Drift:
    """One model trained twice under two column names at one depth: per seed ``100 · (acc_a − acc_b)`` (points),
    their mean, and the machine kinds each side ran on."""
    depth: int
    per_seed: dict[int, float]
    mean: float
    kinds_a: tuple[str, ...]
    kinds_b: tuple[str, ...]

    @property
    def same_kinds(self) -> bool:
        """Whether every seed ran on the same kind on both sides."""
        return self.kinds_a == self.kinds_b


def same_model_drift(records: Sequence[dict], a: Column, b: Column, depth: int, accuracy) -> Drift:
    """``a`` − ``b`` at ``depth``, seed by seed (``accuracy(record)``, %), where the two are one model
    (``same_model_depths``); ``kinds_a[i]``/``kinds_b[i]`` the kinds of the i-th seed's runs."""
    def runs(column):
        return {r["seed"]: r for r in records if _column(r) == tuple(column) and r["depth"] == depth}
    runs_a, runs_b = runs(a), runs(b)
    seeds = sorted(runs_a)
    per_seed = {s: accuracy(runs_a[s]) - accuracy(runs_b[s]) for s in seeds}
    return Drift(depth, per_seed, statistics.mean(per_seed.values()),
                 tuple(machine_kind(runs_a[s]) for s in seeds), tuple(machine_kind(runs_b[s]) for s in seeds))


def _kinds_text(kinds: Sequence[str]) -> str:
    return " and ".join(sorted(set(kinds)))


def _depths_text(exclusive: dict[int, tuple[str, ...]]) -> str:
    """``"6 and 24 only on A, at 48 and 96 only on B"``: the exclusive depths grouped by their kinds."""
    groups = collections.defaultdict(list)
    for depth, kinds in exclusive.items():
        groups[kinds].append(str(depth))
    return ", at ".join(f"{' and '.join(depths)} only on {_kinds_text(kinds)}" for kinds, depths in groups.items())


def confounded_cells(records: Sequence[dict], column: Column) -> frozenset:
    """The cells ``(scheme, warm-up, depth)`` of ``column`` at its ``exclusive_depths``."""
    return frozenset((*column, depth) for depth in exclusive_depths(records, column))


def confound_note(records: Sequence[dict], column: Column, twin: Column, accuracy, mark: str = "‡") -> str:
    """The disclosure written next to a rate choice's numbers when ``column`` ran at some depths only on machine
    kinds no other column used (``exclusive_depths``), with the machine effect measured where ``column`` and its
    ``twin`` are one model (``same_model_drift``); "" when no depth is exclusive."""
    exclusive = exclusive_depths(records, column)
    if not exclusive:
        return ""
    name, twin_name = f"`{column[0]}`", f"`{twin[0]}`"
    text = (f"{mark} Machine confound (post hoc, from the records' `machine` fields): {name} ran at depths "
            f"{_depths_text(exclusive)} — kinds on which no other column's runs here ran — so every comparison "
            f"with {name} at those depths ({mark}) compares machine kinds as well as schemes.")
    for depth in same_model_depths(records, column, twin):
        drift = same_model_drift(records, column, twin, depth, accuracy)
        values = drift.per_seed.values()
        if drift.same_kinds:
            text += (f" At depth {depth}, where {name} and {twin_name} are one model trained on the same kinds, "
                     f"they differ by {drift.mean:+.2f} points ({min(values):+.2f} … {max(values):+.2f} seed by "
                     f"seed).")
        else:
            text += (f" At depth {depth} {name} and {twin_name} are one model (same ε, rate and seeds) trained on "
                     f"different kinds ({_kinds_text(drift.kinds_a)} against {_kinds_text(drift.kinds_b)}): they "
                     f"differ by {drift.mean:+.2f} points in the mean, {min(values):+.2f} … {max(values):+.2f} seed "
                     f"by seed — the size of the machine effect.")
    return text
