"""The MNIST-1D study's analysis code, on records made up here (no training): the validation-best rate, the paired
test against scipy's, Holm's adjustment and the outcomes, whole single-kind blocks, and the pilot's choices."""
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import mnist1d_pilot as pilot  # noqa: E402
import mnist1d_study as study  # noqa: E402
import power  # noqa: E402

INTEL, AMD = "Intel(R) Xeon(R) Processor, family 6 model 207", "AMD EPYC, family 25 model 1"


def _record(run, val, test, kind=INTEL, diverged=False, loss=1.0):
    cpu, family = kind.split(", ")
    return {"run_id": run.run_id, "seed": run.seed, "depth": run.depth, "scheme": run.scheme,
            "num_train": run.num_train,
            "learning_rate": run.learning_rate, "final_val_accuracy": val / 1000, "final_test_accuracy": test / 100,
            "final_test_loss": loss, "diverged": diverged, "machine": {"cpu": cpu, "cpu_family_model": family}}


@pytest.fixture
def design(monkeypatch):
    monkeypatch.setattr(study, "NUM_SEEDS", 4)
    monkeypatch.setattr(study, "NUM_TRAIN", 2000)
    monkeypatch.setattr(study, "SEEDS", (1, 2, 3, 4))


def _blocks(values, kind=INTEL, seeds=(1, 2, 3, 4)):
    """Records of whole blocks: ``values(run) -> (validation correct, test %)``."""
    return [_record(run, *values(run), kind=kind) for s in seeds for run in study.block_runs(s)]


def test_a_block_is_every_column_rate_and_depth_once(design):
    runs = study.block_runs(3)
    assert len(runs) == len(study.RATES) * (len(study.COLUMNS) + len(study.COLUMNS) - 1)
    assert len({r.run_id for r in runs}) == len(runs) and {r.seed for r in runs} == {3}
    assert not [r for r in runs if r.depth == study.SHALLOW and r.scheme == "layerscale_eps0.1"]
    assert runs[0].depth == study.DEEP and runs[-1].depth == study.SHALLOW


def test_selected_rate_takes_the_most_validation_signals_and_the_lower_rate_on_a_tie(design):
    rates = study.RATES
    correct = {rates[0]: 800, rates[1]: 830, rates[2]: 830, rates[3]: 700}
    records = _blocks(lambda r: (correct[r.learning_rate], 50.0), seeds=(1,))
    block = study.blocks(records)[1]
    assert study.selected_rate(block, study.DEEP, "none") == rates[1]
    for r in records:                                   # the best run diverged: it is not usable
        if r["learning_rate"] == rates[1]:
            r["diverged"] = True
    assert study.selected_rate(study.blocks(records)[1], study.DEEP, "none") == rates[2]


def test_paired_test_is_scipys_and_the_interval_is_by_hand():
    from scipy import stats
    a, b = [80.1, 82.3, 79.9, 81.0, 83.2], [79.0, 81.9, 80.2, 79.4, 81.0]
    result = study.paired(a, b, (48, "layerscale"), (48, "none"))
    reference = stats.ttest_rel(a, b)
    assert math.isclose(result.t, reference.statistic) and math.isclose(result.p, reference.pvalue)
    d = np.subtract(a, b)
    half = stats.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    assert np.allclose(result.ci, (d.mean() - half, d.mean() + half))


def test_holm_and_outcomes():
    # three comparisons with p ≈ 0.001, 0.03, 0.6: Holm → 0.003, 0.06, 0.6
    def make(mean, p):
        r = study.Paired((48, "layerscale"), (48, "x"), [mean - 0.1, mean + 0.1, mean], mean, (0, 0), 0.0, p)
        return r
    family = study.decide([make(2.0, 0.001), make(-1.5, 0.03), make(0.05, 0.6)])
    assert [round(r.p_holm, 6) for r in family] == [0.003, 0.06, 0.6]
    assert family[0].outcome == "as claimed"
    assert family[1].outcome == "not resolved"
    assert family[2].outcome == "not resolved; equivalent within ±1"      # SD 0.1 over 3: a tight interval
    against = study.decide([make(-2.0, 0.001)])[0]
    assert against.outcome == "against"
    assert study.decide([make(-2.0, 0.001)], claimed_sign=-1)[0].outcome == "as claimed"   # lower NLL is better


