"""Several processes through the CLI (2 processes × 2 CPU devices, gloo collectives) against one process holding all
4 devices: every mesh layout, resume on another process count, a preemption signal to one process."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config

from test_train import TINY, read_metrics, subprocess_env, tiny_config

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS = 8
# 4 heads, so that tensor=4 splits them; checkpoints every 4 steps.
OVERRIDES = {"model.num_heads": 4, "train.checkpoint_every": 4}


def config(**train):
    cfg = tiny_config(f"steps={STEPS}")
    cfg.model.num_heads = OVERRIDES["model.num_heads"]
    cfg.train.checkpoint_every = OVERRIDES["train.checkpoint_every"]
    for key, value in train.items():
        cfg.train[key] = value
    return cfg


def experiment(**train):
    """``config(**train)`` validated, as the command line validates it: what the loop takes."""
    return validate_experiment_config(config(**train))


def flags(mesh=None, **train):
    out = [f"--config.{k}={v}" for k, v in OVERRIDES.items()]
    out += [f"--config.train.mesh.{axis}={size}" for axis, size in (mesh or {}).items()]
    out += [f"--config.train.{k}={v}" for k, v in train.items()]
    return out


def launch(workdir, *extra, processes=2):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    return [subprocess.Popen([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps={STEPS}",
                              f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
                              f"--num_processes={processes}", f"--process_id={i}", *extra],
                             env=subprocess_env(4 // processes), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
            for i in range(processes)]


def finish(procs, timeout=300, status=0):
    """The processes' outputs once they exited with ``status`` (143: stopped by a preemption notice)."""
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert all(p.returncode == status for p in procs), "\n\n".join(outputs)
    return outputs


def losses(workdir):
    return {r["step"]: r["train_loss"] for r in read_metrics(workdir) if "train_loss" in r}


