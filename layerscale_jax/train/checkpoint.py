"""Orbax checkpoints of the train state, the data-iterator state and the config.

- Saves are asynchronous; the last ``keep`` checkpoints and the best one by an eval metric are kept.
- Each process's data-iterator state is written, before the orbax save starts, as
  ``checkpoints/data_state/<step>/process_<i>.json`` (iterators differ per process); a checkpoint without it
  counts as incomplete.
- Restoring walks from the newest checkpoint back: an incomplete or corrupt one is skipped with a warning.
- A state with a non-finite parameter is never saved.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as ocm

log = logging.getLogger(__name__)


class NonFiniteStateError(RuntimeError):
    pass


def all_finite(tree) -> bool:
    leaves = [x for x in jax.tree.leaves(tree) if jax.numpy.issubdtype(x.dtype, jax.numpy.floating)]
    return bool(all(jax.device_get(jax.numpy.all(jax.numpy.isfinite(x))) for x in leaves))


class Checkpointer:
    def __init__(self, directory: str, *, keep: int, best_metric: str = "test_accuracy"):
        self.directory = os.path.abspath(directory)
        self.best_metric = best_metric
        policy = ocm.AnyPreservationPolicy([
            ocm.LatestN(n=keep),
            ocm.BestN(get_metric_fn=lambda metrics: metrics[best_metric], reverse=False, n=1,
                      keep_checkpoints_without_metrics=False),
        ])
        options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=True,
                                               enable_async_checkpointing=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    # -- paths of the per-process data-iterator states ----------------------------------------------------------
    def _data_state_path(self, step: int, process: int | None = None) -> str:
        process = jax.process_index() if process is None else process
        return os.path.join(self.directory, "data_state", str(step), f"process_{process}.json")

    def _prune_data_states(self) -> None:
        root = os.path.join(self.directory, "data_state")
        if jax.process_index() != 0 or not os.path.isdir(root):
            return
        keep = {str(s) for s in self.manager.all_steps()}
        for name in os.listdir(root):
            if name not in keep and not self.manager.is_saving_in_progress():
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)

    # -- save / restore -----------------------------------------------------------------------------------------
    def save(self, step: int, state: dict, data_state: Any, config_json: dict,
             metrics: dict[str, float] | None = None, force: bool = False) -> bool:
        if not all_finite(state["params"]):
            raise NonFiniteStateError(f"refusing to save a non-finite state at step {step}")
        path = self._data_state_path(step)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(data_state, f)
        os.replace(path + ".tmp", path)
        saved = self.manager.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), config=ocp.args.JsonSave(config_json)),
            metrics=metrics, force=force)
        self._prune_data_states()
        return saved

    def wait(self) -> None:
        self.manager.wait_until_finished()
        self._prune_data_states()

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, abstract_state: dict, step: int | None = None):
        """``(step, state, data_state)`` from the newest complete, readable checkpoint (or ``step``), else None."""
        steps = sorted(self.manager.all_steps(), reverse=True) if step is None else [step]
        for candidate in steps:
            data_path = self._data_state_path(candidate)
            try:
                if not os.path.exists(data_path):
                    raise FileNotFoundError(f"missing data-iterator state {data_path}")
                with open(data_path) as f:
                    data_state = json.load(f)
                restored = self.manager.restore(
                    candidate, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
                state = restored["state"]
                if not all_finite(state["params"]):
                    raise NonFiniteStateError("non-finite parameters")
                return candidate, state, data_state
            except Exception as err:  # corrupt or incomplete: fall back to the previous checkpoint
                log.warning("checkpoint at step %d in %s is unusable (%s: %s); falling back to the previous one",
                            candidate, self.directory, type(err).__name__, err)
        return None

    def close(self) -> None:
        self.manager.wait_until_finished()
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