def test_analysis_finds_a_planted_difference_and_only_that(design):
    """LayerScale at depth 48 planted 3 points above every other column (block noise shared by the columns of a
    block, small per-run noise): its three comparisons come out 'as claimed'; the other families are not run on
    a difference that is not there."""
    rng = np.random.default_rng(0)
    block_effect = {s: rng.normal(0, 3) for s in range(1, 5)}

    def values(run):
        planted = 3.0 if (run.scheme == "layerscale" and run.depth == study.DEEP) else 0.0
        test = 70 + block_effect[run.seed] + planted + rng.normal(0, 0.2)
        val = 700 + (run.learning_rate == study.RATES[1]) * 50
        return val, test
    result = study.analyse(_blocks(values))
    primary = result["families"][f"depth {study.DEEP}: selected"]
    assert [r.outcome for r in primary] == ["as claimed"] * 3
    assert all(2.5 < r.mean < 3.5 for r in primary)
    claim1 = result["families"]["claim 1: none @ 6 vs @ 48"][0]
    assert claim1.outcome.startswith("not resolved")


def test_blocks_are_whole_and_of_one_machine_kind(design):
    records = _blocks(lambda r: (700, 70.0), seeds=(1, 2, 3))
    records += [_record(run, 700, 70.0, kind=AMD) for run in study.block_runs(4)[:5]]   # begun on AMD
    records = [r for r in records if not (r["seed"] == 3 and r["learning_rate"] == study.RATES[0])]
    by_seed = study.blocks(records)
    assert [s for s, b in by_seed.items() if b.complete] == [1, 2]
    assert study.analyse(records)["families"] == {}                  # 2 of 4 complete: not decided
    assert study.seeds_to_train(records, INTEL) == [1, 2, 3, 5]     # AMD's block 4 left to AMD, seed 5 instead
    assert study.seeds_to_train(records, AMD) == [4, 5, 6, 7]       # the Intel blocks are Intel's


def test_report_before_and_after_the_blocks(design, tmp_path):
    os.makedirs(tmp_path / "runs")
    import sweep
    records = _blocks(lambda r: (700 + (r.learning_rate == study.RATES[2]) * 30, 70.0 + r.seed
                                 + (r.scheme == "layerscale")), seeds=(1, 2))
    for r in records:
        sweep.write_json_atomically(sweep.record_path(str(tmp_path), r["run_id"]), r)
    text = study.write_report(str(tmp_path))
    assert "Interim: not decided" in text and "p (Holm)" not in text
    for r in _blocks(lambda r: (700, 70.0 + r.seed + (r.scheme == "layerscale")), seeds=(3, 4)):
        sweep.write_json_atomically(sweep.record_path(str(tmp_path), r["run_id"]), r)
    text = study.write_report(str(tmp_path))
    assert "Interim" not in text and "| layerscale @ 48 − none @ 48 | claim 2 | +1.00 [+1.00, +1.00]" in text
    assert study.write_figure(str(tmp_path)).endswith("study.png")


def test_power_by_hand():
    """Paired power against G*Power's textbook value (d_z = 1, n = 10, α = 0.05: 0.803) and the seeds that
    follow from it; the SD's upper limit by the χ² formula."""
    assert abs(power.paired_power(10, 1.0, 1.0, 0.05) - 0.8031) < 1e-3
    assert power.seeds_for(1.0, 1.0, 0.05) == 10
    assert power.paired_power(power.seeds_for(1.0, 1.5, 0.05 / 3), 1.0, 1.5, 0.05 / 3) >= 0.8
    assert power.paired_power(power.seeds_for(1.0, 1.5, 0.05 / 3) - 1, 1.0, 1.5, 0.05 / 3) < 0.8
    from scipy import stats
    assert math.isclose(power.sd_upper_limit(2.0, 6, 0.8), 2.0 * math.sqrt(6 / stats.chi2.ppf(0.2, 6)))


def test_pilot_size_rule():
    """The size closest to 85% among those in [80, 90]; none inside: the closest to the interval."""
    def records(means):
        out = []
        for size, mean in means.items():
            for rate in pilot.RATES:
                for seed in pilot.STAGE1_SEEDS:
                    run = pilot.m1.Run("pilot", pilot.SHALLOW, "none", seed, rate, size)
                    out.append(_record(run, round(10 * mean) if rate == pilot.RATES[1] else 500, 0.0))
        return out
    choice = pilot.size_choice(records({2000: 81.0, 4000: 86.0, 8000: 89.0}))
    assert (choice["size"], choice["rate"], choice["in_target"]) == (4000, pilot.RATES[1], True)
    choice = pilot.size_choice(records({2000: 91.0, 4000: 93.0, 8000: 95.0}))
    assert (choice["size"], choice["in_target"]) == (2000, False)
    assert pilot.size_choice(records({2000: 81.0, 4000: 86.0, 8000: 89.0})[1:]) is None   # stage 1 unfinished


