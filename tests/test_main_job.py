"""The main job's per-seed accuracies quoted in README and docs are the committed records of
``experiments/main_job.py`` (one folder per CPU kind)."""
import glob
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def committed_accuracies(cpu_folder):
    records = [json.load(open(p)) for p in glob.glob(os.path.join(ROOT, "experiments", "results", "main_job",
                                                                  cpu_folder, "runs", "seed*.json"))]
    return [f"{100 * r['test_accuracy']:.2f}" for r in sorted(records, key=lambda r: r["seed"])]


def test_readme_and_reliability_quote_the_committed_main_job_records():
    intel = committed_accuracies("intel-xeon")
    assert len(intel) == 3
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert f"{'/'.join(intel)}% on an Intel Xeon" in readme
    reliability = open(os.path.join(ROOT, "docs", "reliability.md")).read()
    for seed, accuracy in enumerate(intel):
        row = next(line for line in reliability.splitlines() if line.startswith(f"| {seed} |"))
        assert row.endswith(f"| {accuracy}% |"), row
