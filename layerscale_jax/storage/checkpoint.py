"""Orbax checkpoints of the train state, with the data-iterator state, the config and a content seal.

Layout of ``<workdir>/checkpoints`` (any orbax / ``etils.epath`` path, ``gs://`` included):

- ``<step>/``: orbax's checkpoint (async save; the newest ``keep`` and the best by an eval metric are kept): the
  train state and the config. Process ``i`` writes ``state/ocdbt.process_<i>/`` and
  ``state/array_metadatas/process_<i>``; process 0 also writes everything else (the merged index, the metadata).
- ``meta/<step>/data_process_<i>.json``: process ``i``'s data-iterator state, written before the orbax save starts
  (a checkpoint without it is incomplete). ``meta/<step>/window.json``: the per-step metrics logged since the last
  metrics line (so a resumed run's ``metrics.jsonl`` equals an uninterrupted one's); ``meta/<step>/log.json``: how
  many records ``metrics.jsonl`` held at the save and those since the previous save (a log torn or deleted after it
  is rebuilt from them at a resume, or its loss named). ``meta/<step>/checksums.json``:
  the seal, SHA-256 of every file of ``<step>/`` but the two orbax rewrites when it commits the step
  (``_CHECKPOINT_METADATA``, ``commit_success.txt``: times and the commit marker, no train state).
- ``quarantine/<step>/``: checkpoints found corrupt or unsealed at restore, moved aside so that no later save
  collides with them. The move is journalled in ``quarantining.json`` (``paths.move_all``: on a bucket a step moves
  object by object), and a job killed midway has it finished when the next ``Checkpointer`` starts.

Sealing is part of finishing a step: once a process has written its files, it hashes them (on several threads) and
writes ``meta/<step>/digests_process_<i>.json``, before orbax's write barrier (with one process there is no barrier:
process 0 hashes everything below); process 0, after the barrier and orbax's merge, hashes the shared files and any
file no process has hashed, merges everything into ``checksums.json``, and only then does orbax commit the step
(atomic rename, or its commit file on ``gs://``). A committed step without a seal therefore means a job that
stopped in the middle of writing it (or a checkpoint of an older version of this code) and is not trusted.

Restore walks from the newest step back; every process checks its share of the recorded files (threads again) and
every process follows the combined decision: a step whose files do not match its seal (truncated, overwritten, bits
flipped), or that has no seal, is quarantined with one warning line and the previous one is tried. Errors while
reading a checkpoint that passed the check (I/O, collectives) are raised: they are not evidence of a corrupt
checkpoint. When checkpoints exist but none is usable, the run stops.

Saves: a state with a non-finite parameter is never saved; a failed save (disk full, permissions) raises
``CheckpointSaveError`` naming the cause and the last complete checkpoint.
"""
from __future__ import annotations

import errno
import functools
import gc
import json
import logging
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as ocm

from layerscale_jax.checksums import corruption, file_digests, list_files
from layerscale_jax.errors import ConfigError, UserError
from layerscale_jax.orbax_failures import log_orbax_errors_on_one_line, release_waiting_save_threads
from layerscale_jax.paths import as_path, finish_moves, is_url, move_all, write_text_atomically

log = logging.getLogger(__name__)


class NonFiniteStateError(RuntimeError):
    pass


class CheckpointSaveError(UserError):
    """A checkpoint could not be written; the message names the cause and the last complete checkpoint."""


class NoUsableCheckpointError(UserError):
    """Checkpoints exist in the workdir but none of them can be restored."""


def _finite_flag(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


@functools.lru_cache(maxsize=None)
def _finite_fn(mesh):
    out = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(_finite_flag, out_shardings=out)


def all_finite(tree) -> bool:
    """Whether every floating leaf is finite: one jitted reduction to a replicated scalar and one host fetch, so it
    also works on arrays that span processes."""
    shardings = [getattr(x, "sharding", None) for x in jax.tree.leaves(tree)]
    mesh = next((s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)), None)
    return bool(_finite_fn(mesh)(tree))


