"""The pre-registered rate-stability test (experiments/rate_stability.py): its runs are what the committed
pre-registration says, its statistic matches a hand computation, and a run cut after N steps of a longer schedule is
the first N steps of the uncut run."""
import math
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import depth_ablation_reports as da_reports  # noqa: E402
import depth_ablation_runs as da_runs  # noqa: E402
import rate_stability as rs  # noqa: E402


def test_the_committed_preregistration_describes_the_runs_the_driver_trains_and_the_rule_it_applies(monkeypatch):
    """The design read from the committed ``preregistration.md`` against what ``run`` hands the trainer and the
    threshold ``verdict`` applies; and the driver runs against that document unchanged (it refuses any other)."""
    from layerscale_jax.layers.scaling import keeps_layernorm
    path = os.path.join(rs.OUT, "preregistration.md")
    text = " ".join(open(path).read().split())
    assert rs.write_preregistration(rs.OUT) == path
    rate, depths, seeds = re.search(r"\*\*Runs\*\*: rate ([\d.e-]+); depths ([\d, ]+); new seeds ([\d, ]+) ",
                                    text).groups()
    without, with_ = re.search(r"without LayerNorm: (.+?); with it: (.+?) \(plain", text).groups()
    n_without, n_with = map(int, re.search(r"(\d+) \+ (\d+) runs", text).groups())
    stop, schedule = map(int, re.search(r"within the first (\d+) steps of the (\d+)-step schedule", text).groups())
    alpha = float(re.search(r"\*confirmed\* if p < ([\d.]+) ", text)[1])

    handed = {}
    monkeypatch.setattr(rs.da, "run_sweep", lambda specs, sizing, out, overrides: handed.update(
        specs=specs, sizing=sizing, overrides=overrides) or [])
    rs.run()
    specs = handed["specs"]
    assert {s.learning_rate for s in specs} == {float(rate)} and {s.protocol for s in specs} == {"rates"}
    assert sorted({s.depth for s in specs}) == [int(d) for d in depths.split(", ")]
    assert sorted({s.seed for s in specs}) == [int(k) for k in seeds.split(", ")]
    assert {s.steps for s in specs} == {handed["sizing"].steps} == {schedule}
    assert handed["overrides"] == {"train.stop_after_steps": stop}
    column = lambda label: (label.removesuffix(" (no warm-up)"), not label.endswith(" (no warm-up)"))  # noqa: E731
    for labels, layernorm, runs in ((without, False, n_without), (with_, True, n_with)):
        mine = [s for s in specs if keeps_layernorm(s.scheme) == layernorm]
        assert {(s.scheme, s.warmup) for s in mine} == {column(label) for label in labels.split(", ")}
        assert len(mine) == runs == len(depths.split(", ")) * len(seeds.split(", ")) * len(labels.split(", "))
    records = [_record(s, not keeps_layernorm(s.scheme)) for s in specs]
    for p, decision in ((alpha * 0.99, "confirmed"), (alpha, "not confirmed")):
        monkeypatch.setattr(rs.cait_claims, "fisher_divergence", lambda *args, alternative, p=p: p)
        assert rs.verdict(records)["decision"] == decision


def test_a_design_changed_after_registration_is_refused(tmp_path):
    path = rs.write_preregistration(str(tmp_path))
    assert open(path).read() == rs.PREREGISTRATION and rs.write_preregistration(str(tmp_path)) == path
    with open(path, "a") as f:
        f.write("- one more seed\n")
    with pytest.raises(ValueError, match="preregistration.md differs from rate_stability.PREREGISTRATION"):
        rs.write_preregistration(str(tmp_path))


def test_the_runs_are_the_preregistered_ones_on_new_seeds_and_each_shard_has_both_groups():
    specs = rs.specs()
    assert len(specs) == len({s.run_id for s in specs}) == 36
    free = [s for s in specs if (s.scheme, s.warmup) in rs.NORM_FREE]
    assert len(free) == 24 and {s.scheme for s in free} == set(da_reports.NORMALISATION_FREE)
    assert {(s.scheme, s.warmup) for s in specs if s not in free} == {("none", True), ("layerscale", True)}
    assert {s.seed for s in specs} == {1, 2, 3}                       # seed 0 was the observation's
    assert {(s.learning_rate, s.depth, s.steps, s.protocol) for s in specs} == {(2e-2, 48, 2000, "rates"),
                                                                                 (2e-2, 96, 2000, "rates")}
    for which in ("1/2", "2/2"):
        mine = rs.sweep.shard(specs, which)
        kept = [s for s in mine if (s.scheme, s.warmup) in rs.NORM_KEPT]
        assert len(kept) == 6 and {(s.seed, s.depth) for s in kept} == {(k, d) for k in (1, 2, 3) for d in (48, 96)}


