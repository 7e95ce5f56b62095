"""Metrics: ``WORKDIR/metrics.jsonl`` (one JSON object per logged step), TensorBoard event files, console lines
(``MetricsWriter``), and the train loop's logs, one logging window at a time: ``MetricsLog`` writes them,
``RunRecord`` (the loop's record mode) keeps a study run's loss curve and evaluations instead.

Records and events are buffered in memory and written by a background thread (and on demand: before every
checkpoint, so a resumed run finds every record up to its step, and when the run ends, a stop on SIGTERM included),
so the loop thread never waits for storage between checkpoints. On a local disk the thread appends the new lines as
they come; on an object store (``gs://``), where an object cannot be appended to, it writes the whole log as one
object (kept in memory), at most every ``FLUSH_SECS``: GCS accepts about one write per second to an object.

Written here rather than by clu's metric writers or tqdm: the log is cut back to a checkpoint's step on a resume
(``workdir.truncate_metrics``) and rewritten whole on a bucket, which append-only summary writers do not do, and the
console line is the same record as ``metrics.jsonl``'s, printed as one line per window when stderr is not a terminal.
"""
from __future__ import annotations

import concurrent.futures
import io
import json
import logging
import sys
import threading
import time
from collections.abc import Sequence

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

    def __init__(self, workdir, total_steps: int, shown: Sequence[str] | None = None, *, records: int = 0,
                 lost: int = 0):
        """``shown``: the quantities of the console line, in order (the loop's: ``console_keys``); None: every one
        given to ``progress``, in the order first given. ``records``: the records in ``metrics.jsonl`` already (a
        resumed run's); ``lost``: how many this run's log has lost so far (``workdir.truncate_metrics``)."""
        self.enabled = jax.process_index() == 0
        self.records, self.lost = records, lost
        self._recent: list[str] = []               # the records since the last checkpoint (``since_checkpoint``)
        self.total_steps = total_steps
        self.shown = shown
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
            self._recent.append(json.dumps(record))
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
                if self.records and not self.jsonl_path.exists():
                    log.warning("%s was deleted during the run: the %d record(s) it held are lost (results.json "
                                "counts them: metrics_records_lost); it goes on from step %s", self.jsonl_path,
                                self.records, json.loads(lines[0])["step"])
                    self.lost, self.records = self.lost + self.records, 0
                with self.jsonl_path.open("a") as f:
                    f.write("".join(lines))
            self.records += len(lines)
            lines = []
            while events:
                self.tb.write_event(events[0])
                events.pop(0)
            self.tb.flush()
        finally:
            with self._lock:
                self._pending, self._pending_events = lines + self._pending, events + self._pending_events

    def progress(self, step: int, scalars: dict[str, float]) -> None:
        """One console line: step, the ``shown`` quantities (the loop's: loss, lr, gradient norm, throughput, input
        wait in ms per step the loop waited for the input pipeline since the last line, near 0 while the pipeline
        keeps up; the evaluation's metrics), ETA.

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
        for key in self.shown if self.shown is not None else list(scalars):
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

    def since_checkpoint(self) -> dict | None:
        """What a checkpoint keeps of the log (after ``flush``): the number of records, the records since the last
        checkpoint, and how many were lost; ``workdir.truncate_metrics`` rebuilds the log from it at a resume.
        None on processes that write no log."""
        if not self.enabled:
            return None
        with self._lock:
            recent, self._recent = self._recent, []
        return {"records": self.records, "recent": recent, "lost": self.lost}

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


# -- the loop's logs: one logging window at a time -------------------------------------------------------------------

def due(step: int, every: int, end: int) -> bool:
    """Whether something done every ``every`` steps (0: only at the end) and at step ``end`` is due at ``step``."""
    return bool(every) and step % every == 0 or step == end


def console_keys(task) -> tuple[str, ...]:
    """The console line's quantities, in order: the train loss, the loop's rates, the task's evaluation metrics
    (every train metric is in metrics.jsonl)."""
    return ("train_loss", "learning_rate", "grad_norm", "img_per_s", "input_wait_ms", *task.eval_keys)


class _Window:
    """The per-step metrics of the current logging window (every ``train.log_every`` steps and at the end),
    fetched from the devices once per window."""

    def __init__(self, every: int, end: int, window: list | None = None):
        self.every, self.end = every, end
        self.pending = list(window or [])            # per-step metrics not yet logged

    def append(self, step: int, metrics: dict) -> None:
        self.pending.append(metrics)

    def due(self, step: int) -> bool:
        return due(step, self.every, self.end)

    def fetch(self) -> list[dict]:
        fetched, self.pending = jax.device_get(self.pending), []
        return fetched


class MetricsLog(_Window):
    """``WORKDIR/metrics.jsonl``, TensorBoard and the console line (``metrics.MetricsWriter``): per window the mean
    of each train metric (``train_*``, ``grad_norm``), the learning rate applied, throughput, the non-finite steps
    and bad records so far (``batches``: the loop's ``feed.Batches``), and the input wait (console only: a timing,
    not a record); at each evaluation its metrics and diagnostics. ``window``: the metrics of the window's first
    steps, restored with a checkpoint."""

    def __init__(self, writer: MetricsWriter, batches, tc, *, end: int, start_step: int, window: list):
        super().__init__(tc.log_every, end, window)
        self.writer, self.batches, self.batch_size = writer, batches, tc.batch_size
        self.last_time, self.last_step = time.time(), start_step

    def write(self, step: int, fetched: list[dict], state: dict) -> None:
        now = time.time()
        scalars = {k: _window_mean([m[k] for m in fetched]) for k in fetched[0]
                   if k.startswith("train_") or k == "grad_norm"}
        scalars["learning_rate"] = float(fetched[-1]["learning_rate"])
        scalars["img_per_s"] = (step - self.last_step) * self.batch_size / max(now - self.last_time, 1e-9)
        scalars["nonfinite_steps"] = float(jax.device_get(state["nonfinite_steps"]))
        scalars["bad_records"] = float(self.batches.bad_records)
        wait_ms = 1e3 * self.batches.take_wait() / max(step - self.last_step, 1)
        self.last_time, self.last_step = now, step
        self.writer.write(step, scalars)
        self.writer.progress(step, {**scalars, "input_wait_ms": wait_ms})
        self.batches.check_replicas(step)

    def evaluated(self, step: int, results: dict, diagnostics: dict) -> None:
        self.writer.write(step, {**results, **diagnostics})
        self.writer.progress(step, results)


class RunRecord(_Window):
    """Record mode's log: the train-loss curve (per window, the mean loss of its finite steps), the evaluations (the
    task's metrics and the diagnostics) and the time spent: setup, the first step (with its compilation), each
    later step, the evaluations."""

    def __init__(self, task, every: int, *, end: int, started: float):
        super().__init__(every, end)
        self.task, self.started = task, started
        self.curve: list[tuple[int, float]] = []
        self.evaluations: list[dict] = []
        self.setup = self.first_step = None

    def setup_done(self) -> None:
        self.setup = time.time() - self.started

    def append(self, step: int, metrics: dict) -> None:
        super().append(step, metrics)
        if step == 1:
            jax.block_until_ready(metrics)
            self.first_step = time.time() - self.started - self.setup

    def write(self, step: int, fetched: list[dict], state: dict) -> None:
        finite = [m["train_loss"] for m in fetched if m["finite"]]
        self.curve.append((step, _window_mean(finite) if finite else float("nan")))

    def evaluated(self, step: int, results: dict, diagnostics: dict) -> None:
        metrics = {k: results[k] for k in self.task.eval_keys if k in results}
        self.evaluations.append({"step": step, **metrics, **diagnostics})

    def results(self, step: int, diverged_at: int | None, info, eval_seconds: float) -> dict:
        seconds = time.time() - self.started
        per_step = (seconds - self.setup - self.first_step - eval_seconds) / max(step - 1, 1)
        best = self.task.best_metric
        values = [e[best] for e in self.evaluations if best in e]
        return {
            "train_split": info.train_split, "eval_split": info.eval_split,
            f"final_{best}": values[-1], f"best_{best}": (max if self.task.best_mode == "max" else min)(values),
            "final_train_loss": float("nan") if diverged_at is not None else self.curve[-1][1],
            "diverged": diverged_at is not None, "diverged_at_step": diverged_at, "steps": step,
            "seconds": seconds, "timing": {"setup": self.setup, "first_step": self.first_step,
                                           "per_step": per_step, "evaluations": eval_seconds},
            "train_loss_curve": self.curve, "evaluations": self.evaluations,
        }


def _window_mean(values: list) -> float:
    """The mean of a logging window's per-step values, accumulated in float64: the same number whether every value
    came from the devices (float32) or the window's first steps came from a checkpoint after a stop (Python floats,
    ``host_window``), so a resumed run logs exactly what an uninterrupted one does."""
    return float(np.mean(np.asarray(values, dtype=np.float64)))


def host_window(pending: list) -> list[dict]:
    """The not-yet-logged per-step metrics as JSON-able floats (carried in the checkpoint across a preemption)."""
    return [{k: float(v) for k, v in m.items()} for m in jax.device_get(pending)]
