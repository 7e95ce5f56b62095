"""``<workdir>/lock.json``: one job at a time in a workdir, and a lock that expires when its job is gone.

Process 0 of the running job holds the lock and renews a heartbeat in it from a background thread, every
``HEARTBEAT_SECONDS`` (one small whole-object write a minute: cheap on GCS, off the loop thread)::

    {"host": ..., "pid": ..., "token": ..., "started": ..., "heartbeat": "2026-12-04T17:00:00Z",
     "heartbeat_every": 60, "job": {"scheduler": "slurm", "id": "812", "restart": "1"}}

A job that finds a lock takes it over, with one line saying why, when its holder is certainly gone:

- the holder is a process on this host that no longer exists;
- the holder is an earlier run of this same scheduler job — a SLURM requeue (same ``SLURM_JOB_ID``, a higher
  ``SLURM_RESTART_COUNT``) or a torchrun restart (same ``TORCHELASTIC_RUN_ID``, another
  ``TORCHELASTIC_RESTART_COUNT``): the scheduler never runs two incarnations of one job at once;
- its heartbeat is older than ``STALE_AFTER_HEARTBEATS`` heartbeat periods (5 minutes): the job was killed outright
  or its machine was lost, e.g. before a restart on new TPU VMs or a new SLURM job;
- the file is empty or not a lock (a run that failed while writing it, e.g. on a full disk; a live holder always
  writes it whole, see below).

Otherwise the job stops in one line naming the holder and when the lock expires. A different job id alone is no
evidence: two jobs of one user may share a workdir by mistake, which is what the lock is for.

The lock is written whole: on a local or network filesystem beside the target and then hard-linked into place
(an exclusive create: of two jobs starting at once one wins) or renamed over a lock taken over; on an object store
as one object, read back to check that this job's write is the one that stayed. ``release`` never raises: a lock
that cannot be removed (the workdir became unwritable) is left with a warning, and the next run takes it over
(dead process, or expired heartbeat), so the error that ended the run stays the one reported.
"""
from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Callable, Mapping

from layerscale_jax.paths import as_path, is_url, write_text_atomically
from layerscale_jax.train.workdir import WorkdirError, _cause

HEARTBEAT_SECONDS = 60.0
STALE_AFTER_HEARTBEATS = 5

log = logging.getLogger(__name__)


def scheduler_job(environ: Mapping[str, str]) -> dict | None:
    """The scheduler's job this process runs in and its incarnation, where the scheduler gives one: SLURM
    (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``: raised by each requeue) or torchrun (``TORCHELASTIC_RUN_ID``,
    unless the default ``none``, and ``TORCHELASTIC_RESTART_COUNT``); None elsewhere (Cloud TPU VMs give none)."""
    if environ.get("SLURM_JOB_ID"):
        return {"scheduler": "slurm", "id": environ["SLURM_JOB_ID"], "restart": environ.get("SLURM_RESTART_COUNT", "0")}
    if environ.get("TORCHELASTIC_RUN_ID", "none") not in ("", "none"):
        return {"scheduler": "torchrun", "id": environ["TORCHELASTIC_RUN_ID"],
                "restart": environ.get("TORCHELASTIC_RESTART_COUNT", "0")}
    return None


def _utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_utc(text) -> float | None:
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


