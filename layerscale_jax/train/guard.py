"""The non-finite guard of the train loop. The step (``train.step``) keeps a step whose loss, gradient norm or
update is non-finite out of the state and counts it; the guard decides what that does to the run
(``train.nonfinite``, or the loop's record mode).
"""
from __future__ import annotations

import jax

from layerscale_jax.errors import UserError


class NonFiniteError(UserError, FloatingPointError):
    """A non-finite step stopped the run (``train.nonfinite='raise'``): reported in one line, naming the step and the
    last complete checkpoint."""


class NonFiniteGuard:
    """What a non-finite step does (``train.step`` has kept its update out of the state and counted it):
    ``'raise'`` stops the run, naming the step and the last complete checkpoint, and never saves a state that
    skipped a step; ``'skip'`` trains on; ``'stop'`` (record mode) ends the run as diverged at its first non-finite
    step, an outcome rather than an error. ``checkpointer``: the run's, named in the error (none in record
    mode)."""

    def __init__(self, mode: str, checkpointer=None):
        self.mode, self.checkpointer = mode, checkpointer
        self.diverged_at: int | None = None

    @property
    def diverged(self) -> bool:
        return self.diverged_at is not None

    def check(self, step: int, fetched: list[dict]) -> None:
        """``fetched``: the per-step metrics of the window ending at ``step``."""
        bad = next((i for i, m in enumerate(fetched) if not m["finite"]), None)
        if bad is None or self.mode == "skip" or self.diverged:
            return
        at = step - len(fetched) + bad + 1
        if self.mode == "raise":
            raise NonFiniteError(_nonfinite_message(at, self.checkpointer))
        self.diverged_at = at

    def before_save(self, step: int, state: dict) -> None:
        if self.mode == "raise" and int(jax.device_get(state["nonfinite_steps"])):
            raise NonFiniteError(_nonfinite_message(step, self.checkpointer))


def _nonfinite_message(step: int, checkpointer) -> str:
    checkpointer.wait()                           # an async save in flight: only a complete checkpoint is named
    last = checkpointer.last_complete
    where = (f"the last complete checkpoint is step {last} in {checkpointer.directory}" if last is not None
             else "no checkpoint has been saved yet")
    return (f"non-finite loss, gradient norm or update at step {step}; the update was not applied and the run stops "
            f"(train.nonfinite='raise'); {where}")
