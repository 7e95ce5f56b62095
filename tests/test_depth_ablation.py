"""Specifications of the depth-ablation driver (experiments/depth_ablation.py) on a grid of tiny runs.

One module-scoped sweep of three depth-1 runs (one of them at a learning rate of 1e30, which must diverge) feeds
every test, so the whole file costs a few compilations.
"""
import csv
import json
import math
import os
import re
import shutil
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import depth_ablation as da  # noqa: E402
import depth_ablation_cost as da_cost  # noqa: E402
import depth_ablation_early as da_early  # noqa: E402
import depth_ablation_imagenet as da_imagenet  # noqa: E402
import depth_ablation_protocol as da_protocol  # noqa: E402
import depth_ablation_reports as da_reports  # noqa: E402
import depth_ablation_runs as da_runs  # noqa: E402
import validation_protocol as vp  # noqa: E402

TINY = da_runs.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=4, evals=2, log_every=2)
SPECS = [da_runs.RunSpec(1, "none", True, 0, 5e-3), da_runs.RunSpec(1, "layerscale", False, 0, 5e-3),
         da_runs.RunSpec(1, "skipinit", True, 0, 1e30)]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("ablation"))
    lines = []
    da_runs.run_sweep(SPECS, TINY, out, log=lines.append)
    return out, lines, da_early.write_reports(out, command="pytest")


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_results_csv_has_one_well_formed_row_per_run(sweep):
    out, _, paths = sweep
    rows = read_rows(paths["csv"])
    assert tuple(rows[0]) == da_reports.CSV_FIELDS
    assert sorted((r["scheme"], r["warmup"]) for r in rows) == [("layerscale", "False"), ("none", "True"),
                                                                ("skipinit", "True")]
    for row in rows:
        assert row["depth"] == "1" and int(row["steps"]) >= 1 and float(row["seconds"]) > 0
        assert 0.0 <= float(row["final_test_accuracy"]) <= float(row["best_test_accuracy"]) <= 1.0


@pytest.mark.slow
def test_a_diverging_run_is_recorded_as_diverged_not_raised(sweep):
    _, lines, paths = sweep
    by_scheme = {r["scheme"]: r for r in read_rows(paths["csv"])}
    assert by_scheme["skipinit"]["diverged"] == "True" and by_scheme["skipinit"]["final_train_loss"] == "nan"
    assert int(by_scheme["skipinit"]["steps"]) < TINY.steps or by_scheme["skipinit"]["diverged_at_step"]
    assert by_scheme["none"]["diverged"] == "False"
    assert any("DIVERGED" in line for line in lines)


@pytest.mark.slow
def test_epsilon_column_follows_the_scheme(sweep):
    by_scheme = {r["scheme"]: r for r in read_rows(sweep[2]["csv"])}
    assert by_scheme["layerscale"]["epsilon"] == "0.1"          # CaiT rule at depth 1
    assert by_scheme["skipinit"]["epsilon"] == "0.0" and by_scheme["none"]["epsilon"] == ""


@pytest.mark.slow
def test_table_and_every_plot_are_written(sweep):
    _, _, paths = sweep
    table = open(paths["table"]).read()
    assert "| depth | none | layerscale (no warm-up) | skipinit |" in table and "(1/1 diverged)" in table
    for what in ("acc_vs_depth", "loss_curves", "scale_heatmap", "ratio_init_end"):
        with open(paths[what], "rb") as f:
            assert f.read(8) == PNG_MAGIC, what


def test_accuracy_vs_depth_adds_a_zoomed_panel_only_when_every_converged_run_is_above_half(tmp_path):
    import depth_ablation_plots as plots
    from PIL import Image

    def record(depth, accuracy, diverged=False):
        return {"scheme": "layerscale", "warmup": True, "depth": depth, "accuracy": accuracy, "diverged": diverged}

    trained = [record(d, a) for d in (6, 96) for a in (97.0, 98.5)] + [record(96, 0.0, diverged=True)]
    widths = {}
    for name, records in (("trained", trained), ("one_low", trained + [record(6, 40.0)])):
        path = str(tmp_path / f"{name}.png")
        plots.plot_accuracy_vs_depth(records, [("layerscale", True)], lambda r: r["accuracy"], path, title=name,
                                     ylabel="accuracy (%)")
        widths[name] = Image.open(path).size[0]
    assert widths == {"trained": 11 * 120, "one_low": 7 * 120}          # figsize (inches) × dpi 120


def test_the_zoomed_accuracy_axis_never_clips_a_confidence_interval():
    import depth_ablation_plots as plots

    def cell(values):
        return [{"scheme": "scalar", "warmup": True, "depth": 96, "accuracy": a, "diverged": False} for a in values]
    value = lambda r: r["accuracy"]  # noqa: E731
    assert plots.zoom_limits(cell([97.0, 98.0, 97.5]), value) == (96, 100.0)
    # scalar @ 96 (per-depth): 98.0, 90.1, 98.0, 97.2, 97.7 → mean 96.2, CI [92.0, 100.5]: the axis goes to 101
    seeds = [98.0, 90.1, 98.0, 97.2, 97.7]
    high = plots.sweep.summarise(seeds).ci_high
    assert 100.4 < high < 100.6 and plots.zoom_limits(cell(seeds), value) == (89, 101.0)


def test_an_interval_the_accuracy_axis_cuts_off_is_found_and_marked_and_the_failing_cell_is_marked(tmp_path):
    """``clipped_intervals``: the cells whose 95% interval crosses an axis limit (the early grid's on 0–100%);
    the figure draws them, and a cell failing the convergence check, without error."""
    import depth_ablation_plots as plots

    def cell(scheme, depth, values):
        return [{"scheme": scheme, "warmup": True, "depth": depth, "accuracy": a, "diverged": False} for a in values]
    records = cell("none", 12, [10.0, 50.0, 30.0]) + cell("scalar", 96, [98.0, 90.1, 98.0, 97.2, 97.7]) \
        + cell("layerscale", 6, [97.0, 98.0, 97.5])
    columns = [("none", True), ("layerscale", True), ("scalar", True)]
    value = lambda r: r["accuracy"]  # noqa: E731
    # none @ 12: mean 30, s 20, t(0.975, 2) = 4.303 → 30 ± 49.7 (below 0); scalar @ 96: CI high 100.5 (above 100)
    assert plots.clipped_intervals(records, columns, value, 0, 100) == [(("none", True), 12, "low"),
                                                                         (("scalar", True), 96, "high")]
    assert plots.clipped_intervals(records, columns, value, -100, 200) == []
    path = str(tmp_path / "marked.png")
    plots.plot_accuracy_vs_depth(records, columns, value, path, title="t", ylabel="%",
                                 not_converged={(12, ("none", True))}, confounded={(12, ("none", True)),
                                                                                   (6, ("layerscale", True))})
    assert open(path, "rb").read(8) == PNG_MAGIC
    assert plots.cell_marks({(12, ("none", True))}, {(12, ("none", True)), (6, ("layerscale", True))}) == {
        (12, ("none", True)): "†‡", (6, ("layerscale", True)): "‡"}


def test_a_cut_budget_axis_counts_what_it_leaves_out_and_the_loss_curves_draw_the_floor(tmp_path):
    import depth_ablation_plots as plots
    curves = {("a", True, 24, 3000): [(100, 34.4), (200, 90.0)], ("b", True, 96, 3000): [(100, 44.9), (200, 95.0)]}
    assert plots.below_axis(curves, 83.0) == [(100, 34.4), (100, 44.9)]
    finals = {("layerscale", True, 24): {3000: 97.0}, ("skipinit", True, 96): {3000: 98.0}}
    curves = {("layerscale", True, 24, 3000): [(100, 34.4), (200, 90.0)],
              ("skipinit", True, 96, 3000): [(100, 44.9), (200, 95.0)]}
    plots.plot_budget(finals, curves, 3000, str(tmp_path / "budget.png"), title="t")
    assert (tmp_path / "budget.png").read_bytes()[:8] == PNG_MAGIC
    run = {"scheme": "none", "warmup": True, "depth": 6, "seed": 0, "train_loss_curve": [(10, 2.3), (20, 0.6)]}
    plots.plot_loss_curves([run], 6, str(tmp_path / "loss.png"), title="t",
                           floor=vp.label_smoothing_floor(0.1, 10))
    assert (tmp_path / "loss.png").read_bytes()[:8] == PNG_MAGIC
    assert vp.label_smoothing_floor(0.1, 10) == pytest.approx(0.5003, abs=1e-4)


