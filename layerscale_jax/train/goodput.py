"""Where a run's hours went: a goodput account of every attempt (the first start, each resume), in
``WORKDIR/goodput.jsonl``, and the run's goodput over all attempts, in ``results.json``, ``lsj.load_run(...).goodput``,
TensorBoard (``WORKDIR/tensorboard/goodput``) and ``python -m layerscale_jax.train.goodput WORKDIR``.

An attempt's wall time is cut into consecutive intervals, each charged to one cause, so the causes sum to the wall
time (to float rounding). The causes, with the ``BadputType`` of Google's ml-goodput-measurement each stands for:

  startup      process start → the train entry (``train_and_evaluate``): the interpreter, imports and JAX's
               backend, less the distributed connect; only when the process is the train command (else 0: a call
               from a notebook starts its attempt at the call).                            TPU_INITIALIZATION
  connect      the distributed connect of a multi-process job (``jax.distributed.initialize``: waiting for every
               process to reach the coordinator), timed by the train command.              TPU_INITIALIZATION
  setup        the workdir's checks, mesh, model, optimizer, the input pipeline and a new state.  TRAINING_PREP
  restore      reading the checkpoint a resume starts from.                   UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME
  compile      compiling the train step before the first step.                                 PROGRAM_STARTUP
  input_wait   the loop waiting for the input pipeline (``feed.Batches``).                   DATA_LOADING_SYNC
  productive   train steps first trained in this attempt: goodput.
  redone       train steps an earlier attempt had trained already (past the checkpoint this one resumed from).
                                                                               WASTED_PROGRESS_FROM_DISRUPTION
  evaluation   the evaluations (and, at the first, their step's compile).                  CUSTOM_BADPUT_EVENTS
  checkpoint   time the loop was blocked by checkpoint saves (an async save's writes overlap the next steps).
                                                                              UNPRODUCTIVE_CHECKPOINT_SAVE_TIME
  other        the rest: results, closing the logs and the input, an interrupted save's cleanup.       OTHER

Step time is taken on the host, where steps are dispatched, one step at a time (from the end of one to the end of
the next, its logging included, as ml-goodput-measurement does from step start to step start); the loop waits
for the devices before each evaluation and checkpoint, so the time the devices still spent on queued steps is
charged to the steps. A stop's save may still include the queued steps' device time (a few steps at most).

Process 0 writes one line per record, flushed when written: after the workdir's checks, the restore and the
compile, at every logging window, evaluation and checkpoint, and at the attempt's end (``"final": true``). Each
record holds the attempt's cumulative seconds by cause up to its time, so an attempt killed without its end (kill
-9, a lost VM) counts up to its last record, and a torn last line is skipped. A later attempt reads the earlier
ones to know the highest step already trained (``reached``): its steps up to there are ``redone``.

Goodput is productive time / wall time, summed over all attempts; each badput is its cause's time / wall time.
Other processes of a job write nothing: one account per run. Record mode (``train_and_record``) keeps none.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time

from layerscale_jax.paths import as_path, is_url

FILE = "goodput.jsonl"
CAUSES = ("startup", "connect", "setup", "restore", "compile", "input_wait", "productive", "redone", "evaluation",
          "checkpoint", "other")
BADPUT = tuple(c for c in CAUSES if c != "productive")
ML_GOODPUT = {"startup": "TPU_INITIALIZATION", "connect": "TPU_INITIALIZATION", "setup": "TRAINING_PREP", "restore":
              "UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME", "compile": "PROGRAM_STARTUP", "input_wait": "DATA_LOADING_SYNC",
              "redone": "WASTED_PROGRESS_FROM_DISRUPTION", "evaluation": "CUSTOM_BADPUT_EVENTS",
              "checkpoint": "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME", "other": "OTHER"}
log = logging.getLogger(__name__)
_connect_seconds = 0.0     # this process's distributed connect, set by the train command (``connected``)
BUCKET_WRITE_SECS = 10     # on an object store (gs://) the file is rewritten whole, at most this often (and at the end)


def process_start_time() -> float | None:
    """When this process started (Linux: ``/proc``), if it is the train command; else None."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is None or not main.name.startswith("layerscale_jax."):
        return None
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])        # field 22: start time, clock ticks after boot
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def connected(seconds: float) -> None:
    """The train command's distributed connect took ``seconds``: charged to ``connect``, not ``startup``."""
    global _connect_seconds
    _connect_seconds = seconds


