"""What a failed orbax save leaves behind in this process, made quiet and brief for the one error line that follows.

Orbax writes a checkpoint in background threads. When that fails (a full disk, a read-only or immutable directory),
each thread involved logs the failure with its traceback — hundreds of lines — and the threads that wait for a step
of the failed save (the step directory created, say) keep waiting until orbax's barrier timeout, 300 s, with the
process unable to exit after its error line. Used by the training checkpoints and by ``save_pretrained``.
"""
from __future__ import annotations

import logging
import threading
import warnings

log = logging.getLogger(__name__)


class _OrbaxErrorsOnOneLine(logging.Filter):
    """Orbax's background save threads log a failure (a full disk) with its traceback in every thread involved and
    in asyncio's "Task exception was never retrieved", hundreds of lines, before ``wait_until_finished`` re-raises
    it as the run's one error line. Their records keep their message, on one line, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and "orbax" in f"{record.pathname} {record.getMessage()}":
            record.msg, record.args = " ".join(record.getMessage().split()), None
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


_ORBAX_ERRORS_ON_ONE_LINE = _OrbaxErrorsOnOneLine()


def log_orbax_errors_on_one_line() -> None:
    """From now on, orbax's error records (through absl's and asyncio's loggers) are one line each."""
    for name in ("absl", "asyncio"):
        if _ORBAX_ERRORS_ON_ONE_LINE not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_ORBAX_ERRORS_ON_ONE_LINE)


def release_waiting_save_threads() -> None:
    """After a failed save: orbax's save threads still waiting for a signal of that save are cancelled and woken,
    so that they end now instead of at orbax's barrier timeout (300 s after the error line, each logging "Timeout
    waiting for key ..."). Their coroutines, never started, are not reported as "never awaited" at exit."""
    from orbax.checkpoint._src.futures import future as orbax_future

    for thread in threading.enumerate():
        if isinstance(thread, orbax_future._SignalingThread) and thread.is_alive():
            thread._cancelled = True
            try:
                orbax_future.set_signals(thread._receive_signals, operation_id=thread._operation_id)
            except Exception as err:  # noqa: BLE001 - the thread then ends at its own timeout, as before
                log.debug("could not wake orbax's thread %s: %s", thread.name, err)
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
