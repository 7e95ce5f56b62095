"""The workdir lock (``storage.workdir_lock``): a requeue onto a new host takes over a lock whose heartbeat expired, a
requeue of the same scheduler job takes over its earlier run's lock at once, a live lock refuses, an empty or
garbled lock is taken over in one line (no RecursionError, also through ``lsj.fit``), a failed write leaves no
lock, the lock's release never hides the error that ended a run, and on ``gs://`` the lock object is created,
taken over, renewed and removed under a generation precondition (of two racing jobs exactly one wins)."""
import errno
import json
import logging
import os
import socket
import threading
import time

import pytest

import layerscale_jax as lsj
from layerscale_jax.storage.workdir import WorkdirError
from layerscale_jax.storage.workdir_lock import (HEARTBEAT_SECONDS, STALE_AFTER_HEARTBEATS, ObjectLockFile,
                                                 WorkdirLock, scheduler_job)
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config

from cloud_bucket import cloud_bucket
from test_train import tiny_config

NOW = 1_800_000_000.0                     # the tests' clock: no test waits for real time


def utc(seconds):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def write_lock(workdir, *, host="t1v-n-0a1b2c3d-w-0", pid=4242, heartbeat_age=0.0, job=None):
    (workdir / "lock.json").write_text(json.dumps({
        "host": host, "pid": pid, "token": "theirs", "started": utc(NOW - 3600), "heartbeat": utc(NOW - heartbeat_age),
        "heartbeat_every": HEARTBEAT_SECONDS, "job": job}))


def holder(workdir):
    return json.loads((workdir / "lock.json").read_text())


def test_a_lock_from_another_host_whose_heartbeat_expired_is_taken_over_in_one_line(tmp_path, capsys):
    """A requeue onto new hosts after a hard kill (lost VM): the old host's lock stopped beating."""
    write_lock(tmp_path, heartbeat_age=STALE_AFTER_HEARTBEATS * HEARTBEAT_SECONDS + 1)
    lock = WorkdirLock(tmp_path, clock=lambda: NOW, environ={})
    lock.acquire()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "taking over" in out[0] and "t1v-n-0a1b2c3d-w-0" in out[0]
    assert "last heartbeat was 301 s ago" in out[0]
    assert holder(tmp_path)["pid"] == os.getpid() and holder(tmp_path)["host"] == socket.gethostname()
    lock.release()
    assert not (tmp_path / "lock.json").exists()


def test_a_live_lock_from_another_host_is_refused_naming_the_holder_and_its_expiry(tmp_path):
    write_lock(tmp_path, heartbeat_age=STALE_AFTER_HEARTBEATS * HEARTBEAT_SECONDS - 1)
    with pytest.raises(WorkdirError, match=r"in use by process 4242 on host t1v-n-0a1b2c3d-w-0 .*last heartbeat "
                                           r"299 s ago; taken over automatically once it is older than 300 s"):
        WorkdirLock(tmp_path, clock=lambda: NOW, environ={}).acquire()
    assert holder(tmp_path)["token"] == "theirs"                       # untouched


def test_a_lock_whose_heartbeat_lies_beyond_the_expiry_in_the_future_is_taken_over_saying_so(tmp_path, capsys):
    """Clock skew: another host's heartbeat 72 years ahead was never taken over ("last heartbeat -2274377736 s
    ago"). Beyond the expiry period in the future, no age can be judged: taken over, the line says why."""
    write_lock(tmp_path, heartbeat_age=-2274377736)
    lock = WorkdirLock(tmp_path, clock=lambda: NOW, environ={})
    lock.acquire()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "taking over" in out[0]
    assert "last heartbeat is 2274377736 s in the future of this host's clock (more than 5 × 60 s)" in out[0]
    assert holder(tmp_path)["pid"] == os.getpid()
    lock.release()


