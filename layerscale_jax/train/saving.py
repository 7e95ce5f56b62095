"""When the train loop saves, and how it stops before its end: ``Checkpoints`` at their steps and at the end,
``Preemption`` on a stop signal or after ``train.stop_after_steps``, saving unless no time is left.
"""
from __future__ import annotations

import time

import jax

from layerscale_jax.runtime import stop_signals
from layerscale_jax.storage.checkpoint import Checkpointer, broadcast_from_primary
from layerscale_jax.train.metrics import due, host_window


class Checkpoints:
    """Saves, every ``train.checkpoint_every`` steps, at the end and at a stop: the state, the input's position, the
    config, the evaluation's metrics (the best checkpoint is kept by them) and the metrics not yet logged. Before
    each: the replicas' input check, the non-finite guard, and the metrics log flushed, so that the records up to
    a checkpoint's step are in metrics.jsonl before it. ``writer``: the run's ``metrics.MetricsWriter``,
    ``batches``: its ``feed.Batches``, ``guard``: its ``guard.NonFiniteGuard``."""

    def __init__(self, checkpointer: Checkpointer, writer, batches, guard, config_json: dict, every: int, *, end: int,
                 saved_at: int | None):
        self.checkpointer, self.writer, self.batches, self.guard = checkpointer, writer, batches, guard
        self.config_json, self.every, self.end = config_json, every, end
        self.saved_at = saved_at                 # the step of the newest checkpoint (restored or saved)

    def due(self, step: int) -> bool:
        return due(step, self.every, self.end)

    def save(self, step: int, state: dict, metrics: dict | None = None, window: list = ()) -> None:
        if self.saved_at == step:
            return
        self.batches.check_replicas(step)
        self.guard.before_save(step, state)
        self.writer.flush()
        self.checkpointer.save(step, state, self.batches.get_state(), self.config_json, metrics=metrics,
                               window=host_window(window), log=self.writer.since_checkpoint())
        self.saved_at = step


class Preemption:
    """A stop before the end: a stop signal (``runtime.stop_signals``: every process stops before the same step;
    asked after every step, and once more after an evaluation, which may have taken a while) or the end of this
    start's share, ``train.stop_after_steps``. The stop saves a checkpoint, unless ``train.stop_deadline_seconds``
    leaves no time for one (``_no_time_to_save``)."""

    def __init__(self, tc, start_step: int, checkpoints: Checkpoints):
        self.stop_after, self.start_step, self.end = tc.stop_after_steps, start_step, tc.steps
        self.deadline, self.checkpoints = tc.stop_deadline_seconds, checkpoints

    def stopped(self, step: int, evaluated: bool, state: dict, window: list) -> bool:
        slot = self.stop_after and step - self.start_step >= self.stop_after
        stop = stop_signals.reached_sync_point(step + 1)
        if not stop and evaluated and step < self.end:      # a notice during the evaluation: stop now, not later
            stop = stop_signals.requested_anywhere()
        if not (stop or slot) or step >= self.end:
            return False
        checkpointer = self.checkpoints.checkpointer
        no_time = _no_time_to_save(self.deadline, checkpointer) if self.checkpoints.saved_at != step else None
        if no_time is not None:
            print(f"stopped at step {step} without saving it ({no_time}); the last checkpoint is step "
                  f"{checkpointer.last_complete} in {checkpointer.directory}", flush=True)
            return True
        self.checkpoints.save(step, state, window=window)
        print(f"stopped at step {step}; checkpoint saved in {checkpointer.directory}", flush=True)
        return True


def _no_time_to_save(deadline: float, checkpointer: Checkpointer) -> str | None:
    """Why the stop's save is skipped, or None: ``train.stop_deadline_seconds`` (the time a preemption notice gives
    before the machine is reclaimed; 0: none) would pass before a save as long as the last one measured in this job
    ends, counted from the notice. Process 0 decides for all (a save is collective); the last sealed checkpoint stays
    the one to resume from. Without a measured save, or a notice (``train.stop_after_steps``), it saves."""
    if not deadline:
        return None
    checkpointer.wait()               # a save still in flight ends first either way: then its time is known
    reason = None
    if jax.process_index() == 0:
        notice, estimate = stop_signals.notice_time(), checkpointer.last_save_seconds
        if notice is not None and estimate is not None:
            left = deadline - (time.time() - notice)
            if estimate > left:
                reason = (f"a save takes about {estimate:.1f} s and {max(left, 0.0):.1f} s of "
                          f"train.stop_deadline_seconds={deadline:g} are left")
    return broadcast_from_primary(reason)
