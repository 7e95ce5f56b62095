"""Orbax checkpoints of the train state, with the data-iterator state, the config and a content checksum.

Layout of ``<workdir>/checkpoints`` (any orbax / ``etils.epath`` path, ``gs://`` included):

- ``<step>/``: orbax's checkpoint (async save; the newest ``keep`` and the best by an eval metric are kept): the
  train state and the config.
- ``meta/<step>/data_process_<i>.json``: process ``i``'s data-iterator state, written before the orbax save starts
  (a checkpoint without it is incomplete). ``meta/<step>/window.json``: the per-step metrics logged since the last
  metrics line (so a resumed run's ``metrics.jsonl`` equals an uninterrupted one's). ``meta/<step>/checksums.json``:
  SHA-256 of every file of ``<step>/``, written by process 0 once orbax has finalised the step ("sealed").
- ``quarantine/<step>/``: checkpoints found corrupt at restore, moved aside so that no later save collides with them.

Restore walks from the newest step back. Process 0 decides about each step and every process follows the same
decision: a step whose files do not match its checksums (truncated, overwritten) is quarantined and the previous one
is tried; a finalised step that was never sealed (the job died first) is trusted, since orbax's finalisation is an
atomic rename, and sealed then. Errors while reading a checkpoint that passed the check (I/O, collectives) are raised:
they are not evidence of a corrupt checkpoint. When checkpoints exist but none is usable, the run stops.

Saves: a state with a non-finite parameter is never saved; a failed save (disk full, permissions) raises
``CheckpointSaveError`` naming the cause and the last complete checkpoint.
"""
from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as ocm

from layerscale_jax.checksums import corruption, file_digests
from layerscale_jax.cli import UserError

log = logging.getLogger(__name__)


class NonFiniteStateError(RuntimeError):
    pass


class CheckpointSaveError(UserError):
    """A checkpoint could not be written; the message names the cause and the last complete checkpoint."""


class NoUsableCheckpointError(UserError):
    """Checkpoints exist in the workdir but none of them can be restored."""


def as_path(path) -> epath.Path:
    """An ``epath.Path`` for a local path (made absolute) or a URL-like one (``gs://...``, kept as is)."""
    text = os.fspath(path)
    return epath.Path(text if "://" in text else os.path.abspath(text))


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


