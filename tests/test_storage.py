"""Paths as users write them (local, ``~``, relative, ``file://``, ``gs://``; anything else refused in one line), a
cloud workdir through train → kill -9 → resume (``gs://`` served from a local folder, ``tests/cloud_bucket.py``), and
the persistent compilation cache."""
import json
import os
import signal
import subprocess
import sys

import pytest
from etils import epath

from layerscale_jax.errors import UserError
from layerscale_jax.data.sources import resolve_data_dir
from layerscale_jax.paths import as_path, write_text_atomically
from layerscale_jax.storage.compile_cache import use_compilation_cache
from layerscale_jax.train import goodput as goodput_lib
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config

from cloud_bucket import cloud_bucket
from test_compile_cache_pod import jax_cache_settings  # noqa: F401 - a fixture
from test_train import ROOT, TINY, read_metrics, subprocess_env, tiny_config

STEPS = 6


def config():
    cfg = tiny_config(f"steps={STEPS}")
    cfg.train.checkpoint_every = 2
    return cfg


@pytest.mark.parametrize("written, meant", [
    ("~/runs/x", os.path.expanduser("~/runs/x")),
    ("runs/x", os.path.join(os.getcwd(), "runs/x")),
    ("file:///tmp/runs/x", "/tmp/runs/x"),
    ("file://~/runs/x", os.path.expanduser("~/runs/x")),
    ("gs://bucket/runs/x", "gs://bucket/runs/x"),
])
def test_paths_are_read_as_users_write_them(written, meant):
    assert os.fspath(as_path(written)) == meant


@pytest.mark.parametrize("field, value", [("--workdir", "memory://runs/x"), ("data.data_dir", "s3://bucket/tfds")])
def test_an_unsupported_scheme_is_one_error_naming_the_field_and_the_value(field, value):
    with pytest.raises(UserError, match=rf"^{field}='{value}': the scheme '{value.split(':')[0]}://' is not supported"):
        as_path(value, field)


def test_a_cloud_data_dir_stays_a_url_and_a_local_one_is_expanded():
    assert resolve_data_dir("gs://bucket/tensorflow_datasets") == "gs://bucket/tensorflow_datasets"
    assert resolve_data_dir("file://~/tensorflow_datasets") == os.path.expanduser("~/tensorflow_datasets")


@pytest.mark.slow
def test_the_cli_refuses_an_unsupported_workdir_scheme_before_jax_starts():
    proc = subprocess.run([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}",
                           "--workdir=memory://runs/x"], env=subprocess_env(1), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --workdir='memory://runs/x': the scheme 'memory://' is not supported; use a local path, "
        "file://PATH or gs://BUCKET/PATH"]


def _without_speed(records):
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "input_wait_ms")} for r in records]


