"""Faults around a workdir, each injected: a finished run re-run, a workdir of another config, corrupt checkpoints,
a failed save, a second job, a killed run's extra metric records, a non-finite update; epath (gs://) workdirs."""
import json
import logging
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from layerscale_jax import network
from layerscale_jax.storage import workdir as workdir_lib
from layerscale_jax.storage.checkpoint import Checkpointer, CheckpointSaveError, NoUsableCheckpointError
from layerscale_jax.storage.workdir_lock import WorkdirLock
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config

from test_train import TINY, read_metrics, subprocess_env, tiny_config, train_losses

STEPS = 6


def config(**train):
    cfg = tiny_config(f"steps={STEPS}")
    cfg.train.checkpoint_every = 2
    cfg.train.update(train)
    return cfg


def experiment(**train):
    """``config(**train)`` validated, as the command line and ``api.fit`` validate it: what the loop takes."""
    return validate_experiment_config(config(**train))


@pytest.fixture(scope="module")
def finished(six_step_run):
    """A finished run of ``config()`` (tests/conftest.py trains it once for this file and tests/test_storage.py)."""
    return six_step_run


@pytest.fixture
def saved_checkpoints(tmp_path):
    """A workdir whose ``checkpoints/`` holds the sealed steps 2, 4 and ``STEPS`` of a small state, as the run saves
    them (keeping 2), without training: for the tests of the checkpoint files alone."""
    import jax.numpy as jnp
    checkpointer = Checkpointer(tmp_path / "saved" / "checkpoints", keep=2)
    for step in (2, 4, STEPS):
        state = {"params": {"w": jnp.full(3, step, jnp.float32), "b": jnp.zeros(2, jnp.float32)}}
        checkpointer.save(step, state, {"position": step}, {"a": 1})
    checkpointer.close()
    return str(tmp_path / "saved")


def checkpoint_steps(workdir):
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def copy_run(finished, tmp_path, name):
    workdir = str(tmp_path / name)
    shutil.copytree(finished[0], workdir)
    return workdir


def corrupt(workdir, step, how):
    for root, _, files in os.walk(os.path.join(workdir, "checkpoints", str(step))):
        for name in files:
            path = os.path.join(root, name)
            if how == "truncate":
                with open(path, "r+b") as f:
                    f.truncate(os.path.getsize(path) // 2)
            elif how == "flipped_bits":             # the lowest bit of every 64th byte: same length, similar values
                with open(path, "r+b") as f:
                    data = bytearray(f.read())
                    data[::64] = bytes(b ^ 1 for b in data[::64])
                    f.seek(0)
                    f.write(data)
            else:                                  # random bytes over the file's start, same length
                size = os.path.getsize(path)
                with open(path, "r+b") as f:
                    f.write(np.random.default_rng(0).bytes(min(size, 64)))


@pytest.mark.slow
def test_rerunning_a_finished_workdir_returns_its_results_untouched(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "again")
    before = open(os.path.join(workdir, "results.json")).read()
    again = loop_lib.train_and_evaluate(experiment(), workdir)
    assert open(os.path.join(workdir, "results.json")).read() == before
    assert again == json.loads(before) and again["test_accuracy"] is not None
    assert "holds a finished run of 6 steps" in capsys.readouterr().out


@pytest.mark.slow
def test_raising_steps_continues_from_the_final_checkpoint(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "longer")
    results = loop_lib.train_and_evaluate(experiment(steps=8), workdir)
    assert results["resumed_from_step"] == STEPS and results["steps"] == 8
    assert sorted(train_losses(workdir)) == list(range(1, 9))


@pytest.mark.slow
def test_another_config_in_the_same_workdir_is_refused_naming_the_fields(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "other")
    other = config()
    other.model.depth = 3
    other.optim.learning_rate = 2e-3
    with pytest.raises(workdir_lib.WorkdirError, match=r"model\.depth: 2 → 3; optim\.learning_rate: 0\.001 → 0\.002"):
        loop_lib.train_and_evaluate(validate_experiment_config(other), workdir)
    assert checkpoint_steps(workdir) == checkpoint_steps(finished[0])          # nothing touched


@pytest.mark.slow
def test_harmless_changes_are_accepted_and_logged(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "harmless")
    changed = config(steps=8, log_every=2)
    loop_lib.train_and_evaluate(validate_experiment_config(changed), workdir)
    out = capsys.readouterr().out
    assert "train.log_every: 1 → 2" in out and "train.steps: 6 → 8" in out


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncate", "random_bytes"])
def test_a_corrupt_checkpoint_is_quarantined_and_the_run_resumes_from_the_previous(finished, tmp_path, how,
                                                                                   caplog):
    workdir = copy_run(finished, tmp_path, how)
    os.remove(os.path.join(workdir, "results.json"))
    corrupt(workdir, STEPS, how)
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    assert f"checkpoint at step {STEPS} is corrupt" in caplog.text
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "quarantine", str(STEPS)))
    assert results["resumed_from_step"] == 4 and results["steps"] == STEPS        # re-saved step 6, no collision
    assert STEPS in checkpoint_steps(workdir)
    np.testing.assert_allclose([train_losses(workdir)[s] for s in range(1, STEPS + 1)],
                               [train_losses(finished[0])[s] for s in range(1, STEPS + 1)], atol=1e-6)


def unfinished_run_with_every_checkpoint_corrupt(finished, tmp_path, name):
    workdir = copy_run(finished, tmp_path, name)
    os.remove(os.path.join(workdir, "results.json"))
    for step in checkpoint_steps(workdir):
        corrupt(workdir, step, "random_bytes")
    return workdir


@pytest.mark.slow
def test_when_no_checkpoint_is_usable_the_run_stops_and_says_how_to_start_fresh(finished, tmp_path):
    workdir = unfinished_run_with_every_checkpoint_corrupt(finished, tmp_path, "all_corrupt")
    with pytest.raises(NoUsableCheckpointError, match="use a new --workdir"):
        loop_lib.train_and_evaluate(experiment(), workdir)


