"""Metrics: ``WORKDIR/metrics.jsonl`` (one JSON object per logged step), TensorBoard event files, console lines.

Records and events are buffered in memory and written by a background thread (and on demand: before every
checkpoint, so a resumed run finds every record up to its step, and when the run ends, a stop on SIGTERM included),
so the loop thread never waits for storage between checkpoints. On a local disk the thread appends the new lines as
they come; on an object store (``gs://``), where an object cannot be appended to, it writes the whole log as one
object (kept in memory), at most every ``FLUSH_SECS``: GCS accepts about one write per second to an object.
"""
from __future__ import annotations

import concurrent.futures
import io
import json
import logging
import sys
import threading
import time

import jax
import numpy as np
from etils import epath

from layerscale_jax.paths import CLOUD_SCHEMES, as_path, is_url

log = logging.getLogger(__name__)
FLUSH_SECS = 10


class _EpathEventFile:
    """A TensorBoard event file on cloud storage, written through ``etils.epath``. An object there cannot be
    appended to, so each flush (every 10 s, and at the end) rewrites the whole file, as tensorboardX's own GCS
    writer does; scalar logs stay small (about 50 bytes a value)."""

    def __init__(self, path: str):
        self.path = epath.Path(path)
        self.buffer = io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        self.path.write_bytes(self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EpathEventFiles:
    """tensorboardX's writer factory for a URL scheme."""

    @staticmethod
    def open(path: str) -> _EpathEventFile:
        return _EpathEventFile(path)

    @staticmethod
    def directory_check(path: str) -> None:
        epath.Path(path).mkdir(parents=True, exist_ok=True)


class MetricsWriter:
    """Writes from process 0 only; every call is a no-op elsewhere."""

    def __init__(self, workdir, total_steps: int):
        self.enabled = jax.process_index() == 0
        self.total_steps = total_steps
        self.start_time = time.time()
        self.start_step = None
        self.live = _is_live(sys.stderr)
        self._shown: dict[str, float] = {}         # live line: the latest value of each shown quantity
        self._line_width = 0
        workdir = as_path(workdir)
        self.jsonl_path = workdir / "metrics.jsonl"
        self.tb_dir = workdir / "tensorboard"
        if self.enabled:
            workdir.mkdir(parents=True, exist_ok=True)
            from tensorboardX import record_writer
            from tensorboardX.event_file_writer import EventsWriter
            # A non-finite loss is logged as it is (train.nonfinite='skip'); tensorboardX warned once per value.
            logging.getLogger("tensorboardX.x2num").setLevel(logging.ERROR)
            for scheme in CLOUD_SCHEMES:          # event files on gs:// through etils.epath, like every other file
                record_writer.register_writer_factory(scheme, _EpathEventFiles())
            # Events are written here, not by tensorboardX's SummaryWriter: its writer thread dies on a failed
            # write (a full disk) and its queue then blocks the run forever.
            record_writer.directory_check(str(self.tb_dir))
            self.tb = EventsWriter(str(self.tb_dir / "events"))
            self._whole_object = is_url(self.jsonl_path)
            self._flush_every = FLUSH_SECS if self._whole_object else 0.0
            self._logged = self.jsonl_path.read_text() if self._whole_object and self.jsonl_path.exists() else ""
            self._pending: list[str] = []          # records not yet flushed
            self._pending_events: list = []        # their TensorBoard events
            self._lock = threading.Lock()          # the two buffers, between the loop and the flushing thread
            self._flusher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="metrics-flush")
            self._in_flight: concurrent.futures.Future | None = None
            self._flushed = time.time()
            self._last_step = None

    def write(self, step: int, scalars: dict[str, float]) -> None:
        """Buffer the record of ``step`` and its TensorBoard events; start a background flush (on a bucket at most
        every ``FLUSH_SECS``). A failed flush raises here (or in ``flush``), naming the newest step."""
        if not self.enabled:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar
        if self._in_flight is not None and self._in_flight.done():
            self._raise_failed_flush()
        record = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
        events = [Event(wall_time=time.time(), step=int(step), summary=scalar(key, float(value)))
                  for key, value in scalars.items()]
        with self._lock:
            self._last_step = int(step)
            self._pending.append(json.dumps(record) + "\n")
            self._pending_events += events
        if time.time() - self._flushed >= self._flush_every and self._in_flight is None:
            self._flushed = time.time()
            self._in_flight = self._flusher.submit(self._flush_now)

    def _error(self, err: OSError) -> OSError:
        return OSError(err.errno, f"writing the metrics of step {self._last_step} in {self.jsonl_path.parent} "
                                  f"failed ({err.strerror or err})")

    def _raise_failed_flush(self) -> None:
        """Wait for the background flush in flight, if any; its error, naming the newest step."""
        done, self._in_flight = self._in_flight, None
        if done is not None:
            try:
                done.result()
            except OSError as err:
                raise self._error(err) from err

    def _flush_now(self) -> None:
        """Write the buffered records and events (in the background thread, or in the caller of ``flush``, never
        both at once). Nothing is lost when it fails: the next flush writes it again."""
        with self._lock:
            lines, self._pending = self._pending, []
            events, self._pending_events = self._pending_events, []
        try:
            if lines and self._whole_object:
                self.jsonl_path.write_text(self._logged + "".join(lines))
                self._logged += "".join(lines)
            elif lines:
                with self.jsonl_path.open("a") as f:
                    f.write("".join(lines))
            lines = []
            while events:
                self.tb.write_event(events[0])
                events.pop(0)
            self.tb.flush()
        finally:
            with self._lock:
                self._pending, self._pending_events = lines + self._pending, events + self._pending_events

    def progress(self, step: int, scalars: dict[str, float]) -> None:
        """One console line: step, loss, lr, throughput, input wait (ms per step the loop waited for the input
        pipeline since the last line: near 0 while the pipeline keeps up), the evaluation's accuracy and loss (MAE:
        loss only), ETA.

        Watched live (a terminal or a Jupyter cell: ``_is_live``) it is one line updated in place, showing the newest
        train and evaluation values together; written to a file or pipe (logs, tests) every call adds a line.
        """
        if not self.enabled:
            return
        if self.live:
            self._shown.update(scalars)
            scalars = self._shown
        if self.start_step is None:
            self.start_step, self.start_time = step, time.time()
        done = step - self.start_step
        elapsed = time.time() - self.start_time
        eta = (self.total_steps - step) * elapsed / done if done > 0 else float("nan")
        width = 24
        filled = int(width * step / max(self.total_steps, 1))
        bar = "#" * filled + "." * (width - filled)
        parts = [f"[{bar}] {step}/{self.total_steps}"]
        for key in ("train_loss", "learning_rate", "grad_norm", "img_per_s", "input_wait_ms", "test_accuracy",
                    "test_loss", "val_accuracy", "val_loss"):
            if key in scalars:
                parts.append(f"{key} {scalars[key]:.4g}")
        parts.append(f"ETA {_fmt_seconds(eta)}")
        line = " | ".join(parts)
        if self.live:
            print("\r" + line.ljust(self._line_width), end="", file=sys.stderr, flush=True)
            self._line_width = len(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def flush(self) -> None:
        """Write everything buffered, and wait for it (before a checkpoint: the records up to its step are then
        in the log). Raises a failed write, naming the newest step."""
        if self.enabled:
            self._raise_failed_flush()
            self._flushed = time.time()
            try:
                self._flush_now()
            except OSError as err:
                raise self._error(err) from err

    def close(self) -> None:
        """Flush and close the event file; a failure is a warning (a failed ``write`` has raised already, and a
        failure while closing must not hide the error that is stopping the run)."""
        if self.enabled:
            try:
                self.flush()
                self.tb.close()
            except OSError as err:
                log.warning("writing the last metrics to %s failed (%s)", self.jsonl_path.parent, err)
            self._flusher.shutdown(wait=True)
            if self.live and self._line_width:
                print(file=sys.stderr, flush=True)          # end the live line
                self._line_width = 0


def _is_live(stream) -> bool:
    """Whether a person watches ``stream`` as it is written: a terminal, or a Jupyter cell's output."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) or type(stream).__module__.startswith("ipykernel")


def _fmt_seconds(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
