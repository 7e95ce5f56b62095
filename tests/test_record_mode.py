"""The study's runs (``experiments/classifier_run.train_classifier``, the train loop's record mode) give the records
committed in ``tests/fixtures/record_mode*.json`` to the last bit: every field but the wall-clock ones (``seconds``,
``timing``), for a few depth-6 runs built as the depth ablation builds them (``depth_ablation_runs.train_run``), one of
them diverging. The first fixture was written by the study's own loop before it became the train loop's record mode,
so committed study records stay what the code gives.

XLA's CPU code differs between CPU generations, and with it the last bits of float32 results, so each fixture holds
the records of one machine kind (its ``machine``: CPU model and generation, threads) and the test compares with the
fixture of the kind it runs on; a kind without a fixture is skipped, naming the kind and the command that adds one
(run it at a commit whose numbers are known good: the fixtures agree with each other in every decision, they differ
in the last bits only). The runs train in a subprocess with the study's environment (one CPU device, XLA's default
optimisation), not the test session's (``conftest.py``: 8 devices, backend optimisation off). Regenerate this kind's
(only when a change of the numbers is intended, naming it in the commit):

    python tests/test_record_mode.py --write
"""
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
WALL_CLOCK = ("seconds", "timing")

# (run spec fields, sizing fields, overrides): depth_ablation_runs.RunSpec(depth, scheme, warmup, seed, learning_rate,
# protocol, steps), depth_ablation_runs.Sizing(embed_dim, num_heads, batch_size, steps, evals, log_every).
RUNS = (
    # validation split (val_*), evaluations every 10 of 30 steps
    ((6, "layerscale", True, 0, 1e-2, "rates", 30), (16, 2, 32, 0, 3, 10), {}),
    # test split (test_*), stopped after 15 steps of a 24-step schedule, logged every 4: the last window is short
    ((6, "skipinit", False, 1, 5e-3, "final", 24), (16, 2, 32, 0, 2, 4), {"train.stop_after_steps": 15}),
    # diverges at step 2 (step 1 finite), within the first logging window: the run goes on to the window's end,
    # keeping the non-finite updates out, and is recorded as diverged at step 2
    ((6, "none", False, 0, 1e3, "rates", 30), (16, 2, 32, 0, 3, 10), {}),
)


def study_records() -> list[dict]:
    """The record of each of ``RUNS``, as the depth ablation's sweep would write it (less ``sweep.run``'s
    ``cpu_seconds`` and ``machine``)."""
    sys.path.insert(0, os.path.join(ROOT, "experiments"))
    import depth_ablation_runs as da
    return [da.train_run(da.RunSpec(*spec), da.Sizing(*sizing), overrides=overrides)
            for spec, sizing, overrides in RUNS]


def differences(old, new, path="record") -> list[str]:
    """Where ``new`` differs from ``old`` (JSON values; floats compared exactly, NaN equal to NaN)."""
    if isinstance(old, dict) and isinstance(new, dict):
        keys = sorted(set(old) | set(new))
        return [d for k in keys for d in (differences(old.get(k), new.get(k), f"{path}.{k}") if k in old and k in new
                                          else [f"{path}.{k}: only in {'old' if k in old else 'new'}"])]
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return [f"{path}: {len(old)} items before, {len(new)} now"]
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    same = (old == new and type(old) is type(new)) or (
        isinstance(old, float) and isinstance(new, float) and math.isnan(old) and math.isnan(new))
    return [] if same else [f"{path}: {old!r} before, {new!r} now"]


def _without_wall_clock(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in WALL_CLOCK}


def _study_environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}
    return {**env, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}


def machine_kind() -> tuple:
    """What a fixture is specific to: CPU model, generation and the threads XLA may use."""
    from layerscale_jax.bench.timing import cpu_family_model, cpu_model
    return cpu_model(), cpu_family_model(), len(os.sched_getaffinity(0))


def fixture_path(kind: tuple) -> str:
    """This kind's fixture: ``record_mode.json`` for the kind that wrote the first, else one named by the kind."""
    first = os.path.join(FIXTURES, "record_mode.json")
    with open(first) as f:
        m = json.load(f)["machine"]
    if (m["cpu"], m["cpu_family_model"], m["cpu_threads"]) == kind:
        return first
    name = "_".join(str(part) for part in kind[1:]).replace(" ", "")
    return os.path.join(FIXTURES, f"record_mode_{name}threads.json")


@pytest.mark.slow
def test_the_study_runs_give_the_committed_records_to_the_last_bit(tmp_path):
    kind = machine_kind()
    path = fixture_path(kind)
    if not os.path.exists(path):
        pytest.skip(f"no record-mode fixture for {kind} (CPU, generation, threads): the last bits differ between "
                    f"CPU kinds; add {os.path.relpath(path, ROOT)} with `python tests/test_record_mode.py --write` "
                    "at a commit whose numbers are known good")
    out = tmp_path / "records.json"
    subprocess.run([sys.executable, __file__, "--out", str(out)], check=True, env=_study_environment(), cwd=ROOT,
                   timeout=900)
    with open(path) as f:
        committed = json.load(f)["records"]
    records = json.loads(out.read_text())["records"]
    assert [r["run_id"] for r in records] == [r["run_id"] for r in committed]
    assert any(r["diverged"] for r in committed) and not all(r["diverged"] for r in committed)
    problems = [d for old, new in zip(committed, records)
                for d in differences(_without_wall_clock(old), _without_wall_clock(new), old["run_id"])]
    assert not problems, "\n".join(problems)


def _write(path: str, note: str | None) -> None:
    from layerscale_jax.bench.timing import machine_info
    machine = {k: v for k, v in machine_info().items() if k not in ("hostname", "load_average")}
    body = {"records": study_records(), "machine": machine}
    if note:
        body = {"produced_by": note, **body}
    with open(path, "w") as f:
        json.dump(body, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="write this machine kind's fixture")
    parser.add_argument("--out", help="write the records here (the test's run)")
    parser.add_argument("--note", help="the fixture's produced_by: the command and commit")
    args = parser.parse_args()
    _write(fixture_path(machine_kind()) if args.write else args.out, args.note)
