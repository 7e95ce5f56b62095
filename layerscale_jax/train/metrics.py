"""Metrics: ``WORKDIR/metrics.jsonl`` (one JSON object per logged step), TensorBoard event files, console lines."""
from __future__ import annotations

import io
import json
import logging
import sys
import time

import jax
import numpy as np
from etils import epath

from layerscale_jax.paths import CLOUD_SCHEMES, as_path

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
            self._flushed = time.time()

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar
        record = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
        try:
            with self.jsonl_path.open("a") as f:
                f.write(json.dumps(record) + "\n")
            for key, value in scalars.items():
                self.tb.write_event(Event(wall_time=time.time(), step=int(step), summary=scalar(key, float(value))))
            if time.time() - self._flushed > FLUSH_SECS:
                self.flush()
        except OSError as err:
            raise OSError(err.errno, f"writing the metrics of step {step} in {self.jsonl_path.parent} failed "
                                     f"({err.strerror or err})") from err

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
        if self.enabled:
            self.tb.flush()
            self._flushed = time.time()

    def close(self) -> None:
        """Flush and close the event file; a failure is a warning (a failed ``write`` has raised already, and a
        failure while closing must not hide the error that is stopping the run)."""
        if self.enabled:
            try:
                self.tb.close()
            except OSError as err:
                log.warning("closing the TensorBoard event file in %s failed (%s)", self.tb_dir, err)
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