@pytest.mark.slow
def test_each_record_holds_the_loss_curve_and_diagnostics_at_init_and_each_evaluation(sweep):
    out, _, _ = sweep
    record = {r["scheme"]: r for r in da_runs.load_records(out)}["layerscale"]
    assert [e["step"] for e in record["evaluations"]] == [0, 2, 4]
    assert [s for s, _ in record["train_loss_curve"]] == [2, 4]
    init = record["evaluations"][0]
    assert init["diag/blocks.0.attn.scale"] == pytest.approx(0.1)
    assert {"diag/blocks.0.attn.ratio", "diag/blocks.0.mlp.ratio", "diag/blocks.0.grad_norm"} <= set(init)


@pytest.mark.slow
def test_a_resumed_sweep_skips_finished_runs_and_trains_only_missing_ones(sweep, monkeypatch, tmp_path):
    out, _, _ = sweep
    trained = []
    monkeypatch.setattr(da_runs, "train_run", lambda spec, *a, **k: trained.append(spec) or pytest.fail("retrained"))
    lines = []
    da_runs.run_sweep(SPECS, TINY, out, log=lines.append)
    assert trained == [] and lines[0] == "3 runs in the grid, 3 already finished, 0 to train"

    # a copy of the sweep missing one record trains exactly that run and reports progress with an ETA
    partial = str(tmp_path / "partial")
    shutil.copytree(out, partial)
    os.remove(da_runs.record_path(partial, SPECS[0]))
    record = {r["scheme"]: r for r in da_runs.load_records(out)}["none"]
    monkeypatch.setattr(da_runs, "train_run", lambda spec, *a, **k: trained.append(spec) or record)
    lines = []
    da_runs.run_sweep(SPECS, TINY, partial, log=lines.append)
    assert trained == [SPECS[0]]
    assert lines[-1].startswith("[3/3 runs done] depth1_none_warmupon_lr0.005_seed0") and "ETA 0:00:00" in lines[-1]


def test_default_grid_has_every_cell_and_the_warmup_ablation():
    specs = da_early.grid(da_runs.DEPTHS, da_runs.DEFAULT_SCHEMES, da_early.SEEDS, 5e-3, sorted(da_runs.DEPTHS)[-2:])
    assert len(specs) == 5 * 6 * 3 + 2 * 2 * 3
    off = {(s.depth, s.scheme) for s in specs if not s.warmup}
    assert off == {(d, s) for d in (48, 96) for s in ("none", "layerscale")}
    assert len({s.run_id for s in specs}) == len(specs)


def test_the_early_grids_per_scheme_rates_are_its_best_non_diverged_lr_sweep_runs(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for i, (scheme, lr, acc, diverged) in enumerate([("none", 1e-3, 0.8, False), ("none", 1e-2, 0.9, False),
                                                    ("rezero", 1e-3, 0.7, False), ("rezero", 1e-2, 0.1, True)]):
        (runs / f"{i}.json").write_text(
            f'{{"scheme": "{scheme}", "learning_rate": {lr}, "final_test_accuracy": {acc}, '
            f'"diverged": {str(diverged).lower()}}}')
    assert da_early.early_rates_chosen_on_test(str(tmp_path), ["none", "rezero"]) == {"none": 1e-2, "rezero": 1e-3}
    specs = da_early.grid((6,), ("none", "rezero"), (0,), {"none": 1e-2, "rezero": 1e-3}, ())
    assert {(s.scheme, s.learning_rate) for s in specs} == {("none", 1e-2), ("rezero", 1e-3)}
    with pytest.raises(FileNotFoundError, match="scheme 'skipinit'"):
        da_early.early_rates_chosen_on_test(str(tmp_path), ["skipinit"])


def test_sweep_estimate_adds_fixed_and_per_step_costs_linear_in_depth():
    costs = {6: {"setup": 1.0, "first_step": 2.0, "evaluations": 0.5, "per_step": 0.06},
             24: {"setup": 1.0, "first_step": 2.0, "evaluations": 0.5, "per_step": 0.24}}
    sizing = da_runs.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=100, evals=4, log_every=10)
    specs = [da_runs.RunSpec(12, "none", True, 0, 1e-3), da_runs.RunSpec(48, "none", True, 0, 1e-3)]
    # per step 0.01 s per block; fixed 1 + 2 + 4 × 0.5 = 5 s
    assert da_cost.estimate_sweep_seconds(costs, specs, sizing) == pytest.approx(2 * 5 + 100 * 0.01 * (12 + 48))


@pytest.mark.slow
def test_each_table_names_the_command_that_produced_it(sweep, tmp_path):
    """An lr sweep writes only its own outputs, headed by its command; the grid's table keeps the grid's command."""
    out = str(tmp_path / "copy")
    shutil.copytree(sweep[0], out)
    shutil.copytree(os.path.join(out, "runs"), os.path.join(out, "lr_sweep", "runs"))
    paths = da_early.write_reports(out, command="the lr sweep", lr_sweep=True)
    assert set(paths) == {"lr_csv", "lr_table"}
    with open(paths["lr_table"]) as f:
        assert "Command: `the lr sweep`" in f.read()
    with open(os.path.join(out, "table.md")) as f:
        assert "Command: `pytest`" in f.read()


@pytest.mark.slow
def test_a_table_never_averages_learning_rates_and_per_scheme_rates_report_apart(sweep, tmp_path):
    """Runs at another rate beside the grid's (what ``--per_scheme_lr`` adds to ``OUT/runs``) are kept out of the
    shared-rate table, reported on their own in ``report_dir``, and a column mixing rates is an error."""
    import json
    out = str(tmp_path / "mixed")
    shutil.copytree(sweep[0], out)
    record = {r["scheme"]: r for r in da_runs.load_records(out)}["none"]
    record["learning_rate"], record["final_test_accuracy"] = 2e-3, 0.5
    with open(os.path.join(out, "runs", "extra.json"), "w") as f:
        json.dump(record, f)
    with pytest.raises(ValueError, match=r"several learning rates in one column: \{'none': \[0.002, 0.005\]\}"):
        da_early.write_reports(out)
    shared = da_early.write_reports(out, rates=5e-3)
    assert sorted(r["scheme"] for r in read_rows(shared["csv"])) == ["layerscale", "none"]
    rates = {"none": 2e-3, "layerscale": 5e-3, "skipinit": 1e30}
    own = da_early.write_reports(out, command="per scheme", rates=rates, report_dir=os.path.join(out, "per_scheme_lr"))
    assert os.path.dirname(own["table"]) == os.path.join(out, "per_scheme_lr")
    rows = {r["scheme"]: r for r in read_rows(own["csv"])}
    assert set(rows) == {"none", "layerscale", "skipinit"} and rows["none"]["final_test_accuracy"] == "0.5"
    table = open(own["table"]).read()
    assert "each scheme at its own learning rate (none 0.002, layerscale 0.005, skipinit 1e+30)" in table
    assert "| 1 | 50.0 |" in table


def _differences(text: str) -> list[tuple[float, ...]]:
    """Every "difference [low, high]" in ``text`` (claims.md writes "+0.23 [-1.38, +1.83]", the write-ups
    "+0.23 [−1.38, 1.83]"), and every end of a range "a … b", as floats."""
    text = text.replace("−", "-")
    number = r"([+-]?\d+\.\d+)"
    found = [tuple(map(float, m)) for m in re.findall(rf"{number} \[{number}, {number}\]", text)]
    return found + [(float(x),) for pair in re.findall(rf"{number} … {number}", text) for x in pair]


@pytest.mark.parametrize("path", ["README.md", "experiments/README.md"])
def test_the_write_ups_verdicts_quote_the_committed_claims(path):
    """The verdict tables of README's Depth ablation and experiments/README's Results are the committed final
    claims.md of each rate choice: each claim's verdict, and every difference, interval and range end they quote is
    one of that claim's comparisons (a rerun that changes claims.md must update the write-ups)."""
    final = os.path.join(da_runs.ROOT, "experiments", "results", "depth_ablation_converged", "final")
    rows = [[c.strip() for c in ln.split("|")[1:-1]]
            for ln in open(os.path.join(da_runs.ROOT, path)).read().splitlines() if re.match(r"\| \d[ab]?\. ", ln)]
    assert [r[0].split(".")[0] for r in rows] in (["1", "2", "3", "4", "5", "6"], ["1", "2", "3", "4a", "4b", "5", "6"])
    for column, choice in ((1, "per_depth"), (2, "one_rate")):
        claims = open(os.path.join(final, choice, "claims.md")).read()
        verdicts = dict(re.findall(r"^\| (\d[ab]?)\. .*\| \*\*(.+?)\*\* \|$", claims, re.M))
        sections = dict(re.findall(r"^### Claim (\d[ab]?):.*?\n(.*?)(?=^### |\Z)", claims, re.M | re.S))
        for row in rows:
            number = row[0].split(".")[0]
            parts = [k for k in verdicts if k == number or k[:-1] == number]
            reproduced = {verdicts[k] == "reproduced" for k in parts}
            assert len(reproduced) == 1 and row[column].startswith("**reproduced**") == reproduced.pop(), row
            quoted = _differences(row[column])
            if {verdicts[k] for k in parts} == {"not tested"}:          # runs missing: the write-up says so
                assert row[column].startswith("not tested") and not quoted, row
                continue
            interim = any(verdicts[k].startswith("interim") for k in parts)   # part of the claim tested: no verdict
            assert row[column].startswith("interim") == interim, row
            assert quoted, row
            tests = [d for k in parts for d in _differences(sections[k].split("| outcome |")[1])]
            for difference in quoted:
                assert any(d[:len(difference)] == difference for d in tests), (path, choice, row[0], difference)


