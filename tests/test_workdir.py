"""Faults around a workdir, each injected: a finished run re-run, a workdir of another config, corrupt checkpoints,
a failed save, a second job, a killed run's extra metric records, a non-finite update; epath (gs://) workdirs."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from etils import epath

from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train import workdir as workdir_lib
from layerscale_jax.train.checkpoint import Checkpointer, CheckpointSaveError, NoUsableCheckpointError

from test_train import read_metrics, tiny_config, train_losses

STEPS = 6


def config(**train):
    cfg = tiny_config(f"steps={STEPS}")
    cfg.train.checkpoint_every = 2
    cfg.train.update(train)
    return cfg


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("finished"))
    return workdir, loop_lib.train_and_evaluate(config(), workdir)


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


def test_rerunning_a_finished_workdir_returns_its_results_untouched(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "again")
    before = open(os.path.join(workdir, "results.json")).read()
    again = loop_lib.train_and_evaluate(config(), workdir)
    assert open(os.path.join(workdir, "results.json")).read() == before
    assert again == json.loads(before) and again["test_accuracy"] is not None
    assert "holds a finished run of 6 steps" in capsys.readouterr().out


def test_raising_steps_continues_from_the_final_checkpoint(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "longer")
    results = loop_lib.train_and_evaluate(config(steps=8), workdir)
    assert results["resumed_from_step"] == STEPS and results["steps"] == 8
    assert sorted(train_losses(workdir)) == list(range(1, 9))


def test_another_config_in_the_same_workdir_is_refused_naming_the_fields(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "other")
    other = config()
    other.model.depth = 3
    other.optim.learning_rate = 2e-3
    with pytest.raises(workdir_lib.WorkdirError, match=r"model\.depth: 2 → 3; optim\.learning_rate: 0\.001 → 0\.002"):
        loop_lib.train_and_evaluate(other, workdir)
    assert checkpoint_steps(workdir) == checkpoint_steps(finished[0])          # nothing touched


def test_harmless_changes_are_accepted_and_logged(finished, tmp_path, capsys):
    workdir = copy_run(finished, tmp_path, "harmless")
    changed = config(steps=8, log_every=2)
    loop_lib.train_and_evaluate(changed, workdir)
    out = capsys.readouterr().out
    assert "train.log_every: 1 → 2" in out and "train.steps: 6 → 8" in out


@pytest.mark.parametrize("how", ["truncate", "random_bytes"])
def test_a_corrupt_checkpoint_is_quarantined_and_the_run_resumes_from_the_previous(finished, tmp_path, how,
                                                                                   caplog):
    workdir = copy_run(finished, tmp_path, how)
    os.remove(os.path.join(workdir, "results.json"))
    corrupt(workdir, STEPS, how)
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(config(), workdir)
    assert f"checkpoint at step {STEPS} is corrupt" in caplog.text
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "quarantine", str(STEPS)))
    assert results["resumed_from_step"] == 4 and results["steps"] == STEPS        # re-saved step 6, no collision
    assert STEPS in checkpoint_steps(workdir)
    np.testing.assert_allclose([train_losses(workdir)[s] for s in range(1, STEPS + 1)],
                               [train_losses(finished[0])[s] for s in range(1, STEPS + 1)], atol=1e-6)


def test_when_no_checkpoint_is_usable_the_run_stops_and_says_how_to_start_fresh(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "all_corrupt")
    os.remove(os.path.join(workdir, "results.json"))
    for step in checkpoint_steps(workdir):
        corrupt(workdir, step, "random_bytes")
    with pytest.raises(NoUsableCheckpointError, match="use a new --workdir"):
        loop_lib.train_and_evaluate(config(), workdir)


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
        loop_lib.train_and_evaluate(config(), workdir)
    monkeypatch.undo()                                          # space freed: the rerun resumes exactly
    results = loop_lib.train_and_evaluate(config(), workdir)
    assert results["resumed_from_step"] == 2


def test_a_second_job_on_a_held_workdir_is_refused_naming_the_holder(tmp_path):
    workdir = tmp_path / "locked"
    workdir.mkdir()
    (workdir / "lock.json").write_text(json.dumps({"host": "other-host", "pid": 123, "started": "then"}))
    with pytest.raises(workdir_lib.WorkdirError, match="in use by process 123 on host other-host"):
        loop_lib.train_and_evaluate(config(), str(workdir))


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    lock = workdir_lib.WorkdirLock(tmp_path)
    (tmp_path / "lock.json").write_text(json.dumps({"host": os.uname().nodename, "pid": 2**22 + 12345}))
    lock.acquire()
    assert json.loads((tmp_path / "lock.json").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "lock.json").exists()


def test_records_of_a_killed_run_after_its_last_checkpoint_are_not_duplicated(finished, tmp_path):
    workdir = copy_run(finished, tmp_path, "killed")
    os.remove(os.path.join(workdir, "results.json"))
    shutil.rmtree(os.path.join(workdir, "checkpoints", str(STEPS)))        # died before its final save completed
    loop_lib.train_and_evaluate(config(), workdir)
    strip = lambda records: [{k: v for k, v in r.items() if k != "img_per_s"} for r in records]
    assert strip(read_metrics(workdir)) == strip(read_metrics(finished[0]))


def test_cleaning_up_after_a_save_keeps_the_side_files_other_processes_write_for_the_next_step(finished, tmp_path):
    """Process 0 removes the side files of deleted checkpoints while the other processes may already be writing
    their data state for the next step: side files of older, deleted steps are removed, a newer step's are kept."""
    workdir = copy_run(finished, tmp_path, "seal")
    meta = os.path.join(workdir, "checkpoints", "meta")
    for step in (1, STEPS + 2):
        os.makedirs(os.path.join(meta, str(step)))
        with open(os.path.join(meta, str(step), "data_process_1.json"), "w") as f:
            f.write("{}")
    Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)._forget_deleted()
    assert not os.path.exists(os.path.join(meta, "1"))
    assert os.path.exists(os.path.join(meta, str(STEPS + 2), "data_process_1.json"))


