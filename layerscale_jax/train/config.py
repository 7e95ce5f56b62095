"""The ``config.train`` and ``config.model`` sections: every field, its default and its meaning.

A full experiment config (see ``configs/``) has four sections: ``model`` (registry name plus architecture
overrides, passed to ``create_model``), ``data`` (``layerscale_jax.data.config``), ``optim``
(``layerscale_jax.optim.default_config``) and ``train`` (below).

``train`` fields:
  steps               optimizer steps of the run.
  batch_size          global train batch (all processes together); must divide by the process count and by
                      the number of devices on the mesh's batch axes (data × fsdp).
  eval_batch_size     global eval batch (padded at the end of the test split; padding is not counted).
  seed                seeds parameters, data order, augmentation, Mixup/CutMix and stochastic depth.
  log_every           steps between metric lines (the only per-step device → host syncs).
  eval_every          steps between evaluations on the test split (0: only at the end).
  checkpoint_every    steps between checkpoints (0: only at the end and on preemption).
  keep_checkpoints    the newest checkpoints kept (the best one by test accuracy is kept as well).
  mesh.data, mesh.fsdp, mesh.tensor   device-mesh axis sizes; one may be -1 (the remaining devices).
  sharding_rules      (logical axis, mesh axis or None) pairs: where each parameter dimension is sharded.
  nonfinite           'raise': a NaN/Inf loss or gradient norm stops the run, naming the step and the last good
                      checkpoint; 'skip': the update is skipped and counted (``nonfinite_steps``).
  init_from           '' or a path: an orbax directory written by ``python -m layerscale_jax.convert`` or a timm
                      ``.safetensors`` / ``.npz`` / ``.pth`` file; its weights initialise the model.
  stop_after_steps    0, or stop (saving a checkpoint) after this many steps of this process's run, as if
                      preempted: a way to split a long job into shorter slots.
"""
from __future__ import annotations

import dataclasses

import ml_collections

from layerscale_jax.models import model_config
from layerscale_jax.train.sharding import DEFAULT_RULES

NONFINITE_MODES = ("raise", "skip")


def model_section(name: str, **overrides) -> ml_collections.ConfigDict:
    """``config.model``: the registry name and every architecture field (so any can be overridden by flag)."""
    arch = model_config(name, **overrides)
    section = ml_collections.ConfigDict({"name": name})
    for field in dataclasses.fields(arch):
        value = getattr(arch, field.name)
        if field.name in ("dtype", "param_dtype"):
            value = value.__name__ if hasattr(value, "__name__") else str(value)
        section[field.name] = value
    return section


def model_overrides(model_cfg) -> dict:
    cfg = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
    cfg.pop("name")
    return cfg


def default_train_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict({
        "steps": 1000,
        "batch_size": 128,
        "eval_batch_size": 256,
        "seed": 0,
        "log_every": 50,
        "eval_every": 0,
        "checkpoint_every": 0,
        "keep_checkpoints": 2,
        "mesh": {"data": -1, "fsdp": 1, "tensor": 1},
        "sharding_rules": DEFAULT_RULES,
        "nonfinite": "raise",
        "init_from": "",
        "stop_after_steps": 0,
    })


def validate_train_config(train) -> None:
    for field in ("steps", "batch_size", "eval_batch_size", "log_every", "keep_checkpoints"):
        value = train[field]
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"train.{field}={value!r} must be a positive integer")
    for field in ("eval_every", "checkpoint_every", "stop_after_steps"):
        value = train[field]
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"train.{field}={value!r} must be a non-negative integer")
    if train.nonfinite not in NONFINITE_MODES:
        raise ValueError(f"train.nonfinite={train.nonfinite!r} is not one of {NONFINITE_MODES}")


def parse_config_arg(arg: str | None, allowed: dict) -> dict:
    """Parse a config-file argument ``"depth=24,branch_scaling=none"`` (the part after ``file.py:``).

    ``allowed`` maps each accepted key to its default; values are converted to the default's type.
    """
    result = dict(allowed)
    if not arg:
        return result
    for item in arg.split(","):
        if "=" not in item:
            raise ValueError(f"config argument {item!r} is not key=value (accepted keys: {sorted(allowed)})")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in allowed:
            raise ValueError(f"config argument key {key!r} is not one of {sorted(allowed)}")
        default = allowed[key]
        if isinstance(default, bool):
            result[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            result[key] = int(value)
        elif isinstance(default, float):
            result[key] = float(value)
        else:
            result[key] = value
    return result