def read_attempts(path) -> list[dict]:
    """The last record of each attempt in ``goodput.jsonl`` (a torn line skipped), in attempt order."""
    path = as_path(path)
    if not path.exists():
        return []
    last: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "attempt" in record:
            last[record["attempt"]] = record
    return [last[n] for n in sorted(last)]


def summarize(attempts: list[dict]) -> dict | None:
    """The run's account over ``attempts`` (``read_attempts``): ``goodput`` (productive / wall), ``badput`` (each
    cause / wall), ``seconds`` by cause, ``wall_seconds``, ``attempts``, ``redone_steps``, ``unfinished_attempts``
    (those without their end record, counted up to their last record). None without an attempt."""
    if not attempts:
        return None
    seconds = {c: sum(a["seconds"].get(c, 0.0) for a in attempts) for c in CAUSES}
    wall = sum(a["wall_seconds"] for a in attempts)
    share = (lambda s: s / wall) if wall > 0 else (lambda s: 0.0)
    return {"goodput": share(seconds["productive"]), "badput": {c: share(seconds[c]) for c in BADPUT},
            "wall_seconds": wall, "seconds": seconds, "attempts": len(attempts),
            "redone_steps": sum(a["redone_steps"] for a in attempts),
            "unfinished_attempts": sum(not a["final"] for a in attempts)}


def read(workdir) -> dict | None:
    """The account of the run in ``workdir`` (``summarize``), None if it has none."""
    return summarize(read_attempts(as_path(workdir) / FILE))


class Goodput:
    """This attempt's account, kept by process 0 (``enabled``; elsewhere every call does nothing). Made at the
    train entry; ``begin`` once the workdir is known to be trained in."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        now = time.time()
        started = process_start_time()
        self.started = started if started is not None and started <= now else now
        self.mark = now
        self.seconds = dict.fromkeys(CAUSES, 0.0)
        connect = _connect_seconds if started is not None else 0.0      # within startup's interval only
        self.seconds["connect"] = min(connect, now - self.started)
        self.seconds["startup"] = now - self.started - self.seconds["connect"]
        self.path = None
        self.step = self.start_step = 0
        self.reached = 0                  # the highest step earlier attempts trained
        self.redone_steps = 0
        self.waited = 0.0                 # the input pipeline's wait counter when last read
        self.earlier: list[dict] = []
        self._lines = ""                  # on an object store: the file's content
        self._written = 0.0

    def begin(self, workdir) -> None:
        """Start this attempt's records in ``workdir``: the earlier attempts are read, the time so far is setup."""
        if not self.enabled:
            return
        self.path = as_path(workdir) / FILE
        self.earlier = read_attempts(self.path)
        self.attempt = 1 + max((a["attempt"] for a in self.earlier), default=0)
        self.reached = max((a["step"] for a in self.earlier), default=0)
        if is_url(self.path) and self.path.exists():
            self._lines = self.path.read_text()
        self.spent("setup")
        self.record()

    def spent(self, cause: str) -> None:
        """Charge the time since the last charge to ``cause``."""
        if self.enabled:
            now = time.time()
            self.seconds[cause] += now - self.mark
            self.mark = now

    def started_at(self, step: int, waited: float) -> None:
        """The loop starts after ``step``; ``waited``: the input's wait counter now (``feed.Batches.waited_total``)."""
        self.step = self.start_step = step
        self.waited = waited

    def trained(self, step: int, waited: float, wait_for=None) -> None:
        """Charge the time since the last charge to train step ``step`` (productive, or redone if an earlier attempt
        trained it), less the input wait since (``waited``: ``feed.Batches.waited_total``). ``wait_for``: outputs
        to wait for first (before an evaluation or a checkpoint, so their time is theirs)."""
        if not self.enabled:
            return
        if wait_for is not None:
            import jax
            jax.block_until_ready(wait_for)
        now = time.time()
        elapsed, self.mark = now - self.mark, now
        wait = min(max(waited - self.waited, 0.0), elapsed)
        self.waited = waited
        self.seconds["input_wait"] += wait
        if step > self.step:                   # the steps after self.step up to step
            redone = max(0, min(step, self.reached) - self.step)
            self.redone_steps += redone
            redone_share = redone / (step - self.step)
            self.step = step
        else:                                  # waiting for step's device work: that step's time
            redone_share = 1.0 if self.step <= self.reached else 0.0
        self.seconds["redone"] += (elapsed - wait) * redone_share
        self.seconds["productive"] += (elapsed - wait) * (1.0 - redone_share)

    def account(self, final: bool = False) -> dict:
        """This attempt's record now (without charging the time since the last charge)."""
        return {"attempt": self.attempt, "started": self.started, "time": self.mark, "start_step": self.start_step,
                "step": self.step, "reached_before": self.reached, "redone_steps": self.redone_steps,
                "wall_seconds": self.mark - self.started, "seconds": dict(self.seconds), "final": final}

    def record(self, final: bool = False) -> None:
        """Append this attempt's record (on an object store: rewrite the file, at most every ``BUCKET_WRITE_SECS``
        but at the end)."""
        if not self.enabled or self.path is None:
            return
        line = json.dumps(self.account(final)) + "\n"
        if not is_url(self.path):
            with open(self.path, "a") as f:
                f.write(line)
                f.flush()
            return
        self._lines += line
        if final or time.time() - self._written >= BUCKET_WRITE_SECS:
            self.path.write_text(self._lines)
            self._written = time.time()

    def summary(self) -> dict | None:
        """The run's account: the earlier attempts and this one up to its last charge (``summarize``)."""
        if not self.enabled or self.path is None:
            return None
        return summarize(self.earlier + [self.account(final=True)])        # this one: not an unfinished one

    def end(self, tb_dir=None) -> None:
        """The attempt's end: the time since the last charge is ``other``; the final record; the run's goodput and
        badput in TensorBoard (``tb_dir``/goodput, at the attempt's last step)."""
        if not self.enabled or self.path is None:
            return
        self.spent("other")
        try:
            self.record(final=True)
            if tb_dir is not None:
                _write_events(tb_dir, self.step, self.summary())
        except OSError as err:             # never hide the error or the stop that is ending the attempt
            log.warning("writing the goodput account to %s failed (%s)", self.path, err)