def _detectable_span(section: str, depth: int) -> str:
    """The write-ups' summary of one claim's detectable differences at ``depth`` from its claims.md ``section``:
    "a–b @ depth" (or "a @ depth") over both levels of every comparison within the range, then "(k of n beyond
    the range)" when some lie beyond it, or "none @ depth (beyond the range)" when all do."""
    values = []
    for line in "".join(section.split("| outcome |")[1:]).splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) > 2 and re.search(rf"@ {depth}( |$)", cells[0]) and cells[-2] != "–":
            values += [None if v.strip().startswith("not detectable") else float(v)
                       for v in cells[-2].split(" (range")[0].split(" / ")]
    inside = [v for v in values if v is not None]
    if not inside:
        return f"none @ {depth} (beyond the range)"
    beyond = len(values) - len(inside)
    span = f"{min(inside):.2f}" + (f"–{max(inside):.2f}" if max(inside) > min(inside) else "")
    return f"{span} @ {depth}" + (f" ({beyond} of {len(values)} beyond the range)" if beyond else "")


@pytest.mark.parametrize("path", ["README.md", "experiments/README.md"])
def test_the_write_ups_detectable_differences_are_the_committed_claims_simulated_ones(path):
    """Every claim row of the verdict tables that quotes a detectable difference quotes, per depth, the range of
    the committed claims.md's simulated ones within the endpoint's range and how many lie beyond it."""
    final = os.path.join(da_runs.ROOT, "experiments", "results", "depth_ablation_converged", "final")
    rows = [[c.strip() for c in ln.split("|")[1:-1]]
            for ln in open(os.path.join(da_runs.ROOT, path)).read().splitlines() if re.match(r"\| \d[ab]?\. ", ln)]
    quoted = 0
    for column, choice in ((1, "per_depth"), (2, "one_rate")):
        claims = open(os.path.join(final, choice, "claims.md")).read()
        assert "by simulation of Welch's test at the observed SDs (post hoc)" in claims
        sections = dict(re.findall(r"^### Claim (\d[ab]?):.*?\n(.*?)(?=^### |\Z)", claims, re.M | re.S))
        for row in rows:
            if "detectable" not in row[column]:
                continue
            number = row[0].split(".")[0]
            section = "".join(v for k, v in sections.items() if k == number or k[:-1] == number)
            expected = f"detectable {_detectable_span(section, 48)}, {_detectable_span(section, 96)}"
            assert expected in row[column], (path, choice, row[0], expected)
            quoted += 1
    assert quoted >= 8


def _detectables(section: str) -> list[tuple[str, int, int, float | None, float | None]]:
    """Every detectable difference in one claim's claims.md ``section``: (comparison, depth, level — 0 for Holm's
    α/m, 1 for α —, the difference or None where it is beyond the range, the range claims.md states or None)."""
    found = []
    for line in "".join(section.split("| outcome |")[1:]).splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) < 3 or cells[-2] in ("–", "---") or not re.search(r"@ \d+", cells[0]):
            continue
        depth = int(re.findall(r"@ (\d+)", cells[0])[-1])
        stated = re.search(r" \(range (\d+\.\d+)\)$", cells[-2])
        for level, v in enumerate(cells[-2].split(" (range")[0].split(" / ")):
            beyond = v.strip().startswith("not detectable")
            found.append((cells[0], depth, level, None if beyond else float(v), float(stated[1]) if stated else None))
    return found


def _span(values) -> str:
    """``"a–b"`` of ``values`` at two decimals."""
    return f"{min(values):.2f}–{max(values):.2f}"


def test_the_write_ups_summaries_of_the_detectable_differences_are_the_committed_per_depth_claims():
    """The prose summaries of the per-depth choice's detectable differences in README and experiments/README are
    the committed ``final/per_depth/claims.md``'s: over every not-reproduced claim (README's opening of the powered
    study), over CaiT's claims 2–5 per depth with the comparisons against `none` apart at 48 (README's and
    experiments/README's "what a digits-scale study can say"), and over claim 4 (4a and 4b; experiments/README's
    claim 4), each with how many lie beyond the range 100 − the claimed-worse cell's mean and those ranges."""
    claims = open(os.path.join(da_protocol.CONVERGED_OUT, "final", "per_depth", "claims.md")).read()
    verdicts = dict(re.findall(r"^\| (\d[ab]?)\. .*\| \*\*(.+?)\*\* \|$", claims, re.M))
    sections = dict(re.findall(r"^### Claim (\d[ab]?):.*?\n(.*?)(?=^### |\Z)", claims, re.M | re.S))
    assert set(sections) == set(verdicts) == {"1", "2", "3", "4a", "4b", "5", "6"}

    def detectables(names, depth=None):
        return [d for k in names for d in _detectables(sections[k]) if depth is None or d[1] == depth]

    readme = " ".join(open(os.path.join(da_runs.ROOT, "README.md")).read().split())
    experiments = " ".join(open(os.path.join(da_runs.ROOT, "experiments", "README.md")).read().split())
    # README: every detectable difference of the claims not reproduced (2–6), both depths, both levels
    found = detectables([k for k, v in verdicts.items() if v != "reproduced"])
    inside = [d[3] for d in found if d[3] is not None]
    assert (f"its seeds resolve only differences of {_span(inside)} points (by simulation, post hoc; claims 2–6 at "
            f"per-depth rates) and {len(found) - len(inside)} of their {len(found)} detectable differences "
            f"exceed") in readme
    # CaiT's claims 2–5: at 48 apart against `none`, at 96 those within the range, how many beyond and their ranges
    cait = ["2", "3", "4a", "4b", "5"]
    at_48 = [d for d in detectables(cait, 48) if d[3] is not None]
    assert len(at_48) == len(detectables(cait, 48)), "beyond the range at 48: the write-ups say none is"
    others = _span([d[3] for d in at_48 if "vs `none`" not in d[0]])
    against_none = _span([d[3] for d in at_48 if "vs `none`" in d[0]])
    at_96 = detectables(cait, 96)
    beyond = [d for d in at_96 if d[3] is None]
    assert all(d[4] is not None for d in beyond)
    within, ranges = _span([d[3] for d in at_96 if d[3] is not None]), _span([d[4] for d in beyond])
    assert (f"only differences of {others} points at depth 48 — {against_none} against `none` — and {within} at 96 "
            f"are resolvable, by simulation at the observed SDs, while {len(beyond)} of the {len(at_96)} at 96 exceed "
            f"the {ranges} points the claimed-worse cell has left to 100%") in readme
    assert (f"is {others} points at depth 48 ({against_none} against `none`, whose seeds spread widely there) and "
            f"{within} points at depth 96 where it is within the range at all: {len(beyond)} of the {len(at_96)} of "
            f"claims 2–5 there exceed the {ranges} points the claimed-worse cell has left to 100%") in experiments
    # claim 4 (4a and 4b): the one difference within the range at 96 named, the others' ranges
    at_96 = detectables(["4a", "4b"], 96)
    (only,) = [d for d in at_96 if d[3] is not None]
    assert only[:3] == ("`layerscale` @ 96 vs `rezero` @ 96", 96, 1)      # ReZero with warm-up, at α
    beyond = _span([d[4] for d in at_96 if d[3] is None])
    assert (f"Detectable at 80% power: {_span([d[3] for d in detectables(['4a', '4b'], 48)])} points at 48; at 96 "
            f"only {only[3]:.2f} (ReZero with warm-up, at α), the other {len(at_96) - 1} of {len(at_96)} beyond the "
            f"{beyond} points LayerScale could be ahead") in experiments


