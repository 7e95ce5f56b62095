"""Evaluation: the task's metrics over the evaluated split (``evaluate``), and ``Evaluation``, the train loop's piece
that evaluates at its steps and measures the per-block diagnostics (``train.diagnostics``) with each.

Each metric is the mean over the split's examples of the task's per-example value (``train.tasks``), from sums
accumulated batch by batch: padding is masked out, so every example counts exactly once, whatever the process
layout.
"""
from __future__ import annotations

import dataclasses
import time

import jax

from layerscale_jax import data as data_lib
from layerscale_jax.data.sharding import process_batch_rows
from layerscale_jax.train import tasks as tasks_lib
from layerscale_jax.train.diagnostics import to_floats
from layerscale_jax.train.metrics import due


def evaluate(eval_step_fn, params, data, batch_size: int, mesh, task=None) -> dict[str, float]:
    """The task's metrics (``task.eval_keys``, and ``<prefix>_examples``) over the whole evaluated split: test loss
    and accuracy for classification (``val_*`` when the split is not 'test'), the masked-patch reconstruction loss
    for MAE. ``eval_step_fn``: ``step.make_eval_step``'s, jitted. ``data``: the data section (a validated
    ``DataSettings`` or a config to validate); ``batch_size``: the global eval batch."""
    task = task if task is not None else tasks_lib.ClassificationTask()
    sums = dict.fromkeys((*task.eval_metrics, "count"), 0.0)
    size = batch_size
    iterator = data_lib.make_eval_iterator(data, global_batch_size=size, rows=process_batch_rows(mesh, size))
    for batch in iterator:
        out = eval_step_fn(params, data_lib.to_global_batch(batch, mesh, size))
        for k, v in jax.device_get(out).items():
            sums[k] += float(v)
    return task.summarize(sums)


class Evaluation:
    """The evaluations, every ``train.eval_every`` steps and at ``end``: the task's metrics over the evaluated split
    (``evaluate``; of the EMA parameters where kept), what the task writes at each into a workdir (MAE: its
    reconstructions; none without a workdir), and the per-block diagnostics (classification) of the parameters on a
    fixed batch, the first train batch of the seed (before Mixup/CutMix; the same one after a resume).

    ``data``, ``train``: the sections (the evaluated split; ``train.eval_every``, ``train.eval_batch_size``, and the
    seed and batch of the diagnostics' batch); ``eval_step``: ``step.make_eval_step``'s, jitted; ``task``: its
    metrics; ``diagnostics``: the jitted per-block diagnostics (None: none); ``after(params, step)``: what the task
    writes at each evaluation (None: nothing)."""

    def __init__(self, data, train, mesh, eval_step, task, *, end: int, diagnostics=None, after=None):
        self.data, self.mesh, self.eval_step, self.task, self.end = data, mesh, eval_step, task, end
        self.every, self.batch_size = train.eval_every, train.eval_batch_size
        self.measure, self.after = diagnostics, after
        self.batch = diagnostics_batch(data, train, mesh) if diagnostics is not None else None
        self.results: dict[str, float] = {}      # the newest evaluation's metrics
        self.seconds = 0.0                       # spent evaluating

    def due(self, step: int) -> bool:
        return due(step, self.every, self.end)

    def metrics(self, state: dict) -> dict[str, float]:
        return evaluate(self.eval_step, _eval_params(state), self.data, self.batch_size, self.mesh, self.task)

    def on_split(self, state: dict, split: str) -> dict[str, float]:
        """The task's metrics of ``state`` over another split of the dataset, named by that split's prefix
        (``test_accuracy`` for 'test'; ``tasks.metric_prefix``)."""
        return evaluate(self.eval_step, _eval_params(state), dataclasses.replace(self.data, eval_split=split),
                        self.batch_size, self.mesh, type(self.task)(split))

    def diagnostics(self, state: dict) -> dict[str, float]:
        return to_floats(self.measure(state["params"], self.batch)) if self.batch is not None else {}

    def __call__(self, step: int, state: dict) -> tuple[dict, dict]:
        """The evaluation at ``step``: ``(metrics, diagnostics)``."""
        started = time.time()
        self.results = self.metrics(state)
        if self.after is not None:
            self.after(_eval_params(state), step)
        diagnostics = self.diagnostics(state)
        self.seconds += time.time() - started
        return self.results, diagnostics


def _eval_params(state: dict):
    return state["ema"] if "ema" in state else state["params"]


def diagnostics_batch(data, train, mesh) -> dict:
    """The batch the per-block diagnostics are measured on at every evaluation: the first train batch of the seed
    (``train.seed``, ``train.batch_size``), before augmentation by Mixup/CutMix, the same one after a resume."""
    with data_lib.make_train_iterator(data, global_batch_size=train.batch_size, seed=train.seed,
                                      rows=process_batch_rows(mesh, train.batch_size)) as iterator:
        return data_lib.to_global_batch(next(iterator), mesh, train.batch_size)