def _write_events(tb_dir, step: int, summary: dict) -> None:
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.record_writer import directory_check
    from tensorboardX.summary import scalar

    directory = f"{tb_dir}/goodput"
    directory_check(directory)
    writer = EventsWriter(f"{directory}/events")
    wall = time.time()
    writer.write_event(Event(wall_time=wall, step=step, summary=scalar("goodput", summary["goodput"])))
    for cause, share in summary["badput"].items():
        writer.write_event(Event(wall_time=wall, step=step, summary=scalar(f"badput/{cause}", share)))
    writer.close()


def describe(summary: dict | None, attempts: list[dict]) -> str:
    """The account as a table: one row per attempt and the run's total, seconds by cause; goodput and badput."""
    if summary is None:
        return "no goodput account (no goodput.jsonl: a run of an earlier version, or not started)"
    head = ["attempt", "steps", "wall s", *CAUSES, "redone steps"]
    rows = [[f"{a['attempt']}{'' if a['final'] else ' (killed)'}", f"{a['start_step']}-{a['step']}",
             f"{a['wall_seconds']:.1f}", *(f"{a['seconds'].get(c, 0.0):.1f}" for c in CAUSES),
             str(a["redone_steps"])] for a in attempts]
    rows.append(["total", "", f"{summary['wall_seconds']:.1f}", *(f"{summary['seconds'][c]:.1f}" for c in CAUSES),
                 str(summary["redone_steps"])])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [head, *rows]]
    badput = ", ".join(f"{c} {s:.1%}" for c, s in sorted(summary["badput"].items(), key=lambda kv: -kv[1]) if s)
    lines.append(f"goodput {summary['goodput']:.1%} of {summary['wall_seconds']:.1f} s over "
                 f"{summary['attempts']} attempt(s); badput: {badput or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m layerscale_jax.train.goodput WORKDIR", file=sys.stderr)
        return 2
    attempts = read_attempts(as_path(argv[0]) / FILE)
    print(describe(summarize(attempts), attempts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
