"""Stop signals (``StopSignals``, one per process: ``stop_signals``): a preemption notice (SIGTERM) or Ctrl-C
(SIGINT) asks the job to stop at the next *sync point* every process agrees on, with a checkpoint when there is new
state.

Python runs a signal handler only between bytecodes of the main thread, so a handler cannot act while the main
thread is inside XLA (a compile of minutes) or any other long C call. A command-line entry point therefore also
calls ``watch()``: the signals' C-level handler writes each signal's number to a pipe (``signal.set_wakeup_fd``) and
a watcher thread, which XLA does not hold up (it releases the GIL), acts on it at once:

- while the job starts (start-up, ``jax.distributed``'s connect aside, model building, restore, the train step's
  compile, all of ``--compile_for``: ``phase`` "starting") a process of its own (no ``jax.distributed``) has nothing
  new to save: the watcher prints the stop's lines and ends the process itself with 128 + the signal's number
  (130 Ctrl-C, 143 SIGTERM), after releasing the workdir's lock (``before_exit``);
- while the process waits for ``jax.distributed``'s connect (``connecting``): it gives up after the connect's
  timeout with one ``error:`` line (exit status 2); a stop signal ends it ``CONNECT_GRACE_SECONDS`` later unless the
  connect completes meanwhile (then the job stops at one point, as below);
- while a multi-process job compiles its train step (``compiling``), JAX's preemption notifier owns SIGTERM, so
  the watcher asks the coordination service every ``NOTICE_POLL_SECONDS`` whether a notice reached any process (a
  Ctrl-C here is handed to the notifier first): none has new state to save, so every process ends at once,
  process 0 (it runs the coordination service) ``COORDINATOR_LAST_SECONDS`` after the others;
- once the first step may run (``phase`` "training"), the stop is the loop's: at the next sync point, saving new
  state; ``watch(deadline=...)`` (``train.stop_deadline_seconds``) bounds it: the watcher ends the process that
  long after the signal (the last sealed checkpoint stays the one to resume);
- a second stop signal, in any phase, ends the process at once without saving (exit 128 + its number).

The watcher acts on a signal only while the handler installed for it is this object's (JAX's preemption notifier
owns SIGTERM in a multi-process job after the connect; ``exit_process`` owns SIGINT while the process exits).
"""
from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import sys
import threading
import time

CONNECT_GRACE_SECONDS = 20.0      # a stop signal during the connect: how long the connect may still complete
NOTICE_POLL_SECONDS = 0.5        # a multi-process job that is starting: how often the watcher asks for a notice
COORDINATOR_LAST_SECONDS = 3.0    # ... and how much later process 0, which runs the coordination service, ends
CLEANUP_SECONDS = 5.0             # the watcher's exit: how long the cleanups (the workdir lock's release) may take
INTERRUPTED_MESSAGE = ("interrupted by a second Ctrl-C: stopped at once, without saving; rerun the command to resume "
                       "from the last checkpoint")
NOTICE_WHILE_COMPILING = "a stop notice reached the job while its train step compiled: every process stops at once"
_RECOMPUTE = 0                    # a byte on the wakeup pipe that is no signal: the watcher's deadlines changed