def broadcast_from_primary(value):
    """Process 0's ``value`` (a JSON-able object) on every process."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.array(len(data), np.int64)))
    padded = np.zeros(size, np.uint8)
    padded[:min(size, len(data))] = data[:size]
    return json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))).decode())


def gather_from_all(value) -> list:
    """Every process's ``value`` (a JSON-able object), in process order, on every process."""
    if jax.process_count() == 1:
        return [value]
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([len(data)], np.int64))).ravel()
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:len(data)] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:size]).decode()) for row, size in zip(rows, sizes)]


# Files orbax writes or rewrites when it commits the step, after the seal: the commit marker, and the step metadata
# (its commit time). They hold no train state.
REWRITTEN_AT_COMMIT = ("_CHECKPOINT_METADATA", "commit_success.txt")
QUARANTINE_JOURNAL = "quarantining.json"     # the moves of a quarantine until they are all done (paths.move_all)
_TEMPORARY = re.compile(r"\.orbax-checkpoint-tmp[^/]*(?=/|$)")  # an item's directory before orbax finalises the step


def check_free_space(directory: epath.Path, state) -> None:
    """Before an async save starts: ``OSError(ENOSPC)`` on every process when the disk of a local ``directory``
    has less space free than the bytes some process's share of ``state`` takes (orbax's zstd barely shrinks
    trained weights). A save that fills the disk midway fails in orbax's background threads, which print hundreds of
    lines before the error reaches the loop; this catches the common case, a disk already (nearly) full, in one."""
    if is_url(directory):
        return
    need = sum(shard.data.nbytes for leaf in jax.tree.leaves(state) for shard in leaf.addressable_shards
               if shard.replica_id == 0)
    existing = str(directory)
    while not os.path.exists(existing):             # a process whose copy of the directory orbax creates later
        existing = os.path.dirname(existing)
    stat = os.statvfs(existing)
    free = stat.f_bavail * stat.f_frsize
    if not _all_processes_ok(free >= need):
        raise OSError(errno.ENOSPC, f"no space left on device: {_mb(free)} free in {directory}, the state takes "
                                    f"about {_mb(need)}" if free < need else "no space left on another process")


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _own_files(root: epath.Path, process: int) -> list[str]:
    """The files process ``process`` wrote under a step being written: ``<item>/ocdbt.process_<i>/...`` and
    ``<item>/array_metadatas/process_<i>`` (process 0 also writes everything else: the merged index, the metadata).
    Only its own directories are listed (on a bucket, a host lists its own objects, not every host's)."""
    names = []
    for item in (child for child in root.iterdir() if child.is_dir()):
        data, metadata = item / f"ocdbt.process_{process}", item / "array_metadatas" / f"process_{process}"
        if data.exists():
            names += [f"{item.name}/{data.name}/{name}" for name in list_files(data)]
        if metadata.exists():
            names.append(f"{item.name}/array_metadatas/{metadata.name}")
    return names


