"""Specifications of the sweep runner shared by the studies in experiments/ (experiments/sweep.py): resume, shards,
divergence as an outcome, the ETA, and the statistics checked against hand computations."""
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import sweep  # noqa: E402


@dataclass(frozen=True)
class Spec:
    name: str
    size: int

    @property
    def run_id(self):
        return self.name


SPECS = [Spec("a", 1), Spec("b", 2), Spec("c", 3), Spec("d", 4), Spec("e", 5)]


def fake_train(trained):
    def train(spec):
        trained.append(spec.run_id)
        return {"run_id": spec.run_id, "value": spec.size / 10, "seconds": float(spec.size),
                "diverged": spec.name == "c"}
    return train


def test_a_resumed_sweep_trains_only_the_runs_without_a_record(tmp_path):
    trained, lines = [], []
    sweep.run(SPECS[:2], fake_train(trained), str(tmp_path), log=lines.append)
    records = sweep.run(SPECS, fake_train(trained), str(tmp_path), log=lines.append)
    assert trained == ["a", "b", "c", "d", "e"]
    assert lines[3] == "5 runs in the grid, 2 already finished, 3 to train"
    assert [r["run_id"] for r in records] == ["a", "b", "c", "d", "e"]
    assert sorted(os.listdir(tmp_path / "runs")) == [f"{x}.json" for x in "abcde"]      # no .tmp left behind


def test_a_run_another_process_records_meanwhile_is_not_trained_again(tmp_path):
    trained, lines = [], []
    train = fake_train(trained)

    def train_while_another_process_finishes_b(spec):
        if spec.run_id == "a":
            sweep.run([SPECS[1]], fake_train([]), str(tmp_path), log=lambda line: None)
        return train(spec)
    sweep.run(SPECS[:3], train_while_another_process_finishes_b, str(tmp_path), log=lines.append)
    assert trained == ["a", "c"]
    assert lines[2] == "[2/3 runs done] b: recorded by another process"


def test_every_record_names_the_machine_and_the_load_it_ran_under(tmp_path):
    (record,) = sweep.run(SPECS[:1], fake_train([]), str(tmp_path), log=lambda line: None)
    with open("/proc/cpuinfo") as f:
        cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    assert record["machine"]["cpu"] == cpu
    assert len(record["machine"]["load_average_start"]) == 3 and len(record["machine"]["load_average"]) == 3


def test_a_record_holds_the_runs_cpu_time_which_leaves_out_time_spent_waiting(tmp_path, monkeypatch):
    cpu_clock = [100.0]
    monkeypatch.setattr(sweep.time, "process_time", lambda: cpu_clock[0])

    def train(spec):
        cpu_clock[0] += 0.05             # 50 ms of CPU in a run of 350 ms: 300 ms of it asleep (as if stopped)
        return {"run_id": spec.run_id, "seconds": 0.35, "diverged": False}
    (record,) = sweep.run(SPECS[:1], train, str(tmp_path), log=lambda line: None)
    assert record["cpu_seconds"] == pytest.approx(0.05) and record["seconds"] == 0.35


def test_the_machines_note_counts_runs_per_cpu_and_gives_the_load_range():
    def record(cpu, load):
        return {"machine": {"cpu": cpu, "load_average_start": [load, 0.0, 0.0]}}
    records = [record("AMD EPYC", 2.3), record("Intel Xeon", 1.1), record("AMD EPYC", 3.05), {"run_id": "old"}]
    assert sweep.machines_note(records) == ("Trained on AMD EPYC (2 runs), Intel Xeon (1 run); 1-minute load at the "
                                            "runs' starts 1.10–3.05.")
    assert sweep.machines_note([{"run_id": "old"}]) == ""


def test_the_machines_note_names_cpu_generations_and_mallocs_where_recorded():
    zen5 = {"cpu": "AMD EPYC", "cpu_family_model": "family 26 model 2", "load_average_start": [1.5, 0, 0]}
    records = [{"machine": dict(zen5, malloc="tcmalloc")}, {"machine": dict(zen5, malloc="tcmalloc")},
               {"machine": {"cpu": "AMD EPYC", "load_average_start": [2.0, 0, 0]}}]
    assert sweep.machines_note(records) == (
        "Trained on AMD EPYC, family 26 model 2 (2 runs), AMD EPYC (1 run); malloc tcmalloc (2 runs), not recorded "
        "(1 run); 1-minute load at the runs' starts 1.50–2.00.")