def test_registered_numbers_are_the_pilots():
    """Every number the pre-registration takes from the pilot recomputed from its committed records."""
    import statistics

    import sweep
    records = sweep.load_records(pilot.OUT)
    choice = pilot.size_choice(records)
    assert (choice["size"], choice["rate"]) == (study.NUM_TRAIN, 0.005) and choice["rate"] in study.RATES
    result = pilot.spread(records)
    assert round(result["difference_sd"], 2) == study.PILOT_DIFFERENCE_SD and result["df"] == study.PILOT_DF
    assert pilot.seeds(result)["n"] == study.PILOT_RULE_SEEDS
    for depth, sd in study.PILOT_SD_BY_DEPTH.items():
        assert round(result["per_depth"][depth]["sd"], 2) == sd
    deep = result["per_depth"][study.DEEP]
    assert round(statistics.mean(deep["differences"]), 2) == study.PILOT_DEEP_MEAN_DIFFERENCE
    assert round(statistics.stdev(deep["values"]["layerscale"].values()), 2) == study.PILOT_LAYERSCALE_DEEP_SD
    for depth, seconds in study.PILOT_CPU_SECONDS.items():
        assert round(statistics.mean(r["cpu_seconds"] for r in records if r["depth"] == depth), 1) == seconds
    assert study.NUM_SEEDS * study.block_cpu_seconds() <= study.BUDGET_CPU_HOURS * 3600
    assert (study.NUM_SEEDS + 1) * study.block_cpu_seconds() > study.BUDGET_CPU_HOURS * 3600


def test_the_committed_preregistration_is_the_drivers():
    with open(os.path.join(study.OUT, "preregistration.md")) as f:
        assert f.read() == study.PREREGISTRATION
    with open(os.path.join(pilot.OUT, "preregistration.md")) as f:
        assert f.read() == pilot.RULES


def test_the_write_ups_quote_the_registered_numbers():
    """README's and experiments/README's MNIST-1D paragraphs quote the pilot's and the registration's numbers as
    the code computes them."""
    import statistics

    import sweep
    records = sweep.load_records(pilot.OUT)
    result = pilot.spread(records)
    root = study.m1.ROOT
    size = pilot.size_choice(records)["sizes"][study.NUM_TRAIN][1]
    deep = result["per_depth"][study.DEEP]["values"]
    quotes = (f"{size:.1f}% validation", f"{statistics.mean(deep['layerscale'].values()):.1f}%",
              f"{statistics.mean(deep['none'].values()):.1f}%",
              f"{study.PILOT_SD_BY_DEPTH[study.SHALLOW]:.2f} points at depth 6",
              f"{study.PILOT_SD_BY_DEPTH[study.DEEP]:.2f} at 48", f"{study.PILOT_RULE_SEEDS} seeds",
              f"{study.NUM_SEEDS} blocks",
              f"{study.detectable(study.PILOT_SD_BY_DEPTH[study.DEEP]):.2f} points",
              f"{study.detectable(study.PILOT_SD_BY_DEPTH[study.SHALLOW], 2):.2f} at depth 6",
              f"{study.detectable(study.ASSUMED_DEEP_PAIR_SD):.2f} for LayerScale")
    for name in ("README.md", os.path.join("experiments", "README.md")):
        with open(os.path.join(root, name)) as f:
            text = " ".join(f.read().split())          # a quote may wrap at a line end
        for quoted in quotes:
            assert quoted in text, (name, quoted)


