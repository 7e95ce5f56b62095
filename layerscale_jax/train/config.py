"""The ``config.train`` and ``config.model`` sections: every field, its default and its meaning.

A full experiment config (see ``configs/``) has four sections (and an optional ``lora``, see ``train.finetune``):
``model`` (registry name plus architecture overrides, passed to ``create_model``), ``data``
(``layerscale_jax.data.config``), ``optim`` (``layerscale_jax.optim.default_config``) and ``train`` (below).

``train`` fields:
  steps               optimizer steps of the run.
  batch_size          global train batch (all processes together); must divide by the number of devices on
                      the mesh's batch axes (data × fsdp). Each process reads the rows its devices hold.
  eval_batch_size     global eval batch (padded at the end of the evaluated split; padding is not counted).
  seed                seeds parameters, data order, augmentation, Mixup/CutMix and stochastic depth.
  log_every           steps between metric lines: the only device → host syncs (a stop signal is acted on at the
                      next step every process agrees on, ``layerscale_jax.runtime.StopSignals``).
  eval_every          steps between evaluations on the evaluated split, ``data.eval_split`` (0: only at the end).
  checkpoint_every    steps between checkpoints (0: only at the end and on preemption).
  keep_checkpoints    the newest checkpoints kept (the best one by the evaluation's accuracy, MAE: its loss, is
                      kept as well).
  mesh.data, mesh.fsdp, mesh.tensor   device-mesh axis sizes (within one slice); one may be -1 (the remaining
                      devices).
  mesh.dcn_data, mesh.dcn_fsdp, mesh.dcn_tensor   slices along each axis (multi-slice TPU; processes where devices
                      carry no slice), default 1; mesh axis a has dcn_a × a devices (``train.sharding.make_mesh``).
  sharding_rules      (logical axis, mesh axis or None) pairs: where each parameter dimension is sharded.
  nonfinite           'raise': a NaN/Inf loss or gradient norm stops the run, naming the step and the last good
                      checkpoint; 'skip': the update is skipped and counted (``nonfinite_steps``).
  init_from           '' or a path: an orbax directory written by ``python -m layerscale_jax.convert`` or a timm
                      ``.safetensors`` / ``.npz`` / ``.pth`` file; its weights initialise the model.
  stop_after_steps    0, or stop (saving a checkpoint) after this many steps of this process's run, as if
                      preempted: a way to split a long job into shorter slots.
  stop_deadline_seconds   0, or the seconds a preemption notice gives before the machine is reclaimed (e.g. 30
                      for spot VMs and GKE, SLURM's KillWait): a stop whose save would not end in time, judged by
                      the last save this job measured, exits without it (the last checkpoint stays).
  finetune            'full' | 'lora' | 'linear_probe': what trains (``train.finetune``); with 'lora' the optional
                      top-level ``config.lora`` section (``layerscale_jax.lora.default_config()``) sets rank, α,
                      dropout, targets and whether the head, norms and LayerScale λ train.
  compilation_cache_dir   JAX's persistent compilation cache (a restart loads the compiled step instead of
                      compiling it again): a local path (default ``~/.cache/layerscale_jax/xla``, per host; with
                      several processes the default becomes ``WORKDIR/xla_cache``, which they all reach), or a path
                      every host and every restarted VM shares (``gs://BUCKET/xla_cache``); '' turns it off. See
                      docs/storage.md.

``load_config(spec)`` reads a config file (``configs/X.py[:arg]``) and ``validate_experiment_config(config)``
checks all four sections where the config enters (the command line calls both before anything else starts):
unknown sections and fields are refused with the closest valid names, every number must be finite and in range,
and each error names the field and the value.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import traceback

import ml_collections

from layerscale_jax.errors import ConfigError, UserError, did_you_mean
from layerscale_jax.models import model_config
from layerscale_jax.models.registry import get_entry
from layerscale_jax.paths import as_path
from layerscale_jax.train.sharding import DEFAULT_RULES, MESH_FIELDS, validate_mesh_config

NONFINITE_MODES = ("raise", "skip")


def model_section(name: str, **overrides) -> ml_collections.ConfigDict:
    """``config.model``: the registry name and every architecture field (so any can be overridden by flag).

    A ConfigDict field takes the type of its first value, and ``--config.model.X=...`` is parsed as that type. So
    float fields are stored as floats (``mlp_ratio=4`` would otherwise refuse ``--config.model.mlp_ratio=2.5``),
    and ``init_values`` (a float or ``'auto'``) is a field of any type, parsed as a Python literal: ``1e-4`` gives
    a float, ``auto`` the string.
    """
    arch = model_config(name, **overrides)
    section = ml_collections.ConfigDict({"name": name})
    for field in dataclasses.fields(arch):
        value = getattr(arch, field.name)
        if field.name in ("dtype", "param_dtype"):
            value = value.__name__ if hasattr(value, "__name__") else str(value)
        elif field.type in ("float", float):
            value = float(value)
        elif field.type in ("float | str", "str | float"):
            value = ml_collections.FieldReference(value, field_type=object)
        section[field.name] = value
    return section


def model_overrides(model_cfg) -> dict:
    cfg = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
    cfg.pop("name")
    return cfg


DEFAULT_CACHE_DIR = "~/.cache/layerscale_jax/xla"    # per host; a job of several processes uses WORKDIR/xla_cache


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
        "mesh": {"data": -1, "fsdp": 1, "tensor": 1, "dcn_data": 1, "dcn_fsdp": 1, "dcn_tensor": 1},
        "sharding_rules": DEFAULT_RULES,
        "nonfinite": "raise",
        "init_from": "",
        "stop_after_steps": 0,
        "stop_deadline_seconds": 0.0,
        "finetune": "full",
        "compilation_cache_dir": DEFAULT_CACHE_DIR,
    })


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_fields(section, known, prefix: str) -> None:
    """Refuse fields of ``section`` that are not in ``known``, naming the closest valid ones."""
    unknown = sorted(set(section.keys()) - set(known))
    if unknown:
        listed = ", ".join(f"{prefix}{key}{did_you_mean(key, known)}" for key in unknown)
        raise ConfigError(f"unknown config field(s) {listed}; valid fields of {prefix.rstrip('.') or 'a config'}: "
                          f"{', '.join(sorted(known))}")


def validate_train_config(train) -> None:
    """Check ``config.train``: unknown fields, integer ranges, the mesh axes and ``nonfinite``."""
    defaults = default_train_config()
    _check_fields(train, defaults.keys(), "train.")
    for field in ("steps", "batch_size", "eval_batch_size", "log_every", "keep_checkpoints"):
        value = train[field]
        if not _is_int(value) or value < 1:
            raise ConfigError(f"train.{field}={value!r} must be a positive integer")
    for field in ("eval_every", "checkpoint_every", "stop_after_steps", "seed"):
        value = train[field]
        if not _is_int(value) or value < 0:
            raise ConfigError(f"train.{field}={value!r} must be a non-negative integer")
    deadline = train.stop_deadline_seconds
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 0 <= deadline < math.inf:
        raise ConfigError(f"train.stop_deadline_seconds={deadline!r} must be a finite number of seconds ≥ 0 (0: none)")
    _check_fields(train.mesh, MESH_FIELDS, "train.mesh.")
    validate_mesh_config(train.mesh)
    if train.nonfinite not in NONFINITE_MODES:
        raise ConfigError(f"train.nonfinite={train.nonfinite!r} is not one of {NONFINITE_MODES}")
    if not isinstance(train.init_from, str):
        raise ConfigError(f"train.init_from={train.init_from!r} must be '' or a path")
    if not isinstance(train.compilation_cache_dir, str):
        raise ConfigError(f"train.compilation_cache_dir={train.compilation_cache_dir!r} must be '' or a path")
    if train.compilation_cache_dir:
        as_path(train.compilation_cache_dir, "train.compilation_cache_dir")     # a supported scheme
    from layerscale_jax.train.finetune import FINETUNE_MODES
    if train.get("finetune", "full") not in FINETUNE_MODES:
        raise ConfigError(f"train.finetune={train.get('finetune')!r} is not one of {FINETUNE_MODES}")


def validate_model_section(model) -> None:
    """Check ``config.model``: a registered name, known fields (with the closest names), finite numbers, and
    everything ``create_model`` checks (divisibility, ranges, choices), without building anything."""
    name = model.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"model.name={name!r} must be a registered model name")
    entry = get_entry(name)                                    # an unknown name lists the closest registered ones
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    _check_fields(model, fields | {"name"}, "model.")
    for key, value in model_overrides(model).items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"model.{key}={value!r} must be a finite number")
    try:
        model_config(name, **model_overrides(model))
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model ({name}): {err}") from err


SECTIONS = ("model", "data", "optim", "train")
OPTIONAL_SECTIONS = ("lora",)


def validate_experiment_config(config) -> None:
    """Check a whole experiment config (the four sections) where it enters; raises ``ValueError`` naming the
    field and the value. Nothing is built and no device is touched."""
    from layerscale_jax.data.config import validate_data_config
    from layerscale_jax.optim.config import validate_config as validate_optim_config

    _check_fields(config, SECTIONS + OPTIONAL_SECTIONS, "")
    missing = [s for s in SECTIONS if s not in config]
    if missing:
        raise ConfigError(f"config lacks section(s) {missing}; a config has the sections {list(SECTIONS)}")
    validate_model_section(config.model)
    validate_data_config(config.data)
    validate_train_config(config.train)
    validate_optim_config(config.optim, total_steps=config.train.steps)
    from layerscale_jax.train.finetune import validate as validate_finetune
    validate_finetune(config)


def _where_in(path: str, err: BaseException) -> str:
    """``" at line N"``: the last line of the config file ``path`` in ``err``'s traceback (``""`` if none)."""
    lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__)
             if os.path.abspath(frame.filename) == os.path.abspath(path)]
    return f" at line {lines[-1]}" if lines else ""


