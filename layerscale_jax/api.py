"""The Python API for notebooks and scripts: config in, trained model and history out, in a few lines.

    import layerscale_jax as lsj

    config = lsj.load_config("configs/digits_layerscale.py:depth=4", {"train.steps": 150},
                             optim={"learning_rate": 1e-2})
    run = lsj.fit(config, "runs/digits4_lr1e-2")  # trains in this process (resuming the workdir), returns a Run
    run.results["test_accuracy"], run.history[-1], run.model     # results.json, metrics.jsonl records, nnx.Module
    steps, loss = run.series("train_loss")
    run = lsj.load_run("runs/digits4_lr1e-2")      # any finished or interrupted workdir, the same Run
    lsj.evaluate(run.model, config)                # {"test_loss", "test_accuracy", "test_examples"}
    lsj.diagnose(run.model, lsj.example_batch(config, "train"))   # per-block ratios, gradient norms, mean |λ|

Every function checks its input where it enters and raises the command line's one-line message as an exception
(``cli.UserError`` or ``ValueError``). Nothing is left behind in the process: a cell can be re-run (a finished
workdir returns its stored run at once), and Ctrl-C during ``fit`` stops at a step boundary after saving a
checkpoint (``TrainingInterrupted``), so ``fit`` on the same workdir resumes exactly where it stopped.
"""
from __future__ import annotations

import copy
import dataclasses
import tempfile
from pathlib import Path
from typing import Any, Mapping

import jax
import ml_collections
import numpy as np
from etils import epath
from flax import nnx

from layerscale_jax.errors import ConfigError, UserError
from layerscale_jax.paths import as_path, is_url, read_json
from layerscale_jax.storage.workdir import metrics_lines
from layerscale_jax.train import config as config_lib

__all__ = ["Run", "TrainingInterrupted", "compile_for", "diagnose", "evaluate", "example_batch", "fit", "load_config",
           "load_run", "override_config"]


class TrainingInterrupted(KeyboardInterrupt):
    """``fit`` was stopped by Ctrl-C (SIGINT) or SIGTERM after ``step`` steps, with their checkpoint in ``workdir``
    (none when the signal came before the first step).

    A ``KeyboardInterrupt``, so a loop of runs in a cell stops too; ``fit(config, err.workdir)`` resumes the run."""

    def __init__(self, workdir: Path, step: int):
        super().__init__(f"stopped after step {step}; fit(config, {str(workdir)!r}) resumes the run from there")
        self.workdir, self.step = workdir, step


