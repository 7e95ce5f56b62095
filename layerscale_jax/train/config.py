"""The ``config.train`` and ``config.model`` sections: every field, its default and its meaning; and the checks of
a whole experiment config where it enters. No jax: the command line runs all of it first.

A full experiment config (see ``configs/``) has four sections (and an optional ``lora``, see ``train.finetune``):
``model`` (registry name plus architecture overrides: ``model_section``), ``data`` (``layerscale_jax.data.config``),
``optim`` (``layerscale_jax.optim.config``) and ``train`` (below). Config files take these defaults from
``layerscale_jax.config_defaults``.

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
                      top-level ``config.lora`` section (``layerscale_jax.lora_config``) sets rank, α,
                      dropout, targets and whether the head, norms and LayerScale λ train.
  compilation_cache_dir   JAX's persistent compilation cache (a restart loads the compiled step instead of
                      compiling it again): a local path (default ``~/.cache/layerscale_jax/xla``, per host; with
                      several processes the default becomes ``WORKDIR/xla_cache``, which they all reach), or a path
                      every host and every restarted VM shares (``gs://BUCKET/xla_cache``); '' turns it off. See
                      docs/storage.md.
  profile_steps       () (default: no profiler call at all), or (first, last): a ``jax.profiler`` trace of the train
                      steps first..last (the steps as logged, 1 ≤ first ≤ last ≤ steps) in
                      ``WORKDIR/tensorboard/plugins/profile/``, where TensorBoard's profile plugin and XProf read it
                      (``train.profiling``); a resume that starts inside the range traces the rest of it.
  profile_all_processes   False: only process 0 traces; True: every process writes its own trace.

``lora`` fields: ``layerscale_jax.lora_config``.

``load_config(spec)`` reads a config file (``configs/X.py[:arg]``) and ``validate_experiment_config(config)``
checks all sections where the config enters (the command line calls both before jax is imported): unknown
sections and fields are refused with the closest valid names, every number must be finite and in range, and each
error names the field and the value. It returns an ``Experiment``, every section typed and frozen (``ArchConfig``,
``DataSettings``, ``TrainSettings`` with its ``MeshSettings`` and sharding rules, ``OptimSettings``,
``LoraSettings``), so nothing after the entry point reads the ``ConfigDict`` or checks a section again.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import math
import os
import sys
import traceback

import ml_collections

from layerscale_jax.arch import ArchConfig, MAEConfig, get_entry, model_config
from layerscale_jax.data.config import DataSettings, validate_data_config
from layerscale_jax.errors import ConfigError, UserError, did_you_mean
from layerscale_jax.lora_config import LoraSettings
from layerscale_jax.optim.config import OptimSettings
from layerscale_jax.paths import as_path
from layerscale_jax.settings import Section, boolean, check_fields, choice, integer, number
from layerscale_jax.storage.compile_cache import DEFAULT_CACHE_DIR

NONFINITE_MODES = ("raise", "skip")
FINETUNE_MODES = ("full", "lora", "linear_probe")          # train.finetune

MESH_AXES = ("data", "fsdp", "tensor")
# Parallelism across slices (TPU multi-slice, over the data-centre network) or, where devices carry no slice, across
# processes: ``mesh.dcn_<axis>`` granules along each axis (MaxText's ``dcn_*``), ``mesh.<axis>`` devices within one.
DCN_AXES = tuple(f"dcn_{axis}" for axis in MESH_AXES)

# Default logical → mesh axis rules: FSDP over the embedding dimension, tensor parallelism over heads and MLP.
DEFAULT_RULES = (
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("classes", None),
    ("layers", None),
)


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
        if field.type in ("float", float):
            value = float(value)
        elif field.type in ("float | str", "str | float"):
            value = ml_collections.FieldReference(value, field_type=object)
        section[field.name] = value
    return section


def model_overrides(model_cfg) -> dict:
    """``config.model`` without its name: the overrides of the registered model, as ``create_model`` takes them."""
    cfg = model_cfg.to_dict() if hasattr(model_cfg, "to_dict") else dict(model_cfg)
    cfg.pop("name")
    return cfg


@dataclasses.dataclass(frozen=True)
class MeshSettings(Section):
    """``train.mesh``: ``data``, ``fsdp``, ``tensor`` positive integers or -1 (at most one: the remaining devices),
    ``dcn_*`` positive integers; a missing axis is 1."""
    PREFIX = "train.mesh"
    data: int = 1
    fsdp: int = 1
    tensor: int = 1
    dcn_data: int = 1
    dcn_fsdp: int = 1
    dcn_tensor: int = 1

    def __post_init__(self):
        for axis in MESH_AXES:
            integer(f"train.mesh.{axis}", getattr(self, axis), 1, also=(-1,), note=" or -1 (the remaining devices)")
        for axis in DCN_AXES:
            integer(f"train.mesh.{axis}", getattr(self, axis), 1)
        fill = [a for a in MESH_AXES if getattr(self, a) == -1]
        if len(fill) > 1:
            raise ConfigError(f"train.mesh: at most one of data, fsdp, tensor may be -1, got {', '.join(fill)} = -1")


def sharding_rules(rules) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """``train.sharding_rules`` checked: (logical axis, a mesh axis, several or None) pairs, as tuples."""
    checked = []
    for rule in rules:
        if isinstance(rule, str) or len(rule) != 2 or not isinstance(rule[0], str):
            raise ConfigError(f"train.sharding_rules entry {rule!r} must be a (logical axis, mesh axis) pair")
        name, target = rule
        target = target if target is None or isinstance(target, str) else tuple(target)
        for t in (target,) if isinstance(target, str) else target or ():
            if t not in MESH_AXES:
                raise ConfigError(f"sharding rule {name!r} → {target!r}: {t!r} is not a mesh axis {MESH_AXES}")
        checked.append((name, target))
    return tuple(checked)


def profile_steps(value, steps: int) -> tuple[int, ...]:
    """``train.profile_steps`` checked: ``()`` or ``(first, last)``, integers with 1 ≤ first ≤ last ≤ ``steps``."""
    pair = tuple(value) if isinstance(value, (tuple, list)) else None
    if pair == ():
        return pair
    if (pair is None or len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair)
            or not 1 <= pair[0] <= pair[1] <= steps):
        raise ConfigError(f"train.profile_steps={value!r} must be () (no profile) or (first, last), the train steps "
                          f"to trace, integers with 1 ≤ first ≤ last ≤ train.steps={steps}")
    return pair


@dataclasses.dataclass(frozen=True)
class TrainSettings(Section):
    """``config.train``, checked when it is made (the module doc has every field)."""
    PREFIX = "train"
    steps: int = 1000
    batch_size: int = 128
    eval_batch_size: int = 256
    seed: int = 0
    log_every: int = 50
    eval_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    mesh: MeshSettings = MeshSettings(data=-1)
    sharding_rules: tuple = DEFAULT_RULES
    nonfinite: str = "raise"
    init_from: str = ""
    stop_after_steps: int = 0
    stop_deadline_seconds: float = 0.0
    finetune: str = "full"
    compilation_cache_dir: str = DEFAULT_CACHE_DIR
    profile_steps: tuple = ()
    profile_all_processes: bool = False

    def __post_init__(self):
        for field in ("steps", "batch_size", "eval_batch_size", "log_every", "keep_checkpoints"):
            integer(f"train.{field}", getattr(self, field), 1)
        for field in ("eval_every", "checkpoint_every", "stop_after_steps", "seed"):
            integer(f"train.{field}", getattr(self, field), 0)
        self._set("stop_deadline_seconds", number("train.stop_deadline_seconds", self.stop_deadline_seconds, 0.0))
        self._set("mesh", MeshSettings.of(self.mesh))
        self._set("sharding_rules", sharding_rules(self.sharding_rules))
        choice("train.nonfinite", self.nonfinite, NONFINITE_MODES)
        choice("train.finetune", self.finetune, FINETUNE_MODES)
        for field in ("init_from", "compilation_cache_dir"):
            if not isinstance(getattr(self, field), str):
                raise ConfigError(f"train.{field}={getattr(self, field)!r} must be '' or a path")
        if self.compilation_cache_dir:
            as_path(self.compilation_cache_dir, "train.compilation_cache_dir")     # a supported scheme
        self._set("profile_steps", profile_steps(self.profile_steps, self.steps))
        boolean("train.profile_all_processes", self.profile_all_processes)


def default_train_config() -> ml_collections.ConfigDict:
    """``config.train``'s defaults as the ``ConfigDict`` a config file starts from."""
    return TrainSettings().to_config()


