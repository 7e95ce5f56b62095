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

from layerscale_jax.cli import UserError
from layerscale_jax.data.sources import resolve_data_dir
from layerscale_jax.paths import as_path, write_text_atomically
from layerscale_jax.train import loop as loop_lib

from cloud_bucket import cloud_bucket
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
        results = loop_lib.train_and_evaluate(config(), "gs://bucket/run")
    assert results["resumed_from_step"] == 2 and results["steps"] == STEPS
    assert _without_speed(read_metrics(run)) == _without_speed(read_metrics(reference))
    assert json.loads((run / "results.json").read_text())["test_accuracy"] == results["test_accuracy"]
    assert json.loads((run / "config.json").read_text())["train"]["steps"] == STEPS
    assert not (run / "lock.json").exists()
    assert sorted(int(d.name) for d in (run / "checkpoints").iterdir() if d.name.isdigit()) == [4, 6]
    for step in (4, 6):
        assert (run / "checkpoints" / str(step) / "commit_success.txt").exists()     # orbax's GCS commit
        assert {f.name for f in (run / "checkpoints" / "meta" / str(step)).iterdir()} == {
            "checksums.json", "data_process_0.json", "window.json"}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    logged = set()
    for events in (run / "tensorboard").iterdir():
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        logged |= {event.step for event in accumulator.Scalars("train_loss")}
    assert logged >= set(range(3, STEPS + 1))         # the resumed run's; the killed run's buffer died with it
    assert os.listdir(cwd) == []                          # no local 'gs:' folder


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


def test_an_empty_compilation_cache_dir_leaves_the_cache_off(monkeypatch):
    updates = []
    monkeypatch.setattr(loop_lib.jax.config, "update", lambda name, value: updates.append((name, value)))
    loop_lib.use_compilation_cache("")
    assert updates == []
    loop_lib.use_compilation_cache("~/cache")
    assert updates == [("jax_compilation_cache_dir", os.path.expanduser("~/cache")),
                       ("jax_persistent_cache_min_compile_time_secs", 0.0)]


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
