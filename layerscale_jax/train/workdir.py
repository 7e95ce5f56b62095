"""The workdir around a run: a lock against two jobs at once, the stored config, the metrics log after a resume.

Every path is an ``etils.epath`` path, so a workdir may be local or ``gs://...``; only process 0 writes.
"""
from __future__ import annotations

import json
import os
import socket
import time

from etils import epath

from layerscale_jax.cli import UserError
from layerscale_jax.train.checkpoint import as_path

# Config fields that may differ between the run that wrote a workdir and the run that resumes it: they change how
# long the run goes on, what it logs, how it is laid out on devices, not what the checkpoints hold.
RESUMABLE_CHANGES = (
    "train.steps", "train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
    "train.stop_after_steps", "train.nonfinite", "train.eval_batch_size", "train.mesh.", "train.compilation_cache_dir",
    "data.num_workers", "data.prefetch",
)


class WorkdirError(UserError):
    """The workdir cannot be used as asked (another job holds it, or it belongs to a different experiment)."""


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(stored: dict, current: dict) -> tuple[list[str], list[str]]:
    """``(refused, accepted)``: the dotted fields whose values differ, as ``field: old → new`` lines."""
    old, new = _flatten(stored), _flatten(current)
    refused, accepted = [], []
    for field in sorted(set(old) | set(new)):
        if old.get(field, "<absent>") == new.get(field, "<absent>"):
            continue
        line = f"{field}: {old.get(field, '<absent>')!r} → {new.get(field, '<absent>')!r}"
        harmless = any(field == f or (f.endswith(".") and field.startswith(f)) for f in RESUMABLE_CHANGES)
        (accepted if harmless else refused).append(line)
    return refused, accepted


def check_stored_config(workdir: epath.Path, config_json: dict, has_checkpoints: bool) -> list[str]:
    """Compare ``config_json`` with the config stored in ``workdir`` (writing it on the first run).

    Raises ``WorkdirError`` listing the fields that make the checkpoints unusable; returns the accepted changes.
    """
    path = workdir / "config.json"
    if path.exists() and has_checkpoints:
        refused, accepted = config_changes(json.loads(path.read_text()), config_json)
        if refused:
            raise WorkdirError(
                f"workdir {workdir} holds a run of a different config ({'; '.join(refused)}); resume it with the "
                f"stored config ({path}) or use a new --workdir")
    else:
        accepted = []
    path.write_text(json.dumps(config_json, indent=2))
    return accepted


class WorkdirLock:
    """``<workdir>/lock.json`` held by process 0 of the running job: ``{host, pid, started}``.

    A lock left by a dead process on this host is taken over; one held by a live process, or by another host,
    stops the run with the holder's name (delete the file if that job is gone).
    """

    def __init__(self, workdir):
        self.path = as_path(workdir) / "lock.json"
        self.held = False

    def _holder(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def acquire(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
        holder = self._holder()
        if holder is not None and not self._is_stale(holder):
            raise WorkdirError(
                f"workdir {self.path.parent} is in use by process {holder.get('pid')} on host {holder.get('host')} "
                f"(started {holder.get('started')}); wait for it, or delete {self.path} if that job is gone")
        text = json.dumps(me)
        if "://" not in str(self.path) and holder is None:
            try:   # exclusive create on local filesystems: two jobs starting at once cannot both win
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return self.acquire()
            with os.fdopen(fd, "w") as f:
                f.write(text)
        else:
            self.path.write_text(text)
        self.held = True

    @staticmethod
    def _is_stale(holder: dict) -> bool:
        if holder.get("host") != socket.gethostname():
            return False
        try:
            os.kill(int(holder.get("pid", -1)), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError):
            return False
        return int(holder.get("pid", -1)) == os.getpid()

    def release(self) -> None:
        if self.held:
            holder = self._holder()
            if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                self.path.unlink()
            self.held = False


def truncate_metrics(path: epath.Path, last_step: int) -> None:
    """Drop the records after ``last_step`` (logged by a run that was killed before its next checkpoint), so the
    resumed run appends exactly what an uninterrupted run would have written."""
    if not path.exists():
        return
    lines = path.read_text().splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line)["step"] <= last_step]
    if len(kept) != len(lines):
        path.write_text("".join(line + "\n" for line in kept))