@dataclasses.dataclass
class Run:
    """A training run read from its workdir.

    ``config``: the experiment config (``ml_collections.ConfigDict``). ``model``: the ``nnx.Module`` holding the
    checkpoint's weights, in eval mode (``model.train()`` turns stochastic depth back on). ``step``: the step of
    that checkpoint. ``results``: ``results.json`` (test metrics, steps, timing, the architecture) when the run
    finished at ``step``, else None. ``history``: the ``metrics.jsonl`` records up to ``step``, one dict per logged
    step (``{"step", "train_loss", "learning_rate", ...}``) and per evaluation (``{"step", "test_accuracy",
    "test_loss", "diag/blocks.3.attn.scale", ...}``). ``workdir``: where it all is. ``goodput``: where the run's
    wall time went over all its attempts, as the workdir's ``goodput.jsonl`` holds it now (``goodput`` = productive
    step time / wall time, ``badput`` by cause, ``seconds``, ``attempts``, ``redone_steps``:
    ``layerscale_jax.train.goodput.summarize``), None for a run without one.
    """
    config: ml_collections.ConfigDict
    model: nnx.Module
    step: int
    results: dict | None
    history: list[dict]
    workdir: Path
    goodput: dict | None = None

    @property
    def finished(self) -> bool:
        return self.results is not None

    def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)``: the records of ``history`` that hold ``key``, in step order. Raises ``KeyError``
        naming the recorded keys when no record holds it."""
        records = [r for r in self.history if key in r]
        if not records:
            known = sorted({k for r in self.history for k in r} - {"step"})
            from layerscale_jax.errors import did_you_mean
            raise KeyError(f"no record of the history holds {key!r}{did_you_mean(key, known)}; recorded: "
                           f"{', '.join(k for k in known if not k.startswith('diag/'))} and diag/<group>.<layer>.* "
                           "(train.diagnostics)")
        return np.array([r["step"] for r in records]), np.array([r[key] for r in records])


# ---------------------------------------------------------------------------------------------------------------
# Configs.

def _dotted(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"steps": 5}, "model.depth": 8}`` → ``{"train.steps": 5, "model.depth": 8}``."""
    flat = {}
    for key, value in overrides.items():
        if isinstance(value, Mapping) and not isinstance(value, ml_collections.ConfigDict):
            flat.update(_dotted(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def override_config(config: ml_collections.ConfigDict, overrides: Mapping[str, Any] | None = None,
                    **sections: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of ``config`` with fields replaced, checked as the command line checks them; ``config`` is unchanged.

    ``overrides`` maps dotted field names to values (``{"train.steps": 300, "model.depth": 8}``, as
    ``--config.train.steps=300``); ``sections`` give the same per section (``train={"steps": 300}``). Returns the
    validated config. Raises ``UserError`` for an unknown field (the CLI's message, naming the closest fields) and
    ``ValueError`` naming the field and the value for a value of the wrong type or out of range.
    """
    flat = _dotted({**(overrides or {}), **sections})
    config_lib.check_override_paths(config, [f"--config.{path}" for path in flat])
    config = config_lib.with_overrides(config, flat)
    config_lib.validate_experiment_config(config)
    return config


def load_config(spec: str, overrides: Mapping[str, Any] | None = None,
                **sections: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """The experiment config of ``spec`` (the command line's ``--config``: ``"configs/NAME.py[:arg]"``), with
    ``overrides`` / ``sections`` applied as in ``override_config``. Returns the validated ``ConfigDict``; raises
    the CLI's one-line errors (``UserError`` for a missing or broken file or an unknown field, ``ValueError`` for a
    bad value)."""
    return override_config(config_lib.load_config(spec), overrides, **sections)


# ---------------------------------------------------------------------------------------------------------------
# Training and loading runs.

def _local_workdir(workdir: str | Path) -> Path:
    """The local directory of a workdir written as the command line takes it (``~``, relative, ``file://PATH``);
    ``gs://`` and other schemes raise ``UserError``: the Python API trains and reads local workdirs."""
    path = as_path(workdir, "workdir")
    if is_url(path):
        raise UserError(f"workdir={str(workdir)!r}: fit and load_run use a local workdir (a path, ~/..., or "
                        "file://PATH); train on gs:// with python -m layerscale_jax.train --workdir gs://..., and copy "
                        "the workdir to this machine to load it (gcloud storage cp -r)")
    return Path(path)


def fit(config: ml_collections.ConfigDict, workdir: str | Path | None = None, *, ema: bool | None = None,
        restart: bool = False) -> Run:
    """Train ``config`` in this process, as ``python -m layerscale_jax.train`` would, and return the ``Run``.

    ``workdir``: the run's local directory (a path, ``~/...`` or ``file://PATH``, as on the command line; ``gs://``
    is refused: train there with the command line); an existing one is resumed from its newest checkpoint (a
    finished one is returned without training; one of a different config is refused), None makes a new temporary
    directory (kept: delete ``run.workdir`` when done). ``ema`` chooses the model's weights as in ``load_run``.
    ``restart=True`` starts over in a workdir that holds an earlier run without a usable checkpoint (the CLI's
    ``--restart``: its files move to ``WORKDIR/previous/<time>/``).

    It prints what the command line prints (docs/python_api.md): the model and its parameter groups, the progress
    (one line updated in place in a terminal or notebook), the results and where they are. Ctrl-C (or SIGTERM)
    stops at the next step boundary, saves a checkpoint (when there is new state) and raises
    ``TrainingInterrupted`` naming the workdir; a second Ctrl-C stops at once. A config stopped by
    ``train.stop_after_steps`` returns the unfinished ``Run`` (``run.finished`` is False). Errors in the config or
    workdir raise the CLI's one-line messages (``ValueError``, ``UserError``, ``workdir.WorkdirError``).
    """
    from layerscale_jax.convert.workdir import workdir_checkpoint
    from layerscale_jax.train.loop import train_and_evaluate

    experiment = config_lib.validate_experiment_config(config)
    workdir = Path(tempfile.mkdtemp(prefix="layerscale_jax_run_")) if workdir is None else _local_workdir(workdir)
    try:
        start_step = workdir_checkpoint(workdir)[0]
    except (FileNotFoundError, ValueError):
        start_step = 0
    results = train_and_evaluate(experiment, workdir, restart=restart)
    stopped = results.get("preempted_at_step")
    slot = experiment.train.stop_after_steps
    if stopped is not None and not (slot and stopped - start_step >= slot):
        raise TrainingInterrupted(workdir, stopped)
    run = load_run(workdir, ema=ema)
    return dataclasses.replace(run, config=config)


def compile_for(config: ml_collections.ConfigDict, target: str, *, check_fit: bool = True, eval_step: bool = True):
    """``config``'s train and eval steps compiled for ``target`` (a TPU or GPU slice, ``plan.targets``) on this
    machine, as ``python -m layerscale_jax.train --compile_for TARGET`` compiles them: the ``plan.compile_for``
    report (memory per chip, FLOPs, collectives, step-time range; ``report.fits``, ``report.format()``). A run that
    does not fit raises ``DoesNotFit``, one line with the numbers (``check_fit=False``: the report instead)."""
    from layerscale_jax.plan import compile_for as plan

    return plan.compile_for(config_lib.validate_experiment_config(config), target, check_fit=check_fit,
                            eval_step=eval_step)


def load_run(workdir: str | Path, *, step: int | None = None, ema: bool | None = None) -> Run:
    """The ``Run`` of a training workdir, finished or interrupted: its newest complete checkpoint (or ``step``'s).

    ``ema``: True for the EMA of the parameters (an error if the run kept none, ``optim.ema_decay=0``), False for
    the parameters, None (default) for the weights the run evaluated (the EMA when it kept one). The config is the
    one stored with the checkpoint. Raises ``UserError`` for a missing directory, ``FileNotFoundError`` /
    ``ValueError`` naming the workdir when it holds no usable checkpoint (or not ``step``).
    """
    from layerscale_jax.convert.pretrained import load_workdir
    from layerscale_jax.convert.workdir import checkpoint_config, workdir_checkpoint

    given, workdir = workdir, _local_workdir(workdir)
    if workdir.is_file():
        raise UserError(f"workdir {str(given)!r} is a file, not a training workdir (a directory with checkpoints/); "
                        "a converted model loads with layerscale_jax.convert.load_model, a timm file with from_timm")
    if not workdir.is_dir():
        raise UserError(f"workdir {str(given)!r} does not exist" + (f" ({workdir})" if str(workdir) != given else ""))
    step, directory = checkpoint = workdir_checkpoint(workdir, step)      # its files hashed once, here
    model, _ = load_workdir(workdir, ema=ema, checkpoint=checkpoint)
    model.eval()
    results = None
    if (workdir / "results.json").is_file():
        results = read_json(epath.Path(workdir) / "results.json", "delete it and rerun fit (or the training command): "
                            "the final checkpoint is evaluated again")
        if results.get("steps") != step:
            results = None
    history = []
    if (workdir / "metrics.jsonl").is_file():         # a torn last line is dropped with a warning
        history = [record for _, record in metrics_lines(epath.Path(workdir) / "metrics.jsonl")
                   if record["step"] <= step]
    config = ml_collections.ConfigDict(checkpoint_config(directory))
    from layerscale_jax.train import goodput as goodput_lib
    return Run(config=config, model=model, step=step, results=results, history=history, workdir=workdir,
               goodput=goodput_lib.read(workdir))


# ---------------------------------------------------------------------------------------------------------------
# Using a model.

def _params(model: nnx.Module, mode: str):
    """``(graphdef, params)`` of ``model`` in ``mode`` ('train' | 'eval'), without changing ``model``'s mode."""
    graphdef, params = nnx.split(model, nnx.Param)
    copy_ = nnx.merge(graphdef, params)
    copy_.eval() if mode == "eval" else copy_.train()
    return nnx.split(copy_, nnx.Param)


def example_batch(config: ml_collections.ConfigDict, split: str = "eval", size: int | None = None) -> dict:
    """A batch of host arrays ``{"image": (n, H, W, C) float32, normalised as the model sees it, "label": (n,)}``.

    ``split='eval'``: the first ``size`` (default ``train.eval_batch_size``) examples of the evaluated split,
    unaugmented. ``split='train'``: the seed's first train batch of ``size`` (default ``train.batch_size``),
    augmented but before Mixup/CutMix — with the default size, the batch the run's logged diagnostics used.
    """
    from layerscale_jax import data as data_lib

    if split not in ("eval", "train"):
        raise ConfigError(f"split={split!r} is not 'eval' (the config's evaluated split) or 'train'")
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ConfigError(f"size={size!r} must be a positive integer")
    if split == "train":
        size = size or config.train.batch_size
        iterator = data_lib.make_train_iterator(config.data, global_batch_size=size, seed=config.train.seed,
                                                process_index=0, process_count=1)
    else:
        size = size or config.train.eval_batch_size
        iterator = data_lib.make_eval_iterator(config.data, global_batch_size=size, process_index=0,
                                               process_count=1)
    with iterator:
        batch = next(iter(iterator))
    keep = np.asarray(batch["mask"], bool) if "mask" in batch else slice(None)
    return {"image": np.asarray(batch["image"])[keep], "label": np.asarray(batch["label"])[keep]}


def diagnose(model: nnx.Module, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The per-block diagnostics of ``train.diagnostics`` for ``model`` on ``batch`` (``{"image", "label"}``, e.g.
    ``example_batch``), as host arrays: ``"loss"`` (scalar, the hard-label cross-entropy), and per block group and
    branch one value per layer: ``"blocks/attn.ratio"`` (‖scaled branch‖ / ‖residual stream‖), ``"blocks/attn.scale"``
    (mean |λ|; absent for ``branch_scaling='none'``), likewise ``mlp``, and ``"blocks/grad_norm"`` (‖∂L/∂θ_l‖)."""
    from layerscale_jax.train import tasks as tasks_lib
    from layerscale_jax.train.diagnostics import branch_diagnostics

    if not tasks_lib.for_model(model).uses_labels:
        raise ConfigError(f"diagnose measures a classifier's blocks on its loss; {type(model).__name__} is not one")
    missing = {"image", "label"} - set(batch)
    if missing:
        raise ConfigError(f"batch lacks {sorted(missing)}: diagnose needs {{'image', 'label'}}")
    graphdef, params = _params(model, "eval")
    inputs = {k: jax.numpy.asarray(batch[k]) for k in ("image", "label", "mask") if k in batch}
    out = jax.jit(branch_diagnostics, static_argnums=0)(graphdef, params, inputs)
    return {key: np.asarray(value) for key, value in jax.device_get(out).items()}


def evaluate(model: nnx.Module, config: ml_collections.ConfigDict, split: str | None = None) -> dict[str, float]:
    """The test metrics of ``model`` over a whole split of ``config.data``'s dataset, each example counted once,
    computed as the training loop's evaluation: ``{"test_loss", "test_accuracy", "test_examples"}`` for a
    classifier (``val_*`` when the split is not 'test'), the masked-patch reconstruction loss for an MAE.

    ``split``: a split name of the dataset (``data.eval_split``); None: the config's evaluated split. The batches
    are ``train.eval_batch_size`` on the config's mesh over all devices.
    """
    from layerscale_jax.data import get_dataset_info, validate_data_config
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train import tasks as tasks_lib
    from layerscale_jax.train.evaluation import evaluate as evaluate_split
    from layerscale_jax.train.step import make_eval_step

    if split is not None:
        config = copy.deepcopy(config)           # only the data section is read: a stored config of an older run works
        config.data.eval_split = split
    data = validate_data_config(config.data)
    info = get_dataset_info(data)
    cfg = model.cfg
    for field, expected in (("num_classes", info.num_classes), ("img_size", info.image_size),
                            ("in_chans", info.channels), ("patch_dims", info.input_dims)):
        found = getattr(cfg, field, 2 if field == "patch_dims" else expected)
        if found != expected:
            raise ConfigError(f"the model's {field}={found!r} does not match dataset {info.name!r} ({field} = "
                              f"{expected})")
    mesh = shard_lib.make_mesh(config.train.mesh)
    graphdef, params = _params(model, "eval")
    task = tasks_lib.for_model(model, info.eval_split)
    params = jax.device_put(params, shard_lib.replicated(mesh))
    return evaluate_split(jax.jit(make_eval_step(graphdef, task)), params, data, config.train.eval_batch_size,
                          mesh, task)