def load_config(spec: str) -> ml_collections.ConfigDict:
    """The config of ``configs/X.py[:arg]``: the file's ``get_config(arg)`` (``get_config()`` without an
    argument). Raises ``UserError`` naming the file for a missing or unreadable file, ``ValueError`` for a bad
    argument."""
    path, arg = spec, None
    if not os.path.isfile(path) and ":" in spec:
        path, arg = spec.split(":", 1)
    if not os.path.exists(path):
        raise UserError(f"config file {path!r} does not exist")
    if not os.path.isfile(path) or not path.endswith(".py"):
        raise UserError(f"config file {path!r} is not a Python file (expected configs/NAME.py[:arg])")
    module_name = "layerscale_jax_config_" + os.path.splitext(os.path.basename(path))[0]
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except SyntaxError as err:
        raise UserError(f"config file {path!r} is not valid Python (line {err.lineno}: {err.msg})") from err
    except ImportError as err:
        raise UserError(f"config file {path!r} cannot be imported: {err}") from err
    except Exception as err:  # noqa: BLE001 - the user's file failed while it ran: name it and where, no traceback
        raise UserError(f"config file {path!r} failed{_where_in(path, err)}: {type(err).__name__}: {err}") from err
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        raise UserError(f"config file {path!r} defines no get_config() function")
    try:
        config = get_config(arg) if arg is not None else get_config()
    except UserError:
        raise
    except ValueError as err:
        raise ConfigError(f"config file {spec!r}: {err}") from err
    except TypeError as err:
        if arg is not None and "positional argument" in str(err):
            raise UserError(f"config file {path!r} takes no argument, got {arg!r}") from err
        raise UserError(f"config file {path!r}: get_config() failed{_where_in(path, err)}: TypeError: {err}") from err
    except Exception as err:  # noqa: BLE001 - as above: an error in the user's own code, named with its line
        raise UserError(f"config file {path!r}: get_config() failed{_where_in(path, err)}: "
                        f"{type(err).__name__}: {err}") from err
    if not isinstance(config, ml_collections.ConfigDict):
        raise UserError(f"config file {path!r}: get_config() returned a {type(config).__name__}, "
                        "not an ml_collections.ConfigDict")
    sys.modules.pop(module_name, None)
    return config


