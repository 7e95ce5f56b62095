"""Specifications of the validation protocol shared by the studies in experiments/ (experiments/validation_protocol.py):
the budget criterion, the bracketed learning-rate ladder, and test tables from final runs only, checked against
hand computations."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import validation_protocol as vp  # noqa: E402

# Rows by depth, columns by method, the value in %: a layout a study would give.
LAYOUT = vp.Layout("depth", lambda r: r["depth"], lambda r: r["method"], ("a", "b", "c"), lambda c: f"method {c}",
                   lambda r: 100 * vp.accuracy(r))


def fake_record(method="a", depth=12, lr=1e-2, acc=0.9, diverged=False, seed=0, protocol="rates", split="validation"):
    prefix = "test" if split == "test" else "val"
    return {"run_id": f"{protocol}_{method}_{depth}_{lr:g}_{seed}", "protocol": protocol, "method": method,
            "depth": depth, "learning_rate": lr, "seed": seed, "diverged": diverged, "eval_split": split,
            f"final_{prefix}_accuracy": acc}


def test_the_budget_is_the_shortest_run_from_which_no_longer_run_ends_a_tolerance_higher():
    # 3,000 steps end at 98.0; 2,000 at 97.5 (0.5 below), 1,000 at 97.3 (0.7 below), 500 at 95.0 (3.0 below)
    finals = {500: 95.0, 1000: 97.3, 2000: 97.5, 3000: 98.0}
    assert vp.converged_budget(finals, tolerance=0.9) == 1000
    assert vp.converged_budget(finals, tolerance=0.6) == 2000
    assert vp.converged_budget(finals, tolerance=0.4) is None           # nothing shorter is close: run longer
    # a short run that is close does not count when a longer one is not
    assert vp.converged_budget({500: 97.9, 1000: 96.0, 2000: 97.8, 3000: 98.0}, tolerance=0.9) == 2000
    # a shorter run ending higher than the longest is close
    assert vp.converged_budget({1000: 98.5, 3000: 98.0}, tolerance=0.1) == 1000


def test_the_binomial_standard_error_is_the_resolution_of_an_accuracy_on_n_images():
    # √(0.975 · 0.025 / 285) = √(8.5526e-5) = 0.0092480 → 0.9248 points
    assert vp.binomial_standard_error(97.5, 285) == pytest.approx(0.9248, abs=1e-4)
    assert vp.binomial_standard_error(100.0, 285) == 0.0


def test_a_cells_validation_curve_is_the_mean_over_its_seeds_at_the_steps_all_of_them_evaluated():
    def run(method, seed, accs):
        r = fake_record(method, seed=seed)
        r["evaluations"] = [{"step": 0}] + [{"step": s, "val_accuracy": a} for s, a in accs.items()]
        return r
    records = [run("a", 0, {100: .5, 200: .7, 300: .9}), run("a", 1, {100: .6, 200: .8}), run("b", 0, {100: .1})]
    curves = vp.mean_validation_curves(records, lambda r: r["method"])
    assert curves.keys() == {"a", "b"} and curves["b"] == [(100, 10.0)]
    assert curves["a"] == [(100, pytest.approx(55.0)), (200, pytest.approx(75.0))]     # step 300: seed 1 lacks it


def test_the_rate_ladder_steps_one_two_five():
    assert [vp.ladder(x, +1) for x in (1e-3, 2e-3, 5e-3, 2e-2)] == [2e-3, 5e-3, 1e-2, 5e-2]
    assert [vp.ladder(x, -1) for x in (1e-3, 2e-3, 5e-3)] == [5e-4, 1e-3, 2e-3]


def test_a_rate_at_the_edge_extends_the_sweep_until_it_is_inside_with_a_cap():
    start = (1e-3, 2e-3, 5e-3)
    at = lambda accs: [fake_record(lr=lr, acc=a) for lr, a in accs.items()]  # noqa: E731
    assert vp.swept_rates([], start, 3) == [1e-3, 2e-3, 5e-3]                     # nothing run: the start
    assert vp.swept_rates(at({1e-3: .5, 2e-3: .6, 5e-3: .7}), start, 3) == [1e-3, 2e-3, 5e-3, 1e-2]
    assert vp.swept_rates(at({1e-3: .5, 2e-3: .6, 5e-3: .7, 1e-2: .6}), start, 3) == [1e-3, 2e-3, 5e-3, 1e-2]
    assert vp.swept_rates(at({1e-3: .9, 2e-3: .6, 5e-3: .5}), start, 3) == [5e-4, 1e-3, 2e-3, 5e-3]
    rising = at({1e-3: .1, 2e-3: .2, 5e-3: .3, 1e-2: .4, 2e-2: .5, 5e-2: .6})
    assert vp.swept_rates(rising, start, max_extensions=3) == [1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2]  # capped
    diverged = [fake_record(lr=lr, diverged=True) for lr in start]
    assert vp.swept_rates(diverged, start, 3) == [5e-4, 1e-3, 2e-3, 5e-3]


def test_the_best_rate_is_chosen_on_validation_runs_only():
    assert vp.best_rate([fake_record(lr=1e-3, acc=.8), fake_record(lr=2e-3, acc=.8)]) == 1e-3   # ties: the lower
    assert vp.best_rate([fake_record(diverged=True)]) is None
    with pytest.raises(ValueError, match="validation split only"):
        vp.best_rate([fake_record(split="test")])


def test_a_test_table_takes_final_runs_only_and_never_averages_diverged_runs(tmp_path):
    final = [fake_record(acc=a, seed=k, protocol="final", split="test") for k, a in enumerate((.90, .92, .94))]
    final.append(fake_record(acc=.10, seed=3, diverged=True, protocol="final", split="test"))
    table = vp.write_ci_table(final, str(tmp_path / "t.md"), "title", LAYOUT)
    # mean 92.0, s = 2.0, t(0.975, 2) = 4.3027: half-width 4.3027 · 2 / √3 = 4.97
    assert "| 12 | 92.0 [87.0, 97.0]; 1/4 diverged | – | – |" in table
    assert "Student's t" in (tmp_path / "t.md").read_text()
    with pytest.raises(ValueError, match="final-protocol runs only"):
        vp.write_ci_table([fake_record()], str(tmp_path / "t.md"), "title", LAYOUT)
    with pytest.raises(ValueError, match="final-protocol runs only"):
        vp.write_comparisons([fake_record()], str(tmp_path / "c.md"), "title", LAYOUT, "a")


def test_comparisons_give_welch_p_of_the_reference_against_each_column(tmp_path):
    from scipy import stats
    a, b = (.90, .92, .94), (.80, .85, .86)
    records = [fake_record("a", acc=x, seed=k, protocol="final", split="test") for k, x in enumerate(a)]
    records += [fake_record("b", acc=x, seed=k, protocol="final", split="test") for k, x in enumerate(b)]
    records += [fake_record("c", acc=.1, seed=0, diverged=True, protocol="final", split="test")]
    table = vp.write_comparisons(records, str(tmp_path / "c.md"), "title", LAYOUT, "a")
    expected = stats.ttest_ind([100 * x for x in a], [100 * x for x in b], equal_var=False)
    row = [ln for ln in table.splitlines() if "| method b |" in ln][0]
    assert f"| {expected.pvalue:.3g} |" in row and "+8.3" in row and "3/3 vs 3/3" in row
    assert "| 12 | method c | – | – | – | – | 3/3 vs 0/1 |" in table
    assert table.splitlines()[0].startswith("| depth | method a vs |")


def test_the_label_smoothing_floor_is_the_smoothed_targets_entropy():
    # ε = 0.1, K = 10: targets 0.91 and nine 0.01; 0.91 · 0.0943107 + 9 · 0.01 · 4.6051702 = 0.0858227 + 0.4144653
    assert vp.label_smoothing_floor(0.1, 10) == pytest.approx(0.5002880, abs=1e-6)
    assert vp.label_smoothing_floor(0.0, 10) == 0.0


def _final_run(train_loss, late, last, diverged=False, steps=2000):
    """A final run whose test accuracy is ``late`` at 80% of its steps and ``last`` at the end."""
    return {"eval_split": "test", "diverged": diverged, "final_train_loss": train_loss, "steps": steps,
            "final_test_accuracy": last / 100,
            "evaluations": [{"step": 0}] + [{"step": s, "test_accuracy": a / 100} for s, a in
                                            ((400, 50.0), (1200, 90.0), (1600, late), (2000, last))]}


def test_the_convergence_check_holds_train_loss_to_the_floor_and_the_late_gain_to_one_standard_error():
    floor = 0.5
    # gap (0.505 + 0.507)/2 − 0.5 = 0.006; gain (0.5 + 0.3)/2 = 0.4 points; SE at 97.5% on 355 images:
    # 100·√(0.975·0.025/355) = 0.8286 points
    ok = vp.convergence_check([_final_run(0.505, 97.0, 97.5), _final_run(0.507, 97.2, 97.5)], floor, 355)
    assert ok.runs == 2 and ok.train_loss_gap == pytest.approx(0.006) and ok.late_gain == pytest.approx(0.4)
    assert ok.late_gain_tolerance == pytest.approx(0.8286, abs=1e-4) and ok.converged
    # the train loss 0.017 above the floor: not converged, though the accuracy has stopped moving
    assert not vp.convergence_check([_final_run(0.517, 97.5, 97.5)] * 2, floor, 355).converged
    # +1.0 point over the last fifth (> 0.83): not converged; a diverged run does not count
    late = vp.convergence_check([_final_run(0.501, 96.5, 97.5), _final_run(9.9, 10.0, 10.0, diverged=True)], floor,
                                355)
    assert late.runs == 1 and late.late_gain == pytest.approx(1.0) and not late.converged
    assert vp.convergence_check([_final_run(9.9, 10.0, 10.0, diverged=True)], floor, 355) is None
    few = _final_run(0.5, 97.0, 97.5)
    few["evaluations"] = [{"step": 0}, {"step": 2000, "test_accuracy": 0.975}]    # nothing before the last fifth
    assert vp.convergence_check([few], floor, 355) is None