def test_the_command_refuses_a_bad_shard_and_a_changed_design(monkeypatch, tmp_path, capsys):
    """One `error:` line and exit status 2 (sweep.registered_study_command), before anything trains."""
    monkeypatch.setattr(study, "train", lambda shard: pytest.fail("trained"))
    with pytest.raises(SystemExit) as exit_:
        study.main(["--shard", "3/2"])
    assert exit_.value.code == 2 and "error: --shard='3/2' must have 1 ≤ i ≤ n" in capsys.readouterr().err
    (tmp_path / "preregistration.md").write_text("another design")
    monkeypatch.setattr(study, "OUT", str(tmp_path))
    monkeypatch.setattr(study.write_preregistration, "__defaults__", (str(tmp_path),))
    with pytest.raises(SystemExit) as exit_:
        study.main(["--shard", "1/2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error: ") and "the design changed after it was registered" in err


@pytest.fixture(scope="module")
def committed():
    """The committed study: its records and the registered analysis of them."""
    records = study.finished_records()
    return records, study.analyse(records)


@pytest.mark.slow
def test_the_committed_report_is_what_the_committed_records_give(committed, tmp_path):
    """report.md, regenerated by the registered analysis from the committed run records, is the committed one."""
    import shutil
    shutil.copytree(os.path.join(study.OUT, "runs"), tmp_path / "runs")
    with open(os.path.join(study.OUT, "report.md")) as f:
        assert study.write_report(str(tmp_path)) == f.read()
    records, result = committed
    assert len(records) == 476 and len(result["blocks"]) == study.NUM_SEEDS == 17


@pytest.mark.slow
def test_the_write_ups_quote_the_decided_report(committed):
    """README's and experiments/README's verdicts, intervals, Holm p-values, spreads and descriptive numbers are the
    registered analysis's, recomputed here from the committed records."""
    import statistics
    records, result = committed
    families, done = result["families"], result["blocks"]

    def row(family, other):
        (r,) = [r for r in families[family] if r.b[1] == other or (other == "claim 1" and r.b == (48, "none"))]
        return r

    def interval(r, f="+.2f"):
        return f"{r.mean:{f}} [{r.ci[0]:{f}}, {r.ci[1]:{f}}]"

    def cell(depth, column, rate):
        values = [study.test_accuracy(study._run(b, depth, column, rate)) for b in done]
        return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}%"

    primary = {"2": row("depth 48: selected", "none"), "3": row("depth 48: selected", "scalar"),
               "5": row("depth 48: selected", "layerscale_eps0.1"),
               "1": row("claim 1: none @ 6 vs @ 48", "claim 1")}
    assert [primary[k].outcome for k in "1235"] == ["as claimed", "as claimed", "not resolved; equivalent within ±1",
                                                   "not resolved"]
    readme = " ".join(open(os.path.join(study.m1.ROOT, "README.md")).read().split())
    experiments = " ".join(open(os.path.join(study.m1.ROOT, "experiments", "README.md")).read().split())
    for claim, r in primary.items():
        assert f"{interval(r)} | {r.p_holm:.3g} |" in readme, claim
        sd = statistics.stdev(r.differences)
        assert (f"{interval(r)} | {sd:.2f}; {study.detectable(sd, len(families[_family_of(r)]), 17):.2f} | "
                f"{r.p_holm:.3g} | {r.outcome}") in experiments, claim
    for text in (readme, experiments):
        for rate in ("0.002", "0.01"):                      # the smallest and largest of claim 2 over the rates
            assert f"{row(f'depth 48: {rate}', 'none').mean:+.2f}" in text
            assert text is experiments or interval(row(f"depth 48: {rate}", "none")) in text
        assert all(r.outcome == "as claimed" for rate in ("0.002", "0.005", "0.01", "0.02")
                   for r in [row(f"depth 48: {rate}", "none")])
        for family, other, outcome in (("depth 48: 0.002", "layerscale_eps0.1", "against"),
                                       ("depth 48: 0.005", "layerscale_eps0.1", "against"),
                                       ("depth 48: 0.02", "scalar", "as claimed")):
            r = row(family, other)
            assert r.outcome == outcome and interval(r) in text, (family, other)
            assert text is experiments or f"{r.p_holm:.3g}" in text, (family, other)      # README quotes Holm's p
        for other in ("none", "scalar"):
            assert interval(row("depth 6: selected", other)) in text
    assert cell(48, "layerscale", 0.005)[:-1] in readme and cell(48, "none", 0.005) in readme   # the shared recipe
    for depth, column, rate in ((48, "none", 0.002), (48, "scalar", 0.02), (48, "layerscale", 0.02),
                                (6, "none", 0.005), (6, "none", 0.02), (6, "layerscale", 0.02)):
        assert cell(depth, column, rate) in experiments, (depth, column, rate)
    assert interval(row("depth 48: nll", "none"), "+.3f").replace("+", "", 1).replace(" [", " nats [") in experiments
    picks = {(d, c): [study.selected_rate(b, d, c) for b in done] for d, c in ((48, "none"), (6, "none"),
                                                                                (48, "layerscale"))}
    assert picks[(48, "none")].count(0.002) == 15 and picks[(6, "none")].count(0.005) == 13
    assert picks[(48, "layerscale")].count(0.005) == 15
    assert "in 15 of 17 blocks" in readme and "in 13 of 17 blocks" in readme
    detect = {k: study.detectable(statistics.stdev(primary[k].differences), 3, 17) for k in "235"}
    for text in (readme, experiments):
        assert f"{detect['2']:.2f} points for claim 2" in text
        assert f"{detect['5']:.2f} for claim 5, {detect['3']:.2f} for claim 3" in text or (
            f"{detect['5']:.2f} and {detect['3']:.2f} for claims 5 and 3" in text)
    assert not any(r["diverged"] for r in records)
    hours = sum(r["cpu_seconds"] for r in records) / 3600
    assert f"{hours:.1f} CPU-hours" in readme and f"{hours:.1f} CPU-hours" in experiments


def _family_of(r):
    return "claim 1: none @ 6 vs @ 48" if r.b == (48, "none") and r.a == (6, "none") else "depth 48: selected"
