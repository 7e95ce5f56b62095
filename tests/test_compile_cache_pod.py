"""The compilation cache of a multi-process job: JAX writes entries from process 0 only, so a job of several
processes keeps its cache where they all reach it — ``WORKDIR/xla_cache`` by default, or a shared
``train.compilation_cache_dir`` — and on a restart every process whose cache keys match process 0's (every host of
a pod; on CPU only with ``layerscale_jax.bench.cache_keys``) loads the train step from it, also from a ``gs://``
bucket (the project's fake bucket, tests/cloud_bucket.py)."""
import os
import re
import socket
import subprocess
import sys
import tempfile

import jax
import pytest

from layerscale_jax.storage.compile_cache import DEFAULT_CACHE_DIR, use_compilation_cache

from test_train import ROOT, TINY, subprocess_env

CACHE_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
HIT = "Persistent compilation cache hit for 'jit_wrapped'"       # the train step (see tests/test_storage.py)


@pytest.fixture
def jax_cache_settings():
    """JAX's compilation-cache settings as the test leaves them, then restored."""
    before = {n: getattr(jax.config, n) for n in CACHE_SETTINGS}
    yield
    for name, value in before.items():
        jax.config.update(name, value)


def test_several_processes_use_the_workdirs_cache_instead_of_a_per_host_default(monkeypatch, jax_cache_settings):
    cache_dir = lambda: jax.config.jax_compilation_cache_dir                      # noqa: E731
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert use_compilation_cache(DEFAULT_CACHE_DIR, "gs://bucket/run") == "gs://bucket/run/xla_cache"
    assert cache_dir() == "gs://bucket/run/xla_cache"
    assert use_compilation_cache("/shared/xla", "gs://bucket/run") == "/shared/xla" == cache_dir()  # as set
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    assert use_compilation_cache(DEFAULT_CACHE_DIR, "gs://bucket/run") == DEFAULT_CACHE_DIR
    assert cache_dir() == os.path.expanduser(DEFAULT_CACHE_DIR)


def two_processes(bucket, *args, env=()):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    # 5 steps, each job stopped after 2 or 1 (at 2, 3, 4): none finishes, so none compiles and runs the final evaluation
    env = dict(subprocess_env(2), JAX_LOG_COMPILES="1", LAYERSCALE_JAX_MALLOC="system", **dict(env))
    logs = [tempfile.TemporaryFile("w+") for _ in range(2)]       # not pipes: a full one would stall a process
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "cloud_bucket.py"), str(bucket), f"--config={TINY}:steps=5",
         "--workdir=gs://bucket/run", f"--coordinator_address=localhost:{port}", "--num_processes=2",
         f"--process_id={i}", f"--config.train.compilation_cache_dir={DEFAULT_CACHE_DIR}", *args],
        env=env, stdout=log, stderr=subprocess.STDOUT, text=True) for i, log in enumerate(logs)]
    codes = [p.wait(timeout=600) for p in procs]
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    assert codes == [0, 0], "\n\n".join(o[-3000:] for o in outputs)
    return outputs


def train_step_key_components(output: str) -> dict:
    """The hash of each component of the train step's cache key, from JAX's debug log of ``jax._src.cache_key``
    (it logs them before the compiler logs the key's hit or miss)."""
    components = {}
    for line in output.splitlines():
        found = re.search(r"get_cache_key hash of serialized (.+?): ([0-9a-f]+)$", line.strip())
        if found:
            components[found[1]] = found[2]
        elif "cache hit for 'jit_wrapped'" in line or "CACHE MISS for 'jit_wrapped'" in line:
            return components
        elif re.search(r"(cache hit|CACHE MISS) for '", line):
            components = {}
    raise AssertionError("no cache lookup of the train step in the log")


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_restarted_two_process_job_loads_the_step_from_the_cache_in_its_gs_workdir(tmp_path):
    """Process 0 writes the entries into the bucket; on the restart every process whose cache keys match process
    0's loads the train step from there. With pod-like keys (``--pod_cache_keys``: JAX's key without the process
    index, as every host of a TPU slice computes it) both processes hit. With JAX's own keys on CPU, process 1 looks
    the step up in the shared cache too, but its key differs from process 0's in exactly one component,
    ``accelerator_config`` (XLA's CPU topology lists only the calling process's devices, with its process index),
    so it never finds process 0's entries (``layerscale_jax.bench.cache_keys``)."""
    bucket = tmp_path / "bucket"
    first = two_processes(bucket, "--config.train.stop_after_steps=2", "--pod_cache_keys")
    assert not any(HIT in out for out in first)
    assert "compilation cache: gs://bucket/run/xla_cache, shared by the job's 2 processes" in first[0]
    assert any((bucket / "bucket" / "run" / "xla_cache").iterdir())              # written into the bucket
    second = two_processes(bucket, "--config.train.stop_after_steps=1", "--pod_cache_keys")
    assert HIT in second[0] and HIT in second[1]

    third = two_processes(bucket, "--config.train.stop_after_steps=1", env={
        "JAX_DEBUG_LOG_MODULES": "jax._src.cache_key", "JAX_EXPLAIN_CACHE_MISSES": "1"})
    assert "PERSISTENT COMPILATION CACHE MISS for 'jit_wrapped'" in third[1]    # looked up, not found
    keys = [train_step_key_components(out) for out in third]
    assert set(keys[0]) == set(keys[1]) and "accelerator_config" in keys[0]
    assert [name for name in keys[0] if keys[0][name] != keys[1][name]] == ["accelerator_config"]
