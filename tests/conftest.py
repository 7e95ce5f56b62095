"""Test session setup, before JAX starts (subprocesses started by tests inherit it):

- 8 virtual CPU devices, so sharded layouts and meshes can be tested on one CPU;
- XLA:CPU without backend optimisation: the tests check semantics (model maths, sharding
  equivalence, exact resume), not XLA's code generation, and this cuts compile time about 3× on small programs;
- a persistent compilation cache, so identical programs compiled by several tests are compiled once.

Also a session fixture, ``six_step_run``: one finished tiny run that several test files read instead of each
training it again.
"""
import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# On a GPU, float32 matmuls default to TF32 (10-bit mantissa): the tests check the maths in float32 on every backend
# (measured on an H200: two fp32 parity tests off by 8e-4 and 1.6e-2 at TF32); benchmarks measure the default.
if os.environ["JAX_PLATFORMS"] != "cpu":
    os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_backend_optimization_level=0").strip()
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "layerscale_jax_test_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402 - after the environment above, which must be set before JAX is imported
from layerscale_jax.train.config import validate_experiment_config


@pytest.fixture(scope="session")
def six_step_run(tmp_path_factory):
    """``(workdir, results)`` of a finished 6-step run of tests/configs/tiny_synthetic.py (8 devices, checkpoints at
    steps 2, 4 and 6), trained once per session: tests/test_workdir.py copies it, tests/test_storage.py compares a
    cloud workdir's logs with it. Tests only read it."""
    from layerscale_jax.train import loop as loop_lib
    from test_train import tiny_config
    config = tiny_config("steps=6")
    config.train.checkpoint_every = 2
    workdir = str(tmp_path_factory.mktemp("six_step_run"))
    return workdir, loop_lib.train_and_evaluate(validate_experiment_config(config), workdir)