def test_a_non_finite_update_never_reaches_the_parameters():
    from layerscale_jax.train.step import init_train_state, make_train_step
    from flax import nnx
    from layerscale_jax.models import create_model
    cfg = tiny_config()
    model = create_model(cfg.model.name, rngs=nnx.Rngs(0), **loop_lib.model_overrides(cfg.model))
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
    """gs:// served from a local folder by etils' mock: the lock, the stored config, the metrics log and the
    checkpoint checksums use epath only (a direct os call would write to a local 'gs:' folder or fail)."""
    from etils.epath import gpath, testing as epath_testing
    monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)     # else gs:// goes to TensorFlow's gfile

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
        lock = workdir_lib.WorkdirLock(workdir)
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
        loop_lib.train_and_evaluate(config(), str(tmp_path / "async"))


# -- the seal: written as part of finishing a step, checked before a step is trusted (issue 22 item 2) -------------

def test_each_step_is_sealed_before_orbax_commits_it(tmp_path, monkeypatch):
    """The seal is written while the step is still orbax's temporary directory, so no committed step lacks one."""
    committed_when_sealed = {}
    original = Checkpointer._seal_in_flight

    def spy(self):
        committed_when_sealed[self._in_flight] = (self.directory / str(self._in_flight)).exists()
        original(self)

    monkeypatch.setattr(Checkpointer, "_seal_in_flight", spy)
    workdir = str(tmp_path / "sealed")
    loop_lib.train_and_evaluate(config(), workdir)
    assert committed_when_sealed == {2: False, 4: False, 6: False}
    for step in checkpoint_steps(workdir):
        seal = os.path.join(workdir, "checkpoints", "meta", str(step), "checksums.json")
        recorded = json.load(open(seal))
        assert "state/manifest.ocdbt" in recorded and "config/metadata" in recorded
        assert Checkpointer(os.path.join(workdir, "checkpoints"), keep=2)._verify(step) is None


@pytest.mark.parametrize("how", ["truncate", "random_bytes", "flipped_bits"])
def test_a_damaged_newest_step_without_its_seal_is_never_trusted(finished, tmp_path, how, caplog):
    """A killed run's newest step whose seal is missing, then damaged: the rerun falls back to the previous sealed
    step with one warning line (no TensorStore traceback, no 'non-finite' dead end) and ends as the original run."""
    workdir = copy_run(finished, tmp_path, f"unsealed_{how}")
    os.remove(os.path.join(workdir, "results.json"))
    os.remove(os.path.join(workdir, "checkpoints", "meta", str(STEPS), "checksums.json"))
    corrupt(workdir, STEPS, how)
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(config(), workdir)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "checkpoint at step" in
                r.getMessage()]
    assert len(warnings) == 1 and f"checkpoint at step {STEPS} cannot be trusted (never sealed" in warnings[0]
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "quarantine", str(STEPS)))
    assert results["resumed_from_step"] == 4 and results["steps"] == STEPS
    assert results["test_accuracy"] == json.load(open(os.path.join(finished[0], "results.json")))["test_accuracy"]


def test_flipped_bits_in_a_sealed_step_are_found_by_its_seal(finished, tmp_path, caplog):
    workdir = copy_run(finished, tmp_path, "sealed_flipped")
    os.remove(os.path.join(workdir, "results.json"))
    corrupt(workdir, STEPS, "flipped_bits")
    with caplog.at_level("WARNING"):
        results = loop_lib.train_and_evaluate(config(), workdir)
    assert f"checkpoint at step {STEPS} is corrupt" in caplog.text and results["resumed_from_step"] == 4


def test_each_process_checks_only_its_share_of_the_files_and_the_shares_cover_every_file(finished, tmp_path):
    from layerscale_jax.checksums import corruption
    workdir = copy_run(finished, tmp_path, "shares")
    step_dir = epath.Path(workdir) / "checkpoints" / str(STEPS)
    seal = epath.Path(workdir) / "checkpoints" / "meta" / str(STEPS) / "checksums.json"
    names = sorted(json.loads(seal.read_text()))
    (step_dir / names[1]).write_bytes(b"changed")                    # the second file: process 1's share of 2
    assert corruption(step_dir, seal, share=(0, 2)) is None
    assert names[1] in corruption(step_dir, seal, share=(1, 2))
    assert names[1] in corruption(step_dir, seal)


def test_checkpoint_files_belong_to_the_process_that_wrote_them():
    from layerscale_jax.train.checkpoint import writer_process
    assert writer_process("state/ocdbt.process_3/d/0a1b") == 3
    assert writer_process("state/array_metadatas/process_12") == 12
    assert writer_process("state/d/0a1b") == writer_process("state/manifest.ocdbt") == 0
    assert writer_process("config/metadata") == writer_process("state/_sharding") == 0
