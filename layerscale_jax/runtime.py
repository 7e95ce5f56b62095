"""Process start-up for the command-line entry points: huge pages for XLA's CPU buffers, and stop signals.

XLA's CPU runtime allocates a step's temporary buffers afresh at every step (about 2 GB for a DeiT III-S/16 train
step at batch 16) and glibc hands such large blocks back to the kernel when they are freed, so each step
page-faults its whole working set in again, 4 KiB at a time. glibc's ``glibc.malloc.hugetlb=1`` tunable makes malloc
ask for transparent huge pages (2 MiB) for those blocks, which cuts the faults ~300-fold and the kernel time with
them (``python -m layerscale_jax.bench page_faults`` measures both settings side by side).

glibc reads tunables only when a process starts, so ``python -m layerscale_jax.train`` and
``python -m layerscale_jax.bench`` re-execute themselves once, with the tunable added to ``GLIBC_TUNABLES``, before
anything else runs. Set ``LAYERSCALE_JAX_HUGEPAGES=0`` to keep the process as started.

Stop signals (``StopSignals``, one per process: ``stop_signals``): a preemption notice (SIGTERM) or Ctrl-C (SIGINT)
asks the job to stop at the next *sync point* every process agrees on, with a checkpoint when there is new state.
"""
from __future__ import annotations

import os
import platform
import signal
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


class StopSignals:
    """SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) ask the job to stop; a second Ctrl-C raises
    ``KeyboardInterrupt`` at once.

    The job asks ``reached_sync_point(step)`` before each step (the train loop after every step, and once, through
    ``stopped_before``, before its first step) and stops where it answers True: every process of the job answers
    True at the same step, whichever process got the signal, and at whatever moment since the handlers were
    installed (distributed start-up, restore, compile, a step, a save). How the processes agree:

    - one process (no ``jax.distributed``): the signal's flag;
    - ``jax.distributed`` with its preemption service (the default, ``jax_enable_preemption_service``): JAX's sync
      point, ``jax.experimental.multihost_utils.reached_preemption_sync_point``. ``jax.distributed.initialize``
      installs JAX's own SIGTERM handler (its preemption notifier); a stop signal that came before that, and every
      Ctrl-C, is passed on to it by raising SIGTERM (right after ``initialize``, and at the next sync point). The
      notifier tells the coordination service; a background protocol then takes the highest step any process has
      asked about and makes the next one the sync point (within about a second; each question is a mutex lock, no
      device sync). The loop is the only caller (the Checkpointer's orbax manager does not ask), so the count
      only ever moves forward, one step at a time;
    - ``jax.distributed`` without the preemption service: the processes' flags all-gathered at every sync point.
    """

    def __init__(self):
        self.received: str | None = None          # the name of the first stop signal, once one came
        self._previous: dict = {}                 # the handlers ours replaced
        self._installs: list[bool] = []           # per ``with``: whether it installed the handlers
        self._passed_to_jax = False

    def install(self) -> bool:
        """Handle the stop signals from now on (in the main thread only); False when already installed or not
        possible here (another thread). SIGTERM stays JAX's when its preemption notifier already owns it."""
        if self._previous:
            return False
        signals = (signal.SIGINT,) if _jax_sync_point_available() else (signal.SIGTERM, signal.SIGINT)
        try:
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:                        # not the main thread (e.g. a notebook's worker thread)
            self.uninstall()
            return False
        self.received = None
        return True

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def __enter__(self) -> StopSignals:
        self._installs.append(self.install())
        return self

    def __exit__(self, *exc) -> None:
        if self._installs.pop():
            self.uninstall()

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = name
            os.write(2, f"received {name}: the job stops before the next step every process agrees on, with a "
                        "checkpoint if there is new state (a second Ctrl-C stops at once, without one)\n".encode())
        # Not passed on to JAX from here: this may run inside jax.distributed.initialize, before JAX's notifier owns
        # SIGTERM; ``pass_to_jax`` runs after it, and at every sync point.

    def pass_to_jax(self) -> None:
        """Once ``jax.distributed`` runs its preemption notifier, hand it a stop signal received so far (call it
        right after ``jax.distributed.initialize``; ``reached_sync_point`` does too)."""
        if self.received is not None and not self._passed_to_jax and _jax_sync_point_available():
            self._passed_to_jax = True
            signal.raise_signal(signal.SIGTERM)   # JAX's notifier owns SIGTERM now

    def reached_sync_point(self, step: int) -> bool:
        """Whether every process stops before ``step`` (see the class docstring). Ask at every step, in order."""
        if _jax_sync_point_available():
            self.pass_to_jax()
            from jax.experimental import multihost_utils
            return multihost_utils.reached_preemption_sync_point(step)
        if _distributed():
            import numpy as np
            from jax.experimental import multihost_utils
            return bool(np.any(multihost_utils.process_allgather(np.array([self.received is not None]))))
        return self.received is not None

    def stopped_before(self, first_step: int) -> bool:
        """Whether every process stops before ``first_step``, the job's first step after restoring or creating
        its state: a stop signal during start-up or restore. With JAX's sync point, asks about steps 1, 2, ...,
        ``first_step`` in turn (each process's sequence of questions starts at 1 in a new job)."""
        if _jax_sync_point_available():
            return any(self.reached_sync_point(step) for step in range(1, first_step + 1))
        return self.reached_sync_point(first_step)


def _distributed() -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def _jax_sync_point_available() -> bool:
    """``jax.distributed`` runs, with its preemption service (and so its SIGTERM notifier and sync manager)."""
    return _distributed() and bool(sys.modules["jax"].config.jax_enable_preemption_service)


stop_signals = StopSignals()
