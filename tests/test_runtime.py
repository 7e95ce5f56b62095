"""The entry points' huge-page malloc re-execution (layerscale_jax/runtime.py)."""
import os
import subprocess
import sys

import pytest

from layerscale_jax import runtime


def test_environment_adds_the_tunable_and_keeps_existing_ones():
    env = runtime.huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "PATH": "/bin"})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert env["PATH"] == "/bin"
    assert runtime.huge_page_environment({})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"


def test_nothing_to_do_when_already_set_or_opted_out():
    assert runtime.huge_page_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert runtime.huge_page_environment({runtime.OPT_OUT_VARIABLE: "0"}) is None


@pytest.mark.skipif(not runtime.huge_page_malloc_supported(), reason="needs Linux, glibc >= 2.35 and THP")
def test_a_process_reexecutes_itself_once_with_the_tunable():
    code = ("import os; from layerscale_jax.runtime import reexec_with_huge_page_malloc as r; r(); "
            "print('ran', os.environ['GLIBC_TUNABLES'])")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", runtime.OPT_OUT_VARIABLE)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["ran glibc.malloc.hugetlb=1"]


@pytest.mark.skipif(not runtime.huge_page_malloc_supported(), reason="needs Linux, glibc >= 2.35 and THP")
def test_opting_out_keeps_the_process_as_started():
    code = ("import os; from layerscale_jax.runtime import reexec_with_huge_page_malloc as r; r(); "
            "print('ran', os.environ.get('GLIBC_TUNABLES', ''))")
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env[runtime.OPT_OUT_VARIABLE] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["ran "]


def test_the_train_command_reaches_its_stop_handlers_before_importing_jax():
    """``python -m layerscale_jax.train`` runs the package ``__init__``s first: they must not import jax (seconds),
    so a preemption notice in the first second already finds the handlers (``runtime.stop_signals``)."""
    code = ("import sys, layerscale_jax, layerscale_jax.train, layerscale_jax.runtime\n"
            "assert not [m for m in ('jax', 'flax', 'ml_collections') if m in sys.modules], sorted(sys.modules)\n"
            "from layerscale_jax import create_model\n"
            "from layerscale_jax.train import train_and_evaluate\n"
            "assert 'jax' in sys.modules and callable(create_model) and callable(train_and_evaluate)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