@pytest.mark.slow
def test_a_failed_save_stops_the_run_naming_the_cause_and_the_last_complete_checkpoint(tmp_path, monkeypatch):
    workdir = str(tmp_path / "disk_full")
    original = Checkpointer._write_json
    calls = []

    def full_disk(path, value):
        calls.append(path)
        if str(path).endswith("data_process_0.json") and "/meta/4/" in str(path):
            raise OSError(28, "No space left on device")
        return original(path, value)

    monkeypatch.setattr(Checkpointer, "_write_json", staticmethod(full_disk))
    with pytest.raises(CheckpointSaveError, match=r"step 4 .*No space left on device.*last complete checkpoint is "
                                                  r"step 2"):
        loop_lib.train_and_evaluate(experiment(), workdir)
    monkeypatch.undo()                                          # space freed: the rerun resumes exactly
    results = loop_lib.train_and_evaluate(experiment(), workdir)
    assert results["resumed_from_step"] == 2


def test_a_second_job_on_a_held_workdir_is_refused_naming_the_holder(tmp_path):
    workdir = tmp_path / "locked"
    workdir.mkdir()
    (workdir / "lock.json").write_text(json.dumps({"host": "other-host", "pid": 123, "started": "then",
                                                   "heartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                                   "heartbeat_every": 86400}))
    with pytest.raises(workdir_lib.WorkdirError, match="in use by process 123 on host other-host"):
        loop_lib.train_and_evaluate(experiment(), str(workdir))


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    lock = WorkdirLock(tmp_path)
    (tmp_path / "lock.json").write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 12345}))
    lock.acquire()
    assert json.loads((tmp_path / "lock.json").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "lock.json").exists()


@pytest.mark.slow
def test_records_of_a_killed_run_after_its_last_checkpoint_are_not_duplicated(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "killed")
    os.remove(os.path.join(workdir, "results.json"))
    shutil.rmtree(os.path.join(workdir, "checkpoints", str(STEPS)))        # died before its final save completed
    loop_lib.train_and_evaluate(experiment(), workdir)
    strip = lambda records: [{k: v for k, v in r.items() if k != "img_per_s"} for r in records]
    assert strip(read_metrics(workdir)) == strip(read_metrics(finished[0]))


def test_cleaning_up_after_a_save_keeps_the_side_files_other_processes_write_for_the_next_step(saved_checkpoints):
    """Process 0 removes the side files of deleted checkpoints while the other processes may already be writing
    their data state for the next step: side files of older, deleted steps are removed, a newer step's are kept."""
    workdir = saved_checkpoints
    meta = os.path.join(workdir, "checkpoints", "meta")
    for step in (1, STEPS + 2):
        os.makedirs(os.path.join(meta, str(step)))
        with open(os.path.join(meta, str(step), "data_process_1.json"), "w") as f:
            f.write("{}")
    Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)._forget_deleted()
    assert not os.path.exists(os.path.join(meta, "1"))
    assert os.path.exists(os.path.join(meta, str(STEPS + 2), "data_process_1.json"))


@pytest.mark.slow
def test_a_non_finite_update_never_reaches_the_parameters():
    from layerscale_jax.train.step import init_train_state, make_train_step
    from flax import nnx
    from layerscale_jax.models import create_model
    from layerscale_jax.train.config import model_overrides
    cfg = tiny_config()
    model = create_model(cfg.model.name, rngs=nnx.Rngs(0), **model_overrides(cfg.model))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.sgd(float("nan"))                        # finite loss and gradients, a NaN update
    state = init_train_state(params, tx, 0, use_ema=False)
    step = jax.jit(make_train_step(graphdef, tx, lambda s: jnp.nan, optim_config=cfg.optim, data_config=cfg.data,
                                   num_classes=4))
    batch = {"image": jnp.zeros((4, 8, 8, 3)), "label": jnp.arange(4) % 4}
    new_state, metrics = step(state, batch)
    assert not bool(metrics["finite"]) and int(new_state["nonfinite_steps"]) == 1
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_state["params"]), jax.device_get(params))