@pytest.mark.slow
def test_a_gs_workdir_survives_kill_and_resume_with_every_file_in_the_bucket(six_step_run, tmp_path, monkeypatch):
    """Killed (SIGKILL) when it asks for step 4's save, then rerun: every file the run writes itself is in the
    bucket (checkpoints through orbax and TensorStore, their seals and side files, config.json, metrics.jsonl,
    TensorBoard event files, results.json, the lock while it runs), none on the local disk, and the resumed run
    logs exactly what an uninterrupted local run logs."""
    reference, _ = six_step_run                           # an uninterrupted local run of config() (conftest.py)
    bucket, cwd = tmp_path / "bucket", tmp_path / "cwd"
    cwd.mkdir()
    run = bucket / "bucket" / "run"
    killed = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "cloud_bucket.py"), str(bucket), "--kill_at_save=4",
         f"--config={TINY}:steps={STEPS}", "--workdir=gs://bucket/run", "--config.train.checkpoint_every=2"],
        env=subprocess_env(), cwd=cwd, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert (run / "lock.json").exists() and (run / "checkpoints" / "2" / "commit_success.txt").exists()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4]

    monkeypatch.chdir(cwd)
    with cloud_bucket(bucket):
        results = loop_lib.train_and_evaluate(validate_experiment_config(config()), "gs://bucket/run")
    assert results["resumed_from_step"] == 2 and results["steps"] == STEPS
    assert _without_speed(read_metrics(run)) == _without_speed(read_metrics(reference))
    assert json.loads((run / "results.json").read_text())["test_accuracy"] == results["test_accuracy"]
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == STEPS
    assert not (run / "lock.json").exists()
    assert sorted(int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit()) == [4, 6]
    for step in (4, 6):
        assert (run / "checkpoints" / str(step) / "commit_success.txt").exists()     # orbax's GCS commit
        assert {f.name for f in (run / "checkpoints" / "meta" / str(step)).iterdir()} == {
            "checksums.json", "data_process_0.json", "log.json", "window.json"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logged = set()
    for events in (run / "tensorboard").glob("events*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        logged |= {event.step for event in accumulator.Scalars("train_loss")}
    assert logged >= set(range(3, STEPS + 1))         # the resumed run's; the killed run's buffer died with it
    assert os.listdir(cwd) == []                          # no local 'gs:' folder
    attempts = goodput_lib.read_attempts(run / "goodput.jsonl")          # the goodput account is in the bucket too
    assert [(a["attempt"], a["final"]) for a in attempts] == [(1, False), (2, True)]      # the killed one unfinished


@pytest.mark.slow
def test_a_restart_loads_its_programs_from_the_compilation_cache(tmp_path):
    """Stopped after 2 steps, then resumed in a fresh process for a third: the train step is loaded from the cache
    (its program is named 'wrapped', after the activation-sharding wrapper around the step function). The resumed
    process stops as well, so neither compiles the evaluation."""
    cache = tmp_path / "xla"
    command = [sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=4",
               f"--workdir={tmp_path / 'run'}", f"--config.train.compilation_cache_dir=file://{cache}"]
    env = dict(subprocess_env(1), JAX_LOG_COMPILES="1")         # cache hits are logged at WARNING then
    first = subprocess.run([*command, "--config.train.stop_after_steps=2"], env=env, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Persistent compilation cache hit for 'jit_wrapped'" not in first.stderr
    assert any(cache.iterdir())
    second = subprocess.run([*command, "--config.train.stop_after_steps=1"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Persistent compilation cache hit for 'jit_wrapped'" in second.stderr


@pytest.mark.usefixtures("jax_cache_settings")
def test_an_empty_compilation_cache_dir_leaves_the_cache_off(monkeypatch, tmp_path):
    config = loop_lib.jax.config
    config.update("jax_compilation_cache_dir", None)
    assert use_compilation_cache("") == "" and config.jax_compilation_cache_dir is None
    monkeypatch.setenv("HOME", str(tmp_path))
    use_compilation_cache("~/cache")                           # every program cached, however fast it compiled
    assert config.jax_compilation_cache_dir == str(tmp_path / "cache")
    assert config.jax_persistent_cache_min_compile_time_secs == 0.0


def test_gs_paths_stay_epath_urls():
    assert isinstance(as_path("gs://bucket/x"), epath.Path) and str(as_path("gs://bucket/x") / "y") == "gs://bucket/x/y"


def test_a_json_file_of_a_run_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """results.json, config.json, metrics.jsonl's truncation and the checkpoints' side files go through
    ``write_text_atomically``: a job killed while writing one leaves the previous file intact."""
    path = epath.Path(tmp_path) / "results.json"
    write_text_atomically(path, '{"steps": 1}')
    assert json.loads(path.read_text()) == {"steps": 1} and sorted(os.listdir(tmp_path)) == ["results.json"]

    def killed_midway(self, text, *args, **kwargs):
        with open(self, "w") as f:
            f.write(text[: len(text) // 2])              # the first half reached the disk, then the job died
        raise KeyboardInterrupt

    monkeypatch.setattr(type(path), "write_text", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomically(path, '{"steps": 2, "test_accuracy": 0.9}')
    assert json.loads(open(path).read()) == {"steps": 1}


# -- object-store semantics (tests/cloud_bucket.py's FakeBucket): no append, no rename, a write rate per object ----

def test_the_fake_bucket_keeps_gcs_semantics(tmp_path):
    """What the storage tests rely on: an append rewrites the whole object, an upload that fails publishes nothing,
    a directory renames object by object (a kill leaves it half done), an object written too often is refused."""
    from cloud_bucket import Killed
    with cloud_bucket(tmp_path, burst=3) as bucket:
        log = epath.Path("gs://b/log")
        log.write_text("a\n")
        with log.open("a") as f:
            f.write("b\n")
        assert log.read_text() == "a\nb\n" and bucket.writes["gs://b/log"] == 2
        with pytest.raises(RuntimeError), log.open("w") as f:
            f.write("torn")
            raise RuntimeError("the writer died")
        assert log.read_text() == "a\nb\n"
        with pytest.raises(OSError, match="429 Too Many Requests: the object gs://b/log"):
            log.write_text("c\n")
            log.write_text("d\n")
        for name in ("x", "y", "z"):
            (epath.Path("gs://b/dir") / name).write_text(name)
        bucket.kill_after(3)                      # copy x, delete x, copy y: then the job dies
        with pytest.raises(Killed):
            epath.Path("gs://b/dir").rename("gs://b/moved")
        assert sorted(os.listdir(tmp_path / "b" / "dir")) == ["y", "z"]
        assert sorted(os.listdir(tmp_path / "b" / "moved")) == ["x", "y"]


def test_metrics_on_a_bucket_are_buffered_and_written_as_whole_objects_within_the_write_rate(tmp_path):
    """100 records logged in a tight loop: none is written by the loop thread, each flush writes the whole log as
    one object (the fake refuses more than a burst of writes to one object), and every record is in it."""
    from layerscale_jax.train.metrics import MetricsWriter
    with cloud_bucket(tmp_path) as bucket:
        writer = MetricsWriter("gs://bucket/run", total_steps=100)
        for step in range(1, 101):
            writer.write(step, {"train_loss": 1.0 / step})
        assert bucket.writes["gs://bucket/run/metrics.jsonl"] == 0
        writer.flush()
        writer.write(101, {"train_loss": 0.0})
        writer.close()
        assert bucket.writes["gs://bucket/run/metrics.jsonl"] == 2
    assert [r["step"] for r in read_metrics(tmp_path / "bucket" / "run")] == list(range(1, 102))


@pytest.mark.slow
def test_a_stop_on_sigterm_loses_no_metrics_on_a_bucket(tmp_path, monkeypatch):
    """SIGTERM at step 3 of a run that checkpoints only at its end: the stop path flushes the buffered records
    before its checkpoint, so the log holds steps 1-3."""
    from layerscale_jax.train.metrics import MetricsWriter
    original = MetricsWriter.write

    def write(self, step, scalars):
        original(self, step, scalars)
        if step == 3:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(MetricsWriter, "write", write)
    cfg = config()
    cfg.train.checkpoint_every = 0
    monkeypatch.chdir(tmp_path)
    with cloud_bucket(tmp_path / "bucket"):
        experiment = validate_experiment_config(cfg)
        assert loop_lib.train_and_evaluate(experiment, "gs://bucket/run") == {"preempted_at_step": 3}
    run = tmp_path / "bucket" / "bucket" / "run"
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    assert (run / "checkpoints" / "3" / "commit_success.txt").exists()


def _fill(root: epath.Path, names) -> dict:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"content of {name}")
    return {name: f"content of {name}" for name in names}


def _files(local_root) -> dict:
    return {os.path.relpath(os.path.join(d, f), local_root): open(os.path.join(d, f)).read()
            for d, _, files in os.walk(local_root) for f in files}


RUN_FILES = ("checkpoints/2/state/a", "checkpoints/2/state/b", "checkpoints/meta/2/window.json", "config.json",
             "metrics.jsonl", "tensorboard/events.1")


@pytest.mark.parametrize("killed_after", range(0, 2 * len(RUN_FILES) + 1, 1))
def test_a_restart_killed_midway_on_a_bucket_is_finished_by_the_next_start(tmp_path, killed_after):
    """``--restart`` moves the earlier run object by object (copy, delete): killed after any number of object
    operations, the next start finishes the move, and every file is in previous/<time>/ once, intact."""
    from cloud_bucket import Killed

    from layerscale_jax.storage import workdir as workdir_lib
    with cloud_bucket(tmp_path) as bucket:
        workdir = epath.Path("gs://bucket/run")
        expected = _fill(workdir, RUN_FILES)
        (workdir / "lock.json").write_text("{}")
        bucket.kill_after(killed_after)
        try:
            target = workdir_lib.move_aside(workdir)
            bucket.kill_after(None)
        except Killed:
            target = workdir_lib.finish_restart(workdir)       # what the next start does first
        assert workdir_lib.finish_restart(workdir) is None
    local = tmp_path / "bucket" / "run"
    if target is None:                            # killed before its journal was written: nothing has moved
        assert killed_after == 0 and _files(local) == {**expected, "lock.json": "{}"}
        return
    assert sorted(os.listdir(local)) == ["lock.json", "previous"]
    assert _files(local / "previous") == {f"{target.name}/{name}": text for name, text in expected.items()}


@pytest.mark.parametrize("killed_after", [0, 1, 2, 3, 5])
def test_a_quarantine_killed_midway_on_a_bucket_is_finished_by_the_next_start(tmp_path, killed_after, caplog):
    """A step quarantined on a bucket moves object by object; killed midway, the next Checkpointer finishes the
    move before orbax lists the steps, so the half-moved step is never seen as a checkpoint."""
    from cloud_bucket import Killed

    from layerscale_jax.storage.checkpoint import Checkpointer
    with cloud_bucket(tmp_path) as bucket:
        root = epath.Path("gs://bucket/run/checkpoints")
        expected = _fill(root, ["4/state/a", "4/state/b", "4/commit_success.txt", "meta/4/checksums.json"])
        checkpointer = Checkpointer(root, keep=2)
        bucket.kill_after(killed_after)
        with pytest.raises(Killed):
            checkpointer._quarantine(4, "never sealed")
        bucket.kill_after(None)
        checkpointer.manager.close()
        with caplog.at_level("WARNING"):
            again = Checkpointer(root, keep=2)
        again.close()
    local = tmp_path / "bucket" / "run" / "checkpoints"
    if killed_after == 0:                         # killed before its journal: the step is where it was, checked again
        assert again.manager.all_steps() == [4] and _files(local / "4") == {
            name[2:]: text for name, text in expected.items() if name.startswith("4/")}
        return
    assert again.manager.all_steps() == [] and "a quarantine) was interrupted; finished now" in caplog.text
    assert _files(local / "quarantine" / "4") == {
        name.replace("4/", "", 1).replace("meta/4/", "meta/"): text for name, text in expected.items()}
    assert not (local / "4").exists() and not (local / "meta" / "4").exists()


def test_a_run_stored_before_the_read_plan_existed_resumes_with_it_off():
    """A config stored without data.read_block / read_window ran with a uniform permutation: resuming it with the
    defaults (plan off) is no change; with the plan on it is refused (another order of the records)."""
    from layerscale_jax.storage.workdir import config_changes
    stored = {"data": {"name": "digits"}}
    assert config_changes(stored, {"data": {"name": "digits", "read_block": 0, "read_window": 16}}) == ([], [])
    refused, _ = config_changes(stored, {"data": {"name": "digits", "read_block": 256, "read_window": 16}})
    assert refused == ["data.read_block: 0 → 256"]