def test_the_one_sided_fisher_p_is_the_hypergeometric_tail():
    fisher = rs.cait_claims.fisher_divergence
    # 3 of 4 against 0 of 2: the tail P(X >= 3) with 3 diverged among 6 runs, 4 of them in A: C(4,3)C(2,0)/C(6,3)
    assert fisher(3, 4, 0, 2, "greater") == pytest.approx(4 / 20)
    # all 24 against none of 12: one table of C(36, 12) is as extreme
    assert fisher(24, 24, 0, 12, "greater") == pytest.approx(1 / math.comb(36, 12))
    assert fisher(0, 24, 12, 12, "greater") == pytest.approx(1.0)   # the other way round


def _record(spec, diverged):
    return {"run_id": spec.run_id, "scheme": spec.scheme, "warmup": spec.warmup, "depth": spec.depth,
            "seed": spec.seed, "diverged": diverged, "diverged_at_step": 100 if diverged else None,
            "steps": 100 if diverged else rs.STOP_AFTER, "final_val_accuracy": 0.1 if diverged else 0.9}


def test_the_decision_waits_for_every_run_and_follows_the_preregistered_rule():
    specs = rs.specs()
    free = lambda s: (s.scheme, s.warmup) in rs.NORM_FREE            # noqa: E731
    assert rs.verdict([_record(s, free(s)) for s in specs[:12]])["decision"] == "not decided: runs missing"
    confirmed = rs.verdict([_record(s, free(s)) for s in specs])
    assert confirmed["decision"] == "confirmed" and confirmed["free"] == (24, 24) and confirmed["kept"] == (0, 12)
    # 4 of 24 against 0 of 12: the tail with 4 diverged among 36 runs, 24 in A: P(X = 4) = C(24,4)/C(36,4) ≈ 0.18
    few = set(sorted(s.run_id for s in specs if free(s))[:4])
    weak = rs.verdict([_record(s, s.run_id in few) for s in specs])
    assert weak["p"] == pytest.approx(math.comb(24, 4) / math.comb(36, 4))
    assert weak["decision"] == ("confirmed" if weak["p"] < rs.ALPHA else "not confirmed") == "not confirmed"


def test_the_report_counts_every_cell_and_names_the_decision(tmp_path):
    os.makedirs(tmp_path / "runs")
    for spec in rs.specs():
        rs.sweep.write_json_atomically(rs.sweep.record_path(str(tmp_path), spec.run_id),
                                       _record(spec, (spec.scheme, spec.warmup) in rs.NORM_FREE))
    text = rs.write_report(str(tmp_path), command="pytest")
    assert "**confirmed** — 36 of 36 runs finished" in text
    assert "without LayerNorm 24/24, with it 0/12" in text
    assert text.count("| 3/3 | 100, 100, 100 |") == 8 and text.count("| 0/3 | — |") == 4


def test_the_figure_draws_every_run_of_the_test(tmp_path):
    os.makedirs(tmp_path / "runs")
    for spec in rs.specs():
        rs.sweep.write_json_atomically(rs.sweep.record_path(str(tmp_path), spec.run_id),
                                       _record(spec, (spec.scheme, spec.warmup) in rs.NORM_FREE))
    path = rs.write_figure(str(tmp_path))
    assert path.endswith("divergence.png") and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_run_cut_after_n_steps_is_the_first_n_steps_of_the_whole_schedule():
    tiny = da_runs.Sizing(embed_dim=8, num_heads=2, batch_size=16, steps=8, evals=2, log_every=2)
    spec = da_runs.RunSpec(1, "layerscale", True, 0, 5e-3, "rates", 8)
    whole = da_runs.train_run(spec, tiny)
    cut = da_runs.train_run(spec, tiny, overrides={"train.stop_after_steps": 4})
    assert cut["steps"] == 4 and cut["warmup_steps"] == whole["warmup_steps"] == 1   # the 8-step schedule's warm-up
    assert cut["train_loss_curve"] == whole["train_loss_curve"][:2]
    assert [e["step"] for e in cut["evaluations"]] == [0, 4]
    assert cut["evaluations"][-1]["val_accuracy"] == whole["evaluations"][1]["val_accuracy"]


def test_the_committed_report_is_what_the_committed_records_give_and_the_write_ups_quote_it(tmp_path):
    import shutil
    shutil.copytree(os.path.join(rs.OUT, "runs"), tmp_path / "runs")
    committed = open(os.path.join(rs.OUT, "report.md")).read()
    assert rs.write_report(str(tmp_path)) == committed
    v = rs.verdict(rs.sweep.load_records(rs.OUT))
    assert v["complete"] and v["decision"] == "confirmed"
    (free, free_runs), (kept, kept_runs) = v["free"], v["kept"]
    mantissa, exponent = f"{v['p']:.1e}".split("e")
    for page in ("README.md", os.path.join("experiments", "README.md")):
        text = " ".join(open(os.path.join(rs.da.ROOT, page)).read().split())
        assert f"{free} of {free_runs}" in text and f"{kept} of {kept_runs}" in text, page
        assert f"p = {mantissa}e{int(exponent)}" in text, page