def test_workdir_files_go_through_epath_so_gs_urls_work(tmp_path, monkeypatch):
    """gs:// served from a local folder by etils' mock: the stored config, the metrics log and the checkpoint
    checksums use epath only (a direct os call would write to a local 'gs:' folder or fail); the lock goes through
    TensorStore's kvstore for the bucket (its exclusive create), here a ``file`` kvstore in the folder."""
    from etils.epath import gpath, testing as epath_testing
    from orbax.checkpoint._src.path import gcs_utils
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)     # else gs:// goes to TensorFlow's gfile
    monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", lambda path: {"driver": "file", "path": local(path)})

    def local(path):
        text = os.fspath(path)
        return str(tmp_path / "bucket" / text[len("gs://"):]) if text.startswith("gs://") else text

    def redirect(original, path, *args, **kwargs):
        args = tuple(local(a) if isinstance(a, (str, os.PathLike)) else a for a in args)
        return original(local(path), *args, **kwargs)

    fns = ("exists", "glob", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rename", "replace",
           "rmtree", "stat", "walk")
    with epath_testing.mock_epath(**{name: redirect for name in fns}):
        workdir = epath.Path("gs://bucket/run")
        assert str(loop_lib.as_path("gs://bucket/run")) == "gs://bucket/run"
        workdir.mkdir(parents=True)
        lock = WorkdirLock(workdir)
        lock.acquire()
        assert workdir_lib.check_stored_config(workdir, {"train": {"steps": 1}}, has_checkpoints=False) == []
        (workdir / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
        workdir_lib.truncate_metrics(workdir / "metrics.jsonl", 1)
        lock.release()
        step_dir = workdir / "checkpoints" / "3" / "state"
        step_dir.mkdir(parents=True)
        (step_dir / "data").write_bytes(b"weights")
        from layerscale_jax.checksums import file_digests
        digests = file_digests(workdir / "checkpoints" / "3")
    local_run = tmp_path / "bucket" / "bucket" / "run"
    assert (local_run / "config.json").exists() and not (local_run / "lock.json").exists()
    assert (local_run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert list(digests) == ["state/data"]
    assert not os.path.exists("gs:")


@pytest.mark.slow
def test_a_failed_async_save_is_not_ignored(tmp_path, monkeypatch):
    """An error of the background save surfaces when the next save (or the end of the run) waits for it."""
    import orbax.checkpoint as ocp
    original = ocp.CheckpointManager.wait_until_finished
    state = {"calls": 0}

    def failing_wait(self):
        original(self)
        state["calls"] += 1
        if state["calls"] == 2:                 # the save of step 2 finished badly; noticed before step 4's
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", failing_wait)
    with pytest.raises(CheckpointSaveError, match="No space left on device"):
        loop_lib.train_and_evaluate(experiment(), str(tmp_path / "async"))


# -- the seal: written as part of finishing a step, checked before a step is trusted -----------------------------------

@pytest.mark.slow
def test_each_step_is_sealed_before_orbax_commits_it(tmp_path, monkeypatch):
    """The seal is written while the step is still orbax's temporary directory, so no committed step lacks one."""
    committed_when_sealed = {}
    original = Checkpointer._seal_in_flight

    def spy(self):
        committed_when_sealed[self._in_flight] = (self.directory / str(self._in_flight)).exists()
        original(self)

    monkeypatch.setattr(Checkpointer, "_seal_in_flight", spy)
    workdir = str(tmp_path / "sealed")
    loop_lib.train_and_evaluate(experiment(), workdir)
    assert committed_when_sealed == {2: False, 4: False, 6: False}
    for step in checkpoint_steps(workdir):
        seal = os.path.join(workdir, "checkpoints", "meta", str(step), "checksums.json")
        recorded = json.load(open(seal))
        assert "state/manifest.ocdbt" in recorded and "config/metadata" in recorded
        assert Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)._verify(step) is None


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncate", "random_bytes", "flipped_bits"])
def test_a_damaged_newest_step_without_its_seal_is_never_trusted(finished, tmp_path, how, caplog):
    """A killed run's newest step whose seal is missing, then damaged: the rerun falls back to the previous sealed
    step with one warning line (no TensorStore traceback, no 'non-finite' dead end) and ends as the original run."""
    workdir = copy_run(finished, tmp_path, f"unsealed_{how}")
    os.remove(os.path.join(workdir, "results.json"))
    os.remove(os.path.join(workdir, "checkpoints", "meta", str(STEPS), "checksums.json"))
    corrupt(workdir, STEPS, how)
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint at step" in
                r.getMessage()]
    assert len(warnings) == 1 and f"checkpoint at step {STEPS} cannot be trusted (never sealed" in warnings[0]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "quarantine", str(STEPS)))
    assert results["resumed_from_step"] == 4 and results["steps"] == STEPS
    assert results["test_accuracy"] == json.load(open(os.path.join(finished[0], "results.json")))["test_accuracy"]


@pytest.mark.slow
def test_flipped_bits_in_a_sealed_step_are_found_by_its_seal(finished, tmp_path, caplog):
    workdir = copy_run(finished, tmp_path, "sealed_flipped")
    os.remove(os.path.join(workdir, "results.json"))
    corrupt(workdir, STEPS, "flipped_bits")
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    assert f"checkpoint at step {STEPS} is corrupt" in caplog.text and results["resumed_from_step"] == 4


def test_each_process_checks_only_its_share_of_the_files_and_the_shares_cover_every_file(saved_checkpoints):
    from layerscale_jax.checksums import corruption
    workdir = saved_checkpoints
    step_dir = epath.Path(workdir) / "checkpoints" / str(STEPS)
    seal = epath.Path(workdir) / "checkpoints" / "meta" / str(STEPS) / "checksums.json"
    names = sorted(json.loads(seal.read_text()))
    (step_dir / names[1]).write_bytes(b"changed")                    # the second file: process 1's share of 2
    assert corruption(step_dir, seal, share=(0, 2)) is None
    assert names[1] in corruption(step_dir, seal, share=(1, 2))
    assert names[1] in corruption(step_dir, seal)


# -- torn logs, restarts, changed step counts, unusable workdirs, full disks ----------------------------------------

def resumable_copy(finished, tmp_path, name):
    """A copy of the finished run as a run killed after its step-4 checkpoint."""
    workdir = copy_run(finished, tmp_path, name)
    os.remove(os.path.join(workdir, "results.json"))
    shutil.rmtree(os.path.join(workdir, "checkpoints", str(STEPS)))
    return workdir


def without_speed(records):
    return [{k: v for k, v in r.items() if k != "img_per_s"} for r in records]


@pytest.mark.slow
def test_a_torn_last_line_of_the_metrics_log_is_dropped_with_one_warning(finished, tmp_path, caplog):
    workdir = resumable_copy(finished, tmp_path, "torn")
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write('{"step": 7, "train_lo')                      # the disk filled while this line was appended
    with caplog.at_level("WARNING"):
        loop_lib.train_and_evaluate(experiment(), workdir)
    torn = [r for r in caplog.records if "is incomplete" in r.getMessage()]
    assert len(torn) == 1 and "metrics.jsonl line" in torn[0].getMessage()
    assert without_speed(read_metrics(workdir)) == without_speed(read_metrics(finished[0]))


