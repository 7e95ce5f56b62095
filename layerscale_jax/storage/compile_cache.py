"""JAX's persistent compilation cache for a run (``train.compilation_cache_dir``): a restarted job loads its compiled
programs instead of compiling them again; a damaged entry is replaced by the next compile.

Imports no jax until it is used: the config's checks (``train.config``) take the default directory from here.
"""
from __future__ import annotations

import os

from layerscale_jax.paths import as_path
from layerscale_jax.storage.workdir import CACHE_IN_WORKDIR

DEFAULT_CACHE_DIR = "~/.cache/layerscale_jax/xla"    # per host; a job of several processes uses WORKDIR/xla_cache


def use_compilation_cache(directory: str, workdir=None) -> str:
    """JAX's persistent compilation cache in ``directory`` (``train.compilation_cache_dir``; '' leaves it off): a
    restarted job loads its compiled programs instead of compiling them again. Every program is cached however fast
    it compiled (JAX's default skips those under 1 s: the restore's small ones add up); the minimum entry size stays
    JAX's choice for the filesystem. Takes effect only before the process's first compilation. A damaged entry heals
    (``_replace_damaged_cache_entries``).

    JAX writes cache entries from process 0 only, so on a pod a per-host directory leaves hosts 1…N−1 compiling at
    every restart while the pod waits for them. A job of several processes whose ``directory`` is the per-host
    default uses ``<workdir>/xla_cache`` instead, which every process reaches (their checkpoints are there too).
    Returns the directory used ('' for none)."""
    import jax

    if directory == DEFAULT_CACHE_DIR and workdir is not None and jax.process_count() > 1:
        directory = os.fspath(as_path(workdir) / CACHE_IN_WORKDIR)
    if directory:
        jax.config.update("jax_compilation_cache_dir", os.fspath(as_path(directory, "train.compilation_cache_dir")))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    _replace_damaged_cache_entries()
    return directory


def _replace_damaged_cache_entries() -> None:
    """A damaged entry of the persistent compilation cache (a job killed or a disk filled while JAX wrote it, a
    changed file) fails to load on every run: JAX warns and compiles again, but never replaces it (it writes no key
    that exists). Here an entry that fails to load is deleted first, so that JAX's one warning is followed by the
    compiled program replacing it: the next run loads it."""
    from jax._src import compilation_cache

    load = compilation_cache.get_executable_and_time
    if getattr(load, "replaces_damaged_entries", False):
        return

    def load_or_delete(cache_key, *args, **kwargs):
        try:
            return load(cache_key, *args, **kwargs)
        except Exception:
            root = getattr(compilation_cache._cache, "path", None)
            if root is not None:
                (root / f"{cache_key}-cache").unlink(missing_ok=True)
            raise                                          # JAX warns once, compiles, and writes the entry again

    load_or_delete.replaces_damaged_entries = True
    compilation_cache.get_executable_and_time = load_or_delete
