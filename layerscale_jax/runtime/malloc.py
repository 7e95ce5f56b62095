"""A malloc that keeps XLA's CPU buffers, chosen when an entry point starts.

XLA's CPU runtime allocates a step's temporary buffers afresh at every step (about 2 GB for a DeiT III-S/16 train
step at batch 16; 300 MB for the depth-96 ablation model) and glibc hands such large blocks back to the kernel when
they are freed (above 32 MiB it always ``mmap``s them), so each step page-faults its whole working set in again,
4 KiB at a time. Two remedies, both leaving every number the step computes unchanged:

- **TCMalloc** (gperftools' ``libtcmalloc_minimal.so.4``; Debian/Ubuntu package ``libtcmalloc-minimal4``) keeps
  freed spans for reuse: no page faults left in a step, and no kernel time for them;
- glibc's ``glibc.malloc.hugetlb=1`` tunable makes malloc ask for transparent huge pages (2 MiB): 100- to 370-fold
  fewer faults, but every step still zeroes its buffers' fresh pages.

``python -m layerscale_jax.bench page_faults`` measures the three side by side (docs/performance.md, "Allocator",
has the speed-ups per machine kind).

An allocator is chosen when a process starts (``LD_PRELOAD``, ``GLIBC_TUNABLES``), so the entry points
(``python -m layerscale_jax.train``, ``python -m layerscale_jax.bench``, the experiment drivers) re-execute
themselves once, before anything else runs, with ``LAYERSCALE_JAX_MALLOC``'s choice:

- ``auto`` (default): TCMalloc where the system has it, else glibc's huge pages where supported (Linux, glibc ≥
  2.35, transparent huge pages not ``never``);
- ``hugepages``: glibc's huge pages even where TCMalloc is installed;
- ``system``: the process as started.
"""
from __future__ import annotations

import ctypes.util
import os
import platform
import sys

from layerscale_jax.errors import ConfigError

MALLOC_VARIABLE = "LAYERSCALE_JAX_MALLOC"
MALLOC_CHOICES = ("auto", "hugepages", "system")
TUNABLE = "glibc.malloc.hugetlb=1"
TCMALLOC = "tcmalloc_minimal"          # gperftools' TCMalloc without the heap profiler: libtcmalloc_minimal.so.4
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_page_malloc_supported() -> bool:
    """Linux with glibc ≥ 2.35 (the first with ``glibc.malloc.hugetlb``) and transparent huge pages not ``never``."""
    if sys.platform != "linux":
        return False
    lib, version = platform.libc_ver()
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    if lib != "glibc" or (major, minor) < (2, 35):
        return False
    try:
        with open(_THP_SETTING) as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def tcmalloc_library() -> str | None:
    """The soname of the system's TCMalloc (``libtcmalloc_minimal.so.4``) as the dynamic loader finds it, or None."""
    return ctypes.util.find_library(TCMALLOC) if sys.platform == "linux" else None


def malloc_environment(environ: dict[str, str], tcmalloc: str | None, huge_pages: bool) -> dict[str, str] | None:
    """The environment to re-execute with for ``environ[LAYERSCALE_JAX_MALLOC]``'s choice, given what the system
    offers (``tcmalloc``: its library or None; ``huge_pages``: glibc's tunable works), or None when there is
    nothing to do: ``system``, already chosen (TCMalloc preloaded or the tunable set), or nothing available."""
    choice = environ.get(MALLOC_VARIABLE, "auto")
    if choice not in MALLOC_CHOICES:
        raise ConfigError(f"{MALLOC_VARIABLE}={choice!r}: expected one of {', '.join(MALLOC_CHOICES)}")
    preload = environ.get("LD_PRELOAD", "")
    tunables = environ.get("GLIBC_TUNABLES", "")
    if choice == "system" or "tcmalloc" in preload or "glibc.malloc.hugetlb" in tunables:
        return None
    if choice == "auto" and tcmalloc:
        return dict(environ, LD_PRELOAD=" ".join(p for p in (tcmalloc, preload) if p))
    if huge_pages:
        return dict(environ, GLIBC_TUNABLES=":".join(t for t in (tunables, TUNABLE) if t))
    return None


def malloc_in_use(environ: dict[str, str] | None = None) -> str:
    """The malloc this process started with, for records and benchmarks: ``tcmalloc``, ``glibc huge pages`` or
    ``glibc``."""
    environ = os.environ if environ is None else environ
    if "tcmalloc" in environ.get("LD_PRELOAD", ""):
        return "tcmalloc"
    return "glibc huge pages" if TUNABLE in environ.get("GLIBC_TUNABLES", "") else "glibc"


def reexec_with_fast_malloc() -> None:
    """Replace this process by the same command with the allocator ``LAYERSCALE_JAX_MALLOC`` chooses (once; see the
    module docstring). A bad choice ends the process with one ``error:`` line (exit status 2)."""
    try:
        env = malloc_environment(dict(os.environ), tcmalloc_library(), huge_page_malloc_supported())
    except ValueError as e:
        sys.exit(f"error: {e}")
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
