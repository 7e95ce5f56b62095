"""The compilation cache of a multi-process job: JAX writes entries from process 0 only, so a job of several
processes keeps its cache where they all reach it — ``WORKDIR/xla_cache`` by default, or a shared
``train.compilation_cache_dir`` — and on a restart process 0 loads the train step from it, also from a ``gs://``
bucket (the project's fake bucket, tests/cloud_bucket.py)."""
import os
import socket
import subprocess
import sys

import pytest

from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import DEFAULT_CACHE_DIR

from test_train import ROOT, TINY, subprocess_env

HIT = "Persistent compilation cache hit for 'jit_wrapped'"       # the train step (see tests/test_storage.py)


def test_several_processes_use_the_workdirs_cache_instead_of_a_per_host_default(monkeypatch):
    updates = []
    monkeypatch.setattr(loop_lib.jax.config, "update", lambda name, value: updates.append((name, value)))
    monkeypatch.setattr(loop_lib.jax, "process_count", lambda: 2)
    assert loop_lib.use_compilation_cache(DEFAULT_CACHE_DIR, "gs://bucket/run") == "gs://bucket/run/xla_cache"
    assert updates[0] == ("jax_compilation_cache_dir", "gs://bucket/run/xla_cache")
    assert loop_lib.use_compilation_cache("/shared/xla", "gs://bucket/run") == "/shared/xla"    # as set
    monkeypatch.setattr(loop_lib.jax, "process_count", lambda: 1)
    assert loop_lib.use_compilation_cache(DEFAULT_CACHE_DIR, "gs://bucket/run") == DEFAULT_CACHE_DIR


def two_processes(bucket, *args):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(subprocess_env(2), JAX_LOG_COMPILES="1", LAYERSCALE_JAX_MALLOC="system")
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "cloud_bucket.py"), str(bucket), f"--config={TINY}:steps=4",
         "--workdir=gs://bucket/run", f"--coordinator_address=localhost:{port}", "--num_processes=2",
         f"--process_id={i}", f"--config.train.compilation_cache_dir={DEFAULT_CACHE_DIR}", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    return outputs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_restarted_two_process_job_loads_the_step_from_the_cache_in_its_gs_workdir(tmp_path):
    """Process 0 writes the entries into the bucket and loads the train step from there on the restart. (Process 1
    logs no cache hit in this fake-bucket setup: not established yet whether it reads the shared entries.)"""
    bucket = tmp_path / "bucket"
    first = two_processes(bucket, "--config.train.stop_after_steps=2")
    assert not any(HIT in out for out in first)
    assert "compilation cache: gs://bucket/run/xla_cache, shared by the job's 2 processes" in first[0]
    assert any((bucket / "bucket" / "run" / "xla_cache").iterdir())              # written into the bucket
    second = two_processes(bucket, "--config.train.stop_after_steps=1")
    assert HIT in second[0]