def test_a_lock_whose_heartbeat_is_a_little_in_the_future_is_live(tmp_path):
    """A small skew within the expiry period: the holder is live, and the refusal says the heartbeat is ahead."""
    write_lock(tmp_path, heartbeat_age=-(STALE_AFTER_HEARTBEATS * HEARTBEAT_SECONDS - 1))
    with pytest.raises(WorkdirError, match=r"last heartbeat 299 s in the future of this host's clock; taken over "):
        WorkdirLock(tmp_path, clock=lambda: NOW, environ={}).acquire()
    assert holder(tmp_path)["token"] == "theirs"


def test_a_requeue_of_the_same_slurm_job_takes_over_its_earlier_runs_lock_at_once(tmp_path, capsys):
    """``scontrol requeue`` (or --requeue after a node failure): same SLURM_JOB_ID, SLURM_RESTART_COUNT raised, maybe
    another node; the earlier run's heartbeat is still fresh."""
    write_lock(tmp_path, host="gpu-node-17", job={"scheduler": "slurm", "id": "812", "restart": "0"})
    lock = WorkdirLock(tmp_path, clock=lambda: NOW, environ={"SLURM_JOB_ID": "812", "SLURM_RESTART_COUNT": "1"})
    lock.acquire()
    assert "earlier run of this slurm job 812 (restart 0; this is restart 1)" in capsys.readouterr().out
    assert holder(tmp_path)["job"] == {"scheduler": "slurm", "id": "812", "restart": "1"}
    lock.release()


@pytest.mark.parametrize("environ", [{"SLURM_JOB_ID": "813"}, {"SLURM_JOB_ID": "812", "SLURM_RESTART_COUNT": "0"}],
                         ids=["another_job", "same_incarnation"])
def test_another_live_job_or_the_same_incarnation_is_refused(tmp_path, environ):
    """A different job id is no evidence that the holder is gone (two jobs on one workdir is what the lock is for)."""
    write_lock(tmp_path, host="gpu-node-17", job={"scheduler": "slurm", "id": "812", "restart": "0"})
    with pytest.raises(WorkdirError, match="in use by process 4242 on host gpu-node-17"):
        WorkdirLock(tmp_path, clock=lambda: NOW, environ=environ).acquire()