def _all_processes_ok(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils
    return bool(np.all(multihost_utils.process_allgather(np.array([ok]))))


class _Manager(ocp.CheckpointManager):
    """orbax's manager, minus its own calls to JAX's preemption sync point.

    orbax asks ``multihost_utils.reached_preemption_sync_point(step)`` for every step it saves and again from its
    background finalize thread (for statistics only: our saves are forced). The sync point counts calls in step
    order, and the train loop is its one caller (``runtime.StopSignals``, every step): a late call from another
    thread with an older step could move a process's count back just as the processes agree on where to stop.
    """

    def reached_preemption(self, step: int) -> bool:
        return False


class Checkpointer:
    def __init__(self, directory, *, keep: int, best_metric: str = "test_accuracy", best_mode: str = "max"):
        """Keeps the newest ``keep`` checkpoints and the best by ``best_metric`` (``best_mode`` 'max': higher is
        better, as accuracy; 'min': lower, as a loss)."""
        if best_mode not in ("max", "min"):
            raise ConfigError(f"best_mode={best_mode!r} is not 'max' or 'min'")
        self.directory = as_path(directory)
        self.best_metric = best_metric
        policy = ocm.AnyPreservationPolicy([
            ocm.LatestN(n=keep),
            ocm.BestN(get_metric_fn=lambda metrics: metrics[best_metric], reverse=best_mode == "min", n=1,
                      keep_checkpoints_without_metrics=False),
        ])
        self._in_flight: int | None = None        # the step orbax is writing in the background
        self._barrier = None
        async_options = ocp.AsyncOptions(
            post_finalization_callback=lambda: self._finalized(),
            barrier_sync_fn=self._digest_then_barrier if jax.process_count() > 1 else None)
        # cleanup_tmp_directories: a save cut off (two Ctrl-Cs, a kill) leaves <step>.orbax-checkpoint-tmp*,
        # which orbax removes as the next run starts (it survived a successful rerun). Not on gs://: there orbax
        # writes a step in place and takes every directory without its commit file for one (meta/, quarantine/).
        options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=True,
                                               enable_async_checkpointing=True, async_options=async_options,
                                               cleanup_tmp_directories=not is_url(self.directory))
        if jax.process_index() == 0:
            for source, target in finish_moves(self.directory / QUARANTINE_JOURNAL)[:1]:
                log.warning("moving %s to %s (a quarantine) was interrupted; finished now", source, target)
            if not is_url(self.directory) and self.directory.exists():
                # orbax 0.12.8's cleanup_tmp_directories left <step>.orbax-checkpoint-tmp-<time> in place here.
                import shutil
                for temporary in self.directory.glob("*.orbax-checkpoint-tmp*"):
                    shutil.rmtree(temporary, ignore_errors=True)
        _all_processes_ok(True)                     # before any process lists the steps
        self._set_aside_half_deleted_steps()
        self.manager = _Manager(self.directory, options=options)
        log_orbax_errors_on_one_line()
        self.last_complete: int | None = None     # newest step known to be fully written (restored or saved)
        self.last_save_seconds: float | None = None   # process 0: the last save's time, from its start to its seal
        self._save_started: float | None = None

    def _set_aside_half_deleted_steps(self) -> None:
        """A local step directory without orbax's ``_CHECKPOINT_METADATA`` is what a job killed while orbax deleted
        an old checkpoint leaves (orbax writes that file before it gives the step its final name): it is moved to
        ``quarantine/`` with one warning, instead of orbax logging "Metadata file does not exist" for it on every
        run until the next save deletes it."""
        if is_url(self.directory) or not self.directory.exists():
            return
        half = sorted(int(d.name) for d in self.directory.iterdir() if d.name.isdigit() and d.is_dir()
                      and not (d / "_CHECKPOINT_METADATA").exists())
        for step in half:
            target = self.directory / "quarantine" / str(step)
            if jax.process_index() == 0:
                if target.exists():
                    target.rmtree()
                moves = [(self.directory / str(step), target)]
                if self._meta(step).exists():
                    moves.append((self._meta(step), target / "meta"))
                move_all(self.directory / QUARANTINE_JOURNAL, moves)
            log.warning("checkpoint at step %d is incomplete (no _CHECKPOINT_METADATA: a deletion of this old "
                        "checkpoint was interrupted); moved to %s", step, target)
        if half:
            _all_processes_ok(True)                 # moved before any process lists the steps

    # -- side files ---------------------------------------------------------------------------------------------
    def log_path(self, step: int) -> epath.Path:
        """``meta/<step>/log.json``: the metrics log's records up to ``step`` (their count, those since the previous
        checkpoint, the count lost; ``MetricsWriter.since_checkpoint``), to rebuild a log damaged after it."""
        return self._meta(step) / "log.json"

    def _meta(self, step: int) -> epath.Path:
        return self.directory / "meta" / str(step)

    def _data_state_path(self, step: int, process: int) -> epath.Path:
        return self._meta(step) / f"data_process_{process}.json"

    @staticmethod
    def _write_json(path: epath.Path, value) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, json.dumps(value))     # overwrites a side file of an earlier attempt

    # -- the seal (see the module docstring) ----------------------------------------------------------------------
    def _writing_dir(self, step: int) -> epath.Path:
        """Where orbax is writing ``step`` before committing it: its temporary directory, or on ``gs://`` (where
        orbax commits with a file instead of a rename) the step's own directory."""
        temporary = self.directory / f"{step}.orbax-checkpoint-tmp"
        return temporary if temporary.exists() else self.directory / str(step)

    def _digest_then_barrier(self, key: str, timeout_ms: int) -> None:
        """Orbax's barrier between processes, preceded at its write barrier (this process's files are written) by
        the digests of this process's own files, all processes at once. Should it fail, process 0 hashes them."""
        step = self._in_flight
        if "async_write_complete" in key and step is not None:
            try:
                root = self._writing_dir(step)
                mine = _own_files(root, jax.process_index())
                digests = {_TEMPORARY.sub("", name): digest for name, digest in file_digests(root, mine).items()}
                self._write_json(self._meta(step) / f"digests_process_{jax.process_index()}.json", digests)
            except Exception as err:                  # noqa: BLE001 (the save itself goes on; process 0 covers)
                log.warning("hashing this process's files of step %d failed (%s); process 0 hashes them", step, err)
        if self._barrier is None:
            self._barrier = ocp.multihost.get_barrier_sync_fn()
        self._barrier(key=key, timeout_ms=timeout_ms)

    def _finalized(self) -> None:
        self._seal_in_flight()
        if self._save_started is not None:
            self.last_save_seconds = time.monotonic() - self._save_started

    def _seal_in_flight(self) -> None:
        """Process 0, after every process's files and orbax's merge are written and before orbax commits the step:
        the seal, from the other processes' digests and this process's (of every file nobody else hashed)."""
        step = self._in_flight
        root, meta = self._writing_dir(step), self._meta(step)
        names = [name for name in list_files(root) if name not in REWRITTEN_AT_COMMIT]
        others = sorted(meta.glob("digests_process_*.json")) if meta.exists() else []
        hashed = {}
        for path in others:
            hashed.update(json.loads(path.read_text()))
        digests = {name: hashed[name] for name in names if name in hashed}   # not a stale attempt's other files
        digests.update(file_digests(root, [name for name in names if name not in digests]))
        self._write_json(meta / "checksums.json", dict(sorted(digests.items())))

    def _forget_deleted(self) -> None:
        """After a save: the newest complete step; process 0 removes the side files of steps orbax deleted. Only
        side files of steps older than the newest finalised one are removed: the other processes may already be
        writing theirs for the next step."""
        self.manager.reload()
        steps = set(self.manager.all_steps())
        if steps:
            self.last_complete = max(steps)
        if jax.process_index() != 0:
            return
        meta_root, newest = self.directory / "meta", max(steps, default=-1)
        if meta_root.exists():
            for child in meta_root.iterdir():
                if child.name.isdigit() and int(child.name) not in steps and int(child.name) < newest:
                    child.rmtree()

    def _verify(self, step: int) -> str | None:
        """Why ``step`` cannot be trusted (files changed, or never sealed), or None. Collective: each process checks
        its share of the files, and every process returns the same answer."""
        mine = corruption(self.directory / str(step), self._meta(step) / "checksums.json",
                          share=(jax.process_index(), jax.process_count()))
        return next((reason for reason in gather_from_all(mine) if reason is not None), None)

    def _quarantine(self, step: int, reason: str) -> None:
        if jax.process_index() == 0:
            target = self.directory / "quarantine" / str(step)
            if target.exists():                     # a step of that number quarantined before
                target.rmtree()
            moves = [(self.directory / str(step), target)]
            if self._meta(step).exists():
                moves.append((self._meta(step), target / "meta"))
            move_all(self.directory / QUARANTINE_JOURNAL, moves)   # finished by the next start if killed midway
        how = "cannot be trusted" if reason.startswith("never sealed") else "is corrupt"
        log.warning("checkpoint at step %d %s (%s); moved to %s", step, how, reason,
                    self.directory / "quarantine" / str(step))
        _all_processes_ok(True)                     # the move is done before any process reloads the step list
        self.manager.reload()

    # -- save / restore -----------------------------------------------------------------------------------------
    def save(self, step: int, state: dict, data_state: Any, config_json: dict, *,
             metrics: dict[str, float] | None = None, window: list[dict] | None = None,
             log: dict | None = None) -> None:
        """Save ``step`` whenever called (the loop decides when). The write finishes in the background; a failure
        raises ``CheckpointSaveError`` here or at the next ``save`` / ``wait``."""
        if not all_finite(state["params"]):
            raise NonFiniteStateError(f"refusing to save a non-finite state at step {step}")
        self.wait()                                 # the previous async save: a failure of it names its own step
        self._save_started = time.monotonic()
        try:
            check_free_space(self.directory, state)
            self._write_json(self._data_state_path(step, jax.process_index()), data_state)
            (self._meta(step) / f"digests_process_{jax.process_index()}.json").unlink(missing_ok=True)  # earlier try
            if jax.process_index() == 0:
                (self._meta(step) / "checksums.json").unlink(missing_ok=True)
                self._write_json(self._meta(step) / "window.json", window or [])
                if log is not None:
                    self._write_json(self.log_path(step), log)
            self._in_flight = step
            self.manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                              config=ocp.args.JsonSave(config_json)),
                metrics=metrics, force=True)
        except Exception as err:
            release_waiting_save_threads()
            raise self._save_error(step, err) from err

    def _save_error(self, step: int, err: Exception) -> CheckpointSaveError:
        last = (f"step {self.last_complete}" if self.last_complete is not None else "none")
        return CheckpointSaveError(f"saving the checkpoint of step {step} in {self.directory} failed "
                                   f"({type(err).__name__}: {err}); the last complete checkpoint is {last}")

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
            self._forget_deleted()
        except Exception as err:
            release_waiting_save_threads()
            gc.collect()                      # orbax's failed asyncio tasks report now, before the error line
            step = self._in_flight if self._in_flight is not None else self.manager.latest_step() or -1
            raise self._save_error(step, err) from err

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, abstract_state: dict):
        """``(step, state, data_state, window)`` from the newest usable checkpoint, or None if there is no checkpoint
        at all. Every process restores the same step."""
        candidates = broadcast_from_primary(sorted(self.manager.all_steps(), reverse=True))
        for candidate in candidates:
            reason = self._verify(candidate)
            if reason is None:
                data_state, reason = self._read_data_state(candidate)
                reason = None if _all_processes_ok(reason is None) else (reason or "another process's data state")
            if reason is not None:
                self._quarantine(candidate, reason)
                continue
            restored = self.manager.restore(
                candidate, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
            state = restored["state"]
            if not all_finite(state["params"]):
                raise NonFiniteStateError(f"checkpoint at step {candidate} in {self.directory} has non-finite "
                                          f"parameters although it matches its seal")
            window_path = self._meta(candidate) / "window.json"
            window = json.loads(window_path.read_text()) if window_path.exists() else []
            self.last_complete = candidate
            self._forget_deleted()
            return candidate, state, data_state, window
        if candidates:
            raise NoUsableCheckpointError(
                f"none of the {len(candidates)} checkpoint(s) in {self.directory} is usable (moved to "
                f"{self.directory / 'quarantine'}); to start over, rerun with --restart (the earlier run's files are "
                f"moved aside, not deleted) or use a new --workdir")
        return None

    def _read_data_state(self, step: int):
        """This process's data-iterator state for ``step``: its own file when the process layout is unchanged,
        else process 0's (valid for any layout when no process had a partly used batch). ``(state, problem)``."""
        meta = self._meta(step)
        files = sorted(meta.glob("data_process_*.json")) if meta.exists() else []
        if not files:
            return None, f"missing data-iterator state in {meta}"
        try:
            states = {int(f.stem.rsplit("_", 1)[1]): json.loads(f.read_text()) for f in files}
        except ValueError as err:
            return None, f"unreadable data-iterator state in {meta} ({err})"
        saved_processes = len(states)   # every process writes its state before the (collective) orbax save
        if sorted(states) != list(range(saved_processes)):
            return None, f"data-iterator states of processes {sorted(states)} in {meta}"
        if saved_processes == jax.process_count():
            return states[jax.process_index()], None
        positions = {(s["next_batch"], s["offset"]) for s in states.values()}
        if len(positions) != 1 or next(iter(positions))[1] != 0:
            raise ConfigError(f"checkpoint at step {step} was saved by {saved_processes} process(es) whose input "
                              f"pipelines stood at different positions (skipped bad records: {sorted(positions)}); "
                              f"it can only be resumed with the same {saved_processes} process(es) and mesh")
        return states[0], None

    def close(self) -> None:
        self.wait()
        self.manager.close()


def to_jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)
