"""One classification run of a sweep, recorded for the study: train a config with ``train.loop.create_trainer``'s
jitted step, keep the train-loss curve (mean per log interval), evaluate accuracy and loss on the config's
``data.eval_split`` with per-block diagnostics (``layerscale_jax.train.diagnostics``) at step 0 and at every
evaluation, and stop at the first
non-finite step (``train.nonfinite='skip'`` keeps it out of the state), recording the run as diverged — an outcome
of the run, not an exception. No checkpoints: a run is short, and the sweep's record is its result.

Metrics are named after the evaluated split as the train loop names them (``train.tasks.metric_prefix``): ``test_*``
for the test split, ``val_*`` for any other (``validation``, a slice of train), so a number selected on is never
named like a number reported. The record says which splits it trained on and evaluated (``train_split``,
``eval_split``, as the data pipeline resolved them).
"""
from __future__ import annotations

import time


def evaluation_record(diagnostics_fn, params, diagnostics_batch) -> dict[str, float]:
    """What is recorded at each evaluation besides accuracy and loss: ``train.diagnostics`` of the current params on a
    fixed batch (replicated outputs → floats)."""
    from layerscale_jax.train.diagnostics import to_floats
    return to_floats(diagnostics_fn(params, diagnostics_batch))


def _evaluate(trainer, params, config, mesh, prefix: str) -> dict[str, float]:
    """``<prefix>_accuracy`` and ``<prefix>_loss`` over one pass of the config's eval split."""
    import jax

    from layerscale_jax import data as data_lib
    sums = {"loss_sum": 0.0, "correct": 0.0, "count": 0.0}
    for batch in data_lib.make_eval_iterator(config.data, global_batch_size=config.train.eval_batch_size):
        out = jax.device_get(trainer.eval_step(params, data_lib.to_global_batch(batch, mesh)))
        for key in sums:
            sums[key] += float(out[key])
    count = max(sums["count"], 1.0)
    return {f"{prefix}_accuracy": sums["correct"] / count, f"{prefix}_loss": sums["loss_sum"] / count}


def train_classifier(config) -> dict:
    """Train ``config`` (its ``train.steps``, ``eval_every``, ``log_every``, ``seed``; ``data.train_split`` and
    ``data.eval_split``; ``train.stop_after_steps`` > 0 ends the run after that many steps of the ``train.steps``
    schedule, with an evaluation there) and return the record's results: ``train_split``, ``eval_split``,
    ``final_<p>_accuracy``, ``best_<p>_accuracy`` (``p``: ``test`` or ``val``, ``metric_prefix``),
    ``final_train_loss`` (NaN if diverged), ``diverged``, ``diverged_at_step``, ``steps``, ``seconds``, ``timing``
    (setup, first step, per step, evaluations), ``train_loss_curve`` ([step, loss] pairs) and ``evaluations``
    (dicts with ``step``)."""
    import jax
    import numpy as np

    from layerscale_jax import data as data_lib
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train.loop import create_trainer
    from layerscale_jax.train.tasks import metric_prefix

    start = time.time()
    mesh = shard_lib.make_mesh(config.train.mesh)
    info = data_lib.get_dataset_info(config.data)
    prefix = metric_prefix(info.eval_split)
    trainer = create_trainer(config, mesh)
    state = trainer.init_state()
    train_iter = data_lib.make_train_iterator(config.data, global_batch_size=config.train.batch_size,
                                              seed=config.train.seed)
    diagnostics_fn = trainer.diagnostics                          # the train loop's (train.loop.create_trainer)
    first = data_lib.to_global_batch(next(train_iter), mesh)
    diagnostics_batch = {"image": first["image"], "label": first["label"]}

    evaluations = [{"step": 0, **evaluation_record(diagnostics_fn, state["params"], diagnostics_batch)}]
    train_loss: list[tuple[int, float]] = []
    pending, step, diverged, diverged_at = [], 0, False, None
    batch = first
    setup_seconds = time.time() - start
    eval_seconds, first_step_seconds = 0.0, None
    last_step = min(config.train.steps, config.train.stop_after_steps or config.train.steps)
    while step < last_step:
        state, metrics = trainer.train_step(state, batch)
        step += 1
        if step == 1:
            jax.block_until_ready(metrics)
            first_step_seconds = time.time() - start - setup_seconds
        pending.append(metrics)
        if step % config.train.log_every == 0 or step == last_step:
            fetched = jax.device_get(pending)
            pending = []
            bad = [i for i, m in enumerate(fetched) if not m["finite"]]
            if bad:
                diverged, diverged_at = True, step - len(fetched) + bad[0] + 1
            finite = [float(m["train_loss"]) for m in fetched if m["finite"]]
            train_loss.append((step, float(np.mean(finite)) if finite else float("nan")))
        is_eval = step % config.train.eval_every == 0 or step == last_step or diverged
        if is_eval:
            eval_start = time.time()
            evaluation = _evaluate(trainer, state["params"], config, mesh, prefix)
            evaluation.update(evaluation_record(diagnostics_fn, state["params"], diagnostics_batch))
            evaluations.append({"step": step, **evaluation})
            eval_seconds += time.time() - eval_start
        if diverged:
            break
        batch = data_lib.to_global_batch(next(train_iter), mesh)
    train_iter.close()
    seconds = time.time() - start
    step_seconds = (seconds - setup_seconds - first_step_seconds - eval_seconds) / max(step - 1, 1)
    accuracies = [e[f"{prefix}_accuracy"] for e in evaluations if f"{prefix}_accuracy" in e]
    return {
        "train_split": info.train_split, "eval_split": info.eval_split,
        f"final_{prefix}_accuracy": accuracies[-1], f"best_{prefix}_accuracy": max(accuracies),
        "final_train_loss": float("nan") if diverged else train_loss[-1][1],
        "diverged": diverged, "diverged_at_step": diverged_at, "steps": step, "seconds": seconds,
        "timing": {"setup": setup_seconds, "first_step": first_step_seconds, "per_step": step_seconds,
                   "evaluations": eval_seconds},
        "train_loss_curve": train_loss, "evaluations": evaluations,
    }