def validate_train_config(train) -> TrainSettings:
    """``config.train`` (a ``ConfigDict``, a mapping or ``TrainSettings``) as ``TrainSettings``."""
    return TrainSettings.of(train)


def validate_model_section(model) -> ArchConfig:
    """Check ``config.model`` and return it as the architecture config the trainer builds
    (``models.create_from_config``): a registered name, known fields (with the closest names), finite numbers, and
    everything the config class checks (divisibility, ranges, choices), without building anything."""
    name = model.get("name")
    if not isinstance(name, str):
        raise ConfigError(f"model.name={name!r} must be a registered model name")
    entry = get_entry(name)                                    # an unknown name lists the closest registered ones
    fields = {f.name for f in dataclasses.fields(entry.config_cls)}
    check_fields(model, fields | {"name"}, "model.")
    overrides = model_overrides(model)
    for key, value in overrides.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"model.{key}={value!r} must be a finite number")
    try:
        return entry.make_config(overrides)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model ({name}): {err}") from err


SECTIONS = ("model", "data", "optim", "train")
OPTIONAL_SECTIONS = ("lora",)


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A validated experiment config, one typed section each: ``model``, the architecture config the trainer builds;
    ``data``, the ``data.config.DataSettings`` the input pipeline reads; ``train`` (``TrainSettings``, its mesh and
    sharding rules included); ``optim`` (``optim.config.OptimSettings``); ``lora`` (``lora_config.LoraSettings``
    with ``train.finetune='lora'``, the section's defaults where it is absent; else None). ``config`` is the
    ``ConfigDict`` as given, written to the workdir's config.json. Made once by ``validate_experiment_config`` where
    a config enters (the command line, ``api.fit``, the loop's entries); what it is passed to checks nothing again."""
    config: ml_collections.ConfigDict
    model: ArchConfig
    data: DataSettings
    train: TrainSettings
    optim: OptimSettings
    lora: LoraSettings | None = None


def validate_experiment_config(config) -> Experiment:
    """Check a whole experiment config (the four sections and the optional ``lora``) where it enters, and return
    it as an ``Experiment``; raises ``ConfigError`` naming the field and the value. Nothing is built, no device is
    touched and jax is not imported."""
    check_fields(config, SECTIONS + OPTIONAL_SECTIONS, "")
    missing = [s for s in SECTIONS if s not in config]
    if missing:
        raise ConfigError(f"config lacks section(s) {missing}; a config has the sections {list(SECTIONS)}")
    arch = validate_model_section(config.model)
    data = validate_data_config(config.data)
    train = TrainSettings.of(config.train)
    optim = OptimSettings.of(config.optim).check_steps(train.steps)
    lora = LoraSettings.of(config.lora) if "lora" in config else None
    if lora is not None and train.finetune != "lora":
        raise ConfigError(f"config.lora is set but train.finetune={train.finetune!r}; set train.finetune='lora' or "
                          "remove the lora section")
    if train.finetune != "full" and isinstance(arch, MAEConfig):
        raise ConfigError(f"train.finetune={train.finetune!r} needs a classifier, but model.name="
                          f"{config.model.name!r} is an MAE pre-training model; fine-tune its encoder in a ViT "
                          "(train.init_from=<MAE run>)")
    return Experiment(config, arch, data, train, optim, lora or (LoraSettings() if train.finetune == "lora" else None))


def require_experiment(value, function: str) -> Experiment:
    """``value``, an ``Experiment``: the library's functions take the config validated once where it entered (the
    command line, ``api``, ``validate_experiment_config``); anything else, a ``ConfigDict`` included, is refused in
    one line rather than run unchecked."""
    if not isinstance(value, Experiment):
        raise TypeError(f"{function} takes an Experiment, not a {type(value).__name__}: validate the config once "
                        "where it enters, experiment = validate_experiment_config(config)")
    return value


CONFIG_FLAG = "config"               # the command line's --config, and --config.SECTION.FIELD overrides


def _leaf_paths(config, prefix: str = "") -> list[str]:
    paths = []
    for key in config.keys():
        path = prefix + key
        paths.append(path)
        value = config[key]
        if hasattr(value, "keys") and not isinstance(value, (str, bytes)):
            paths += _leaf_paths(value, path + ".")
    return paths


def check_override_paths(config, overrides: list[str]) -> None:
    """Refuse ``--config.X`` overrides whose field does not exist, naming the closest existing fields."""
    paths = [f"{CONFIG_FLAG}.{p}" for p in _leaf_paths(config)]
    for arg in overrides:
        if not arg.startswith("-"):
            continue                                           # the value of a '--config.a.b value' pair
        name = arg.lstrip("-").split("=", 1)[0]
        field = f"{CONFIG_FLAG}.{name.split('.', 1)[1]}" if "." in name else CONFIG_FLAG
        node = config
        for key in field.split(".")[1:]:
            if not hasattr(node, "keys") or key not in node.keys():
                raise UserError(f"unknown config field {field}{did_you_mean(field, paths)}")
            node = node[key]


def with_overrides(config, overrides: dict) -> ml_collections.ConfigDict:
    """A copy of ``config`` with the fields of dotted paths set (``{"train.steps": 300}``, as
    ``--config.train.steps=300``); a value of the wrong type raises ``ConfigError`` naming the path."""
    changed = copy.deepcopy(config)
    for path, value in overrides.items():
        *parents, field = path.split(".")
        node = changed
        for key in parents:
            node = node[key]
        try:
            node[field] = value
        except (TypeError, ValueError) as err:
            raise ConfigError(f"config.{path}={value!r}: {err}") from None
    return changed


def _where_in(path: str, err: BaseException) -> str:
    """``" at line N"``: the last line of the config file ``path`` in ``err``'s traceback (``""`` if none)."""
    lines = [frame.lineno for frame in traceback.extract_tb(err.__traceback__)
             if os.path.abspath(frame.filename) == os.path.abspath(path)]
    return f" at line {lines[-1]}" if lines else ""


def load_config(spec: str) -> ml_collections.ConfigDict:
    """The config of ``configs/X.py[:arg]``: the file's ``get_config(arg)`` (``get_config()`` without an
    argument). Raises ``UserError`` naming the file for a missing or unreadable file, ``ValueError`` for a bad
    argument. (Not ml_collections' ``DEFINE_config_file``: it names neither the file nor the line in these errors.)"""
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