class StopSignals:
    """SIGTERM (a scheduler's preemption notice) and SIGINT (Ctrl-C) ask the job to stop; a second Ctrl-C raises
    ``KeyboardInterrupt`` at once (in a process that ``watch``es, a command-line job, it ends the process at once,
    from the watcher or, when another library took the wakeup fd, from the handler). Python drops an
    exception raised where it cannot propagate (a garbage-collector callback such as JAX's ``_xla_gc_callback``, a
    ``__del__``, a weakref callback: "Exception ignored in ..."); a second Ctrl-C that landed there raises again at
    the next sync point.

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
        # The watcher (``watch``): its pipe, its thread, and what it knows about the main thread.
        self._lock = threading.RLock()
        self._pipe: tuple[int, int] | None = None
        self._watcher: threading.Thread | None = None
        self._signals_seen = 0                    # stop signals the watcher has acted on since ``install``
        self.phase = "starting"                   # "starting", "connecting" or "training" (module docstring)
        self._stop_line = "stopped before the first step: nothing new to save"
        self._connect: dict | None = None         # while connecting: what it waits for and until when
        self._give_up_at: tuple[float, str, int] | None = None   # (monotonic time, line, exit status)
        self._deadline = 0.0                      # train.stop_deadline_seconds (0: none)
        self.joins_job = False                    # the process will connect to a multi-process job (``watch``)
        self._before_exit: list = []              # callables the watcher runs before it ends the process
        self._compiling = False                   # the train step compiles (``compiling``)

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
        self._signals_seen = 0
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
        if self._watched():
            return                                # the watcher thread acts on it (it got the signal's number too)
        name = signal.Signals(signum).name
        if self.received is not None and signum == signal.SIGINT:
            self._interrupted = True
            if self._watcher is not None:
                # A command-line job whose watcher did not get this Ctrl-C (another library took the wakeup fd, as an
                # asyncio event loop that handles a signal does) ends here, as the watcher ends it. A
                # KeyboardInterrupt would unwind through whatever the main thread is in: orbax logs one that
                # interrupts its wait for a save ("ERROR:absl:... Save Finalize thread (save_finalize) failed.").
                self._exit(128 + signum, INTERRUPTED_MESSAGE)
            raise KeyboardInterrupt
        if self.received is None:
            self.received, self.received_at = name, time.time()
            os.write(2, f"received {name}: the job stops before the next step every process agrees on, with a "
                        "checkpoint if there is new state (a second Ctrl-C stops at once, without one)\n".encode())
        # Not passed on to JAX from here: this may run inside jax.distributed.initialize, before JAX's notifier owns
        # SIGTERM; ``pass_to_jax`` runs after it, and at every sync point.

    # -- the watcher: stop signals while the main thread is inside XLA ------------------------------------------------
    def watch(self, *, deadline: float = 0.0, joins_job: bool = False) -> bool:
        """Act on the stop signals from a watcher thread as well (see the module docstring): for a process that is a
        command-line job (it may end the process). Call it in the main thread after ``install``; ``deadline``:
        ``train.stop_deadline_seconds`` (0: none); ``joins_job``: the process is to connect to a multi-process job
        (a stop signal before the connect then waits for it as one during it does). False when the handlers are not
        installed or not in the main thread."""
        self._deadline = float(deadline or 0.0)
        self.joins_job = joins_job
        if not self._previous:
            return False
        if self._watcher is None:
            read, write = os.pipe()
            os.set_blocking(write, False)
            try:
                signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            except ValueError:                    # not the main thread
                os.close(read)
                os.close(write)
                return False
            self._pipe = (read, write)
            self._watcher = threading.Thread(target=self._watch_loop, name="stop-signal-watcher", daemon=True)
            self._watcher.start()
        return True

    def _watched(self) -> bool:
        """Whether the watcher gets the signals' numbers (nobody else took the wakeup fd since ``watch``)."""
        if self._watcher is None or self._pipe is None or not self._watcher.is_alive():
            return False
        try:
            current = signal.set_wakeup_fd(self._pipe[1], warn_on_full_buffer=False)
        except ValueError:
            return True                           # not the main thread: cannot tell, the watcher has it
        if current != self._pipe[1]:              # another library took it: leave it theirs, act here
            signal.set_wakeup_fd(current)
            return False
        return True

    def starting(self, stop_line: str) -> None:
        """The job is starting again (nothing new to save): a stop signal now ends a process of its own at once,
        printing ``stop_line`` (e.g. ``stopped before step 7: nothing new to save``)."""
        with self._lock:
            self.phase, self._stop_line = "starting", stop_line

    def before_exit(self, cleanup) -> None:
        """Run ``cleanup()`` (in another thread, ``CLEANUP_SECONDS`` at most) before the watcher ends the process."""
        self._before_exit.append(cleanup)       # no lock: a cleanup discards itself while the watcher exits

    def discard_before_exit(self, cleanup) -> None:
        try:
            self._before_exit.remove(cleanup)
        except ValueError:
            pass

    @contextlib.contextmanager
    def connecting(self, waiting_for: str, timeout: float, timeout_line: str):
        """While ``jax.distributed`` connects: the watcher ends the process after ``timeout`` seconds with
        ``timeout_line`` (exit status 2), and ``CONNECT_GRACE_SECONDS`` after a stop signal (``waiting_for`` names
        what it waits for in that line)."""
        with self._lock:
            self.phase = "connecting"
            self._connect = {"waiting_for": waiting_for}
            give_up = (time.monotonic() + timeout, timeout_line, 2)
            if self._give_up_at is None or give_up[0] < self._give_up_at[0]:   # else: a stop signal's, sooner
                self._give_up_at = give_up
        self._wake_watcher()
        try:
            yield
        finally:
            with self._lock:
                self.phase, self._connect, self._give_up_at = "starting", None, None
            self._wake_watcher()

    def _wake_watcher(self) -> None:
        if self._pipe is not None:
            try:
                os.write(self._pipe[1], bytes([_RECOMPUTE]))
            except OSError:
                pass

    def _watch_loop(self) -> None:
        while True:
            try:
                self._watch_once(self._pipe[0])
            except Exception:                      # noqa: BLE001 - keep watching: a stop must never be lost
                import traceback
                traceback.print_exc()
                time.sleep(1.0)

    def _watch_once(self, read: int) -> None:
        """Wait for a signal's number on the pipe or the next deadline, and act on it."""
        with self._lock:
            due = self._give_up_at
            polls = self._compiling and _jax_sync_point_available()
        timeout = None if due is None else max(0.0, due[0] - time.monotonic())
        if polls:
            timeout = NOTICE_POLL_SECONDS if timeout is None else min(timeout, NOTICE_POLL_SECONDS)
        ready, _, _ = select.select([read], [], [], timeout)
        data = os.read(read, 512) if ready else b""
        for signum in data:
            if signum in (signal.SIGINT, signal.SIGTERM) and signal.getsignal(signum) == self._handle:
                self._on_signal(signum)
        if polls:
            self._end_the_compile_on_a_notice()
        with self._lock:
            due = self._give_up_at
            if due is not None and time.monotonic() >= due[0]:
                self._exit(due[2], due[1])

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        with self._lock:
            self._signals_seen += 1
            if self._signals_seen > 1 or self._interrupted:
                self._interrupted = True
                self._exit(128 + signum, INTERRUPTED_MESSAGE if signum == signal.SIGINT else
                           f"interrupted by a second stop signal ({name}): stopped at once, without saving; rerun "
                           "the command to resume from the last checkpoint")
            first = self.received is None
            if first:
                self.received, self.received_at = name, time.time()
            before_connect = self.phase == "starting" and self.joins_job and not _distributed()
            if self.phase == "starting" and not _distributed() and not before_connect:
                self._exit(128 + signum, f"received {name} while the job was starting (start-up, restore or "
                                         f"compile): it stops at once\n{self._stop_line}")
            if self.phase == "connecting" or before_connect:
                waiting_for = self._connect["waiting_for"] if self._connect else "the job's processes to connect"
                self._say(f"received {name} while waiting for {waiting_for}: stopping in "
                          f"{CONNECT_GRACE_SECONDS:g} s unless the job connects first (then every process stops "
                          "at one point; a second Ctrl-C stops at once)")
                self._give_up_at = (time.monotonic() + CONNECT_GRACE_SECONDS,
                                    f"stopped while waiting for {waiting_for}: nothing new to save", 128 + signum)
                return
            if first:
                self._say(f"received {name}: the job stops before the next step every process agrees on, with a "
                          "checkpoint if there is new state (a second Ctrl-C stops at once, without one)")
                if self._deadline > 0:
                    self._give_up_at = (
                        time.monotonic() + self._deadline,
                        f"stopped without saving: the stop did not end within train.stop_deadline_seconds="
                        f"{self._deadline:g} of the {name}; rerun the command to resume from the last checkpoint",
                        128 + signum)

    @contextlib.contextmanager
    def compiling(self):
        """The train step compiles (the job is starting): in a multi-process job the watcher ends this process once a
        stop notice reached any process (``_end_the_compile_on_a_notice``). Only here: the restore before it has
        collectives a peer's exit would break; a peer past its compile waits in ``stopped_before``'s, which ends
        it too."""
        with self._lock:
            self._compiling = True
        self._wake_watcher()                      # it polls from now on
        try:
            yield
        finally:
            with self._lock:
                self._compiling = False
                ending = self._give_up_at is not None and self._give_up_at[1].startswith(NOTICE_WHILE_COMPILING)
            while ending:                         # the watcher ends the process (process 0: its peers first)
                time.sleep(1.0)

    def _end_the_compile_on_a_notice(self) -> None:
        """A multi-process job is starting (after the connect): once a stop notice reached any process (JAX's notifier
        records it with the coordination service; a Ctrl-C here is handed to it), end this process: nothing new to
        save anywhere, and every process sees the same notice."""
        if self.received is not None:
            self.pass_to_jax()
        if _jax_preemption_notice() is None:
            return
        import jax
        with self._lock:
            if self._give_up_at is None and self._compiling:
                last = COORDINATOR_LAST_SECONDS if jax.process_index() == 0 else 0.0
                self._give_up_at = (time.monotonic() + last, f"{NOTICE_WHILE_COMPILING}\n{self._stop_line}",
                                    self.exit_status)

    @staticmethod
    def _say(line: str) -> None:
        os.write(2, (line + "\n").encode())

    def _exit(self, status: int, lines: str) -> None:
        """End the process from the watcher: the cleanups and the buffered output's flush (bounded: in another thread,
        as the main thread may hold a stream's lock), the lines, exit."""
        cleanups = [*self._before_exit, sys.stdout.flush, sys.stderr.flush]
        done = threading.Thread(target=lambda: [_quietly(c) for c in cleanups], daemon=True)
        done.start()
        done.join(CLEANUP_SECONDS)
        self._say(lines)
        os._exit(status)

    def pass_to_jax(self) -> None:
        """Once ``jax.distributed`` runs its preemption notifier, hand it a stop signal received so far (call it
        right after ``jax.distributed.initialize``; ``reached_sync_point`` does too)."""
        with self._lock:                          # the watcher and the main thread both call it
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
        its state: a stop signal during start-up, restore or the compile, at any process (``requested_anywhere``:
        one that came during a long compile takes effect here, not a step later). With JAX's sync point, asks about
        steps 1, 2, ..., ``first_step`` in turn (each process's sequence of questions starts at 1 in a new job). From
        here on a stop saves new state: the watcher leaves the stop to the loop (``phase`` "training").

        A peer whose watcher ended it while it started (``_end_the_compile_on_a_notice``) leaves this process's
        collective without a partner: this one ends too, with the same lines, before JAX's shutdown barrier (which
        would abort, waiting for the peer)."""
        with self._lock:
            self.phase = "training"
        if _jax_sync_point_available():
            stop = any(self.reached_sync_point(step) for step in range(1, first_step + 1))
        else:
            stop = self.reached_sync_point(first_step)
        try:
            return stop or self.requested_anywhere()
        except Exception:
            if not _distributed() or _jax_preemption_notice() is None:
                raise
            self._exit(self.exit_status, f"{NOTICE_WHILE_COMPILING}\n{self._stop_line}")


def _quietly(action) -> None:
    try:
        action()
    except Exception:                              # noqa: BLE001 - the process ends either way
        pass


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