def _all_processes_ok(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils
    return bool(np.all(multihost_utils.process_allgather(np.array([ok]))))


class Checkpointer:
    def __init__(self, directory, *, keep: int, best_metric: str = "test_accuracy", best_mode: str = "max"):
        """Keeps the newest ``keep`` checkpoints and the best by ``best_metric`` (``best_mode`` 'max': higher is
        better, as accuracy; 'min': lower, as a loss)."""
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode={best_mode!r} is not 'max' or 'min'")
        self.directory = as_path(directory)
        self.best_metric = best_metric
        policy = ocm.AnyPreservationPolicy([
            ocm.LatestN(n=keep),
            ocm.BestN(get_metric_fn=lambda metrics: metrics[best_metric], reverse=best_mode == "min", n=1,
                      keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=True,
                                               enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self.last_complete: int | None = None     # newest step known to be fully written (restored or sealed)

    # -- side files ---------------------------------------------------------------------------------------------
    def _meta(self, step: int) -> epath.Path:
        return self.directory / "meta" / str(step)

    def _data_state_path(self, step: int, process: int) -> epath.Path:
        return self._meta(step) / f"data_process_{process}.json"

    @staticmethod
    def _write_json(path: epath.Path, value) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / (path.name + ".tmp")
        tmp.write_text(json.dumps(value))
        tmp.replace(path)                          # atomic; overwrites a side file of an earlier attempt

    def _seal_finished(self) -> None:
        """Process 0: checksums for every finalised step that has none yet; side files of deleted steps removed.
        Called only when no save is in flight. Only side files of steps older than the newest finalised one are
        removed: the other processes may already be writing theirs for the next step."""
        self.manager.reload()
        steps = set(self.manager.all_steps())
        if steps:
            self.last_complete = max(steps)
        if jax.process_index() != 0:
            return
        for step in sorted(steps):
            checksums = self._meta(step) / "checksums.json"
            if not checksums.exists():
                self._write_json(checksums, file_digests(self.directory / str(step)))
        meta_root, newest = self.directory / "meta", max(steps, default=-1)
        if meta_root.exists():
            for child in meta_root.iterdir():
                if child.name.isdigit() and int(child.name) not in steps and int(child.name) < newest:
                    child.rmtree()

    def _verify(self, step: int) -> str | None:
        """Process 0: why ``step`` is corrupt, or None (also None for a finalised step never sealed)."""
        return corruption(self.directory / str(step), self._meta(step) / "checksums.json")

    def _quarantine(self, step: int, reason: str) -> None:
        if jax.process_index() == 0:
            target = self.directory / "quarantine" / str(step)
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                target.rmtree()
            (self.directory / str(step)).rename(target)
            if self._meta(step).exists():
                self._meta(step).rename(target / "meta")
        log.warning("checkpoint at step %d is corrupt (%s); moved to %s", step, reason,
                    self.directory / "quarantine" / str(step))
        _all_processes_ok(True)                     # the move is done before any process reloads the step list
        self.manager.reload()

    # -- save / restore -----------------------------------------------------------------------------------------
    def save(self, step: int, state: dict, data_state: Any, config_json: dict, *,
             metrics: dict[str, float] | None = None, window: list[dict] | None = None, force: bool = False) -> None:
        if not all_finite(state["params"]):
            raise NonFiniteStateError(f"refusing to save a non-finite state at step {step}")
        try:
            self.manager.wait_until_finished()      # the previous async save (orbax would wait for it as well)
            self._seal_finished()
            self._write_json(self._data_state_path(step, jax.process_index()), data_state)
            if jax.process_index() == 0:
                (self._meta(step) / "checksums.json").unlink(missing_ok=True)   # left by an earlier attempt
                self._write_json(self._meta(step) / "window.json", window or [])
            self.manager.save(
                step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                              config=ocp.args.JsonSave(config_json)),
                metrics=metrics, force=force)
        except Exception as err:
            raise self._save_error(step, err) from err

    def _save_error(self, step: int, err: Exception) -> CheckpointSaveError:
        last = (f"step {self.last_complete}" if self.last_complete is not None else "none")
        return CheckpointSaveError(f"saving the checkpoint of step {step} in {self.directory} failed "
                                   f"({type(err).__name__}: {err}); the last complete checkpoint is {last}")

    def wait(self) -> None:
        try:
            self.manager.wait_until_finished()
            self._seal_finished()
        except Exception as err:
            raise self._save_error(self.manager.latest_step() or -1, err) from err

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, abstract_state: dict, step: int | None = None):
        """``(step, state, data_state, window)`` from the newest usable checkpoint (or ``step``), or None if there
        is no checkpoint at all. Every process restores the same step."""
        steps = sorted(self.manager.all_steps(), reverse=True) if step is None else [step]
        candidates = broadcast_from_primary(steps)
        for candidate in candidates:
            reason = broadcast_from_primary(self._verify(candidate) if jax.process_index() == 0 else None)
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
                                          f"parameters although it passed its checksum")
            window_path = self._meta(candidate) / "window.json"
            window = json.loads(window_path.read_text()) if window_path.exists() else []
            self.last_complete = candidate
            self._seal_finished()
            return candidate, state, data_state, window
        if candidates:
            raise NoUsableCheckpointError(
                f"none of the {len(candidates)} checkpoint(s) in {self.directory} is usable (moved to "
                f"{self.directory / 'quarantine'}); to start fresh, use a new --workdir or delete {self.directory}")
        return None

    def _read_data_state(self, step: int):
        """This process's data-iterator state for ``step``: its own file when the process layout is unchanged,
        else process 0's (valid for any layout when no process had a partly used batch). ``(state, problem)``."""
        meta = self._meta(step)
        files = sorted(meta.glob("data_process_*.json")) if meta.exists() else []
        if not files:
            return None, f"missing data-iterator state in {meta}"
        states = {int(f.stem.rsplit("_", 1)[1]): json.loads(f.read_text()) for f in files}
        saved_processes = len(states)   # every process writes its state before the (collective) orbax save
        if sorted(states) != list(range(saved_processes)):
            return None, f"data-iterator states of processes {sorted(states)} in {meta}"
        if saved_processes == jax.process_count():
            return states[jax.process_index()], None
        positions = {(s["next_batch"], s["offset"]) for s in states.values()}
        if len(positions) != 1 or next(iter(positions))[1] != 0:
            raise ValueError(f"checkpoint at step {step} was saved by {saved_processes} process(es) whose input "
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