def test_the_compute_note_sums_cpu_time_and_counts_runs_that_only_have_wall_time():
    records = [{"cpu_seconds": 3600.0, "seconds": 4000.0}, {"cpu_seconds": 1800.0, "seconds": 9999.0},
               {"seconds": 1800.0}, {"run_id": "neither"}]
    # by hand: 3,600 + 1,800 CPU seconds + 1,800 wall seconds = 7,200 s = 2.0 hours; 0.5 of them wall time
    assert sweep.compute_note(records) == (
        "3 runs took 2.0 CPU-hours in total (the sum of each run's process CPU time; 1 run recorded before that was "
        "measured counts 0.5 hours of wall time, pauses included).")
    assert sweep.compute_note(records[:2]).startswith("2 runs took 1.5 CPU-hours in total (")
    assert sweep.compute_note(records[2:]) == ("1 run took 0.5 hours of wall time in total (recorded before their "
                                               "CPU time was; pauses included).")
    assert sweep.compute_note([{"run_id": "neither"}]) == ""


def test_a_diverged_run_is_a_record_and_a_log_line_not_an_exception(tmp_path):
    lines = []
    records = sweep.run(SPECS, fake_train([]), str(tmp_path), outcome=lambda r: f"value {r['value']}",
                        log=lines.append)
    assert {r["run_id"]: r["diverged"] for r in records} == dict(a=False, b=False, c=True, d=False, e=False)
    assert "] c: DIVERGED in 3.0 s" in lines[3] and "] a: value 0.1 in 1.0 s" in lines[1]


def test_the_eta_extrapolates_seconds_per_unit_of_cost(tmp_path):
    lines = []
    sweep.run(SPECS, fake_train([]), str(tmp_path), cost=lambda s: s.size, log=lines.append)
    # a run takes 1 s per unit of size: after a (1 s), b, c, d, e (2+3+4+5 = 14 units) are left
    assert lines[1].endswith("ETA 0:00:14") and lines[-1].endswith("ETA 0:00:00")


def test_shards_split_the_grid_into_disjoint_parts_whose_records_merge_into_the_whole(tmp_path):
    parts = [sweep.shard(SPECS, f"{i}/3") for i in (1, 2, 3)]
    assert [[s.run_id for s in p] for p in parts] == [["a", "d"], ["b", "e"], ["c"]]
    for i, part in enumerate(parts):
        sweep.run(part, fake_train([]), str(tmp_path / f"machine{i}"), log=lambda line: None)
    merged = sweep.load_records(*(str(tmp_path / f"machine{i}") for i in range(3)))
    assert [r["run_id"] for r in merged] == ["a", "b", "c", "d", "e"]
    assert sweep.shard(SPECS, None) == SPECS


def test_records_that_disagree_under_one_run_id_refuse_to_merge(tmp_path):
    for i, value in enumerate((1, 2)):
        os.makedirs(tmp_path / f"m{i}" / "runs")
        (tmp_path / f"m{i}" / "runs" / "a.json").write_text(json.dumps({"value": value}))
    with pytest.raises(ValueError, match="two different records of run 'a'"):
        sweep.load_records(str(tmp_path / "m0"), str(tmp_path / "m1"))


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "1/2/3"])
def test_a_bad_shard_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match=f"--shard={text!r}"):
        sweep.parse_shard(text)


def test_summary_mean_std_and_t_confidence_interval_match_a_hand_computation():
    s = sweep.summarise([1, 2, 3, 4, 5])
    # mean 3, s² = 10/4 = 2.5; t(0.975, 4) = 2.776 (printed t tables); half-width 2.776 · √2.5 / √5 = 1.963
    assert (s.n, s.mean, s.std) == (5, 3.0, pytest.approx(math.sqrt(2.5)))
    assert s.ci_low == pytest.approx(3 - 1.9632, abs=2e-4) and s.ci_high == pytest.approx(3 + 1.9632, abs=2e-4)
    one = sweep.summarise([0.7])
    assert (one.mean, one.std, one.ci_low, one.ci_high) == (0.7, 0.0, 0.7, 0.7)
    same = sweep.summarise([0.5, 0.5, 0.5])                    # all seeds agree: an interval of width 0, no NaN
    assert (same.n, same.std, same.ci_low, same.ci_high) == (3, 0.0, 0.5, 0.5)


def student_t_two_sided_p(t, dof):
    """P(|T| ≥ |t|) for Student's t with ``dof`` degrees of freedom, by integrating its density (trapezoid rule)."""
    x = np.linspace(-abs(t), abs(t), 200_001)
    density = (math.gamma((dof + 1) / 2) / (math.sqrt(dof * math.pi) * math.gamma(dof / 2))
               * (1 + x ** 2 / dof) ** (-(dof + 1) / 2))
    return 1.0 - np.trapezoid(density, x)


