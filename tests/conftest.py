"""Test session setup, before JAX starts (subprocesses started by tests inherit it):

- 8 virtual CPU devices, so sharded layouts and meshes can be tested on one CPU;
- XLA:CPU without backend optimisation: the tests check semantics (model maths, sharding
  equivalence, exact resume), not XLA's code generation, and this cuts compile time about 3× on small programs;
- a persistent compilation cache, so identical programs compiled by several tests are compiled once.
"""
import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_backend_optimization_level=0").strip()
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "layerscale_jax_test_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
