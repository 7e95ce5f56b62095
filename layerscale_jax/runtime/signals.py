"""Stop signals (``StopSignals``, one per process: ``stop_signals``): a preemption notice (SIGTERM) or Ctrl-C
(SIGINT) asks the job to stop at the next *sync point* every process agrees on, with a checkpoint when there is new
state.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time


class StopSignals:
    """SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) ask the job to stop; a second Ctrl-C raises
    ``KeyboardInterrupt`` at once. Python drops an exception raised where it cannot propagate (a garbage-collector
    callback such as JAX's ``_xla_gc_callback``, a ``__del__``, a weakref callback: "Exception ignored in ...");
    a second Ctrl-C that landed there raises again at the next sync point.

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
        self.received_at: float | None = None     # when it came (seconds since the epoch)
        self._previous: dict = {}                 # the handlers ours replaced
        self._installs: list[bool] = []           # per ``with``: whether it installed the handlers
        self._passed_to_jax = False
        self._interrupted = False                 # a second Ctrl-C came (its KeyboardInterrupt may have been dropped)

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
        self.received = self.received_at = None
        self._interrupted = False
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
            self._interrupted = True
            raise KeyboardInterrupt
        if self.received is None:
            self.received, self.received_at = name, time.time()
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
        """Whether every process stops before ``step`` (see the class docstring). Ask at every step, in order.
        Raises ``KeyboardInterrupt`` after a second Ctrl-C whose own raise Python dropped."""
        if self._interrupted:
            raise KeyboardInterrupt
        if _jax_sync_point_available():
            self.pass_to_jax()
            from jax.experimental import multihost_utils
            return multihost_utils.reached_preemption_sync_point(step)
        if _distributed():
            import numpy as np
            from jax.experimental import multihost_utils
            return bool(np.any(multihost_utils.process_allgather(np.array([self.received is not None]))))
        return self.received is not None

    def requested_anywhere(self) -> bool:
        """Whether a stop signal has reached any process of the job by now: the same answer on every process (with
        several, a collective: every process calls it at the same point). Asked where the job has been busy for a
        while without stepping (after the first compile, after an evaluation), so that a notice that came meanwhile
        takes effect at once rather than a step or two later, when JAX's sync protocol has run."""
        if not _distributed():
            return self.received is not None
        import numpy as np
        from jax.experimental import multihost_utils
        here = self.received is not None or _jax_preemption_notice() is not None
        return bool(np.any(multihost_utils.process_allgather(np.array([here]))))

    def notice_time(self) -> float | None:
        """When the first stop signal of the job came (seconds since the epoch), as far as this process knows: its
        own, or the one JAX's preemption notifier recorded for the job (any process's SIGTERM)."""
        times = [t for t in (self.received_at, _parse_rfc3339(_jax_preemption_notice())) if t is not None]
        return min(times, default=None)

    @property
    def exit_status(self) -> int:
        """The exit status of a job stopped by a signal: 130 after Ctrl-C at this process (as a shell reports it),
        143 (128 + SIGTERM) for a preemption notice here or at another process: "preempted, rerun to resume"."""
        return 128 + (signal.SIGINT if self.received == "SIGINT" else signal.SIGTERM)

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


_NOTICE_KEY = "RECEIVED_PREEMPTION_NOTICE"   # where JAX's preemption notifier records a notice (its death time)


def _jax_preemption_notice() -> str | None:
    """The time of a SIGTERM that JAX's preemption notifier got at any process (RFC 3339), from the coordination
    service's key-value store (xla/tsl preemption_sync_manager.cc), or None."""
    if not _jax_sync_point_available():
        return None
    from jax._src import distributed
    try:
        return distributed.global_state.client.key_value_try_get(_NOTICE_KEY)
    except Exception:                              # noqa: BLE001 - NOT_FOUND: no notice yet
        return None


def _parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    import datetime
    match = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(\.\d+)?(.*)", text.strip())
    if match is None:
        return None
    fraction = (match.group(2) or ".0")[:7]                                  # microseconds at most
    zone = match.group(3).replace("Z", "+00:00") or "+00:00"
    try:
        return datetime.datetime.fromisoformat(match.group(1) + fraction + zone).timestamp()
    except ValueError:
        return None


def _jax_sync_point_available() -> bool:
    """``jax.distributed`` runs, with its preemption service (and so its SIGTERM notifier and sync manager)."""
    return _distributed() and bool(sys.modules["jax"].config.jax_enable_preemption_service)


stop_signals = StopSignals()
