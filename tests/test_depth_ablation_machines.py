"""The depth ablation's machine confound (experiments/depth_ablation_machines.py) and the write-ups' statements
that rest on records: the confound, the convergence rule's date, claim 3's corrected interval and claim 1's mark."""
import functools
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import cait_claims  # noqa: E402
import depth_ablation_machines as machines  # noqa: E402
import depth_ablation_protocol as da_protocol  # noqa: E402
import depth_ablation_reports as da_reports  # noqa: E402
import depth_ablation_runs as da_runs  # noqa: E402
import validation_protocol as vp  # noqa: E402

FINAL = os.path.join(da_protocol.CONVERGED_OUT, "final")
LAYERSCALE, TWIN = da_reports.REFERENCE, da_reports.TWIN


def _run(scheme, depth, seed, accuracy, cpu="AMD EPYC", generation="family 26 model 2", epsilon=0.1, lr=1e-2):
    return {"scheme": scheme, "warmup": True, "depth": depth, "seed": seed, "final_test_accuracy": accuracy,
            "branch_scaling": "layerscale" if scheme.startswith("layerscale") else scheme, "epsilon": epsilon,
            "learning_rate": lr, "diverged": False, "machine": {"cpu": cpu, "cpu_family_model": generation}}


def _accuracy(record):
    return 100 * record["final_test_accuracy"]


def test_a_column_is_confounded_only_at_depths_where_every_run_is_on_a_kind_no_other_column_used():
    records = [_run("layerscale", 6, 0, 0.98, generation="family 25 model 1"),
               _run("layerscale", 12, 0, 0.98, generation="family 25 model 1"),
               _run("layerscale", 12, 1, 0.98),                                   # shares a kind with `none`
               _run("none", 6, 0, 0.97), _run("none", 12, 0, 0.97)]
    assert machines.exclusive_depths(records, LAYERSCALE) == {6: ("AMD EPYC, family 25 model 1",)}
    assert machines.confounded_cells(records, LAYERSCALE) == {("layerscale", True, 6)}
    assert machines.machine_kind({"machine": {"cpu": "AMD EPYC"}}) == "AMD EPYC, generation not recorded"
    assert machines.confound_note([r for r in records if r["depth"] == 12 and r["seed"] == 1 or
                                   r["scheme"] == "none"], LAYERSCALE, TWIN, _accuracy) == ""


def test_one_model_under_two_names_gives_its_seed_by_seed_drift_and_the_kinds_of_each_side():
    records = [_run("layerscale", 6, 0, 0.98, generation="family 25 model 1"), _run("layerscale_eps0.1", 6, 0, 0.97),
               _run("layerscale", 6, 1, 0.96, generation="family 25 model 1"), _run("layerscale_eps0.1", 6, 1, 0.97),
               _run("layerscale", 48, 0, 0.98, epsilon=1e-6), _run("layerscale_eps0.1", 48, 0, 0.98)]
    assert machines.same_model_depths(records, LAYERSCALE, TWIN) == [6]          # ε differs at 48
    drift = machines.same_model_drift(records, LAYERSCALE, TWIN, 6, _accuracy)
    assert drift.per_seed == pytest.approx({0: 1.0, 1: -1.0}) and drift.mean == pytest.approx(0.0)
    assert not drift.same_kinds and set(drift.kinds_b) == {"AMD EPYC, family 26 model 2"}
    note = machines.confound_note(records, LAYERSCALE, TWIN, _accuracy)
    assert "depths 6 only on AMD EPYC, family 25 model 1" in note and "-1.00 … +1.00 seed by seed" in note


@functools.cache
def _committed_final_records() -> list[dict]:
    """The committed final records (17 MB of JSON), read once: the tests here only read them."""
    return da_runs.load_records(FINAL)


def _final(which):
    records = _committed_final_records()
    return da_protocol.final_records(records, da_protocol.load_rates(da_protocol.CONVERGED_OUT), which)


def test_the_committed_one_rate_reports_disclose_the_confound_the_records_give_and_per_depth_has_none():
    """The one-rate column of LayerScale ran at depths 6 and 24 on an AMD EPYC family 25 and at 48 and 96 on an
    Intel family 6 model 167, kinds no other column used (issue 46); each one-rate report quotes the note computed
    from the records' ``machine`` fields, and claims.md marks each comparison at those depths."""
    one_rate, per_depth = _final("one_rate"), _final("per_depth")
    exclusive = machines.exclusive_depths(one_rate, LAYERSCALE)
    assert {d: k for d, k in exclusive.items()} == {
        6: ("AMD EPYC, family 25 model 1",), 24: ("AMD EPYC, family 25 model 1",),
        48: ("Intel(R) Xeon(R) Processor, family 6 model 167",),
        96: ("Intel(R) Xeon(R) Processor, family 6 model 167",)}
    assert machines.exclusive_depths(per_depth, LAYERSCALE) == {}
    note = machines.confound_note(one_rate, LAYERSCALE, TWIN, _accuracy)
    for name in ("table.md", "comparisons.md", "claims.md", "convergence.md", "nll.md"):
        assert note in open(os.path.join(FINAL, "one_rate", name)).read(), name
        assert "Machine confound" not in open(os.path.join(FINAL, "per_depth", name)).read(), name
    claims = open(os.path.join(FINAL, "one_rate", "claims.md")).read()
    for line in claims.splitlines():
        cell = re.match(r"\| `layerscale` @ (\d+) vs", line)
        if cell:
            assert line.split("|")[1].rstrip().endswith("‡") == (int(cell.group(1)) in exclusive), line