def keep_records_up_to(workdir, step):
    """``metrics.jsonl`` as the run killed right after the checkpoint of ``step`` left it; its lines."""
    path = os.path.join(workdir, "metrics.jsonl")
    lines = [line for line in open(path).read().splitlines() if json.loads(line)["step"] <= step]
    open(path, "w").write("".join(line + "\n" for line in lines))
    return lines


@pytest.mark.slow
def test_a_torn_line_at_the_checkpoints_step_is_rebuilt_so_the_log_equals_an_uninterrupted_ones(finished, tmp_path,
                                                                                               caplog, capsys):
    """The record of the checkpoint's step torn (the job died while appending it): it was dropped and never written
    again (23 of 24 records). The checkpoint keeps the records since the previous one (``meta/<step>/log.json``)."""
    workdir = resumable_copy(finished, tmp_path, "torn_at_checkpoint")
    lines = keep_records_up_to(workdir, 4)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.write("".join(line + "\n" for line in lines[:-1]) + lines[-1][:15])
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    assert not [r for r in caplog.records if "metrics.jsonl" in r.getMessage()]
    assert (f"{workdir}/metrics.jsonl: its last line was torn; the records up to step 4 are rebuilt from its "
            "checkpoint (the log equals an uninterrupted run's)") in capsys.readouterr().out
    assert without_speed(read_metrics(workdir)) == without_speed(read_metrics(finished[0]))
    assert "metrics_records_lost" not in results


@pytest.mark.slow
def test_a_metrics_log_deleted_during_the_run_is_rebuilt_as_far_as_the_checkpoint_holds_and_the_loss_named(
        finished, tmp_path, caplog):
    """``metrics.jsonl`` deleted mid-run: the resume went on silently with 9 of 24 records. The records since the
    previous checkpoint come back; the others are named as lost, in one warning and in results.json."""
    workdir = resumable_copy(finished, tmp_path, "deleted")
    expected = keep_records_up_to(workdir, 4)
    since_step_2 = [line for line in expected if json.loads(line)["step"] > 2]
    os.remove(os.path.join(workdir, "metrics.jsonl"))
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    [warning] = [r.getMessage() for r in caplog.records if "metrics.jsonl" in r.getMessage()]
    lost = len(expected) - len(since_step_2)
    assert warning == (f"{workdir}/metrics.jsonl: it was missing; {lost} of the {len(expected)} records up to step 4 "
                       "are lost (deleted or damaged during the run; TensorBoard's event files may hold them), the "
                       f"{len(since_step_2)} of step 4's checkpoint are rebuilt; results.json counts them "
                       "(metrics_records_lost)")
    assert results["metrics_records_lost"] == lost
    assert json.load(open(os.path.join(workdir, "results.json")))["metrics_records_lost"] == lost
    after = [r for r in read_metrics(finished[0]) if r["step"] > 2]
    assert without_speed(read_metrics(workdir)) == without_speed(after)


def test_a_metrics_log_deleted_while_the_run_writes_it_is_named_at_once(tmp_path, caplog):
    from layerscale_jax.train.metrics import MetricsWriter
    writer = MetricsWriter(tmp_path, 10)
    writer.write(1, {"train_loss": 1.0})
    writer.flush()
    os.remove(tmp_path / "metrics.jsonl")
    with caplog.at_level("WARNING"):
        writer.write(2, {"train_loss": 0.5})
        writer.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path}/metrics.jsonl was deleted during the run: the 1 record(s) it held are lost (results.json counts "
        "them: metrics_records_lost); it goes on from step 2"]
    assert writer.lost == 1 and writer.since_checkpoint()["records"] == 1


@pytest.mark.slow
def test_a_damaged_line_inside_the_metrics_log_is_an_error_naming_the_file_and_the_line(finished, tmp_path):
    workdir = resumable_copy(finished, tmp_path, "damaged")
    path = os.path.join(workdir, "metrics.jsonl")
    lines = open(path).read().splitlines()
    lines[2] = lines[2][:9]
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(workdir_lib.WorkdirError, match=r"metrics\.jsonl line 3 is not a metrics record"):
        loop_lib.train_and_evaluate(experiment(), workdir)


@pytest.mark.slow
def test_without_a_usable_checkpoint_a_rerun_is_refused_until_restart_moves_the_earlier_run_aside(finished,
                                                                                                    tmp_path):
    workdir = unfinished_run_with_every_checkpoint_corrupt(finished, tmp_path, "restart")
    with pytest.raises(NoUsableCheckpointError, match="rerun with --restart"):
        loop_lib.train_and_evaluate(experiment(), workdir)
    earlier = open(os.path.join(workdir, "metrics.jsonl")).read()
    with pytest.raises(workdir_lib.WorkdirError, match=r"holds an earlier run \(metrics\.jsonl with .*quarantined "
                                                       r"checkpoint.*rerun with --restart"):
        loop_lib.train_and_evaluate(experiment(), workdir)                # the same command again: refused
    assert open(os.path.join(workdir, "metrics.jsonl")).read() == earlier

    results = loop_lib.train_and_evaluate(experiment(), workdir, restart=True)
    assert results["resumed_from_step"] is None and results["steps"] == STEPS
    [previous] = os.listdir(os.path.join(workdir, "previous"))
    moved = os.path.join(workdir, "previous", previous)
    assert open(os.path.join(moved, "metrics.jsonl")).read() == earlier                  # moved, not deleted
    assert {"tensorboard", "config.json", "checkpoints"} <= set(os.listdir(moved))
    assert os.listdir(os.path.join(moved, "checkpoints", "quarantine"))
    assert [r["step"] for r in read_metrics(workdir)] == [r["step"] for r in read_metrics(finished[0])]  # once each
    assert len([n for n in os.listdir(os.path.join(workdir, "tensorboard")) if n.startswith("events")]) == 1


