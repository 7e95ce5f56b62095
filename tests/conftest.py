"""Test session setup, before JAX starts: 8 virtual CPU devices (so sharded layouts can be tested on one CPU) and
a persistent compilation cache, so identical train steps compiled by several tests (and by the subprocesses the
multi-process and preemption tests start, which inherit the environment) are compiled once."""
import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "layerscale_jax_test_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