def test_welch_t_test_matches_a_hand_computation():
    a, b = [1, 2, 3, 4, 5], [2, 4, 6, 8, 10]
    w = sweep.welch(a, b)
    # variances of the means 2.5/5 = 0.5 and 10/5 = 2; t = (3 − 6)/√2.5; dof = 2.5² / (0.5²/4 + 2²/4)
    assert w.t == pytest.approx(-3 / math.sqrt(2.5))
    assert w.dof == pytest.approx(6.25 / 1.0625)
    assert w.p == pytest.approx(student_t_two_sided_p(w.t, w.dof), abs=1e-6)
    assert w.p == pytest.approx(0.1075, abs=1e-4)
    with pytest.raises(ValueError, match="at least 2 values"):
        sweep.welch([1.0], b)


def test_cells_state_mean_and_spread_and_count_diverged_runs():
    assert sweep.mean_std_cell([80.0, 90.0], diverged=1) == "85.0 ± 7.1 (1/2 diverged)"
    assert sweep.mean_std_cell([42.0]) == "42.0" and sweep.mean_std_cell([]) == "–"
    assert sweep.markdown_table(["x", "y"], [[1, "a"]]) == "| x | y |\n|---|---|\n| 1 | a |\n"


def test_the_finetune_study_on_the_runner_reproduces_its_committed_table(tmp_path):
    import finetune_digits as fd
    results = os.path.join(os.path.dirname(fd.__file__), "results", "finetune")
    with open(os.path.join(results, "results.json")) as f:
        committed = json.load(f)
    mae = {"test_loss": committed["mae"]["test_reconstruction_loss"],
           "train_seconds": committed["mae"]["train_seconds"]}
    assert [s.config_spec for s in fd.specs(600, (0, 1, 2))] == [r["config"] for r in committed["runs"]]
    fd.write_outputs(committed["runs"], mae, str(tmp_path), 1500, committed["finetune_steps"], [0, 1, 2])
    for name in ("table.md", "results.json"):
        assert (tmp_path / name).read_text() == open(os.path.join(results, name)).read(), name


def test_the_trivial_mae_baseline_is_each_patchs_mean_prediction_by_hand(monkeypatch):
    """Predicting each patch's mean costs, in norm-pix units, mean(t²) = (P−1)/P · var/(var + 1e-6) on a
    non-constant P-pixel patch and 0 on a constant one; padded rows (mask False) do not count."""
    import finetune_digits
    import ml_collections

    from layerscale_jax import data as data_lib
    one = np.zeros((4, 4, 1), np.float32)
    one[1, 1, 0] = 1.0                       # patch (0, 0) = [0, 0, 0, 1]: var = 0.25, mean(t²) = 0.75 · 0.25/0.250001
    images = np.stack([one, np.full((4, 4, 1), 3.0, np.float32), one + 7.0])
    batch = {"image": images, "mask": np.array([True, True, False])}
    monkeypatch.setattr(data_lib, "make_eval_iterator", lambda *a, **k: iter([batch]))
    config = ml_collections.ConfigDict({"data": {}, "model": {"patch_size": 2}, "train": {"eval_batch_size": 3}})
    expected = (0.75 * 0.25 / (0.25 + 1e-6) / 4 + 0.0) / 2
    assert finetune_digits.trivial_reconstruction_loss(config) == pytest.approx(expected, rel=1e-5)


def test_the_detectable_difference_is_the_t_approximation_by_hand():
    # 5 against 5 seeds, SD 0.5 each: Welch df 8; t_{0.975,8} = 2.3060, t_{0.8,8} = 0.8889 (tables); se = 0.5·√(2/5)
    assert sweep.detectable_difference(0.5, 0.5, 5, 5, 0.05) == pytest.approx((2.3060 + 0.8889) * 0.5 * math.sqrt(0.4),
                                                                               abs=1e-3)
    # one side without spread: df n_a − 1 = 4; t_{0.975,4} = 2.7764, t_{0.8,4} = 0.9410; se = 1/√5
    assert sweep.detectable_difference(1.0, 0.0, 5, 5, 0.05) == pytest.approx((2.7764 + 0.9410) / math.sqrt(5),
                                                                              abs=1e-3)
    assert sweep.detectable_difference(0.0, 0.0, 5, 5, 0.05) == 0.0
