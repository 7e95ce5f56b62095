"""Profiles on demand: ``train.profile_steps = (first, last)`` writes a ``jax.profiler`` trace of the train steps
``first..last`` (the steps as metrics.jsonl numbers them) where TensorBoard's profile plugin and XProf read it:
``WORKDIR/tensorboard/plugins/profile/<session>/<host>.xplane.pb`` (and ``<host>.trace.json.gz``), the session
named ``steps_<first>-<last>_<UTC start time>`` (``_process<p>`` appended with ``train.profile_all_processes``:
every process writes its own session, so processes on one host never write the same file).

Read it with ``pip install -e ".[profile]"`` (``tensorboard-plugin-profile``, which brings ``xprof``), then
``tensorboard --logdir WORKDIR/tensorboard`` (the Profile tab) or ``xprof --logdir WORKDIR/tensorboard``.

Each traced step is a ``jax.profiler.StepTraceAnnotation`` named ``train_step`` with its ``step_num``, around the
input's fetch and the step's dispatch (XProf's step-time view splits the trace by it). The trace starts before step
``first`` and ends when step ``last`` has finished on the devices (its outputs waited for: the device work is in the
trace; nothing the step computes changes, so metrics.jsonl is the same as without a profile). A resume that starts
inside the range traces the rest of it; a range already trained is not traced again; a run that stops or fails
inside the range writes what it traced. With ``train.profile_steps = ()`` (the default) the loop calls nothing of
``jax.profiler``. Record mode (``loop.train_and_record``: no workdir) takes no profile.
"""
from __future__ import annotations

import time
from typing import Callable

import jax

STEP_NAME = "train_step"            # the name of each traced step in the trace (StepTraceAnnotation)


class StepProfile:
    """The trace of one attempt's steps ``first..last`` into ``logdir`` (the run's TensorBoard directory)."""

    def __init__(self, logdir: str, first: int, last: int, session: str):
        self.logdir, self.first, self.last, self.session = logdir, first, last, session
        self.running = False
        self.traced = None                  # the newest step traced

    @classmethod
    def of(cls, train, logdir, start_step: int) -> StepProfile | None:
        """The profile this process takes in an attempt that starts after ``start_step`` (None: none).
        ``train``: the train section (``TrainSettings``); ``logdir``: the run's TensorBoard directory."""
        if not train.profile_steps or (not train.profile_all_processes and jax.process_index() != 0):
            return None
        first, last = train.profile_steps
        if last <= start_step:                          # traced (or trained) before this resume
            return None
        first = max(first, start_step + 1)
        session = f"steps_{first}-{last}_{time.strftime('%Y_%m_%d_%H_%M_%S', time.gmtime())}"
        if train.profile_all_processes:
            session += f"_process{jax.process_index()}"
        return cls(str(logdir), first, last, session)

    @property
    def directory(self) -> str:
        return f"{self.logdir}/plugins/profile/{self.session}"

    def _start(self) -> None:
        options = jax.profiler.ProfileOptions()
        options.session_id = self.session
        try:
            jax.profiler.start_trace(self.logdir, profiler_options=options)
        except RuntimeError as err:             # e.g. the caller's own trace is running: the run goes on without
            print(f"train.profile_steps: no profile taken ({err})", flush=True)
            self.last = -1
            return
        self.running = True

    def close(self) -> None:
        """End the trace if it runs (at step ``last``, or when the loop ends before it) and write it."""
        if self.running:
            self.running = False
            jax.profiler.stop_trace()
            steps = f"steps {self.first}-{self.traced}" if self.traced is not None else "no step"
            print(f"profile of {steps}: {self.directory} (tensorboard --logdir "
                  f"{self.logdir}, Profile tab)", flush=True)

    def step(self, train_step: Callable, batches, state, step: int):
        """``train_step(state, next(batches))`` as train step ``step``, traced when it lies in the range."""
        if step == self.first:
            self._start()
        if not self.running:
            return train_step(state, next(batches))
        with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=step):
            out = train_step(state, next(batches))
        self.traced = step
        if step >= self.last:
            jax.block_until_ready(out)          # the step's device work ends inside the trace
            self.close()
        return out


def step_fn(train_step: Callable, batches, profile: StepProfile | None) -> Callable:
    """The loop's step, ``(state, step) → (state, metrics)``: ``train_step(state, next(batches))``, and with a
    ``profile`` traced in its range. Without one nothing else is called."""
    if profile is None:
        return lambda state, step: train_step(state, next(batches))
    return lambda state, step: profile.step(train_step, batches, state, step)
