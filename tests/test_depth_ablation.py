"""Specifications of the depth-ablation driver (experiments/depth_ablation.py) on a grid of tiny runs.

One module-scoped sweep of three depth-1 runs (one of them at a learning rate of 1e30, which must diverge) feeds
every test, so the whole file costs a few compilations.
"""
import csv
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import depth_ablation as da  # noqa: E402

TINY = da.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=4, evals=2, log_every=2)
SPECS = [da.RunSpec(1, "none", True, 0, 5e-3), da.RunSpec(1, "layerscale", False, 0, 5e-3),
         da.RunSpec(1, "skipinit", True, 0, 1e30)]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ablation"))
    lines = []
    da.run_sweep(SPECS, TINY, out, log=lines.append)
    return out, lines, da.write_reports(out, command="pytest")


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_results_csv_has_one_well_formed_row_per_run(sweep):
    out, _, paths = sweep
    rows = read_rows(paths["csv"])
    assert tuple(rows[0]) == da.CSV_FIELDS
    assert sorted((r["scheme"], r["warmup"]) for r in rows) == [("layerscale", "False"), ("none", "True"),
                                                                ("skipinit", "True")]
    for row in rows:
        assert row["depth"] == "1" and int(row["steps"]) >= 1 and float(row["seconds"]) > 0
        assert 0.0 <= float(row["final_test_accuracy"]) <= float(row["best_test_accuracy"]) <= 1.0


def test_a_diverging_run_is_recorded_as_diverged_not_raised(sweep):
    _, lines, paths = sweep
    by_scheme = {r["scheme"]: r for r in read_rows(paths["csv"])}
    assert by_scheme["skipinit"]["diverged"] == "True" and by_scheme["skipinit"]["final_train_loss"] == "nan"
    assert int(by_scheme["skipinit"]["steps"]) < TINY.steps or by_scheme["skipinit"]["diverged_at_step"]
    assert by_scheme["none"]["diverged"] == "False"
    assert any("DIVERGED" in line for line in lines)


def test_epsilon_column_follows_the_scheme(sweep):
    by_scheme = {r["scheme"]: r for r in read_rows(sweep[2]["csv"])}
    assert by_scheme["layerscale"]["epsilon"] == "0.1"          # CaiT rule at depth 1
    assert by_scheme["skipinit"]["epsilon"] == "0.0" and by_scheme["none"]["epsilon"] == ""


def test_table_and_every_plot_are_written(sweep):
    _, _, paths = sweep
    table = open(paths["table"]).read()
    assert "| depth | none | layerscale (no warm-up) | skipinit |" in table and "(1/1 diverged)" in table
    for what in ("acc_vs_depth", "loss_curves", "scale_heatmap", "ratio_init_end"):
        with open(paths[what], "rb") as f:
            assert f.read(8) == PNG_MAGIC, what


def test_each_record_holds_the_loss_curve_and_diagnostics_at_init_and_each_evaluation(sweep):
    out, _, _ = sweep
    record = {r["scheme"]: r for r in da.load_records(out)}["layerscale"]
    assert [e["step"] for e in record["evaluations"]] == [0, 2, 4]
    assert [s for s, _ in record["train_loss_curve"]] == [2, 4]
    init = record["evaluations"][0]
    assert init["diag/blocks.0.attn.scale"] == pytest.approx(0.1)
    assert {"diag/blocks.0.attn.ratio", "diag/blocks.0.mlp.ratio", "diag/blocks.0.grad_norm"} <= set(init)


def test_a_resumed_sweep_skips_finished_runs_and_trains_only_missing_ones(sweep, monkeypatch, tmp_path):
    out, _, _ = sweep
    trained = []
    monkeypatch.setattr(da, "train_run", lambda spec, *a, **k: trained.append(spec) or pytest.fail("retrained"))
    lines = []
    da.run_sweep(SPECS, TINY, out, log=lines.append)
    assert trained == [] and lines[0] == "3 runs in the grid, 3 already finished, 0 to train"

    # a copy of the sweep missing one record trains exactly that run and reports progress with an ETA
    import shutil
    partial = str(tmp_path / "partial")
    shutil.copytree(out, partial)
    os.remove(da.record_path(partial, SPECS[0]))
    record = {r["scheme"]: r for r in da.load_records(out)}["none"]
    monkeypatch.setattr(da, "train_run", lambda spec, *a, **k: trained.append(spec) or record)
    lines = []
    da.run_sweep(SPECS, TINY, partial, log=lines.append)
    assert trained == [SPECS[0]]
    assert lines[-1].startswith("[3/3 runs done] depth1_none_warmupon_lr0.005_seed0") and "ETA 0:00:00" in lines[-1]


