"""Process start-up for the command-line entry points: huge pages for XLA's CPU buffers.

XLA's CPU runtime allocates a step's temporary buffers afresh at every step (about 2 GB for a DeiT III-S/16 train
step at batch 16) and glibc hands such large blocks back to the kernel when they are freed, so each step
page-faults its whole working set in again, 4 KiB at a time. glibc's ``glibc.malloc.hugetlb=1`` tunable makes malloc
ask for transparent huge pages (2 MiB) for those blocks, which cuts the faults ~300-fold and the kernel time with
them (``python -m layerscale_jax.bench page_faults`` measures both settings side by side).

glibc reads tunables only when a process starts, so ``python -m layerscale_jax.train`` and
``python -m layerscale_jax.bench`` re-execute themselves once, with the tunable added to ``GLIBC_TUNABLES``, before
anything else runs. Set ``LAYERSCALE_JAX_HUGEPAGES=0`` to keep the process as started.
"""
from __future__ import annotations

import os
import platform
import sys

OPT_OUT_VARIABLE = "LAYERSCALE_JAX_HUGEPAGES"
TUNABLE = "glibc.malloc.hugetlb=1"
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


def huge_page_environment(environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-execute with, or None when there is nothing to do (already set, opted out)."""
    if environ.get(OPT_OUT_VARIABLE, "1") == "0":
        return None
    tunables = environ.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb" in tunables:
        return None
    return dict(environ, GLIBC_TUNABLES=":".join(t for t in (tunables, TUNABLE) if t))


def reexec_with_huge_page_malloc() -> None:
    """Replace this process by the same command with ``glibc.malloc.hugetlb=1`` (once; see the module docstring)."""
    env = huge_page_environment(dict(os.environ))
    if env is None or not huge_page_malloc_supported():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