@pytest.mark.slow
def test_lowering_steps_below_the_run_in_a_workdir_is_refused_leaving_it_untouched(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "shorter")
    before = {name: open(os.path.join(workdir, name)).read() for name in ("results.json", "config.json")}
    with pytest.raises(workdir_lib.WorkdirError, match=rf"trained to step {STEPS}, past train\.steps=4: .*"
                                                       rf"train\.steps >= {STEPS}"):
        loop_lib.train_and_evaluate(experiment(steps=4), workdir)
    assert {name: open(os.path.join(workdir, name)).read() for name in before} == before


@pytest.mark.slow
def test_changing_steps_at_a_resume_says_what_the_learning_rate_becomes(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "schedule")
    loop_lib.train_and_evaluate(experiment(steps=8), workdir)
    optim = config().optim
    peak, end, warmup = optim.learning_rate, optim.end_learning_rate, optim.warmup_steps
    assert optim.schedule == "cosine"
    cosine = lambda t, total: end + (peak - end) * 0.5 * (1 + np.cos(np.pi * (t - warmup) / (total - warmup)))
    assert (f"train.steps {STEPS} → 8: the cosine learning-rate schedule is laid over 8 steps now; step {STEPS + 1} "
            f"runs at {cosine(STEPS, 8):.3g} (with train.steps={STEPS}: {cosine(STEPS, STEPS):.3g})"
            ) in capsys.readouterr().out
    assert read_metrics(workdir)[-2]["learning_rate"] == pytest.approx(cosine(STEPS + 1, 8))   # step 8's rate


@pytest.mark.parametrize("what", ["a file", "under /proc"])
def test_a_workdir_that_cannot_be_a_directory_is_one_clear_error(tmp_path, what):
    workdir = tmp_path / "file" if what == "a file" else "/proc/layerscale_jax_workdir"
    if what == "a file":
        workdir.write_text("not a directory\n")
    expected = "is a file, not a directory" if what == "a file" else "cannot be created (No such file or directory"
    with pytest.raises(workdir_lib.WorkdirError, match=rf"--workdir {workdir} {re.escape(expected)}"):
        loop_lib.train_and_evaluate(experiment(), str(workdir))


@pytest.mark.slow
def test_a_disk_too_full_for_the_state_stops_before_orbax_writes_naming_the_step(tmp_path, monkeypatch):
    from layerscale_jax.storage import checkpoint as checkpoint_lib
    workdir = tmp_path / "full_disk"
    real_statvfs = os.statvfs

    def almost_full(path):
        stat = real_statvfs(path)
        return os.statvfs_result((stat.f_bsize, 1) + tuple(stat)[2:4] + (100,) + tuple(stat)[5:])   # 100 bytes free

    monkeypatch.setattr(checkpoint_lib.os, "statvfs", almost_full)
    with pytest.raises(CheckpointSaveError, match=r"checkpoint of step 2 .*no space left on device: 0\.0 MiB free "
                                                  r"in .*, the state takes about .* MiB\); the last complete "
                                                  r"checkpoint is none"):
        loop_lib.train_and_evaluate(experiment(), str(workdir))
    assert not [name for name in os.listdir(workdir / "checkpoints") if "orbax-checkpoint-tmp" in name]


@pytest.mark.slow
def test_a_failed_async_save_names_its_own_step(tmp_path, monkeypatch):
    """The save of step 2 fails in the background; the error surfaces when step 4's save waits for it."""
    import orbax.checkpoint as ocp
    original_wait, original_save = ocp.CheckpointManager.wait_until_finished, ocp.CheckpointManager.save
    started = []

    def save(self, step, *args, **kwargs):
        started.append(step)
        return original_save(self, step, *args, **kwargs)

    def failing_wait(self):
        original_wait(self)
        if started == [2]:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(ocp.CheckpointManager, "save", save)
    monkeypatch.setattr(ocp.CheckpointManager, "wait_until_finished", failing_wait)
    with pytest.raises(CheckpointSaveError, match="checkpoint of step 2 .*No space left on device.*last complete "
                                                  "checkpoint is none"):
        loop_lib.train_and_evaluate(experiment(), str(tmp_path / "async_step"))