def test_default_grid_has_every_cell_and_the_warmup_ablation():
    specs = da.grid(da.DEPTHS, da.DEFAULT_SCHEMES, da.SEEDS, 5e-3, sorted(da.DEPTHS)[-2:])
    assert len(specs) == 5 * 6 * 3 + 2 * 2 * 3
    off = {(s.depth, s.scheme) for s in specs if not s.warmup}
    assert off == {(d, s) for d in (48, 96) for s in ("none", "layerscale")}
    assert len({s.run_id for s in specs}) == len(specs)


def test_per_scheme_learning_rates_come_from_the_best_non_diverged_lr_sweep_run(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for i, (scheme, lr, acc, diverged) in enumerate([("none", 1e-3, 0.8, False), ("none", 1e-2, 0.9, False),
                                                    ("rezero", 1e-3, 0.7, False), ("rezero", 1e-2, 0.1, True)]):
        (runs / f"{i}.json").write_text(
            f'{{"scheme": "{scheme}", "learning_rate": {lr}, "final_test_accuracy": {acc}, '
            f'"diverged": {str(diverged).lower()}}}')
    assert da.best_learning_rates(str(tmp_path), ["none", "rezero"]) == {"none": 1e-2, "rezero": 1e-3}
    specs = da.grid((6,), ("none", "rezero"), (0,), {"none": 1e-2, "rezero": 1e-3}, ())
    assert {(s.scheme, s.learning_rate) for s in specs} == {("none", 1e-2), ("rezero", 1e-3)}
    with pytest.raises(FileNotFoundError, match="scheme 'skipinit'"):
        da.best_learning_rates(str(tmp_path), ["skipinit"])


def test_sweep_estimate_adds_fixed_and_per_step_costs_linear_in_depth():
    costs = {6: {"setup": 1.0, "first_step": 2.0, "evaluations": 0.5, "per_step": 0.06},
             24: {"setup": 1.0, "first_step": 2.0, "evaluations": 0.5, "per_step": 0.24}}
    sizing = da.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=100, evals=4, log_every=10)
    specs = [da.RunSpec(12, "none", True, 0, 1e-3), da.RunSpec(48, "none", True, 0, 1e-3)]
    # per step 0.01 s per block; fixed 1 + 2 + 4 × 0.5 = 5 s
    assert da.estimate_sweep_seconds(costs, specs, sizing) == pytest.approx(2 * 5 + 100 * 0.01 * (12 + 48))


def test_each_table_names_the_command_that_produced_it(sweep, tmp_path):
    """An lr sweep writes only its own outputs, headed by its command; the grid's table keeps the grid's command."""
    import shutil
    out = str(tmp_path / "copy")
    shutil.copytree(sweep[0], out)
    shutil.copytree(os.path.join(out, "runs"), os.path.join(out, "lr_sweep", "runs"))
    paths = da.write_reports(out, command="the lr sweep", lr_sweep=True)
    assert set(paths) == {"lr_csv", "lr_table"}
    with open(paths["lr_table"]) as f:
        assert "Command: `the lr sweep`" in f.read()
    with open(os.path.join(out, "table.md")) as f:
        assert "Command: `pytest`" in f.read()