class WorkdirLock:
    """``<workdir>/lock.json`` held by process 0 of the running job (see the module docstring).

    ``clock`` (seconds since the epoch) and ``environ`` are the process's unless a test gives its own.
    """

    def __init__(self, workdir, *, clock: Callable[[], float] = time.time, environ: Mapping[str, str] | None = None,
                 heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.path = as_path(workdir) / "lock.json"
        self.held = False
        self._clock = clock
        self._job = scheduler_job(os.environ if environ is None else environ)
        self._heartbeat_seconds = heartbeat_seconds
        self._token = uuid.uuid4().hex
        self._stop_heartbeat = threading.Event()
        self._thread: threading.Thread | None = None
        self._record: dict | None = None

    # -- reading -------------------------------------------------------------------------------------------------
    def _read(self) -> tuple[dict | None, str | None]:
        """``(holder, None)``, ``(None, None)`` when there is no lock, ``(None, what is wrong)`` for a damaged one."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None, None
        if not text.strip():
            return None, "empty"
        try:
            holder = json.loads(text)
        except ValueError:
            return None, f"not JSON ({text[:40]!r})"
        if not isinstance(holder, dict):
            return None, f"not a lock ({text[:40]!r})"
        return holder, None

    def takeover_reason(self, holder: dict) -> str | None:
        """Why ``holder``'s lock may be taken over (see the module docstring), or None when it is live."""
        host, pid = holder.get("host"), holder.get("pid")
        if host == socket.gethostname():
            if pid == os.getpid():
                return "this process holds it"
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return f"its process {pid} on this host is gone"
            except (PermissionError, ValueError, TypeError, OverflowError):
                pass
        job = holder.get("job")
        if (isinstance(job, dict) and self._job is not None and job.get("scheduler") == self._job["scheduler"]
                and job.get("id") == self._job["id"] and job.get("restart") != self._job["restart"]):
            return (f"it belongs to an earlier run of this {job['scheduler']} job {job['id']} (restart "
                    f"{job.get('restart')}; this is restart {self._job['restart']})")
        beat = _parse_utc(holder.get("heartbeat"))
        if beat is None:
            return "it has no heartbeat (an older version wrote it)"
        every = holder.get("heartbeat_every")
        every = float(every) if isinstance(every, (int, float)) and every > 0 else HEARTBEAT_SECONDS
        age = self._clock() - beat
        if age > STALE_AFTER_HEARTBEATS * every:
            return (f"its last heartbeat was {age:.0f} s ago (more than {STALE_AFTER_HEARTBEATS} × {every:g} s): the "
                    f"job holding it is gone")
        return None

    # -- acquiring -----------------------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the lock, taking over one whose holder is gone (one line printed), or raise ``WorkdirError`` naming
        the live holder."""
        holder, damage = self._read()
        if holder is not None:
            reason = self.takeover_reason(holder)
            if reason is None:
                raise self._in_use(holder)
            if reason != "this process holds it":
                print(f"taking over {self.path} from process {holder.get('pid')} on host {holder.get('host')}: "
                      f"{reason}", flush=True)
        elif damage is not None:
            print(f"taking over {self.path}: it is {damage}, left by a run that could not finish writing it",
                  flush=True)
        now = self._clock()
        self._record = {"host": socket.gethostname(), "pid": os.getpid(), "token": self._token,
                        "started": _utc(now), "heartbeat": _utc(now), "heartbeat_every": self._heartbeat_seconds,
                        "job": self._job}
        self._write(replace=holder is not None or damage is not None)
        self.held = True
        self._stop_heartbeat.clear()
        self._thread = threading.Thread(target=self._beat_until_released, name="workdir-lock-heartbeat", daemon=True)
        self._thread.start()

    def _in_use(self, holder: dict) -> WorkdirError:
        every = holder.get("heartbeat_every")
        every = float(every) if isinstance(every, (int, float)) and every > 0 else HEARTBEAT_SECONDS
        beat = _parse_utc(holder.get("heartbeat"))
        expiry = ""
        if beat is not None:
            age = self._clock() - beat
            expiry = (f", last heartbeat {age:.0f} s ago; taken over automatically once it is older than "
                      f"{STALE_AFTER_HEARTBEATS * every:g} s")
        return WorkdirError(
            f"workdir {self.path.parent} is in use by process {holder.get('pid')} on host {holder.get('host')} "
            f"(started {holder.get('started')}{expiry}); wait for it, or delete {self.path} if that job is gone")

    def _write(self, replace: bool) -> None:
        text = json.dumps(self._record)
        try:
            if is_url(self.path):
                self.path.write_text(text)
            else:
                self._write_local(text, replace)
        except OSError as err:
            raise WorkdirError(f"--workdir {self.path.parent} cannot be written ({_cause(err)}); give a directory "
                               "this user can write") from err
        holder, _ = self._read()                   # the other of two jobs that wrote at once: the last write stays
        if holder is None or holder.get("token") != self._token:
            raise self._in_use(holder or {})

    def _write_local(self, text: str, replace: bool) -> None:
        tmp = os.fspath(self.path) + f".{self._token}.tmp"
        try:
            with open(tmp, "w") as f:
                f.write(text)
            if replace:
                os.replace(tmp, self.path)
                return
            try:
                os.link(tmp, self.path)            # exclusive, and never visible half written
            except FileExistsError:
                holder, _ = self._read()
                raise self._in_use(holder or {}) from None
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    # -- heartbeat and release -----------------------------------------------------------------------------------
    def beat(self) -> bool:
        """Renew the heartbeat once; False (with a warning) when another job has taken the lock over."""
        holder, _ = self._read()
        if holder is None or holder.get("token") != self._token:
            log.warning("%s was taken over by process %s on host %s: this job no longer holds the workdir", self.path,
                        (holder or {}).get("pid"), (holder or {}).get("host"))
            return False
        self._record["heartbeat"] = _utc(self._clock())
        write_text_atomically(self.path, json.dumps(self._record))
        return True

    def _beat_until_released(self) -> None:
        failing = False
        while not self._stop_heartbeat.wait(self._heartbeat_seconds):
            try:
                if not self.beat():
                    return
                failing = False
            except OSError as err:                 # storage unreachable for a while: try again next period
                if not failing:
                    log.warning("could not renew the heartbeat in %s (%s); retrying every %g s", self.path,
                                _cause(err), self._heartbeat_seconds)
                failing = True

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if this job still holds it. Never raises (module docstring)."""
        self._stop_heartbeat.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.held:
            return
        self.held = False
        try:
            holder, _ = self._read()
            if holder is not None and holder.get("token") == self._token:
                self.path.unlink()
        except OSError as err:
            log.warning("could not remove %s (%s); the next run takes it over", self.path, _cause(err))