def test_the_ceiling_the_write_up_states_is_the_committed_per_depth_runs():
    """experiments/README's "what a digits-scale study can say": the span of every cell's mean and the headroom to
    100% at depths 48 and 96, recomputed from the per-depth choice's committed run rows (runs that did not diverge;
    a cell is a depth and a column: scheme, ε and warm-up)."""
    rows = csv.DictReader(open(os.path.join(da_protocol.CONVERGED_OUT, "final", "per_depth", "results.csv")))
    cells = {}
    for row in rows:
        if row["diverged"] == "False":
            key = (int(row["depth"]), row["scheme"], row["epsilon"], row["warmup"])
            cells.setdefault(key, []).append(100 * float(row["final_test_accuracy"]))
    means = {key: sum(v) / len(v) for key, v in cells.items()}
    assert len(means) == 40                                  # 8 columns × 5 depths
    deep = [m for (depth, *_), m in means.items() if depth in (48, 96)]
    experiments = " ".join(open(os.path.join(da_runs.ROOT, "experiments", "README.md")).read().split())
    assert f"every cell's mean lies between {min(means.values()):.1f} and {max(means.values()):.1f}%" in experiments
    assert (f"the headroom to 100% at depths 48 and 96 is {100 - max(deep):.1f}–{100 - min(deep):.1f} points"
            in experiments)


def test_the_committed_tables_are_what_the_committed_run_records_give(tmp_path):
    """Regenerating from ``experiments/results/depth_ablation/runs`` reproduces both protocols' tables (mean ± std,
    CI, Welch comparisons) and CSV."""
    results = os.path.join(da_runs.ROOT, "experiments", "results", "depth_ablation")
    records = da_runs.load_records(results)
    rates = da_early.early_rates_chosen_on_test(os.path.join(results, "lr_sweep"), da_runs.DEFAULT_SCHEMES)
    for rate, where in ((da_runs.RECIPE["learning_rate"], results), (rates, os.path.join(results, "per_scheme_lr"))):
        chosen = da_early.select_rates(records, rate)
        committed = open(os.path.join(where, "table.md")).read()
        title = committed.split("\n\n| depth")[0]
        da_early.write_table(chosen, str(tmp_path / "table.md"), title)
        da_reports.write_csv(chosen, str(tmp_path / "results.csv"))
        assert (tmp_path / "table.md").read_text() == committed
        ci = open(os.path.join(where, "table_ci.md")).read()
        vp.write_ci_table(chosen, str(tmp_path / "table_ci.md"), ci.split("\n\n| depth")[0], da_reports.layout(chosen))
        assert (tmp_path / "table_ci.md").read_text() == ci
        comparisons = open(os.path.join(where, "comparisons.md")).read()
        vp.write_comparisons(chosen, str(tmp_path / "comparisons.md"), comparisons.split("\n\n| depth")[0],
                             da_reports.layout(chosen), da_runs.REFERENCE)
        assert (tmp_path / "comparisons.md").read_text() == comparisons
        assert (tmp_path / "results.csv").read_text() == open(os.path.join(where, "results.csv")).read()


def test_the_committed_rates_are_what_the_committed_rate_records_give(tmp_path):
    """Regenerating rates.json, rates.md and results.csv from ``depth_ablation_converged/rates/runs`` gives the
    committed files, every cell bracketed."""
    committed = os.path.join(da_protocol.CONVERGED_OUT, "rates")
    shutil.copytree(os.path.join(committed, "runs"), tmp_path / "runs")
    da_reports.write_rates_report(str(tmp_path), da_protocol.validation_images())
    for name in ("rates.json", "rates.md", "results.csv"):
        assert (tmp_path / name).read_text() == open(os.path.join(committed, name)).read(), name
    assert all(json.load(open(os.path.join(committed, "rates.json")))["bracketed"].values())


def test_the_committed_budget_is_what_the_committed_budget_records_give(tmp_path):
    """Regenerating budget.json and budget.md from ``depth_ablation_converged/budget/runs`` gives the committed
    files, on the pre-registered seeds 0-2 (``BUDGET_SEEDS``), every run length of every cell with all of them."""
    committed = os.path.join(da_protocol.CONVERGED_OUT, "budget")
    shutil.copytree(os.path.join(committed, "runs"), tmp_path / "runs")
    da_reports.write_budget_report(str(tmp_path))
    for name in ("budget.json", "budget.md"):
        assert (tmp_path / name).read_text() == open(os.path.join(committed, name)).read(), name
    budget = json.load(open(os.path.join(committed, "budget.json")))
    assert budget["seeds"] == list(da_protocol.BUDGET_SEEDS)
    assert len(da_runs.load_records(committed)) == len(da_protocol.budget_specs())


def test_the_write_ups_compute_of_the_final_stage_is_what_its_records_give():
    """The final stage's run count, CPU-hours and per-machine-kind cost quoted in README and experiments/README are
    ``sweep.compute_note`` and ``cost_by_machine_kind`` of the committed final records."""
    records = da_runs.load_records(os.path.join(da_protocol.CONVERGED_OUT, "final"))
    total = re.match(r"(\d+) runs took ([\d.]+) CPU-hours", da.sweep.compute_note(records)).groups()
    kinds = re.findall(r"from its (\d+) runs\): ([\d.]+) CPU-hours, ≈ ([\d.]+) hours",
                       da_cost.cost_by_machine_kind(records))
    readme = open(os.path.join(da_runs.ROOT, "README.md")).read().replace("\n", " ")
    experiments = open(os.path.join(da_runs.ROOT, "experiments", "README.md")).read()
    assert f"final stage's {total[0]} runs took {total[1]} CPU-hours" in readme
    assert f"the {total[0]} runs took {total[1]} CPU-hours" in experiments.replace("\n", " ")
    table = experiments[experiments.index("| machine (2 cores; malloc) |"):]
    table = table[:table.index("\n\n")]
    assert re.findall(r"\| (\d+) \| ([\d.]+) \| \**([\d.]+)\** \|", table) == kinds


def test_a_bad_shard_stops_the_command_naming_it():
    with pytest.raises(SystemExit, match="--shard='5/4' must have 1 ≤ i ≤ n"):
        da.main(["--protocol", "final", "--shard", "5/4", "--out", "/nonexistent"])


# ---------------------------------------------------------------------------------------------------------------
# The protocol's stages (their generic pieces: tests/test_validation_protocol.py)
# ---------------------------------------------------------------------------------------------------------------
def fake_record(scheme="layerscale", warmup=True, depth=12, lr=1e-2, acc=0.9, diverged=False, seed=0,
                protocol="rates", split="validation"):
    prefix = "test" if split == "test" else "val"
    return {"run_id": f"{protocol}_{scheme}_{warmup}_{depth}_{lr:g}_{seed}", "protocol": protocol, "scheme": scheme,
            "warmup": warmup, "depth": depth, "learning_rate": lr, "seed": seed, "diverged": diverged,
            "eval_split": split, f"final_{prefix}_accuracy": acc}


def test_the_budget_is_the_largest_cells_converged_length_within_the_validation_resolution():
    def run(scheme, depth, steps, acc):
        r = fake_record(scheme, depth=depth, protocol="budget", acc=acc / 100)
        r["steps"], r["run_id"] = steps, f"{r['run_id']}_{steps}"
        return r
    # tolerance = one binomial standard error of the longest run on 285 images: 98.0% → 0.829, 97.0% → 1.010
    records = [run("layerscale", 24, t, a) for t, a in {500: 96.0, 1000: 97.5, 3000: 98.0}.items()]
    records += [run("skipinit", 96, t, a) for t, a in {500: 95.0, 1000: 95.9, 2000: 96.5, 3000: 97.0}.items()]
    choice = da_protocol.choose_budget(records, validation_images=285)
    assert choice["cells"] == {"layerscale, depth 24": 1000, "skipinit, depth 96": 2000}
    assert choice["steps"] == 2000
    assert choice["tolerance_points"]["skipinit, depth 96"] == pytest.approx(1.0105, abs=1e-4)
    assert da_protocol.choose_budget(records, 285, tolerance=2.5)["steps"] == 500
    with pytest.raises(ValueError, match=r"add a longer run \(--budget_steps\)"):
        da_protocol.choose_budget(records, 285, tolerance=0.4)
    test_run = run("layerscale", 24, 500, 90.0)
    test_run["eval_split"] = "test"
    with pytest.raises(ValueError, match="validation split only"):
        da_protocol.choose_budget([test_run], 285)


