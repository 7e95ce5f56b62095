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
- its heartbeat lies more than those 5 minutes in the future of this host's clock: the clocks of the two hosts
  disagree too much to judge its age (synchronised clocks differ by well under a second), so it is treated like a
  lock that has expired — a live holder whose clock runs that far ahead loses the lock and warns at its next
  heartbeat;
- the file is empty or not a lock (a run that failed while writing it, e.g. on a full disk; a live holder always
  writes it whole, see below).

Otherwise the job stops in one line naming the holder and when the lock expires. A different job id alone is no
evidence: two jobs of one user may share a workdir by mistake, which is what the lock is for.

The lock is written whole, and exclusively: of two jobs starting at once (or taking over one stale lock at once)
exactly one wins and the other stops with the "in use" error naming the winner.

- On a local or network filesystem it is written beside the target and hard-linked into place (``link`` fails
  when the target exists) or renamed over a lock taken over.
- On ``gs://`` it is one object written with a generation precondition (``ObjectLockFile``): created with
  ``ifGenerationMatch=0`` (only if no object exists), taken over, renewed and removed only if the object is still the
  generation this job read or wrote last, so GCS itself refuses the loser's write (412) instead of the last write
  winning.

``release`` never raises: a lock that cannot be removed (the workdir became unwritable) is left with a warning, and
the next run takes it over (dead process, or expired heartbeat), so the error that ended the run stays the one
reported.
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
from layerscale_jax.runtime import stop_signals
from layerscale_jax.storage.workdir import WorkdirError, _cause

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


class ObjectLockFile:
    """An object on a bucket (``gs://``) written and deleted only under a generation precondition, through
    TensorStore's kvstore for the bucket — the one orbax writes the checkpoints' arrays with
    (``gcs_utils.get_kvstore_for_gcs``: the ``gcs`` driver, or ``gcs_grpc`` with ``TENSORSTORE_GCS_BACKEND``).

    Every object has a generation, and a write or delete given ``if_equal=G`` happens only if the object's current
    generation is ``G``; ``NO_OBJECT`` (TensorStore's ``StorageGeneration::NoValue``) sends ``ifGenerationMatch=0``:
    only if there is no object. A failed precondition (GCS answers 412) comes back as an empty generation, not an
    error. Storage failures raise ``OSError``."""

    NO_OBJECT = b"\x02"

    def __init__(self, path):
        import tensorstore as ts
        from orbax.checkpoint._src.path import gcs_utils

        self._spec = gcs_utils.get_kvstore_for_gcs(os.fspath(path))
        self._open = ts.KvStore.open

    def _call(self, what: str, operation):
        try:
            return operation(self._open(self._spec).result()).result()
        except ValueError as err:                  # TensorStore's I/O failures (absl status errors)
            raise OSError(f"{what} failed: {err}") from err

    def read(self) -> tuple[bytes | None, bytes]:
        """``(content, generation)``; ``(None, NO_OBJECT)`` when there is no object."""
        result = self._call("reading", lambda store: store.read(""))
        return (result.value if result.state == "value" else None), result.stamp.generation

    def write(self, data: bytes, if_generation: bytes) -> bytes | None:
        """Write the whole object if its generation is ``if_generation``: the new generation, or None when the
        precondition failed (another writer came first)."""
        return self._call("writing", lambda store: store.write("", data, if_equal=if_generation)).generation or None

    def delete(self, if_generation: bytes) -> bool:
        """Delete the object if its generation is ``if_generation``; False when the precondition failed."""
        return bool(self._call("deleting", lambda store: store.write("", None, if_equal=if_generation)).generation)


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
        self._object = ObjectLockFile(self.path) if is_url(self.path) else None
        self._seen: bytes | None = None              # on gs://: the lock object's generation when last read
        self._generation: bytes | None = None        # on gs://: the generation this job wrote last

    # -- reading -------------------------------------------------------------------------------------------------
    def _read(self) -> tuple[dict | None, str | None]:
        """``(holder, None)``, ``(None, None)`` when there is no lock, ``(None, what is wrong)`` for a damaged one."""
        if self._object is not None:
            data, self._seen = self._object.read()
            if data is None:
                return None, None
            text = data.decode("utf-8", "replace")
        else:
            try:
                text = self.path.read_bytes().decode("utf-8", "replace")     # random bytes are a damaged lock too
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
        if -age > STALE_AFTER_HEARTBEATS * every:
            return (f"its last heartbeat is {-age:.0f} s in the future of this host's clock (more than "
                    f"{STALE_AFTER_HEARTBEATS} × {every:g} s): a clock that far off cannot tell whether its job lives")
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
        stop_signals.before_exit(self.release)    # a stop that ends the process from its watcher releases it too
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
            when = f"{age:.0f} s ago" if age >= 0 else f"{-age:.0f} s in the future of this host's clock"
            expiry = (f", last heartbeat {when}; taken over automatically once it is older than "
                      f"{STALE_AFTER_HEARTBEATS * every:g} s")
        return WorkdirError(
            f"workdir {self.path.parent} is in use by process {holder.get('pid')} on host {holder.get('host')} "
            f"(started {holder.get('started')}{expiry}); wait for it, or delete {self.path} if that job is gone")

    def _write(self, replace: bool) -> None:
        text = json.dumps(self._record)
        try:
            if self._object is not None:
                self._write_object(text, replace)
            else:
                self._write_local(text, replace)
        except OSError as err:
            raise WorkdirError(f"--workdir {self.path.parent} cannot be written ({_cause(err)}); give a directory "
                               "this user can write") from err

    def _write_object(self, text: str, replace: bool) -> None:
        """Create the object only if there is none, or replace exactly the lock this job read (``_read`` kept its
        generation); losing either race to another job is its "in use" error."""
        generation = self._object.write(text.encode(), self._seen if replace else ObjectLockFile.NO_OBJECT)
        if generation is None:
            holder, _ = self._read()
            raise self._in_use(holder or {})
        self._generation = generation

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
        if self._object is not None:
            record = dict(self._record, heartbeat=_utc(self._clock()))
            generation = self._object.write(json.dumps(record).encode(), self._generation)
            if generation is not None:
                self._record, self._generation = record, generation
                return True
            holder, _ = self._read()
        else:
            holder, _ = self._read()
            if holder is not None and holder.get("token") == self._token:
                self._record["heartbeat"] = _utc(self._clock())
                write_text_atomically(self.path, json.dumps(self._record))
                return True
        log.warning("%s was taken over by process %s on host %s: this job no longer holds the workdir", self.path,
                    (holder or {}).get("pid"), (holder or {}).get("host"))
        return False

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
        stop_signals.discard_before_exit(self.release)
        self._stop_heartbeat.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if not self.held:
            return
        self.held = False
        try:
            if self._object is not None:
                self._object.delete(self._generation)          # not if another job has taken it over since
            else:
                holder, _ = self._read()
                if holder is not None and holder.get("token") == self._token:
                    self.path.unlink()
        except OSError as err:
            log.warning("could not remove %s (%s); the next run takes it over", self.path, _cause(err))