@pytest.mark.slow
def test_a_full_disk_while_logging_stops_the_run_naming_the_step_instead_of_hanging(tmp_path, monkeypatch):
    """A failed write of the metrics log or of TensorBoard's events (written in this thread: tensorboardX's writer
    thread would die and block the run on its queue) stops the run with the cause."""
    from tensorboardX import record_writer
    real_write = record_writer.RecordWriter.write
    written = []

    def fill_up(self, data):
        written.append(data)
        if len(written) > 12:
            raise OSError(28, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(record_writer.RecordWriter, "write", fill_up)
    with pytest.raises(OSError, match=r"writing the metrics of step \d+ in .* failed \(No space left on device\)"):
        loop_lib.train_and_evaluate(experiment(), str(tmp_path / "logging"))


def test_orbax_errors_from_a_failed_background_save_are_logged_on_one_line_each(tmp_path, caplog):
    """A full disk during orbax's async save is logged by each of its threads with a traceback (hundreds of lines
    before the run's own error line); once a Checkpointer exists, each is one line keeping its message."""
    import logging
    import sys
    Checkpointer(str(tmp_path / "checkpoints"), keep=1).close()
    try:
        raise ValueError("RESOURCE_EXHAUSTED: Error writing local file: No space left on device")
    except ValueError:
        exc_info = sys.exc_info()
    absl = logging.getLogger("absl")
    record = absl.makeRecord("absl", logging.ERROR, "/site-packages/orbax/checkpoint/_src/futures/future.py", 1,
                             "[thread=array_type_handler] run() raised an exception:\n%s", (exc_info[1],), exc_info)
    with caplog.at_level("ERROR", logger="absl"):
        absl.handle(record)
    assert caplog.text.strip().splitlines() == [
        "ERROR    absl:future.py:1 [thread=array_type_handler] run() raised an exception: RESOURCE_EXHAUSTED: Error "
        "writing local file: No space left on device"]


@pytest.fixture
def no_failed_save(monkeypatch):
    """A process in which no save has failed yet (``orbax_failures`` keeps that per process)."""
    from layerscale_jax import orbax_failures
    monkeypatch.setattr(orbax_failures, "_save_failed", threading.Event())
    orbax_failures.log_orbax_errors_on_one_line()             # what a Checkpointer installs
    return orbax_failures


def test_orbax_write_tasks_abandoned_by_a_failed_save_do_not_report_after_the_error(no_failed_save, caplog):
    """A disk that fills during an async save: asyncio reports each of orbax's abandoned write tasks ("Task" or
    "_GatheringFuture exception was never retrieved", 85 lines, after the error line). Once a save has failed they
    are dropped; before any failure such a record is kept (on one line)."""
    import logging
    never_retrieved = ("_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished exception="
                       "ValueError('RESOURCE_EXHAUSTED: Error writing \"step/0\" in OCDBT database at local file "
                       "\"/x/2.orbax-checkpoint-tmp/state\"')>")
    asyncio_logger = logging.getLogger("asyncio")
    with caplog.at_level("ERROR", logger="asyncio"):
        asyncio_logger.error(never_retrieved)
        assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()
        no_failed_save.release_waiting_save_threads()                  # the checkpointer saw the save fail
        asyncio_logger.error(never_retrieved)
        asyncio_logger.error(never_retrieved.replace("_GatheringFuture", "Task"))
    assert len(caplog.records) == 1


@pytest.mark.slow
def test_an_interrupt_of_orbaxs_wait_for_a_save_is_not_logged_as_a_failed_save(tmp_path, monkeypatch, caplog):
    """Issue 49 item 5: a second Ctrl-C that interrupts orbax's wait for a save (``fit``'s ``KeyboardInterrupt``; the
    command line's watcher raises none) was logged as ``ERROR:absl:[process=0][thread=MainThread][step=1]
    [wait_until_finished] Save Finalize thread (save_finalize) failed.`` before it went on up. The save itself
    completes; a later wait finds it."""
    from orbax.checkpoint import checkpoint_manager
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    sealed, release = checkpointer._finalized, threading.Event()
    checkpointer._finalized = lambda: (release.wait(60), sealed())       # the save is in flight while orbax waits
    checkpointer.save(1, {"params": {"w": jnp.ones(4)}}, {"next_batch": 0, "offset": 0}, {})

    def interrupted(thread, *args, **kwargs):
        raise KeyboardInterrupt                                             # Ctrl-C: its handler raises here

    join = checkpoint_manager._FinalizeThread.join
    monkeypatch.setattr(checkpoint_manager._FinalizeThread, "join", interrupted)
    with caplog.at_level("ERROR"), pytest.raises(KeyboardInterrupt):
        checkpointer.wait()
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
    monkeypatch.setattr(checkpoint_manager._FinalizeThread, "join", join)
    release.set()
    checkpointer.close()
    assert checkpointer.latest_step() == checkpointer.last_complete == 1


def closed_loop_error():
    """The exception TensorStore meets completing an abandoned write: a callback into a closed event loop."""
    import asyncio
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as err:        # called from TensorStore's C++ thread: no Python frame above asyncio's
        return RuntimeError, err, err.__traceback__.tb_next
    raise AssertionError("a closed loop took a callback")


def test_callbacks_into_the_closed_loop_of_a_failed_save_print_no_traceback(no_failed_save, capsys):
    """65-210 lines of "RuntimeError: Event loop is closed" tracebacks (TensorStore completing writes of a save
    whose event loop had closed on the first error): none, also before orbax has logged the failure (the first
    callback can come first); the same error raised in other code, and any other exception, keeps its traceback."""
    kind, value, traceback = closed_loop_error()
    sys.excepthook(kind, value, traceback)
    assert capsys.readouterr().err == ""                          # before orbax logged the failure: dropped too
    no_failed_save.release_waiting_save_threads()
    sys.excepthook(kind, value, traceback)
    sys.unraisablehook(type("Unraisable", (), {"exc_type": kind, "exc_value": value, "exc_traceback": traceback,
                                               "err_msg": None, "object": None})())
    assert capsys.readouterr().err == ""
    try:
        raise RuntimeError("Event loop is closed")                            # raised here, not in asyncio
    except RuntimeError:
        sys.excepthook(*sys.exc_info())
    assert "Event loop is closed" in capsys.readouterr().err


def _mount_tmpfs(target, kilobytes) -> bool:
    os.makedirs(target, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kilobytes}k", "tmpfs", str(target)],
                          capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("kilobytes", [416, 440, 536])
def test_a_disk_that_fills_during_an_async_save_ends_in_the_error_line_alone(tmp_path, kilobytes):
    """The train command on a tmpfs that fills while orbax writes step 2 in the background (needs mount: root).
    On this machine's 2-core Intel Xeon, with the tiny config saving every step, these sizes filled it where the
    run printed 106 lines with 85 "Task exception was never retrieved" after the error line (416 KiB), 441 lines
    with 210 lines of "Event loop is closed" tracebacks (440 KiB), or 12 "_GatheringFuture exception was never
    retrieved" after the error line (536 KiB); where exactly it fills varies a little between runs (the logs'
    sizes), and a size may also be caught by the check before the save or fill during the first save. Each must end
    with the error line, last, rc 2, no traceback, and the last complete checkpoint it names whole (its seal
    matches)."""
    from layerscale_jax.checksums import corruption
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, kilobytes):
        pytest.skip("mounting a tmpfs needs root")
    try:
        done = subprocess.run([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=12",
                               f"--workdir={disk}/run", "--config.train.checkpoint_every=1"],
                              env=subprocess_env(1), capture_output=True, text=True, timeout=600)
        lines = (done.stdout + done.stderr).strip().splitlines()
        checkpoints = disk / "run" / "checkpoints"
        assert done.returncode == 2, lines[-20:]
        assert lines[-1].startswith("error: saving the checkpoint of step "), lines[-20:]
        assert "no space left on device" in lines[-1].lower()
        noise = [line for line in lines if "Traceback" in line or "Event loop is closed" in line
                 or "never retrieved" in line]
        assert noise == []
        last = re.search(r"the last complete checkpoint is step (\d+)$", lines[-1])
        if last is not None:                               # (a fill during the first save leaves none)
            step = last[1]
            assert corruption(checkpoints / step, checkpoints / "meta" / step / "checksums.json") is None
    finally:
        subprocess.run(["umount", str(disk)], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("side_file", ["checksums.json", "data_process_0.json"])
def test_a_damaged_seal_or_data_state_of_the_newest_step_is_quarantined_not_a_traceback(finished, tmp_path,
                                                                                       side_file, caplog):
    workdir = copy_run(finished, tmp_path, f"damaged_{side_file}")
    os.remove(os.path.join(workdir, "results.json"))
    with open(os.path.join(workdir, "checkpoints", "meta", str(STEPS), side_file), "wb") as f:
        f.write(np.random.default_rng(0).bytes(64))
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(experiment(), workdir)
    assert f"checkpoint at step {STEPS} is corrupt" in caplog.text and results["resumed_from_step"] == 4


@pytest.mark.slow
def test_a_save_that_cannot_create_its_step_directory_stops_without_waiting_for_orbax_threads(tmp_path, monkeypatch,
                                                                                               caplog):
    """The step directory of step 4 cannot be created (a read-only or immutable checkpoints directory): orbax's
    other save threads wait for its "created" signal. They are woken when the run stops, instead of each logging
    "Timeout waiting for key ..." after orbax's barrier timeout (300 s, here 20 s) with the process unable to exit."""
    import threading
    from orbax.checkpoint._src.futures import future as orbax_future
    from orbax.checkpoint._src.path import atomicity
    real_create = atomicity._create_paths

    async def immutable_directory(tmp_paths, *args, **kwargs):
        if any("4.orbax-checkpoint-tmp" in str(p.get()) for p in tmp_paths):
            raise PermissionError(1, "Operation not permitted", str(tmp_paths[0].get()))
        return await real_create(tmp_paths, *args, **kwargs)

    monkeypatch.setattr(atomicity, "_create_paths", immutable_directory)
    monkeypatch.setattr(orbax_future.multihost, "coordination_timeout", lambda: 20)
    with caplog.at_level("ERROR"), pytest.raises(CheckpointSaveError, match=r"step 4 .*Operation not permitted.*"
                                                                            r"last complete checkpoint is step 2"):
        loop_lib.train_and_evaluate(experiment(), str(tmp_path / "immutable"))
    for thread in threading.enumerate():
        if isinstance(thread, orbax_future._SignalingThread):
            thread.join()
    assert "Timeout waiting for key" not in caplog.text
    monkeypatch.undo()                                          # writable again: the rerun resumes
    assert loop_lib.train_and_evaluate(experiment(), str(tmp_path / "immutable"))["resumed_from_step"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("damaged", ["results.json", "config.json"])
def test_a_damaged_results_or_config_file_is_named_with_what_to_do(finished, tmp_path, damaged):
    from layerscale_jax.errors import UserError
    workdir = copy_run(finished, tmp_path, f"damaged_{damaged}")
    with open(os.path.join(workdir, damaged), "w") as f:
        f.write('{"steps": 6, model')
    remedy = ("delete it and rerun: the final checkpoint is evaluated again" if damaged == "results.json" else
              "copy checkpoints/<newest step>/config/metadata over it")
    with pytest.raises(UserError, match=rf"{damaged} is damaged \(Expecting .*\); .*{re.escape(remedy)}"):
        loop_lib.train_and_evaluate(experiment(), workdir)
    if damaged == "results.json":
        os.remove(os.path.join(workdir, damaged))
    else:
        shutil.copy(os.path.join(workdir, "checkpoints", str(STEPS), "config", "metadata"),
                    os.path.join(workdir, damaged))
    assert loop_lib.train_and_evaluate(experiment(), workdir)["test_accuracy"] == finished[1]["test_accuracy"]


@pytest.mark.slow
def test_another_config_with_fewer_steps_on_a_finished_workdir_names_the_differing_fields_first(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "other_and_shorter")
    other = config()
    other.model.depth, other.train.steps = 3, 4
    with pytest.raises(workdir_lib.WorkdirError, match=r"different config \(model\.depth: 2 → 3\)"):
        loop_lib.train_and_evaluate(validate_experiment_config(other), workdir)


@pytest.mark.slow
def test_an_old_checkpoint_whose_deletion_was_interrupted_is_set_aside_once(finished, tmp_path, caplog):
    """A kill while orbax deleted step 4 (kept: 6): its directory lost _CHECKPOINT_METADATA and config/. It is moved
    to quarantine/ with one warning, instead of orbax's "Metadata file does not exist" lines on every run."""
    workdir = copy_run(finished, tmp_path, "half_deleted")
    step_dir = os.path.join(workdir, "checkpoints", "4")
    os.remove(os.path.join(step_dir, "_CHECKPOINT_METADATA"))
    shutil.rmtree(os.path.join(step_dir, "config"))
    with caplog.at_level("WARNING"):
        assert loop_lib.train_and_evaluate(experiment(), workdir) == finished[1]
    assert "Metadata file does not exist" not in caplog.text
    assert [r.getMessage() for r in caplog.records if "incomplete" in r.getMessage()] == [
        f"checkpoint at step 4 is incomplete (no _CHECKPOINT_METADATA: a deletion of this old checkpoint was "
        f"interrupted); moved to {workdir}/checkpoints/quarantine/4"]
    assert checkpoint_steps(workdir) == [STEPS]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "quarantine", "4", "state"))