def parse_config_arg(arg: str | None, allowed: dict) -> dict:
    """Parse a config-file argument ``"depth=24,branch_scaling=none"`` (the part after ``file.py:``).

    ``allowed`` maps each accepted key to its default; values are converted to the default's type.
    """
    result = dict(allowed)
    if not arg:
        return result
    for item in arg.split(","):
        if "=" not in item:
            raise ConfigError(f"config argument {item!r} is not key=value (accepted keys: {sorted(allowed)})")
        key, value = (s.strip() for s in item.split("=", 1))
        if key not in allowed:
            raise ConfigError(f"config argument key {key!r} is not one of {sorted(allowed)}"
                              f"{did_you_mean(key, allowed)}")
        default = allowed[key]
        if isinstance(default, bool):
            if value.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ConfigError(f"config argument {key}={value!r} is not a bool (true/false)")
            result[key] = value.lower() in ("1", "true", "yes")
        elif isinstance(default, (int, float)):
            kind = int if isinstance(default, int) else float
            try:
                result[key] = kind(value)
            except ValueError:
                raise ConfigError(f"config argument {key}={value!r} is not a{'n int' if kind is int else ' number'}"
                                  ) from None
            if kind is float and not math.isfinite(result[key]):
                raise ConfigError(f"config argument {key}={value!r} must be a finite number")
        else:
            result[key] = value
    return result