def test_the_budget_on_several_seeds_compares_each_run_lengths_mean_and_refuses_unequal_seeds(tmp_path):
    def run(steps, seed, acc):
        r = fake_record("skipinit", depth=96, protocol="budget", acc=acc / 100, seed=seed)
        r.update(steps=steps, run_id=f"{r['run_id']}_{steps}", dataset="digits", train_split="train_without_validation",
                 embed_dim=32, seconds=1.0, diverged_at_step=None,
                 evaluations=[{"step": steps // 2, "val_accuracy": 0.9}, {"step": steps, "val_accuracy": acc / 100}])
        return r
    # seed 0 alone: 2,000 steps ends 1.1 points above 3,000 — by hand, with 97.0% at 3,000 the tolerance is 1.01,
    # and 1,000 steps (95.0) is 2.0 below: converged at 2,000. Seeds 1 and 2 move the means: 1,000 → 96.5, 3,000 →
    # 97.0: 0.5 below, within the tolerance of the mean (1.01): converged at 1,000
    accs = {1000: (95.0, 97.5, 97.0), 2000: (98.1, 97.0, 96.5), 3000: (97.0, 97.0, 97.0)}
    records = [run(t, seed, a[seed]) for t, a in accs.items() for seed in range(3)]
    assert da_protocol.choose_budget([r for r in records if r["seed"] == 0], 285)["steps"] == 2000
    choice = da_protocol.choose_budget(records, 285)
    assert choice["steps"] == 1000 and choice["seeds"] == [0, 1, 2]
    assert choice["finals"]["skipinit, depth 96"] == pytest.approx({1000: 96.5, 2000: 97.2, 3000: 97.0})
    with pytest.raises(ValueError, match=r"skipinit, depth 96 has different seeds per run length \(steps: seeds "
                                         r"\{1000: \[0, 1, 2\], 2000: \[0, 1, 2\], 3000: \[0\]\}\)"):
        da_protocol.choose_budget(records[:-2], 285)
    for r in records:
        da.sweep.save_json(da.sweep.record_path(str(tmp_path), r["run_id"]), r)
    da_reports.write_budget_report(str(tmp_path))
    text = (tmp_path / "budget.md").read_text()
    assert "mean over seeds 0, 1, 2; in brackets each seed's, in that order" in text
    row = "| skipinit, depth 96 | 96.5 (95.0, 97.5, 97.0) | 97.2 (98.1, 97.0, 96.5) | 97.0 (97.0, 97.0, 97.0) |"
    assert row in text


def test_the_protocol_estimate_sums_every_stage_from_per_step_costs_linear_in_depth():
    # one second per step per layer, nothing else: budget 3 seeds × Σ_T T · (24 + 24 + 96 + 96) = 3 · 6,500 · 240 s
    # = 1300:00:00; rates 8 columns × (6+12+24+48+96 = 186 layers) × 4 rates × 10 steps = 59,520 s = 16:32:00;
    # final 8 × 186 × 5 seeds × 2 protocols × 10 steps = 148,800 s = 41:20:00
    costs = {d: {"setup": 0.0, "first_step": 0.0, "per_step": float(d), "evaluations": 0.0} for d in (6, 96)}
    text = da_cost.protocol_estimate(costs, steps=10)
    assert text.startswith("budget 1300:00:00 (48 runs of 500/1000/2000/3000 steps); rates 16:32:00 (160 runs")
    assert "final 41:20:00 (≤ 400 runs of 10 steps); total 1357:52:00" in text


def test_the_validation_split_of_the_budget_has_285_images():
    assert da_protocol.validation_images() == 285


def test_rates_are_chosen_per_depth_and_once_for_all_depths_on_validation():
    records = [fake_record(depth=d, lr=lr, acc=a) for d, accs in
               {12: {1e-3: .5, 2e-3: .9, 5e-3: .6}, 48: {1e-3: .8, 2e-3: .7, 5e-3: .1}}.items()
               for lr, a in accs.items()]
    records += [fake_record(depth=48, lr=5e-4, acc=.7)]                      # 48's best was at the low edge
    rates = da_protocol.best_learning_rates(records, 100, columns=(("layerscale", True),), depths=(12, 48),
                                            start=(1e-3, 2e-3, 5e-3))
    assert rates["per_depth"] == {("layerscale", True, 12): 2e-3, ("layerscale", True, 48): 1e-3}
    assert rates["bracketed"] == {("layerscale", True, 12): True, ("layerscale", True, 48): True}
    assert rates["one_rate"] == {("layerscale", True): 2e-3}                  # 90 + 70 of 100 images is the most
    assert rates["one_rate_bracketed"] == {("layerscale", True): True}        # inside 1e-3 … 5e-3, swept at both
    assert not any(rates["tie_at_edge"].values())
    assert da_protocol.rates_from_json(da_protocol.rates_to_json(rates)) == rates
    with pytest.raises(ValueError, match="validation split only"):
        da_protocol.best_learning_rates([fake_record(split="test")], 100, columns=(("layerscale", True),), depths=(12,))
    with pytest.raises(ValueError, match="unfinished"):
        da_protocol.best_learning_rates(records[:2], 100, columns=(("layerscale", True),), depths=(12,),
                                        start=(1e-3, 2e-3, 5e-3))


def test_the_one_rate_choice_compares_whole_images_and_breaks_a_tie_to_the_lower_rate():
    # 1391 of 285 images at both 1e-2 and 2e-2 over the five depths in the committed rate sweep: the float sums of
    # accuracy differ in the 16th digit (the audit of issue 37), the image counts do not; the rule's tie goes to 1e-2
    records = da_runs.load_records(os.path.join(da_protocol.CONVERGED_OUT, "rates"))
    mine = {lr: [r for r in records if (r["scheme"], r["warmup"]) == ("layerscale", True)
                 and math.isclose(r["learning_rate"], lr)] for lr in (1e-2, 2e-2)}
    assert {lr: len(runs) for lr, runs in mine.items()} == {1e-2: 5, 2e-2: 5}
    assert {lr: sum(vp.correct_images(r, 285) for r in runs) for lr, runs in mine.items()} == {1e-2: 1391,
                                                                                                 2e-2: 1391}
    floats = {lr: sum(r["final_val_accuracy"] for r in runs) for lr, runs in mine.items()}
    assert floats == {1e-2: 4.8807017543859645, 2e-2: 4.880701754385965}          # the sum that broke the tie
    rates = da_protocol.best_learning_rates(records, 285)
    assert rates["one_rate"][("layerscale", True)] == 1e-2
    # the audit: `none` (5e-3) and `scalar` (2e-2) sat at an edge of the rates swept at every depth; the
    # one-rate bracketing trained 2e-3 (`none`) and 5e-2 (`scalar`) at every depth lacking them, and neither choice
    # moved: 1380 < 1386 and 1342 < 1389 images (rates.md); three per-depth cells are inside only because an edge
    # rate's tie went to the lower rate
    assert rates["one_rate"][("none", True)] == 5e-3 and rates["one_rate"][("scalar", True)] == 2e-2
    assert rates["one_rate_swept"][("none", True)] == [2e-3, 5e-3, 1e-2, 2e-2]
    assert rates["one_rate_swept"][("scalar", True)] == [5e-3, 1e-2, 2e-2, 5e-2]
    assert all(rates["one_rate_bracketed"].values())
    assert {c for c, tie in rates["tie_at_edge"].items() if tie} == {("none", True, 6), ("scalar", True, 24),
                                                                     ("skipinit", False, 24)}
    # a synthetic tie: 1 + 2 against 2 + 1 of 3 images at two depths; the lower rate
    tie = [fake_record(depth=d, lr=lr, acc=c / 3) for d, counts in {12: {1e-3: 1, 2e-3: 2}, 48: {1e-3: 2, 2e-3: 1}}
           .items() for lr, c in counts.items()]
    tied = da_protocol.best_learning_rates(tie, 3, columns=(("layerscale", True),), depths=(12, 48), start=(1e-3, 2e-3),
                                           max_extensions=0)
    assert tied["one_rate"] == {("layerscale", True): 1e-3} and tied["one_rate_bracketed"] == {("layerscale", True):
                                                                                               False}


def test_the_one_rate_is_bracketed_by_training_the_next_ladder_rate_at_every_depth_that_lacks_it():
    start, column = (1e-3, 2e-3, 5e-3), ("layerscale", True)
    accs = {12: {1e-3: .5, 2e-3: .6, 5e-3: .7, 1e-2: .65},         # own sweep extended up once: best 5e-3
            48: {1e-3: .9, 2e-3: .8, 5e-3: .7, 5e-4: .6}}          # extended down once: best 1e-3
    records = [fake_record(depth=d, lr=lr, acc=a) for d, by_rate in accs.items() for lr, a in by_rate.items()]

    def sweep_of(records, max_extensions=3):
        return da_protocol.one_rate_sweep(records, *column, (12, 48), 100, start, max_extensions)
    # swept at both depths: 1e-3, 2e-3, 5e-3 with 50 + 90, 60 + 80, 70 + 70 of 2 × 100 images: a three-way tie,
    # to the lowest rate, an edge: 5e-4 joins, trained at depth 12 (depth 48 has it from its own sweep)
    assert sweep_of(records) == ([5e-4, 1e-3, 2e-3, 5e-3], None)
    planned = da_protocol.rate_specs(records, 100, (column,), (12, 48), start=start, images=100)
    missing = [s for s in planned if not any(r["depth"] == s.depth and math.isclose(r["learning_rate"],
                                                                                   s.learning_rate) for r in records)]
    assert missing == [da_runs.RunSpec(12, "layerscale", True, 0, 5e-4, "rates", 100)]
    status = da_reports.rates_status(records, (column,), (12, 48), start, images=100)
    assert "| layerscale | needs 0.0005 at depths 12 |" in status
    with pytest.raises(ValueError, match=r"one-rate sweep of layerscale is unfinished \(needs 0.0005 at depths "
                                         r"\[12\]\)"):
        da_protocol.best_learning_rates(records, 100, (column,), (12, 48), start=start)
    # 5e-4 at depth 12 gets 30 images: 30 + 60 = 90 < 140, so 1e-3 is inside 5e-4 … 5e-3
    rates = da_protocol.best_learning_rates(records + [fake_record(depth=12, lr=5e-4, acc=.3)], 100, (column,),
                                            (12, 48), start=start)
    assert rates["one_rate"] == {column: 1e-3} and rates["one_rate_bracketed"] == {column: True}
    assert rates["one_rate_swept"] == {column: [5e-4, 1e-3, 2e-3, 5e-3]}
    assert rates["per_depth"] == {column + (12,): 5e-3, column + (48,): 1e-3}    # each cell's own choice is kept
    assert "| layerscale | bracketed: 0.001 |" in da_reports.rates_status(
        records + [fake_record(depth=12, lr=5e-4, acc=.3)], (column,), (12, 48), start, images=100)
    assert da_protocol.rates_from_json(json.loads(json.dumps(da_protocol.rates_to_json(rates)))) == rates
    # 5e-4 at depth 12 gets 90 images: 150 beats 140, the lowest again → 2e-4 at both depths, or, with no extension
    # left, the choice stays at the edge, unbracketed
    higher = records + [fake_record(depth=12, lr=5e-4, acc=.9)]
    assert sweep_of(higher) == ([2e-4, 5e-4, 1e-3, 2e-3, 5e-3], None)
    assert sweep_of(higher, max_extensions=1) == ([5e-4, 1e-3, 2e-3, 5e-3], 5e-4)
    # a column whose cells' own sweeps are unfinished plans nothing beyond them yet
    assert sweep_of(records[:3]) == ([], None)


def test_rates_md_marks_a_choice_whose_lead_is_below_the_binomial_standard_error(tmp_path):
    accs = {12: {1e-3: .97, 2e-3: .98, 5e-3: .60}, 48: {1e-3: .975, 2e-3: .98, 5e-3: .1}}
    for depth, by_rate in accs.items():
        for lr, acc in by_rate.items():
            r = fake_record(depth=depth, lr=lr, acc=acc, diverged=acc == .1)
            r.update(dataset="digits", train_split="train_without_validation", steps=100, embed_dim=32, seconds=1.0,
                     diverged_at_step=None)
            da.sweep.save_json(da.sweep.record_path(str(tmp_path), r["run_id"]), r)
    da_reports.write_rates_report(str(tmp_path), 285, columns=(("layerscale", True),), depths=(12, 48),
                                  start=(1e-3, 2e-3, 5e-3))
    text = (tmp_path / "rates.md").read_text()
    # by hand: SE at 98% on 285 images = 100·√(0.98·0.02/285) = 0.829 points; depth 12 leads by 1.0 (resolved),
    # depth 48 by 0.5 over 1e-3 (the diverged 5e-3 is no contender)
    assert "in 1 of 2 cells the best rate leads the next-best by less than one binomial standard error" in text
    assert "| layerscale | 12 | 0.001 … 0.005 (3) | 0.002 | yes | 98.0 | 1.0 | 0 |" in text
    assert "| layerscale | 48 | 0.001 … 0.005 (3) | 0.002 | yes | 98.0 | 0.5 (< SE) | 1 |" in text


def test_divergence_by_rate_counts_layernorm_kept_against_removed_at_the_deep_depths_with_fishers_test():
    runs = [("none", 48, 2e-2, False), ("layerscale", 96, 2e-2, False), ("scalar", 96, 2e-2, True),
            ("rezero", 48, 2e-2, True), ("skipinit", 96, 2e-2, True), ("skipinit", 96, 1e-2, False),
            ("layerscale", 96, 1e-2, False), ("rezero", 12, 2e-2, False),        # depth 12: not counted
            ("none", 48, 1e-3, False)]                                          # no LayerNorm-free run at 1e-3
    records = [dict(fake_record(depth=d, lr=lr, diverged=div), scheme=scheme) for scheme, d, lr, div in runs]
    text = da_reports.divergence_by_rate(records, (48, 96))
    # by hand, 2e-2: kept 1 of 3 diverged, removed 2 of 2; 3 of the 5 runs diverged, X of them among the 2 removed:
    # P(X=2) = C(3,2)·C(2,0)/C(5,2) = 3/10 (observed), P(X=1) = 6/10, P(X=0) = 1/10; two-sided p sums the tables
    # no likelier than the observed one: 3/10 + 1/10 = 0.4
    assert "| 0.02 | 1/3 | 2/2 | 0.4 |" in text
    assert "| 0.01 | 0/1 | 0/1 | 1 |" in text and "| 0.001 |" not in text
    assert da_reports.divergence_by_rate(records, (24,)) == ""


def test_the_rate_status_shows_each_cells_finished_rates_and_what_it_still_needs():
    start = (1e-3, 2e-3, 5e-3)
    records = [fake_record(depth=12, lr=lr, acc=a) for lr, a in {1e-3: .5, 2e-3: .9, 5e-3: .6}.items()]
    records += [fake_record(depth=24, lr=lr, acc=a) for lr, a in {1e-3: .8, 2e-3: .7}.items()]
    records += [fake_record(depth=24, lr=5e-3, acc=.1, diverged=True), fake_record(depth=48, lr=2e-3, acc=.9)]
    records += [fake_record(depth=96, lr=lr, acc=a) for lr, a in {1e-3: .9, 2e-3: .8, 5e-3: .7, 5e-4: .95,
                                                                   2e-4: .97}.items()]
    text = da_reports.rates_status(records, columns=(("layerscale", True),), depths=(12, 24, 48, 96), start=start,
                                   max_extensions=2)
    assert "Rate sweep: 12 runs finished, 2 of 4 cells still need runs." in text
    assert "| layerscale | 12 | 0.001: 50.0, 0.002: 90.0, 0.005: 60.0 | bracketed: 0.002 |" in text
    assert "| layerscale | 24 | 0.001: 80.0, 0.002: 70.0, 0.005: div. | needs 0.0005 |" in text   # best at the edge
    assert "| layerscale | 48 | 0.002: 90.0 | needs 0.001, 0.005 |" in text
    assert "| layerscale | 96 | 0.0002: 97.0, 0.0005: 95.0, 0.001: 90.0, 0.002: 80.0, 0.005: 70.0 | " \
           "**edge: 0.0002** (after 2 extensions) |" in text


def test_the_remaining_cpu_time_is_the_finished_runs_mean_per_depth_or_linear_in_depth():
    records = [{"depth": 6, "cpu_seconds": 40.0}, {"depth": 6, "cpu_seconds": 50.0},
               {"depth": 48, "cpu_seconds": 480.0}, {"depth": 12, "seconds": 999.0}]      # the last: no CPU time
    missing = [da_runs.RunSpec(d, "layerscale", True, 0, 1e-2, "final", 100) for d in (6, 48, 96)]
    # by hand: 45 s (mean at 6) + 480 s (at 48) + 96 × mean(40/6, 50/6, 480/48 = 10) = 96 × 8.333 = 800 s
    hours, based_on, same_kind = da_cost.remaining_cpu_hours(missing, records)
    assert hours == pytest.approx((45 + 480 + 800) / 3600) and based_on == 3 and not same_kind
    assert da_cost.remaining_cpu_hours(missing, records[3:]) is None


def test_the_remaining_cpu_time_counts_only_runs_on_this_machines_kind_where_there_are_some():
    zen5 = {"cpu": "AMD EPYC", "cpu_family_model": "family 26 model 2", "malloc": "tcmalloc"}
    records = [{"depth": 48, "cpu_seconds": 960.0, "machine": {"cpu": "AMD EPYC"}},            # older: no kind
               {"depth": 48, "cpu_seconds": 480.0, "machine": dict(zen5, load_average_start=[1, 1, 1])}]
    missing = [da_runs.RunSpec(d, "layerscale", True, 0, 1e-2, "final", 100) for d in (48, 96)]
    # by hand, this kind only: 480 s at 48 + 96 × 480/48 = 960 s at 96
    assert da_cost.remaining_cpu_hours(missing, records, zen5) == (pytest.approx((480 + 960) / 3600), 1, True)
    other = dict(zen5, malloc="glibc")
    assert da_cost.remaining_cpu_hours(missing, records, other) == (pytest.approx((720 + 1440) / 3600), 2, False)


def test_the_cost_on_one_machine_kind_projects_every_run_onto_each_kind_that_ran_every_depth():
    zen5 = {"cpu": "AMD EPYC", "cpu_family_model": "family 26 model 2", "malloc": "tcmalloc"}
    records = [{"depth": 6, "cpu_seconds": 100.0, "machine": {"cpu": "AMD EPYC"}},
               {"depth": 96, "cpu_seconds": 1600.0, "machine": {"cpu": "AMD EPYC"}},
               {"depth": 96, "cpu_seconds": 2000.0, "machine": {"cpu": "AMD EPYC"}},
               {"depth": 6, "cpu_seconds": 40.0, "machine": zen5},
               {"depth": 96, "cpu_seconds": 720.0, "machine": zen5},
               {"depth": 96, "cpu_seconds": 500.0, "machine": {"cpu": "Intel Xeon", "malloc": "tcmalloc"}},
               {"depth": 6, "seconds": 30.0, "machine": zen5}]                  # no CPU time: not measured
    # by hand, all 7 runs (three at depth 6, four at 96): the older EPYC 3·100 + 4·1800 = 7,500 s; Zen 5
    # 3·40 + 4·720 = 3,000 s; the Xeon ran no depth-6 run, so it projects nothing
    assert da_cost.cost_by_machine_kind(records) == (
        "All 7 runs on one machine kind, each at that kind's mean CPU time at its depth: "
        f"AMD EPYC, malloc not recorded (from its 3 runs): {7500 / 3600:.1f} CPU-hours, ≈ {3750 / 3600:.1f} hours "
        "of 2 cores with one shard per core; "
        f"AMD EPYC, family 26 model 2, malloc tcmalloc (from its 2 runs): {3000 / 3600:.1f} CPU-hours, "
        f"≈ {1500 / 3600:.1f} hours of 2 cores with one shard per core.")
    assert da_cost.cost_by_machine_kind(records[5:]) == ""


def test_status_prints_where_a_stage_stands_and_trains_nothing(tmp_path, capsys):
    da.main(["--protocol", "rates", "--status", "--out", str(tmp_path)])
    assert "Rate sweep: 0 runs finished, 40 of 40 cells still need runs." in capsys.readouterr().out
    da.main(["--protocol", "budget", "--status", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("budget: 0 of 48 runs finished; next: budget_depth24_layerscale_warmupon_lr0.01_seed0")
    with pytest.raises(SystemExit, match="^error: no .*rates.json: run --protocol rates first"):
        da.main(["--protocol", "final", "--status", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="^error: --status is for --protocol budget, rates or final"):
        da.main(["--protocol", "early", "--status", "--out", str(tmp_path)])
    assert not os.listdir(tmp_path)


def test_the_final_runs_of_the_per_depth_choice_come_first_and_a_shared_run_is_trained_once():
    columns = (("layerscale", True), ("none", True))
    rates = {"per_depth": {("layerscale", True, 6): 5e-2, ("layerscale", True, 96): 1e-2,
                           ("none", True, 6): 5e-3, ("none", True, 96): 5e-3},
             "one_rate": {("layerscale", True): 1e-2, ("none", True): 5e-3}}
    specs = da_protocol.final_specs(rates, 100, depths=(6, 96), seeds=(0, 1), columns=columns)
    # 4 per-depth cells × 2 seeds, then layerscale at depth 6 at its one rate (its other cells are shared)
    assert len(specs) == 10 and len({s.run_id for s in specs}) == 10
    assert [(s.seed, s.depth, s.scheme, s.learning_rate) for s in specs] == [
        (0, 6, "layerscale", 5e-2), (0, 6, "none", 5e-3), (0, 96, "layerscale", 1e-2), (0, 96, "none", 5e-3),
        (1, 6, "layerscale", 5e-2), (1, 6, "none", 5e-3), (1, 96, "layerscale", 1e-2), (1, 96, "none", 5e-3),
        (0, 6, "layerscale", 1e-2), (1, 6, "layerscale", 1e-2)]


@pytest.mark.slow
def test_the_whole_protocol_runs_end_to_end_on_a_tiny_grid(tmp_path):
    """budget → rates → final on 2 columns × 2 depths (× 2 seeds for the final runs): selection runs train on
    train_without_validation and record val_* only; final runs train on train and record test_*; every output is
    written. (One rate per cell and no extension keeps it to 16 short runs.)"""
    out = str(tmp_path)
    columns = (("layerscale", True), ("skipinit", False))
    tiny = da_runs.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=0, evals=1, log_every=2)
    common = dict(columns=columns, depths=(1, 2), sizing=tiny, log=lambda *a: None)
    budget = da.run_protocol("budget", out, seeds=(0,), budget=((2, 4), 2, 1e-2), budget_columns=columns,
                             tolerance=100.0, **common)
    assert json.load(open(budget["budget"]))["steps"] == 2          # within 100 points of the 4-step runs
    rates = da.run_protocol("rates", out, rate_start=(1e-2,), max_extensions=0, **common)
    chosen = da_protocol.rates_from_json(json.load(open(rates["rates"])))
    assert set(chosen["per_depth"]) == {c + (d,) for c in columns for d in (1, 2)}
    final = da.run_protocol("final", out, seeds=(0, 1), **common)
    assert len(da_runs.load_records(os.path.join(out, "budget"))) == 2 * 2 * 2
    for stage, splits, prefix in (("budget", ("train_without_validation", "validation"), "val"),
                                  ("rates", ("train_without_validation", "validation"), "val"),
                                  ("final", ("train", "test"), "test")):
        records = da_runs.load_records(os.path.join(out, stage))
        assert {(r["train_split"], r["eval_split"]) for r in records} == {splits}, stage
        other = "test" if prefix == "val" else "val"
        assert all(f"final_{prefix}_accuracy" in r and f"final_{other}_accuracy" not in r for r in records)
    assert len(da_runs.load_records(os.path.join(out, "final"))) == 2 * 2 * 2        # both protocols share the runs
    assert {"per_depth/table", "per_depth/comparisons", "per_depth/claims", "per_depth/claims_figure",
            "one_rate/table", "one_rate/acc_vs_depth"} <= set(final)
    table = open(final["per_depth/table"]).read()
    assert "final: digits train → test, 2 steps" in table and "| 2 |" in table
    machines = da.sweep.machines_note(da_runs.load_records(os.path.join(out, "final")))  # every run is in both choices
    assert machines.startswith("Trained on ") and machines in table
    claims = open(final["per_depth/claims"]).read()        # depth 1 is shallow, 2 deep; two of the columns ran
    assert "`layerscale` @ 2 vs `skipinit` (no warm-up) @ 2 | 2/2 vs 2/2 |" in claims
    assert "### Claim 3: not tested" in claims and "| `layerscale` @ 2 vs `scalar` @ 2 | no runs |" in claims
    assert "INCOMPLETE" not in table + claims
    runs_dir = os.path.join(out, "final", "runs")
    for name in os.listdir(runs_dir):           # an interim report says it is one, and judges the planned claims
        if name.startswith("final_depth2_"):    # at the grid's deep depth although no run there has finished
            os.remove(os.path.join(runs_dir, name))
    final = da.run_protocol("final", out, seeds=(0, 1), report_only=True, **common)
    for what in ("per_depth/table", "per_depth/claims", "one_rate/comparisons"):
        assert "INCOMPLETE: 4 of 8 runs finished — final: digits" in open(final[what]).read(), what
    claims = open(final["per_depth/claims"]).read()
    assert "| `layerscale` @ 2 vs `skipinit` (no warm-up) @ 2 | no runs |" in claims


# ---------------------------------------------------------------------------------------------------------------
# The same study at ImageNet scale
# ---------------------------------------------------------------------------------------------------------------
def test_the_imagenet_cost_from_a_measured_step_is_images_over_throughput_linear_in_depth(tmp_path, capsys):
    step = {"model": "deit3_small_patch16_224", "batch": 256, "dtype": "bfloat16", "overrides": {},
            "img_per_s": 3000.0}
    # by hand: 300 epochs × 1,281,167 images / 3,000 images/s = 128,116.7 s = 35.588 h for 12 blocks, 2.9657 h a
    # block; the grid: (12 + 18 + 24 + 36) = 90 blocks × 8 columns × 1 seed → 2,135.3 device-hours
    assert da_imagenet.imagenet_device_hours(step) == pytest.approx(2135.28, abs=0.01)
    assert (da_imagenet.imagenet_device_hours(dict(step, overrides={"depth": 24}), seeds=(0, 1))
            == pytest.approx(2135.28))
    path = tmp_path / "s16_bf16.json"
    path.write_text("compiling...\n" + json.dumps(step) + "\n")
    da.main(["--imagenet_commands", "gs://b/r", "--imagenet_step_json", str(path)])
    assert "images/s on one device): about 2,135 device-hours" in capsys.readouterr().err
    path.write_text(json.dumps(dict(step, model="deit3_base_patch16_224")))
    with pytest.raises(SystemExit, match="^error: --imagenet_step_json=.*model='deit3_base_patch16_224', img_size=224"):
        da.main(["--imagenet_commands", "gs://b/r", "--imagenet_step_json", str(path)])


@pytest.mark.slow
def test_every_imagenet_command_parses_to_its_cell():
    from layerscale_jax.train.__main__ import parse_command_line
    commands = da_imagenet.imagenet_commands("gs://bucket/ablation", seeds=(0, 1))
    assert len(commands) == len(da_imagenet.IMAGENET_DEPTHS) * len(da_runs.COLUMNS) * 2
    seen = set()
    for command in commands:
        argv = command.split()[3:]
        config = parse_command_line([a.replace("configs/", os.path.join(da_runs.ROOT, "configs") + "/", 1)
                                     if a.startswith("--config=") else a for a in argv]).config
        seen.add((config.model.depth, config.model.branch_scaling, str(config.model.init_values),
                  config.optim.warmup_steps == 0, config.train.seed))
        assert (config.model.embed_dim, config.data.name) == (384, "imagenet2012")
    assert (36, "skipinit", "auto", True, 1) in seen and (12, "layerscale", "0.1", False, 0) in seen
    assert len(seen) == len(commands)
    # 8 columns × (12 + 18 + 24 + 36) blocks × 1.37 node-hours per block (DeiT paper: 53 h · 292 / 940 / 12)
    assert da_imagenet.imagenet_node_hours() == pytest.approx(8 * 90 * 53 * 292 / 940 / 12)


@pytest.mark.slow
def test_an_imagenet_command_trains_its_first_steps_on_fake_tfds_data(tmp_path):
    """The ImageNet-scale command of one cell (DeiT III-S at depth 12, ReZero without warm-up), run in this
    process on mock TFDS imagenet2012 records (random JPEGs; ``tfds.testing.mock_data``), with only the sizes
    shrunk (32 px images, batch 8 over the test session's 8 CPU devices on the config's fsdp axis, 2 steps): it
    trains, evaluates and checkpoints."""
    import io

    import numpy as np
    import tensorflow_datasets as tfds
    from PIL import Image

    from layerscale_jax.data import sources
    from layerscale_jax.train.__main__ import main

    def jpeg(i):
        out = io.BytesIO()
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(out, "JPEG")
        return out.getvalue()

    class Records(list):                  # what builder.as_data_source returns: batched reads by key
        def __getitems__(self, keys):
            return [self[k] for k in keys]

    def as_data_source(builder, split, **_):
        return Records({"image": jpeg(i), "label": i % 1000} for i in range(builder.info.splits[split].num_examples))

    real_builder = sources.tfds_builder

    def builder_with_splits(name, data_dir):
        builder = real_builder(name, data_dir)
        builder.info.set_splits(tfds.core.SplitDict([tfds.core.SplitInfo(name=s, shard_lengths=[n], num_bytes=0)
                                                     for s, n in (("train", 16), ("validation", 8))]))
        return builder

    workdir = str(tmp_path / "run")
    args = [a for a in da_imagenet.imagenet_run_args(12, ("rezero", False), 0, workdir) if a != "--distributed"]
    args += [f"--config.data.data_dir={tmp_path / 'tfds'}", "--config.data.image_size=32", "--config.model.img_size=32",
             "--config.train.batch_size=8", "--config.train.eval_batch_size=8", "--config.train.steps=2",
             "--config.train.log_every=1", "--config.train.eval_every=2", "--config.train.checkpoint_every=2",
             "--config.data.num_workers=0"]
    from unittest import mock
    with mock.patch.object(sources, "tfds_builder", builder_with_splits), \
            mock.patch.object(sources, "_is_prepared_as_array_record", lambda builder: True), \
            tfds.testing.mock_data(as_data_source_fn=as_data_source):
        assert main(args) == 0
    config = json.load(open(os.path.join(workdir, "config.json")))
    assert (config["model"]["depth"], config["model"]["branch_scaling"], config["optim"]["warmup_steps"]) == (
        12, "rezero", 0)
    results = json.load(open(os.path.join(workdir, "results.json")))
    assert results["steps"] == 2 and results["val_examples"] == 8 and 0.0 <= results["val_accuracy"] <= 1.0


def test_the_rate_sweep_runs_round_after_round_until_bracketed_and_a_shard_stops_after_its_share(monkeypatch,
                                                                                                  tmp_path):
    """Validation accuracy peaking at 2e-2 (above the start 1e-3 … 1e-2): the sweep adds 2e-2, then 5e-2, and stops
    with 2e-2 inside. Shard 1/2 trains only its share of the plan its own records give (every other run of the
    sorted plan); rerun without --shard on its records, the sweep trains exactly the rest."""
    trained = []

    def fake_train(spec, *args, **kwargs):
        trained.append(spec.run_id)
        accuracy = 1.0 - abs(math.log10(spec.learning_rate / 2e-2)) / 10
        return {"run_id": spec.run_id, "protocol": spec.protocol, "scheme": spec.scheme, "warmup": spec.warmup,
                "depth": spec.depth, "learning_rate": spec.learning_rate, "seed": spec.seed, "diverged": False,
                "eval_split": "validation", "final_val_accuracy": accuracy, "seconds": 0.0}
    monkeypatch.setattr(da_runs, "train_run", fake_train)
    columns, start = (("layerscale", True), ("rezero", False)), (1e-3, 1e-2)
    out = str(tmp_path)
    da_protocol.run_rate_sweep(out, 10, columns, (12,), which_shard=(1, 2), start=start, log=lambda *a: None)
    # plan sorted by (depth, rate, scheme): layerscale 1e-3, rezero 1e-3, layerscale 1e-2, rezero 1e-2, then
    # layerscale 2e-2 (its cell complete in this shard, best at the edge): this shard's are the 1st, 3rd, 5th
    assert sorted((r["scheme"], r["learning_rate"]) for r in da_runs.load_records(out)) == [
        ("layerscale", 1e-3), ("layerscale", 1e-2), ("layerscale", 2e-2)]
    shard_runs = list(trained)
    records = da_protocol.run_rate_sweep(out, 10, columns, (12,), start=start, log=lambda *a: None)
    assert not set(shard_runs) & set(trained[len(shard_runs):])           # nothing trained twice
    assert len(trained) == len(records) == 2 * 4
    assert sorted({r["learning_rate"] for r in records}) == [1e-3, 1e-2, 2e-2, 5e-2]
    rates = da_protocol.best_learning_rates(records, 285, columns, (12,), start=start)
    assert rates["per_depth"] == {("layerscale", True, 12): 2e-2, ("rezero", False, 12): 2e-2}
    assert all(rates["bracketed"].values())


def test_the_post_hoc_nll_report_compares_layerscale_with_each_column_at_the_deep_depths_by_hand(tmp_path):
    from scipy import stats

    def run(scheme, depth, nll, seed):
        return {"run_id": f"{scheme}{depth}{seed}", "protocol": "final", "eval_split": "test", "scheme": scheme,
                "warmup": True, "depth": depth, "seed": seed, "diverged": False, "final_test_accuracy": 0.9,
                "evaluations": [{"step": 0}, {"step": 10, "test_accuracy": 0.9, "test_loss": nll}]}
    records = [run("layerscale", d, x, k) for d in (6, 48, 96) for k, x in enumerate((0.1, 0.2, 0.3))]
    records += [run("none", d, x, k) for d in (6, 48, 96) for k, x in enumerate((0.3, 0.4, 0.5))]
    text = da_reports.write_nll(records, str(tmp_path / "nll.md"), "title", da_reports.layout(records), (6, 48, 96))
    # difference −0.2; each variance 0.01, se = √(2 · 0.01/3) = 0.08165, t = −2.449 with 4 df; Holm over 2 tests
    p = 2 * stats.t.sf(0.2 / math.sqrt(2 * 0.01 / 3), 4)
    assert "**Post hoc**" in text and "| 6 | 0.400 [" in text and "| 6 | " not in text.split("p (Holm)")[1]
    assert "| 48 | none | -0.200 [" in text and f"| {p:.3g} | {min(1, 2 * p):.3g} |" in text
