"""One classification run of a sweep, recorded for the study: the train loop's record mode
(``layerscale_jax.train.loop.train_and_record``), the loop users run without its workdir. It keeps the train-loss
curve (the mean of each log interval's finite steps), evaluates accuracy and loss on the config's
``data.eval_split`` with per-block diagnostics (``layerscale_jax.train.diagnostics``) at step 0 and at every
evaluation, and stops at the end of the log interval of the first non-finite step (``train.nonfinite='skip'`` keeps
it out of the state), recording the run as diverged — an outcome of the run, not an exception. No checkpoints: a run
is short, and the sweep's record is its result.

Metrics are named after the evaluated split as the train loop names them (``train.tasks.metric_prefix``): ``test_*``
for the test split, ``val_*`` for any other (``validation``, a slice of train), so a number selected on is never
named like a number reported. The record says which splits it trained on and evaluated (``train_split``,
``eval_split``, as the data pipeline resolved them).
"""
from __future__ import annotations
from layerscale_jax.train.config import validate_experiment_config


def train_classifier(config) -> dict:
    """Train ``config`` (its ``train.steps``, ``eval_every``, ``log_every``, ``seed``; ``data.train_split`` and
    ``data.eval_split``; ``train.stop_after_steps`` > 0 ends the run after that many steps of the ``train.steps``
    schedule, with an evaluation there) and return the record's results: ``train_split``, ``eval_split``,
    ``final_<p>_accuracy``, ``best_<p>_accuracy`` (``p``: ``test`` or ``val``, ``metric_prefix``),
    ``final_train_loss`` (NaN if diverged), ``diverged``, ``diverged_at_step``, ``steps``, ``seconds``, ``timing``
    (setup, first step, per step, evaluations), ``train_loss_curve`` ([step, loss] pairs) and ``evaluations``
    (dicts with ``step``)."""
    from layerscale_jax.train.loop import train_and_record
    return train_and_record(validate_experiment_config(config))