def _drift():
    return machines.same_model_drift(_final("one_rate"), LAYERSCALE, TWIN, 6, _accuracy)


@pytest.mark.parametrize("path", ["README.md", "experiments/README.md"])
def test_the_write_ups_state_the_confound_with_the_records_kinds_and_drift(path):
    """README's and experiments/README's one-rate column marks every claim with a LayerScale comparison (2–5) ‡, and
    their text quotes the kinds and the same-model drift the records give (+0.51 points, −0.28 … +1.41 seed by
    seed), next to p = 0.035 / 0.028."""
    text = open(os.path.join(da_runs.ROOT, path)).read()
    rows = {ln.split("|")[1].strip().split(".")[0]: ln.split("|")[3] for ln in text.splitlines()
            if re.match(r"\| \d[ab]?\. ", ln)}
    for claim, cell in rows.items():
        assert ("‡" in cell) == (claim in {"2", "3", "4", "4a", "4b", "5"}), (path, claim)
    flat = " ".join(text.split()).replace("−", "-")
    drift = _drift()
    generations = {re.search(r"family \d+ model \d+", k).group(0)
                   for k in machines.exclusive_depths(_final("one_rate"), LAYERSCALE).values() for k in k}
    assert all(g in flat for g in generations), generations
    span = f"{min(drift.per_seed.values()):+.2f} … {max(drift.per_seed.values()):+.2f}"
    assert f"{drift.mean:+.2f} points" in flat and span in flat, span
    assert "0.0 to 1.4" not in flat
    paragraph = flat[flat.index("p = 0.035"):][:600]
    assert "machine" in paragraph, path


@pytest.mark.parametrize("path", ["README.md", "experiments/README.md"])
def test_the_convergence_rule_is_labelled_as_written_after_the_results_everywhere(path):
    text = " ".join(open(os.path.join(da_runs.ROOT, path)).read().split())
    assert "before it was applied" not in text
    assert "written after the results (on 2026-12-04, once the final records" in text, path
    for which in ("per_depth", "one_rate"):
        for name in ("convergence.md", "table.md"):
            report = open(os.path.join(FINAL, which, name)).read()
            assert "before it was applied" not in report
    assert vp.CONVERGENCE_RULE_WRITTEN in open(os.path.join(FINAL, "per_depth", "convergence.md")).read()


def test_claim_3s_statement_is_the_holm_corrected_interval_not_the_unadjusted_one():
    """experiments/README's claim 3 quotes the interval at Holm's α/m for LayerScale vs `scalar` at 48 (per-depth),
    ``cait_claims.holm_interval``, and no longer says the unadjusted interval "rules out a difference beyond half a
    point"."""
    records = _final("per_depth")
    result = cait_claims.evaluate(records, cait_claims.cait_claims(da_runs.DEPTHS)[2], _accuracy, runs_per_cell=5)
    comparison = next(c for c in result.comparisons if c.better[2] == 48)
    low, high = cait_claims.holm_interval(comparison.accuracy, sum(len(c.tests()) for c in result.comparisons))
    text = " ".join(open(os.path.join(da_runs.ROOT, "experiments", "README.md")).read().split()).replace("−", "-")
    assert f"[{low:.2f}, {high:.2f}]" in text and f"a difference beyond {high:.2f} points, not half a point" in text
    assert "rules out a difference beyond half a point" not in text


def test_holms_interval_widens_the_welch_interval_by_the_ratio_of_t_quantiles_by_hand():
    # ν = 8, m = 2: t_{0.9875, 8} = 2.7515, t_{0.975, 8} = 2.3060 (tables); half-width 1 → 2.7515 / 2.3060
    d = cait_claims.Difference(0.5, -0.5, 1.5, 1.0, 8.0, 0.3)
    low, high = cait_claims.holm_interval(d, 2)
    assert high - 0.5 == pytest.approx(2.7515 / 2.3060, abs=1e-3) and low == pytest.approx(1 - high)


def test_readmes_claim_1_at_depth_48_marks_the_cell_failing_the_convergence_check():
    """The per-depth `none` cell at depth 48 fails the convergence check (convergence.md); README's and
    experiments/README's claim 1 quote it with its mark."""
    failing = [ln for ln in open(os.path.join(FINAL, "per_depth", "convergence.md")).read().splitlines()
               if ln.endswith(f"**no** {vp.NOT_CONVERGED} |")]
    assert [ln.split("|")[1:3] for ln in failing] == [[" 48 ", " none "]]
    for path in ("README.md", "experiments/README.md"):
        row = next(ln for ln in open(os.path.join(da_runs.ROOT, path)).read().splitlines() if ln.startswith("| 1. "))
        per_depth = row.split("|")[2]
        assert re.search(r"\+3\.15 \[0\.70, 5\.61\][^,]*" + vp.NOT_CONVERGED, per_depth), (path, per_depth)


@pytest.mark.parametrize("which", ["per_depth", "one_rate"])
def test_experiments_readmes_accuracy_tables_are_the_committed_tables_with_their_marks(which):
    """Every row of final/<which>/table.md — † on the cell failing the convergence check, ‡ on LayerScale's
    machine-confounded one-rate cells — is in experiments/README.md as it stands."""
    table = open(os.path.join(FINAL, which, "table.md")).read()
    rows = [ln for ln in table.splitlines() if re.match(r"\| \d+ \|", ln)]
    text = open(os.path.join(da_runs.ROOT, "experiments", "README.md")).read()
    assert rows and all(row in text for row in rows), [row for row in rows if row not in text]
    marked = sum("‡" in row for row in rows)
    assert marked == (len(machines.exclusive_depths(_final(which), LAYERSCALE)))
