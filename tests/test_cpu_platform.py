"""A CPU run's stderr without libtpu's lines: on a machine without accelerators every entry point sets
``JAX_PLATFORMS=cpu`` unless it is set (``layerscale_jax/cli.py``), so JAX does not start the TPU plugin that the
``[tpu]`` extra installs (it is still there for ``--compile_for``: tests/test_compile_for.py)."""
import importlib.util
import os
import subprocess
import sys

import pytest

from layerscale_jax import cli as cli_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "configs", "tiny_synthetic.py")


def _libtpu_installed() -> bool:
    return importlib.util.find_spec("libtpu") is not None


@pytest.mark.slow
@pytest.mark.skipif(not _libtpu_installed() or not cli_lib.no_accelerator_here(),
                    reason="needs libtpu installed (the [tpu] extra) on a machine without accelerators")
def test_a_cpu_run_prints_no_libtpu_lines(tmp_path):
    """Issue 49: five lines from libtpu on every CPU command once the [tpu] extra is installed (``E0000 ...
    unexpected worker hostname``, ``libtpu_init_utils.cc:370``, "Failed to find host bounds"). The run's
    environment has no JAX_PLATFORMS, as a user's; ``ALLOW_MULTIPLE_LIBTPU_LOAD`` lets libtpu past its lockfile,
    which another process on a shared machine may hold, to the lines it prints."""
    environ = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    environ.update(ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_NUM_CPU_DEVICES="1", LAYERSCALE_JAX_MALLOC="system",
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=4",
                           f"--workdir={tmp_path / 'run'}"], env=environ, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    noise = [line for line in done.stderr.splitlines() if "tpu" in line.lower() or line.startswith(("E0000", "W0000"))]
    assert noise == [], done.stderr


def test_jax_platforms_is_left_alone_when_set_or_when_jax_runs_already():
    environ = {"JAX_PLATFORMS": "tpu"}
    assert not cli_lib.use_cpu_without_accelerator(environ) and environ == {"JAX_PLATFORMS": "tpu"}
    import jax  # noqa: F401 - running already: too late to choose
    environ = {}
    assert not cli_lib.use_cpu_without_accelerator(environ) and environ == {}
