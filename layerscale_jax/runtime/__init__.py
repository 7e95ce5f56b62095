"""Process start-up for the command-line entry points: a malloc that keeps XLA's CPU buffers (``malloc``: the
entry points re-execute themselves with it, ``reexec_with_fast_malloc``), and the stop signals a job stops on at a
step every process agrees on (``signals``: ``stop_signals``, the process's ``StopSignals``).

Neither imports jax: an entry point installs both before its first heavy import.
"""
from layerscale_jax.runtime.malloc import malloc_in_use, reexec_with_fast_malloc
from layerscale_jax.runtime.signals import StopSignals, stop_signals

__all__ = ["StopSignals", "malloc_in_use", "reexec_with_fast_malloc", "stop_signals"]
