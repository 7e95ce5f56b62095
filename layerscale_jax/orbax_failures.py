"""What a failed orbax save leaves behind in this process, made quiet and brief for the one error line that follows.

Orbax writes a checkpoint in background threads. When that fails (a full disk, a read-only or immutable directory),
each thread involved logs the failure with its traceback — hundreds of lines — and the threads that wait for a step
of the failed save (the step directory created, say) keep waiting until orbax's barrier timeout, 300 s, with the
process unable to exit after its error line. Used by the training checkpoints and by ``save_pretrained``.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import warnings

log = logging.getLogger(__name__)

_save_failed = threading.Event()     # orbax (or the checkpointer) has reported a failed save in this process


class _OrbaxErrorsOnOneLine(logging.Filter):
    """Orbax's background save threads log a failure (a full disk) with its traceback in every thread involved,
    hundreds of lines, before ``wait_until_finished`` re-raises it as the run's one error line. Their records keep
    their message, on one line, without the traceback. Once a save has failed, asyncio's "Task (or
    _GatheringFuture) exception was never retrieved" for each of orbax's abandoned write tasks (one per array,
    reported when they are collected, often at exit, after the error line) is dropped: it repeats the failure
    already reported. An interrupt is no failure: orbax logs a ``KeyboardInterrupt`` (a second Ctrl-C in ``fit``,
    which has no watcher) that ends its wait for a save as "Save Finalize thread (save_finalize) failed."; that
    record is dropped, and the interrupt goes on up (issue 49)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "orbax" in f"{record.pathname} {record.getMessage()}":
            if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
                return False
            if record.name == "asyncio" and "exception was never retrieved" in record.getMessage().split("\n")[0]:
                if _save_failed.is_set():
                    return False
            _save_failed.set()
            record.msg, record.args = " ".join(record.getMessage().split()), None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


_ORBAX_ERRORS_ON_ONE_LINE = _OrbaxErrorsOnOneLine()


def _is_a_callback_into_a_closed_loop(kind, value, traceback) -> bool:
    """A failed save's aftermath: TensorStore completing one of orbax's abandoned writes calls back into the event
    loop of orbax's save thread, which ``asyncio.run`` has closed on the first error; the ``RuntimeError('Event loop
    is closed')`` raised in asyncio (no frame of other code: the call comes from TensorStore's C++ threads) is
    printed as a traceback per write — 65 lines and more, some after the error line. Nothing waits for those writes.
    Not conditional on ``_save_failed``: the first of these callbacks can come before orbax logs the error that
    closed the loop (seen on a 416 KiB tmpfs, 1 run in 4), and nothing but an abandoned write calls into a closed
    loop from outside Python; the same error raised from a frame of other code keeps its traceback."""
    if not (kind is RuntimeError and str(value) == "Event loop is closed"):
        return False
    while traceback is not None:
        if os.path.basename(os.path.dirname(traceback.tb_frame.f_code.co_filename)) != "asyncio":
            return False
        traceback = traceback.tb_next
    return True


def _quiet(original, exc_info):
    """The hook ``original`` (``sys.excepthook``, ``sys.unraisablehook`` or ``threading.excepthook``) without the
    callbacks into a closed loop; ``exc_info`` gives ``(kind, value, traceback)`` from the hook's arguments."""
    def hook(*args):
        if not _is_a_callback_into_a_closed_loop(*exc_info(*args)):
            original(*args)
    hook.quiets_closed_loops = True
    return hook


def _exc_info_of(arg):
    """``(kind, value, traceback)`` of ``sys.unraisablehook``'s or ``threading.excepthook``'s argument."""
    return arg.exc_type, arg.exc_value, arg.exc_traceback


def log_orbax_errors_on_one_line() -> None:
    """From now on, orbax's error records (through absl's and asyncio's loggers) are one line each, and after a
    failed save its abandoned writes stay quiet (``_OrbaxErrorsOnOneLine``, ``_is_a_callback_into_a_closed_loop``)."""
    for name in ("absl", "asyncio"):
        if _ORBAX_ERRORS_ON_ONE_LINE not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_ORBAX_ERRORS_ON_ONE_LINE)
    if not getattr(sys.excepthook, "quiets_closed_loops", False):
        sys.excepthook = _quiet(sys.excepthook, lambda kind, value, traceback: (kind, value, traceback))
    if not getattr(sys.unraisablehook, "quiets_closed_loops", False):
        sys.unraisablehook = _quiet(sys.unraisablehook, _exc_info_of)
    if not getattr(threading.excepthook, "quiets_closed_loops", False):
        threading.excepthook = _quiet(threading.excepthook, _exc_info_of)


def release_waiting_save_threads() -> None:
    """After a failed save: orbax's save threads still waiting for a signal of that save are cancelled and woken,
    so that they end now instead of at orbax's barrier timeout (300 s after the error line, each logging "Timeout
    waiting for key ..."). Their coroutines, never started, are not reported as "never awaited" at exit."""
    from orbax.checkpoint._src.futures import future as orbax_future

    _save_failed.set()
    for thread in threading.enumerate():
        if isinstance(thread, orbax_future._SignalingThread) and thread.is_alive():
            thread._cancelled = True
            try:
                orbax_future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
            except Exception as err:  # noqa: BLE001 - the thread then ends at its own timeout, as before
                log.debug("could not wake orbax's thread %s: %s", thread.name, err)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