def test_scheduler_job_ids_of_slurm_and_torchrun():
    assert scheduler_job({"SLURM_JOB_ID": "5"}) == {"scheduler": "slurm", "id": "5", "restart": "0"}
    assert scheduler_job({"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "2"}) == {
        "scheduler": "torchrun", "id": "job7", "restart": "2"}
    assert scheduler_job({"TORCHELASTIC_RUN_ID": "none"}) is None           # torchrun's default id names no job
    assert scheduler_job({}) is None


@pytest.mark.parametrize("text", ["", "\n", '{"host": "t1v', "[]", '"lock"', b"\x8f\xfe\x00\xc3(\x9d\xa0random"],
                         ids=["empty", "newline", "torn", "list", "string", "random_bytes"])
def test_an_empty_or_garbled_lock_is_taken_over_in_one_line(tmp_path, capsys, text):
    """Random bytes (not UTF-8) were a 35-line UnicodeDecodeError."""
    (tmp_path / "lock.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    lock = WorkdirLock(tmp_path)
    lock.acquire()
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"taking over {tmp_path / 'lock.json'}: it is ")
    assert holder(tmp_path)["pid"] == os.getpid()
    lock.release()


@pytest.mark.slow
def test_fit_takes_over_an_empty_lock_left_by_a_full_disk(tmp_path, capsys):
    """The issue's case: a disk full at start left a 0-byte lock.json; once space is freed, lsj.fit trains."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "lock.json").write_text("")
    run = lsj.fit(tiny_config("steps=3"), str(workdir))
    assert run.results["steps"] == 3
    assert "it is empty" in capsys.readouterr().out
    assert not (workdir / "lock.json").exists()


def test_a_lock_that_cannot_be_written_is_one_error_and_leaves_no_file(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "lock.json"))

    monkeypatch.setattr(os, "link", full_disk)
    with pytest.raises(WorkdirError, match="cannot be written .*No space left on device"):
        WorkdirLock(tmp_path).acquire()
    assert os.listdir(tmp_path) == []                       # neither a lock nor its temporary file


def test_a_lock_created_by_another_job_at_the_same_moment_is_refused_once(tmp_path, monkeypatch):
    """The exclusive create loses to a job that wrote its lock after we looked: one refusal naming it, no retry loop."""
    real_link = os.link

    def other_job_first(src, dst):
        write_lock(tmp_path, host="other-host", heartbeat_age=0)
        real_link(src, dst)

    monkeypatch.setattr(os, "link", other_job_first)
    with pytest.raises(WorkdirError, match="in use by process 4242 on host other-host"):
        WorkdirLock(tmp_path, clock=lambda: NOW).acquire()


def test_the_heartbeat_renews_the_lock_and_stops_when_another_job_took_it_over(tmp_path, caplog):
    clock = [NOW]
    lock = WorkdirLock(tmp_path, clock=lambda: clock[0], environ={})
    lock.acquire()
    clock[0] += 600
    assert lock.beat() and holder(tmp_path)["heartbeat"] == utc(NOW + 600)
    write_lock(tmp_path, host="other-host")                      # taken over while we were cut off
    with caplog.at_level(logging.WARNING):
        assert not lock.beat()
    assert "taken over by process 4242 on host other-host" in caplog.text
    lock.release()
    assert holder(tmp_path)["host"] == "other-host"              # not ours: left alone


@pytest.mark.slow
def test_the_locks_release_never_hides_the_error_that_ended_the_run(tmp_path, monkeypatch, caplog):
    """Issue 39: the workdir turned unwritable near the end. The run's own error is raised (not the lock's EPERM); the
    lock that could not be removed is left with a warning and the next run takes it over."""
    workdir = tmp_path / "run"

    def unwritable(path, text):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(path))

    path_type = type(WorkdirLock(workdir).path)
    real_unlink = path_type.unlink

    def cannot_unlink(self, *args, **kwargs):
        if self.name != "lock.json":
            return real_unlink(self, *args, **kwargs)
        raise PermissionError(errno.EPERM, "Operation not permitted", os.fspath(self))

    monkeypatch.setattr(loop_lib, "write_text_atomically", unwritable)
    monkeypatch.setattr(path_type, "unlink", cannot_unlink)
    with caplog.at_level(logging.WARNING), pytest.raises(PermissionError, match="results.json"):
        loop_lib.train_and_evaluate(validate_experiment_config(tiny_config("steps=3")), str(workdir))
    assert "could not remove" in caplog.text and (workdir / "lock.json").exists()
    monkeypatch.undo()
    lock = WorkdirLock(workdir)                  # same process: its own lock; another host: after its heartbeat
    lock.acquire()
    lock.release()


def test_a_gs_lock_goes_through_tensorstores_gcs_driver_with_a_generation_precondition(tmp_path):
    """The code path of a real bucket: TensorStore's ``gcs`` kvstore, whose write with the no-object generation is
    GCS's ``ifGenerationMatch=0`` (the fake bucket only swaps the driver for a ``file`` kvstore in its folder, which
    enforces the same preconditions)."""
    assert ObjectLockFile("gs://bucket/run/lock.json")._spec == {"driver": "gcs", "bucket": "bucket",
                                                                 "path": "run/lock.json"}
    with cloud_bucket(tmp_path):
        lock = ObjectLockFile("gs://bucket/run/lock.json")
        assert lock.read() == (None, ObjectLockFile.NO_OBJECT)
        first = lock.write(b"A", ObjectLockFile.NO_OBJECT)
        assert first and lock.write(b"B", ObjectLockFile.NO_OBJECT) is None           # create-only
        assert lock.read() == (b"A", first)
        second = lock.write(b"C", first)
        assert second and lock.write(b"D", first) is None                               # compare-and-swap
        assert not lock.delete(first) and lock.read()[0] == b"C"
        assert lock.delete(second) and lock.read()[0] is None
    assert (tmp_path / "bucket" / "run").is_dir() and not (tmp_path / "bucket" / "run" / "lock.json").exists()


def race(tmp_path, *, stale=None):
    """Two jobs acquire the lock of ``gs://bucket/run``: ``late`` looks first (no lock, or the ``stale`` one) but
    writes only after ``early`` has acquired it — the interleaving where a last-write-wins lock lets both in."""
    with cloud_bucket(tmp_path):
        if stale is not None:
            (tmp_path / "bucket" / "run").mkdir(parents=True)
            (tmp_path / "bucket" / "run" / "lock.json").write_text(stale)
        early = WorkdirLock("gs://bucket/run", clock=lambda: NOW, environ={"SLURM_JOB_ID": "1"})
        late = WorkdirLock("gs://bucket/run", clock=lambda: NOW, environ={"SLURM_JOB_ID": "2"})
        looked, early_done, outcome = threading.Event(), threading.Event(), {}
        write = late._object.write

        def write_after_early(*args):
            looked.set()
            early_done.wait(60)
            return write(*args)

        late._object.write = write_after_early

        def acquire_late():
            try:
                late.acquire()
                outcome["late"] = "acquired"
            except WorkdirError as err:
                outcome["late"] = str(err)

        thread = threading.Thread(target=acquire_late)
        thread.start()
        assert looked.wait(60)
        early.acquire()
        early_done.set()
        thread.join(60)
        stored = json.loads((tmp_path / "bucket" / "run" / "lock.json").read_text())
        early.release()
        late.release()
    return early, outcome["late"], stored


@pytest.mark.parametrize("stale", [None, "", json.dumps({"host": "gone-host", "pid": 1, "token": "theirs",
                                                           "heartbeat": utc(NOW - 3600), "heartbeat_every": 60})],
                         ids=["no lock", "an empty lock", "an expired lock"])
def test_of_two_jobs_racing_for_a_gs_lock_exactly_one_wins_and_the_other_names_it(tmp_path, stale, capsys):
    early, late, stored = race(tmp_path, stale=stale)
    assert late.startswith(f"workdir gs://bucket/run is in use by process {os.getpid()} on host "
                           f"{socket.gethostname()}")
    assert "delete gs://bucket/run/lock.json if that job is gone" in late
    assert stored["token"] == early._token and stored["job"]["id"] == "1"
    assert not (tmp_path / "bucket" / "run" / "lock.json").exists()          # released by its holder


def test_a_gs_lock_taken_over_stops_the_old_holders_heartbeat_and_is_not_removed_by_it(tmp_path, caplog):
    clock = [NOW]
    with cloud_bucket(tmp_path):
        old = WorkdirLock("gs://bucket/run", clock=lambda: clock[0], environ={})
        old.acquire()
        clock[0] += 60
        assert old.beat() and json.loads((tmp_path / "bucket/run/lock.json").read_text())["heartbeat"] == utc(NOW + 60)
        old._record["host"] = "lost-vm"                            # as another host would see it after a hard kill
        old._record["heartbeat"] = utc(NOW - 3600)
        old._generation = old._object.write(json.dumps(old._record).encode(), old._generation)
        new = WorkdirLock("gs://bucket/run", clock=lambda: clock[0], environ={})
        new.acquire()
        with caplog.at_level(logging.WARNING):
            assert not old.beat()
        assert f"taken over by process {os.getpid()} on host {socket.gethostname()}" in caplog.text
        old.release()
        assert json.loads((tmp_path / "bucket/run/lock.json").read_text())["token"] == new._token
        new.release()
        assert not (tmp_path / "bucket/run/lock.json").exists()
