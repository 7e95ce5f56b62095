"""The entry points' re-execution with a malloc that keeps XLA's buffers (layerscale_jax/runtime/malloc.py)."""
import os
import subprocess
import sys

import pytest

from layerscale_jax.runtime import malloc

LIB = "libtcmalloc_minimal.so.4"


def test_auto_prefers_tcmalloc_and_keeps_what_is_preloaded_already():
    env = malloc.malloc_environment({"LD_PRELOAD": "libfoo.so", "PATH": "/bin"}, LIB, huge_pages=True)
    assert env["LD_PRELOAD"] == f"{LIB} libfoo.so" and env["PATH"] == "/bin" and "GLIBC_TUNABLES" not in env
    assert malloc.malloc_environment({}, LIB, huge_pages=False)["LD_PRELOAD"] == LIB


def test_huge_pages_without_tcmalloc_or_when_asked_keep_existing_tunables():
    env = malloc.malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, None, huge_pages=True)
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    asked = malloc.malloc_environment({malloc.MALLOC_VARIABLE: "hugepages"}, LIB, huge_pages=True)
    assert asked["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and "LD_PRELOAD" not in asked


def test_nothing_to_do_when_chosen_already_opted_out_or_unavailable():
    assert malloc.malloc_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, LIB, True) is None
    assert malloc.malloc_environment({"LD_PRELOAD": f"/usr/lib/{LIB}"}, LIB, True) is None
    assert malloc.malloc_environment({malloc.MALLOC_VARIABLE: "system"}, LIB, True) is None
    assert malloc.malloc_environment({}, None, huge_pages=False) is None


def test_a_bad_choice_is_one_error_line_naming_the_variable_and_value():
    env = dict(os.environ, **{malloc.MALLOC_VARIABLE: "jemalloc"})
    code = "from layerscale_jax.runtime import reexec_with_fast_malloc as r; r(); print('ran')"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip() == "error: LAYERSCALE_JAX_MALLOC='jemalloc': expected one of auto, hugepages, system"


def _started_with(choice: str | None) -> list[str]:
    """What a process that calls ``reexec_with_fast_malloc`` first sees, started without any allocator setting."""
    code = ("import os; from layerscale_jax.runtime import reexec_with_fast_malloc as r; r(); "
            "print(os.environ.get('LD_PRELOAD', ''), os.environ.get('GLIBC_TUNABLES', ''), sep='|'); "
            "print(sum('tcmalloc' in line for line in open('/proc/self/maps')) > 0)")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "LD_PRELOAD", malloc.MALLOC_VARIABLE)}
    if choice:
        env[malloc.MALLOC_VARIABLE] = choice
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.splitlines()


@pytest.mark.skipif(malloc.tcmalloc_library() is None, reason="needs TCMalloc (libtcmalloc-minimal4)")
def test_a_process_reexecutes_itself_once_with_tcmalloc_loaded():
    assert _started_with(None) == [f"{malloc.tcmalloc_library()}|", "True"]


@pytest.mark.skipif(not malloc.huge_page_malloc_supported(), reason="needs Linux, glibc >= 2.35 and THP")
def test_a_process_reexecutes_itself_once_with_the_tunable():
    assert _started_with("hugepages") == ["|glibc.malloc.hugetlb=1", "False"]


def test_system_keeps_the_process_as_started():
    assert _started_with("system") == ["|", "False"]


@pytest.mark.slow
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
