"""The rules that judge CaiT's claims on the depth ablation's final runs (experiments/cait_claims.py): Holm's
correction and Fisher's test against hand computations, the Welch interval against scipy's, and each verdict on
records built to produce it."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import cait_claims as cc  # noqa: E402

GRID = (6, 12, 24, 48, 96)
HIGH = [98.0, 98.3, 97.7, 98.2, 97.9]          # the claimed-better cells
SAME = [97.9, 98.2, 98.0, 97.8, 98.1]          # indistinguishable from HIGH (Welch p ≈ 0.9)
LOW = [90.0, 91.0, 89.5, 90.5, 90.2]           # 8 points below


def runs(scheme, warmup, depth, accuracies, diverged=0):
    return ([{"scheme": scheme, "warmup": warmup, "depth": depth, "diverged": False, "accuracy": a}
             for a in accuracies]
            + [{"scheme": scheme, "warmup": warmup, "depth": depth, "diverged": True, "accuracy": 10.0}] * diverged)


def judge(records, name):
    claim = {c.name: c for c in cc.cait_claims(GRID)}[name]
    return cc.evaluate(records, claim, lambda r: r["accuracy"])


def test_holm_adjusts_the_ith_smallest_p_by_m_minus_i_and_keeps_the_order():
    # by hand: sorted 0.01, 0.03, 0.04 → 3·0.01 = 0.03, 2·0.03 = 0.06, max(0.06, 1·0.04) = 0.06
    assert cc.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert cc.holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert cc.holm([0.3, 0.2]) == pytest.approx([0.4, 0.4]) and cc.holm([0.9, 0.8]) == [1.0, 1.0]
    assert cc.holm([]) == []


def test_fisher_on_five_diverged_against_none_is_two_over_252():
    # one table in C(10, 5) = 252 as extreme in each direction
    assert cc.fisher_divergence(0, 5, 5, 5) == pytest.approx(2 / 252)
    assert cc.fisher_divergence(1, 5, 1, 5) == pytest.approx(1.0)


def test_the_difference_interval_is_scipys_welch_interval():
    from scipy import stats
    d = cc.welch_difference(HIGH, LOW)
    ref = stats.ttest_ind(HIGH, LOW, equal_var=False)
    low, high = ref.confidence_interval(0.95)
    assert (d.ci_low, d.ci_high, d.p, d.dof) == pytest.approx((low, high, ref.pvalue, ref.df))
    assert d.difference == pytest.approx(sum(HIGH) / 5 - sum(LOW) / 5)
    with pytest.raises(ValueError, match="constant"):
        cc.welch_difference([98.0, 98.0], [97.0, 97.0])


def test_the_claims_on_the_committed_grid_compare_the_two_deepest_depths():
    claims = {c.name: c for c in cc.cait_claims(GRID)}
    assert claims["1"].comparisons == ((("none", True, 6), ("none", True, 48)), (("none", True, 6), ("none", True, 96)))
    assert claims["4b"].comparisons == tuple((("layerscale", True, d), ("skipinit", w, d))
                                             for w in (True, False) for d in (48, 96))
    assert [len(c.comparisons) for c in claims.values()] == [2, 2, 2, 4, 4, 2, 4]
    # ε = 0.1 is the CaiT rule's value up to depth 18: no comparison there
    assert cc.cait_claims((6, 12))[5].comparisons == ()


def test_a_significant_difference_in_the_claimed_direction_reproduces_the_claim():
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("none", True, d, LOW)]
    result = judge(records, "2")
    assert result.verdict == "reproduced"
    assert [c.outcome for c in result.comparisons] == ["as claimed", "as claimed"]
    # two tests of equal p: Holm doubles the smaller, the larger keeps the same value
    assert [c.accuracy_p_holm for c in result.comparisons] == pytest.approx([2 * c.accuracy.p
                                                                            for c in result.comparisons])


def test_the_opposite_difference_contradicts_and_no_difference_resolves_nothing():
    ls = [r for d in (48, 96) for r in runs("layerscale", True, d, LOW)]
    scalar = [r for d in (48, 96) for r in runs("scalar", True, d, HIGH)]
    assert judge(ls + scalar, "3").verdict == "not reproduced: contradicted"
    same = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("scalar", True, d, SAME)]
    result = judge(same, "3")
    assert result.verdict == "not reproduced: no difference resolved"
    assert all(c.outcome == "not resolved" and c.accuracy.ci_low < 0 < c.accuracy.ci_high
               for c in result.comparisons)


def test_divergence_alone_decides_through_fishers_test_after_holms_correction():
    # skipinit with warm-up diverges in all 5 seeds at 48 and 96; without warm-up it equals LayerScale. Family of 4
    # tests: Fisher 2/252 twice, Welch p ≈ 0.9 twice → Holm 4·2/252 = 0.032 < 0.05
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("skipinit", True, d, [], 5)
               + runs("skipinit", False, d, SAME)]
    result = judge(records, "4b")
    assert result.verdict == "reproduced"
    outcomes = {(c.worse[1], c.worse[2]): c for c in result.comparisons}
    assert outcomes[(True, 96)].accuracy is None and outcomes[(True, 96)].outcome == "as claimed"
    assert outcomes[(True, 96)].divergence_p_holm == pytest.approx(4 * 2 / 252)
    assert outcomes[(False, 48)].outcome == "not resolved"


def test_higher_accuracy_with_more_divergence_is_mixed():
    # rezero with warm-up: better accuracy but 5 of 10 diverged; without: 10 of 10 converged 8 points lower.
    # Fisher 5/10 vs 0/10: p = 0.0325, the larger of the family's two p values, so Holm leaves it as it is
    records = runs("rezero", True, 96, HIGH, 5) + runs("rezero", False, 96, LOW + LOW[::-1])
    result = judge(records, "6")
    assert [c.outcome for c in result.comparisons] == ["mixed"]          # the other three cells have no runs
    assert result.verdict == "interim: 1 of 4 comparisons have all their runs" and len(result.missing) == 3


def test_a_claim_with_a_comparison_still_without_runs_has_no_verdict():
    """Part of a claim is not the claim: with depth 48 tested (significant) and depth 96 without runs, Holm's family
    is incomplete and the claim is interim, not reproduced."""
    records = runs("layerscale", True, 48, HIGH) + runs("none", True, 48, LOW)
    result = judge(records, "2")
    assert [c.outcome for c in result.comparisons] == ["as claimed"]
    assert result.verdict == "interim: 1 of 2 comparisons have all their runs"
    # depth 96 with 2 of the protocol's 5 seeds: tested, still interim; with all 5, judged
    claim = {c.name: c for c in cc.cait_claims(GRID)}["2"]
    partial = records + runs("layerscale", True, 96, HIGH[:2]) + runs("none", True, 96, LOW)
    assert cc.evaluate(partial, claim, lambda r: r["accuracy"], runs_per_cell=5).verdict == (
        "interim: 1 of 2 comparisons have all their runs")
    full = records + runs("layerscale", True, 96, HIGH) + runs("none", True, 96, LOW)
    assert cc.evaluate(full, claim, lambda r: r["accuracy"], runs_per_cell=5).verdict == "reproduced"


def test_a_claim_without_runs_is_not_tested_and_the_report_shows_every_statistic(tmp_path):
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("none", True, d, LOW)]
    assert judge(records, "1").verdict == "not tested"          # no `none` at depth 6
    records += runs("none", True, 6, HIGH) + runs("layerscale", True, 6, HIGH)
    results = cc.write_claims(records, str(tmp_path / "claims.md"), "title", lambda r: r["accuracy"],
                              depths=(6, 12, 24, 48, 96))
    text = (tmp_path / "claims.md").read_text()
    assert [r.verdict for r in results][:2] == ["reproduced", "reproduced"]
    # HIGH − LOW = 98.02 − 90.24 = 7.78 points
    assert "### Claim 1: reproduced" in text and "| `none` @ 6 vs `none` @ 96 | 5/5 vs 5/5 | +7.78 [" in text
    assert "| `layerscale` @ 48 vs `none` @ 48 | 5/5 vs 5/5 | +7.78 [+7.10, +8.46] | 28.60 | 5.4 |" in text
    assert "### Claim 5: not tested" in text and "| no runs |" in text


def test_the_claims_figure_draws_every_comparison_with_and_without_an_accuracy_test(tmp_path):
    import depth_ablation_plots as plots
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("skipinit", True, d, [], 5)
               + runs("skipinit", False, d, SAME)]
    path = tmp_path / "claims.png"
    plots.plot_claims([judge(records, "4b")], str(path), title="synthetic")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    marks = {"†": ({("skipinit", True, 48)}, "fails the convergence check"), "‡": (set(), "unused")}
    plots.plot_claims([judge(records, "4b")], str(path), title="marked", marks=marks)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_formulas_detectable_difference_is_the_t_approximation_at_holms_first_and_last_level():
    from scipy import stats
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("none", True, d, SAME)]
    result = judge(records, "2")                               # two comparisons, two tests: α/m = 0.025
    # HIGH: variance 0.228/4 = 0.057; SAME: 0.1/4 = 0.025; se² = (0.057 + 0.025)/5 = 0.0164;
    # df = 0.0164² / ((0.0114² + 0.005²)/4) = 6.943
    se, dof = math.sqrt(0.0164), 0.0164 ** 2 / ((0.0114 ** 2 + 0.005 ** 2) / 4)
    assert dof == pytest.approx(6.943, abs=1e-3)
    for c in result.comparisons:
        strict, loose = cc.detectable(c.spread, 2)
        assert strict == pytest.approx((stats.t.ppf(1 - 0.025 / 2, dof) + stats.t.ppf(0.8, dof)) * se)
        assert loose == pytest.approx((stats.t.ppf(1 - 0.05 / 2, dof) + stats.t.ppf(0.8, dof)) * se)
        assert 0.40 < loose < strict < 0.50
        assert c.detectable is None                             # the verdict's rule does not use it (post hoc)


def test_the_claims_reports_detectable_difference_is_the_simulated_one_capped_at_the_accuracy_headroom(tmp_path):
    """claims.md states each comparison's detectable difference by simulating Welch's test at the observed SDs
    (seeded: the same numbers twice), and one larger than the claimed-worse cell's headroom to 100% as not
    detectable within the endpoint's range, with that range."""
    better = [99.6, 99.9, 99.3, 99.8, 99.4]
    worse = [99.22, 99.72, 98.72, 99.42, 99.02]   # mean 99.22: `layerscale` can be 100 − 99.22 = 0.78 points ahead
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, better) + runs("none", True, d, worse)]
    results = cc.write_claims(records, str(tmp_path / "claims.md"), "title", lambda r: r["accuracy"], depths=GRID)
    text = (tmp_path / "claims.md").read_text()
    claim = {r.claim.name: r for r in results}["2"]
    assert len(claim.comparisons) == 2                          # two tests: Holm's α/m = 0.025
    for c in claim.comparisons:
        assert c.detectable == cc.simulated_detectable_pair(c.spread, 2)
        assert cc.accuracy_headroom(c) == pytest.approx(0.78)
        strict, loose = c.detectable
        formula_strict, formula_loose = cc.detectable(c.spread, 2)
        # the formula (SDs known) would put α/m inside the range; the simulated test needs more, beyond it
        assert formula_strict < 0.78 < strict and formula_loose < loose < 0.78
        assert c.outcome == "not resolved"
    assert f"| {cc.OUT_OF_RANGE} / {loose:.2f} (range 0.78) | not resolved |" in text
    assert "| detectable, 80% power (α/m / α), by simulation of Welch's test at the observed SDs (post hoc) |" in text
    # within the range, both levels are numbers: HIGH against SAME (mean 98.0, range 2.0)
    records = [r for d in (48, 96) for r in runs("layerscale", True, d, HIGH) + runs("none", True, d, SAME)]
    results = cc.write_claims(records, str(tmp_path / "same.md"), "title", lambda r: r["accuracy"], depths=GRID)
    strict, loose = {r.claim.name: r for r in results}["2"].comparisons[0].detectable
    assert f"| {strict:.2f} / {loose:.2f} | not resolved |" in (tmp_path / "same.md").read_text()