def results(workdir):
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The reference: one process holding 4 devices, pure data parallel."""
    workdir = str(tmp_path_factory.mktemp("one_process"))
    loop_lib.train_and_evaluate(experiment(mesh={"data": 4, "fsdp": 1, "tensor": 1}), workdir,
                                devices=jax.devices()[:4])
    return workdir


def assert_same_run(workdir, reference, steps=range(1, STEPS + 1)):
    got, want = losses(workdir), losses(reference)
    np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps], atol=1e-5)


@pytest.mark.parametrize("mesh", [{"data": 4}, {"data": 1, "fsdp": 4}, {"data": 1, "tensor": 4},
                                  {"data": 1, "fsdp": 2, "tensor": 2}],
                         ids=["data4", "fsdp4", "tensor4", "fsdp2_tensor2"])
def test_two_processes_equal_one_process(one_process, tmp_path, mesh):
    workdir = str(tmp_path / "run")
    outputs = finish(launch(workdir, *flags(mesh)))
    assert "2 processes" in outputs[0]
    assert_same_run(workdir, one_process)
    assert results(workdir)["test_examples"] == results(one_process)["test_examples"] == 40
    assert results(workdir)["test_accuracy"] == pytest.approx(results(one_process)["test_accuracy"], abs=1e-6)


def test_processes_whose_rows_interleave_train_equal_to_one_process(one_process, tmp_path):
    """``data=2`` within each process and ``dcn_fsdp=2`` across the 2 processes (each plays a slice): the batch
    shards alternate between the processes, so each reads two non-adjacent quarters of every batch (and of the
    padded last test batch); Mixup/CutMix pair rows of different processes inside the jitted step. Every logged
    loss and every test example as with 1 process × 4 devices."""
    workdir = tmp_path / "interleaved"
    finish(launch(str(workdir), *flags({"data": 2, "dcn_fsdp": 2})))
    assert_same_run(str(workdir), one_process)
    records = [json.loads(line) for line in (workdir / "goodput.jsonl").read_text().splitlines()]
    assert {r["attempt"] for r in records} == {1} and [r["final"] for r in records].count(True) == 1   # process 0's
    end = next(r for r in records if r["final"])
    assert end["seconds"]["connect"] > 0 and end["seconds"]["startup"] > 0     # the connect apart from the start-up
    assert sum(end["seconds"].values()) == pytest.approx(end["wall_seconds"], abs=1e-6)
    assert results(workdir)["goodput"]["attempts"] == 1                                         # one account
    assert results(workdir)["test_examples"] == results(one_process)["test_examples"] == 40
    assert results(workdir)["test_accuracy"] == pytest.approx(results(one_process)["test_accuracy"], abs=1e-6)
    meta = workdir / "checkpoints" / "meta" / str(STEPS)
    rows = [json.loads((meta / f"data_process_{p}.json").read_text())["rows"] for p in range(2)]
    assert rows == [[[0, 4], [8, 12]], [[4, 8], [12, 16]]]


def test_one_process_checkpoint_resumes_on_two_processes(one_process, tmp_path):
    workdir = str(tmp_path / "resume")
    first = experiment(mesh={"data": 4, "fsdp": 1, "tensor": 1}, stop_after_steps=4)
    assert loop_lib.train_and_evaluate(first, workdir, devices=jax.devices()[:4]) == {"preempted_at_step": 4}
    outputs = finish(launch(workdir, *flags({"data": 2, "fsdp": 2})))
    assert "resumed from step 4" in outputs[0] and "resumed from step 4" in outputs[1]
    assert_same_run(workdir, one_process)
    assert sorted(losses(workdir)) == list(range(1, STEPS + 1))   # no record lost or repeated


def test_sigterm_to_one_process_stops_both_at_one_step_then_one_process_resumes(tmp_path):
    workdir = str(tmp_path / "sigterm")
    procs = launch(workdir, *flags({"data": 4}, steps=10_000, log_every=2, checkpoint_every=0))
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 240
    while time.time() < deadline and not (os.path.exists(metrics) and len(read_metrics(workdir)) >= 2):
        assert all(p.poll() is None for p in procs), "a process ended before the signal"
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)                  # the non-primary process only
    outputs = finish(procs, status=143)                   # both: "preempted, rerun to resume"
    stopped = [int(line.split("stopped at step ")[1].split(";")[0]) for out in outputs
               for line in out.splitlines() if "stopped at step" in line]
    assert len(stopped) == 2 and stopped[0] == stopped[1], outputs     # any step: JAX's sync point, every step
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    assert steps == [stopped[0]]
    # Resume with the reference's layout: one process, 4 devices, and the reference's step count.
    loop_lib.train_and_evaluate(experiment(mesh={"data": 4, "fsdp": 1, "tensor": 1}, steps=10_000, log_every=2,
                                           checkpoint_every=0, stop_after_steps=2), workdir, devices=jax.devices()[:4])
    got = losses(workdir)
    # Against an uninterrupted one-process run of the same config: every record, before and after the interruption.
    fresh = str(tmp_path / "fresh")
    loop_lib.train_and_evaluate(experiment(mesh={"data": 4, "fsdp": 1, "tensor": 1}, steps=10_000, log_every=2,
                                           checkpoint_every=0, stop_after_steps=stopped[0] + 2), fresh,
                                devices=jax.devices()[:4])
    want = losses(fresh)
    assert sorted(got) == sorted(want) == list(range(2, stopped[0] + 3, 2))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)], atol=1e-5)


def test_a_failing_process_ends_the_job(tmp_path):
    """Process 1 cannot write its data state at the first checkpoint (a directory stands in the file's place); it
    reports that and exits at once, and process 0 stops as well: its next collective fails because process 1 has
    closed its connection, instead of waiting in the collective until a timeout. What process 0's error says is
    gloo's wording ("Connection closed by peer", "reset by peer" under load), so only what it does is asserted: it
    ends, unsuccessfully, without finishing the run or committing step 4."""
    workdir = tmp_path / "fail"
    (workdir / "checkpoints" / "meta" / "4" / "data_process_1.json").mkdir(parents=True)
    procs = launch(str(workdir), *flags({"data": 2, "fsdp": 2}))
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode != 0 for p in procs] == [True, True], "\n\n".join(outputs)
    assert "error: saving the checkpoint of step 4" in outputs[1] and "data_process_1.json" in outputs[1]
    assert "test accuracy" not in outputs[0] and not (workdir / "results.json").exists(), outputs[0]
    assert not (workdir / "checkpoints" / "4").exists(), outputs[0]