def no_gfile(monkeypatch):
    """gfile, the slow path, must not be reached; the environment names no proxy or other endpoint."""
    def gfile(self):
        raise AssertionError("gfile was asked")

    monkeypatch.setattr(type(epath.Path("gs://bucket/run")), "exists", gfile)
    for name in (*network.GCS_ENDPOINT_VARIABLES, "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def unreachable_message(cause, via=""):
    return (f"--workdir gs://bucket/run: https://storage.googleapis.com/ cannot be reached{via} ({cause}); check the "
            "network (or HTTPS_PROXY) and the credentials (gcloud auth application-default login), or use a local "
            "--workdir")


@pytest.mark.parametrize("failure", [socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
                                     TimeoutError("timed out"),
                                     ConnectionRefusedError(111, "Connection refused")],
                         ids=["no DNS", "no route (dropped)", "refused"])
def test_an_unreachable_storage_endpoint_stops_a_gs_workdir_before_gfile_retries(failure, monkeypatch):
    """Offline, TensorFlow's gfile retries a failed request ten times with back-off (about 200 s) before its error:
    one bounded request to the endpoint comes first and stops the run in one line (nothing touches the bucket)."""
    attempts = []

    def connect(address, timeout, *args, **kwargs):
        attempts.append((address, timeout))
        raise failure

    no_gfile(monkeypatch)
    monkeypatch.setattr(socket, "create_connection", connect)
    with pytest.raises(workdir_lib.WorkdirError) as raised:
        workdir_lib.create(epath.Path("gs://bucket/run"))
    assert str(raised.value) == unreachable_message(failure.strerror or str(failure))
    assert attempts == [(("storage.googleapis.com", 443), network.CONNECT_TIMEOUT_S)]


def test_a_proxy_that_refuses_the_tunnel_stops_a_gs_workdir_naming_the_proxy(monkeypatch):
    """A proxy (``HTTPS_PROXY``) that answers the CONNECT with an error: gfile's curl would retry it for ~200 s."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def refuse_one_tunnel():
        connection, _ = server.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=refuse_one_tunnel, daemon=True)
    thread.start()
    no_gfile(monkeypatch)
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    with pytest.raises(workdir_lib.WorkdirError) as raised:
        workdir_lib.create(epath.Path("gs://bucket/run"))
    thread.join(10)
    server.close()
    assert str(raised.value) == unreachable_message("Tunnel connection failed: 404 Not Found",
                                                    f" through the proxy http://127.0.0.1:{port}")


@pytest.mark.parametrize("answer", [urllib.error.HTTPError(network.GCS_URL, 400, "Bad Request", None, None),
                                    urllib.error.URLError(ssl.SSLError(1, "CERTIFICATE_VERIFY_FAILED"))],
                         ids=["any HTTP status", "a TLS failure"])
def test_an_endpoint_that_answers_is_reachable(answer, monkeypatch):
    def opened(self, request, timeout):
        raise answer

    monkeypatch.setattr(urllib.request.OpenerDirector, "open", opened)
    for name in network.GCS_ENDPOINT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert network.cloud_storage_problem() is None


@pytest.mark.slow
def test_a_gs_workdir_without_network_is_one_error_line_from_the_cli(tmp_path):
    """The real attempt: without network, a gs:// workdir goes to GCS itself (skipped where GCS answers)."""
    env = dict(subprocess_env(1), HOME=str(tmp_path))
    for name in network.GCS_ENDPOINT_VARIABLES:
        env.pop(name, None)
    if network.cloud_storage_problem() is None:
        pytest.skip("this machine reaches storage.googleapis.com")
    done = subprocess.run([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=3",
                           "--workdir=gs://layerscale-jax-test-bucket/run"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, lines
    assert lines[-1].startswith("error: --workdir gs://layerscale-jax-test-bucket/run: https://storage.googleapis.com/ "
                                "cannot be reached")
    assert "check the network" in lines[-1] and not any("Traceback" in line for line in lines)


def test_a_gs_workdir_that_cannot_be_reached_is_one_clear_error(tmp_path, monkeypatch):
    """No network or no credentials: TensorFlow's gfile raised its own error (a 34-line traceback, rc 1)."""
    class FailedPreconditionError(Exception):                  # what tf.errors raises: not an OSError
        pass

    def unreachable(self):
        raise FailedPreconditionError("Error executing an HTTP request: libcurl code 6 meaning 'Could not resolve "
                                      "hostname'\n\t when reading metadata of gs://bucket/run")

    monkeypatch.setattr(type(epath.Path("gs://bucket/run")), "exists", unreachable)
    monkeypatch.setattr(network, "cloud_storage_problem", lambda: None)      # the endpoint answers, gfile fails
    with pytest.raises(workdir_lib.WorkdirError, match=r"--workdir gs://bucket/run cannot be reached "
                                                       r"\(FailedPreconditionError: .*Could not resolve hostname.*\); "
                                                       r"check the network and the credentials"):
        loop_lib.train_and_evaluate(experiment(), "gs://bucket/run")


def test_the_temporary_directory_of_a_cut_off_save_is_removed_when_the_next_run_starts(tmp_path):
    """Two Ctrl-Cs 0.2 s apart cut a save off: ``checkpoints/121.orbax-checkpoint-tmp`` survived the successful
    rerun. Orbax's own cleanup of unfinished saves runs as the ``Checkpointer`` starts."""
    left = tmp_path / "checkpoints" / "121.orbax-checkpoint-tmp-1765000000" / "state"
    left.mkdir(parents=True)
    (left / "_METADATA").write_text("{")
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    checkpointer.wait()
    assert os.listdir(tmp_path / "checkpoints") == []
    checkpointer.close()