def test_a_table_never_averages_learning_rates_and_per_scheme_rates_report_apart(sweep, tmp_path):
    """Runs at another rate beside the grid's (what ``--per_scheme_lr`` adds to ``OUT/runs``) are kept out of the
    shared-rate table, reported on their own in ``report_dir``, and a column mixing rates is an error."""
    import json
    import shutil
    out = str(tmp_path / "mixed")
    shutil.copytree(sweep[0], out)
    record = {r["scheme"]: r for r in da.load_records(out)}["none"]
    record["learning_rate"], record["final_test_accuracy"] = 2e-3, 0.5
    with open(os.path.join(out, "runs", "extra.json"), "w") as f:
        json.dump(record, f)
    with pytest.raises(ValueError, match=r"several learning rates in one column: \{'none': \[0.002, 0.005\]\}"):
        da.write_reports(out)
    shared = da.write_reports(out, rates=5e-3)
    assert sorted(r["scheme"] for r in read_rows(shared["csv"])) == ["layerscale", "none"]
    rates = {"none": 2e-3, "layerscale": 5e-3, "skipinit": 1e30}
    own = da.write_reports(out, command="per scheme", rates=rates, report_dir=os.path.join(out, "per_scheme_lr"))
    assert os.path.dirname(own["table"]) == os.path.join(out, "per_scheme_lr")
    rows = {r["scheme"]: r for r in read_rows(own["csv"])}
    assert set(rows) == {"none", "layerscale", "skipinit"} and rows["none"]["final_test_accuracy"] == "0.5"
    table = open(own["table"]).read()
    assert "each scheme at its own learning rate (none 0.002, layerscale 0.005, skipinit 1e+30)" in table
    assert "| 1 | 50.0 |" in table


def test_readme_depth_ablation_table_quotes_the_committed_tables():
    """README's numbers are the committed results' (a rerun that changes them must update the README)."""
    results = os.path.join(da.ROOT, "experiments", "results", "depth_ablation")

    def cells(path):          # {(column, depth): cell} of a committed table.md
        lines = [ln for ln in open(path).read().splitlines() if ln.startswith("| ")]
        header = [h.strip() for h in lines[0].split("|")[1:-1]]
        return {(h, row[0]): v for ln in lines[1:] for row in [[c.strip() for c in ln.split("|")[1:-1]]]
                for h, v in zip(header[1:], row[1:])}
    shared, own = cells(os.path.join(results, "table.md")), cells(os.path.join(results, "per_scheme_lr", "table.md"))
    readme = open(os.path.join(da.ROOT, "README.md")).read().split("## Depth ablation", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in ln.split("|")[1:-1]] for ln in readme.splitlines() if ln.startswith("| `")]
    columns = {"`none` (pre-norm)": "none", "`layerscale` (CaiT ε)": "layerscale",
               "`layerscale`, ε = 0.1": "layerscale_eps0.1", "`scalar`": "scalar", "`rezero`": "rezero",
               "`skipinit`": "skipinit"}
    assert [r[0] for r in rows] == list(columns)
    for label, *values in rows:
        scheme = columns[label]
        assert values == [shared[(scheme, d)] for d in ("6", "12", "24", "48", "96")] + [own[(scheme, "96")]], label


def test_the_committed_tables_are_what_the_committed_run_records_give(tmp_path):
    """Regenerating from ``experiments/results/depth_ablation/runs`` reproduces both protocols' table and CSV."""
    results = os.path.join(da.ROOT, "experiments", "results", "depth_ablation")
    records = da.load_records(results)
    rates = da.best_learning_rates(os.path.join(results, "lr_sweep"), da.DEFAULT_SCHEMES)
    for rate, where in ((da.RECIPE["learning_rate"], results), (rates, os.path.join(results, "per_scheme_lr"))):
        chosen = da.select_rates(records, rate)
        committed = open(os.path.join(where, "table.md")).read()
        title = committed.split("\n\n| depth")[0]
        da.write_table(chosen, str(tmp_path / "table.md"), title)
        da.write_csv(chosen, str(tmp_path / "results.csv"))
        assert (tmp_path / "table.md").read_text() == committed
        assert (tmp_path / "results.csv").read_text() == open(os.path.join(where, "results.csv")).read()


def test_a_bad_shard_stops_the_command_naming_it():
    with pytest.raises(SystemExit, match="--shard='5/4' must have 1 ≤ i ≤ n"):
        da.main(["--shard", "5/4", "--out", "/nonexistent"])
