"""``train_and_evaluate(experiment, workdir)``: the main job, and ``train_and_record(experiment)``: the same loop in
mode, for a study's runs. The loop trains a classifier (from scratch, or fine-tuned fully, with LoRA or as a linear
probe: ``train.finetune``) or pre-trains an MAE; the task (``train.tasks``) supplies the loss, the evaluation's
metrics and what is written at each evaluation.

mesh → data → model (abstract) → optimizer → shardings → jitted steps (``create_trainer``) → the workdir's policy →
state (created sharded, or restored) → train step compiled → ``_loop`` → results.json.

``_loop`` reads in one glance: step; once per logging window, the metrics behind the non-finite guard; evaluate;
checkpoint; stop. What it calls are named pieces, each in its own module: ``feed.Batches`` (the input, its
position, its wait), ``guard.NonFiniteGuard``, ``metrics.MetricsLog`` (metrics.jsonl, TensorBoard, the console) or
``metrics.RunRecord`` (record mode: the loss curve and the evaluations, returned as the record),
``evaluation.Evaluation`` (the task's metrics, the diagnostics), ``saving.Checkpoints`` and ``saving.Preemption``
(record mode: none), ``profiling.StepProfile`` (``train.profile_steps``' trace; none when empty) and
``goodput.Goodput`` (the attempt's wall time by cause in goodput.jsonl; record mode: none). The workdir's policy
(what a workdir may hold, resuming, the results) is ``_open_workdir``, ``_check_workdir``, ``_restore_or_init`` and
``_write_results`` here.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from flax import nnx

from layerscale_jax import data as data_lib
from layerscale_jax.data.sharding import batch_sharding
from layerscale_jax import network, optim
from layerscale_jax.arch import ArchConfig, MAEConfig
from layerscale_jax.errors import ConfigError, UserError
from layerscale_jax.models.registry import create_from_config
from layerscale_jax.paths import as_path, read_json, write_text_atomically
from layerscale_jax.runtime import stop_signals
from layerscale_jax.storage import workdir as workdir_lib
from layerscale_jax.storage.checkpoint import Checkpointer, broadcast_from_primary, to_jsonable
from layerscale_jax.storage.compile_cache import use_compilation_cache
from layerscale_jax.storage.workdir_lock import WorkdirLock
from layerscale_jax.train import finetune as finetune_lib
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.train import tasks as tasks_lib
from layerscale_jax.optim.config import OptimSettings
from layerscale_jax.train.config import Experiment, TrainSettings, require_experiment
from layerscale_jax.train.diagnostics import make_diagnostics_fn
from layerscale_jax.train.evaluation import Evaluation
from layerscale_jax.train.feed import Batches
from layerscale_jax.train.goodput import Goodput
from layerscale_jax.train.guard import NonFiniteGuard
from layerscale_jax.train.metrics import MetricsLog, MetricsWriter, RunRecord, console_keys
from layerscale_jax.train.profiling import StepProfile, step_fn
from layerscale_jax.train.saving import Checkpoints, Preemption
from layerscale_jax.train.step import init_train_state, make_eval_step, make_train_step


def _check_model_matches_data(arch, info) -> None:
    pretraining = isinstance(arch, MAEConfig)                                # no classifier: labels unused
    for field, expected in ((("num_classes", info.num_classes),) * (not pretraining) +
                            (("img_size", info.image_size), ("in_chans", info.channels),
                             ("patch_dims", info.input_dims))):
        found = getattr(arch, field, 2)                  # patch_dims: 2 (images) in the families without it
        if found != expected:
            raise ConfigError(f"model.{field}={found!r} does not match dataset {info.name!r} "
                              f"({field} = {expected}); set config.model.{field}={expected}")


def _check_batch(name: str, batch_size: int, mesh) -> None:
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % batch_devices:
        raise ConfigError(f"train.{name}={batch_size} is not divisible by the {batch_devices} devices of the "
                          f"mesh's batch axes (data={mesh.shape['data']} × fsdp={mesh.shape['fsdp']})")


def build_model_fns(experiment: Experiment):
    """The abstract model and its train/eval graph definitions (no parameters allocated), for an ``Experiment``
    (``train.config.validate_experiment_config``)."""
    def make(seed: int):
        return finetune_lib.add_adapters(experiment.lora, create_from_config(experiment.model, rngs=nnx.Rngs(seed)),
                                         seed)

    abstract = nnx.eval_shape(lambda: make(experiment.train.seed))
    abstract.train()
    graphdef_train, abstract_params = nnx.split(abstract, nnx.Param)
    abstract.eval()
    graphdef_eval, _ = nnx.split(abstract, nnx.Param)
    abstract.train()
    return make, abstract, graphdef_train, graphdef_eval, abstract_params


def state_shardings(abstract_state: dict, param_sharding, mesh, rules) -> dict:
    """Shardings for the whole train state: params (and EMA) as ``param_sharding``, the optimizer state by
    ``sharding.opt_state_shardings``, the rest replicated."""
    shardings = {k: shard_lib.replicated(mesh) for k in abstract_state}
    shardings["params"] = param_sharding
    if "ema" in abstract_state:
        shardings["ema"] = param_sharding
    shardings["opt_state"] = shard_lib.opt_state_shardings(abstract_state["opt_state"], mesh, rules)
    return shardings


@dataclasses.dataclass
class Trainer:
    """What the loop needs and only the trainer holds, built from an experiment for a mesh (the model, the compiled
    steps, their shardings; usable on its own in notebooks and tests). The loop's pieces take their sections."""
    train: TrainSettings
    arch: ArchConfig              # the architecture the model is built from
    mesh: Any
    info: Any                     # the dataset's DatasetInfo
    make_model: Callable
    abstract_model: nnx.Module
    graphdef_train: Any
    graphdef_eval: Any
    task: Any                     # train.tasks: classification or MAE
    bundle: Any
    optim: OptimSettings          # the optimizer section with the fine-tuning mode's frozen parameters
    param_sharding: Any
    state_shardings: dict
    abstract_state: dict          # ShapeDtypeStructs carrying the target shardings (for restores)
    init_fn: Callable
    train_step: Callable          # jitted, donates the state
    eval_step: Callable           # jitted
    diagnostics: Callable | None  # jitted (params, batch) → train.diagnostics (classification), replicated

    def init_state(self) -> dict:
        """The initial train state, created already sharded; ``train.init_from`` weights replace the random ones."""
        tc = self.train
        params = jax.jit(lambda: nnx.state(self.make_model(tc.seed), nnx.Param),
                         out_shardings=self.param_sharding)()
        if tc.init_from:
            from layerscale_jax.convert import load_pretrained
            model = load_pretrained(nnx.merge(self.graphdef_train, params), tc.init_from)
            params = jax.device_put(nnx.state(model, nnx.Param), self.param_sharding)
        return jax.jit(self.init_fn, out_shardings=self.state_shardings)(params)


def create_trainer(experiment: Experiment, mesh, info=None) -> Trainer:
    """Check the ``experiment`` (``train.config.validate_experiment_config``'s) against ``mesh`` and the dataset, and
    build the sharded, jitted steps. ``info``: the dataset's ``DatasetInfo`` (default: read from the dataset;
    ``compile_for`` declares it from the config)."""
    require_experiment(experiment, "create_trainer")
    tc = experiment.train
    _check_batch("batch_size", tc.batch_size, mesh)
    _check_batch("eval_batch_size", tc.eval_batch_size, mesh)
    info = info if info is not None else data_lib.get_dataset_info(experiment.data)
    _check_model_matches_data(experiment.model, info)

    make_model, abstract_model, graphdef_train, graphdef_eval, abstract_params = build_model_fns(experiment)
    task = tasks_lib.for_model(abstract_model, info.eval_split)
    optim_settings = finetune_lib.optim_settings(experiment, abstract_model)
    bundle = optim.build(optim_settings, abstract_model, total_steps=tc.steps)
    shard_lib.check_tensor_parallelism(experiment.config.model.name, abstract_model, mesh, tc.sharding_rules)
    param_sharding = shard_lib.param_shardings(abstract_params, mesh, tc.sharding_rules)
    use_ema = optim_settings.ema_decay > 0

    def init_fn(params):
        return init_train_state(params, bundle.tx, tc.seed, use_ema)

    abstract_state = jax.eval_shape(init_fn, abstract_params)
    shardings = state_shardings(abstract_state, param_sharding, mesh, tc.sharding_rules)
    abstract_sharded = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    abstract_state, shardings)
    batch_shardings = {"image": batch_sharding(mesh), "label": batch_sharding(mesh)}
    train_step = jax.jit(
        shard_lib.with_activation_sharding(
            make_train_step(graphdef_train, bundle.tx, bundle.schedule, optim_config=optim_settings,
                            data_config=experiment.data, num_classes=info.num_classes,
                            trainable_mask=bundle.trainable_mask, task=task), mesh, tc.sharding_rules),
        in_shardings=(shardings, batch_shardings), out_shardings=(shardings, shard_lib.replicated(mesh)),
        donate_argnums=(0,))
    eval_batch_sharding = dict(batch_shardings, mask=batch_sharding(mesh))
    eval_step = jax.jit(shard_lib.with_activation_sharding(make_eval_step(graphdef_eval, task), mesh,
                                                           tc.sharding_rules),
                        in_shardings=(param_sharding, eval_batch_sharding),
                        out_shardings=shard_lib.replicated(mesh))
    diagnostics = (make_diagnostics_fn(graphdef_train, mesh, param_sharding, batch_shardings, tc.sharding_rules)
                   if task.uses_labels else None)
    return Trainer(experiment.train, experiment.model, mesh, info, make_model, abstract_model, graphdef_train,
                   graphdef_eval, task, bundle, optim_settings, param_sharding, shardings, abstract_sharded, init_fn,
                   train_step, eval_step, diagnostics)


def describe_architecture(config, n_params: int) -> dict:
    """What was actually built: the registry name is only the starting point of the overrides."""
    m = config.model
    arch = {"name": m.name, "parameters": n_params}
    for field in ("depth", "embed_dim", "num_heads", "patch_size", "img_size", "patch_dims", "in_chans",
                  "num_classes", "branch_scaling", "init_values", "scan_layers", "dtype"):
        if field in m:
            arch[field] = m[field]
    return arch


def _architecture_line(arch: dict) -> str:
    size = arch.get("img_size")
    inputs = f"{size}-sample signals" if arch.get("patch_dims") == 1 else f"{size}×{size} images"
    return (f"model {arch['name']} with depth {arch.get('depth')}, width {arch.get('embed_dim')}, "
            f"{arch.get('num_heads')} heads, patch {arch.get('patch_size')} on {inputs}, branch scaling "
            f"{arch.get('branch_scaling')} "
            f"(init {arch.get('init_values')}): {arch['parameters']:,} parameters")


def train_and_evaluate(experiment: Experiment, workdir, devices=None, *, restart: bool = False) -> dict:
    """Train ``experiment`` in ``workdir`` (local or any ``etils.epath`` path; resuming from its latest checkpoint) and
    return the final results.

    ``devices`` (default: all) are arranged into the config's mesh. A finished workdir returns its stored results
    without training; a workdir of a different config, a shorter ``train.steps`` than the run it holds, or an
    earlier run's logs without a checkpoint to resume are refused (``workdir.WorkdirError``). ``restart``
    (``--restart``): the earlier run's files are moved to ``<workdir>/previous/<time>/`` and training starts afresh.
    ``experiment``: the config validated where it entered (the command line, ``api.fit``,
    ``validate_experiment_config``).
    """
    require_experiment(experiment, "train_and_evaluate")
    goodput = Goodput(jax.process_index() == 0)       # this attempt's account (train/goodput.py), from here
    workdir = as_path(workdir, "workdir")
    cache_dir = _check_sources(experiment)
    cache = use_compilation_cache(cache_dir, workdir)
    is_primary = jax.process_index() == 0
    if is_primary and cache != cache_dir:
        print(f"compilation cache: {cache}, shared by the job's {jax.process_count()} processes (set "
              "train.compilation_cache_dir to a shared path to share it between runs too)", flush=True)
    lock = WorkdirLock(workdir)
    _open_workdir(workdir, lock, restart, is_primary)
    try:
        with stop_signals:         # SIGTERM / Ctrl-C stop every process at one sync point (layerscale_jax.runtime)
            return _train_and_evaluate(experiment, workdir, devices, is_primary, goodput)
    finally:
        goodput.end(workdir / "tensorboard")      # the attempt's last record, also after an error or a stop
        lock.release()


def _check_sources(experiment: Experiment) -> str:
    """What the run reads from outside its workdir, checked before anything is built: ``train.init_from`` exists,
    ``data.data_dir`` (or ``TFDS_DATA_DIR``) on ``gs://`` is reachable, else ``UserError`` naming the field; a
    ``train.compilation_cache_dir`` on ``gs://`` that cannot be reached leaves the cache off with one warning line
    (the run works without it). Returns the compilation cache directory to use."""
    from layerscale_jax.data.config import SYNTHETIC
    from layerscale_jax.data.sources import resolve_data_dir
    tc, data = experiment.train, experiment.data
    if data.name != SYNTHETIC:
        field = "data.data_dir" if data.data_dir else "TFDS_DATA_DIR"
        problem = network.cloud_path_problem(resolve_data_dir(data.data_dir), field)
        if problem is not None:
            raise UserError(f"{problem}, or prepare the dataset in a local {field}")
    if tc.init_from:
        source = as_path(tc.init_from, "train.init_from")
        problem = network.cloud_path_problem(source, "train.init_from")
        if problem is not None:
            raise UserError(f"{problem}, or copy the weights to a local train.init_from")
        if not source.exists():
            raise UserError(f"train.init_from={source} does not exist: give a timm weights file, a directory written "
                            "by python -m layerscale_jax.convert or save_pretrained, or a training workdir")
    problem = network.cloud_path_problem(tc.compilation_cache_dir, "train.compilation_cache_dir")
    if problem is not None:
        if jax.process_index() == 0:
            print(f"warning: {problem}; the compilation cache is off for this run", flush=True)
        return ""
    return tc.compilation_cache_dir


def _train_and_evaluate(experiment: Experiment, workdir, devices, is_primary, goodput: Goodput) -> dict:
    config, tc = experiment.config, experiment.train
    trainer = create_trainer(experiment, shard_lib.make_mesh(tc.mesh, devices))
    arch = describe_architecture(config, _count_parameters(trainer.abstract_model))
    config_json = to_jsonable(config.to_dict())
    checkpointer = Checkpointer(workdir / "checkpoints", keep=tc.keep_checkpoints,
                                best_metric=trainer.task.best_metric, best_mode=trainer.task.best_mode)
    finished = _check_workdir(workdir, config_json, checkpointer, tc.steps, is_primary)
    if finished is not None:
        return finished
    goodput.begin(workdir)
    if is_primary:
        _describe(trainer, arch)
    start = _restore_or_init(trainer, checkpointer, workdir, is_primary)
    goodput.spent("restore" if start.resumed else "setup")
    batches = Batches(experiment.data, tc, trainer.mesh, start.data_state)
    goodput.spent("setup")
    # The train step compiles here, before its first run: a stop signal during start-up, restore or this compile
    # (minutes for a large model on a pod) ends the job before that step, with nothing new to save.
    stop_signals.starting(f"stopped before step {start.step + 1}: nothing new to save")
    with stop_signals.compiling():
        trainer.train_step.lower(start.state, batches.first).compile()
    goodput.spent("compile")
    goodput.record()
    if stop_signals.stopped_before(start.step + 1):
        batches.close()
        checkpointer.close()
        print(f"stopped before step {start.step + 1}: nothing new to save", flush=True)
        return {"preempted_at_step": start.step}

    evaluation = Evaluation(experiment.data, tc, trainer.mesh, trainer.eval_step, trainer.task, end=tc.steps,
                            diagnostics=trainer.diagnostics,
                            after=functools.partial(trainer.task.after_evaluation, trainer, workdir=workdir,
                                                    data=experiment.data))
    writer = MetricsWriter(workdir, tc.steps, shown=console_keys(trainer.task), records=start.records,
                           lost=start.lost)
    guard = NonFiniteGuard(tc.nonfinite, checkpointer)
    checkpoints = Checkpoints(checkpointer, writer, batches, guard, config_json, tc.checkpoint_every, end=tc.steps,
                              saved_at=start.step if start.resumed else None)
    log = MetricsLog(writer, batches, tc, end=tc.steps, start_step=start.step, window=start.window)
    profile = StepProfile.of(tc, writer.tb_dir, start.step)       # train.profile_steps; None: no profiler call
    goodput.spent("setup")
    goodput.started_at(start.step, batches.waited_total)
    train_start = time.time()
    try:
        state, step, stopped = _loop(trainer, start.state, start.step, tc.steps, batches=batches, log=log,
                                     guard=guard, evaluation=evaluation, checkpoints=checkpoints,
                                     preemption=Preemption(tc, start.step, checkpoints), profile=profile,
                                     goodput=goodput)
        if not stopped and step == start.step:     # restored at the last step: the run ended before its results
            evaluation.results = evaluation.metrics(state)
    finally:
        if profile is not None:
            profile.close()                        # a run that ended inside the range: what it traced
        writer.close()
        batches.close()
    checkpointer.close()
    if stopped:
        return {"preempted_at_step": step}
    results = {**evaluation.results, "steps": step, "train_seconds": time.time() - train_start,
               "nonfinite_steps": int(jax.device_get(state["nonfinite_steps"])), "model": arch,
               "resumed_from_step": start.step if start.resumed else None}
    if writer.lost:
        results["metrics_records_lost"] = writer.lost     # named in a warning as they were found lost
    if is_primary:
        results["goodput"] = goodput.summary()        # all attempts, this one up to here (train/goodput.py)
        _write_results(workdir / "results.json", results, trainer.task, checkpointer, writer)
    return results


def train_and_record(experiment: Experiment, final_splits: tuple[str, ...] = ()) -> dict:
    """The record mode of the loop, for a study's runs (``experiments/``): train ``experiment`` without a workdir (no
    checkpoints, no logs: a run is short, and its record is its result) and return its record.

    The run ends after ``train.steps``, or after ``train.stop_after_steps`` (> 0) steps of that schedule, with an
    evaluation there, or at the end of the logging window of its first non-finite step (``train.nonfinite='skip'``
    keeps that step out of the state), evaluated there and recorded as diverged: an outcome of the run, not an
    exception. The diagnostics (``train.diagnostics``) are recorded at step 0 and at every evaluation.

    The record: ``train_split``, ``eval_split`` (as the data pipeline resolved them); ``final_<m>`` and ``best_<m>``
    of the task's best metric ``m`` (classification: ``<p>_accuracy``, ``p`` the evaluated split's prefix
    ``test`` or ``val``, ``tasks.metric_prefix``); ``final_train_loss`` (NaN if diverged); ``diverged``,
    ``diverged_at_step``; ``steps``; ``seconds`` and ``timing`` (setup, first step with its compilation, per later
    step, evaluations); ``train_loss_curve`` ([step, mean loss of the window's finite steps] per logging window) and
    ``evaluations`` (dicts with ``step``, the task's metrics and the diagnostics). ``final_splits``: other splits
    the final state is evaluated on, each metric recorded as ``final_<metric>`` (``('test',)`` →
    ``final_test_accuracy``, ``final_test_loss``, ``final_test_examples``): a study that selects on the evaluated
    split and reports another trains each run once. ``experiment``: ``validate_experiment_config``'s."""
    started = time.time()
    require_experiment(experiment, "train_and_record")
    tc = experiment.train
    trainer = create_trainer(experiment, shard_lib.make_mesh(tc.mesh))
    end = min(tc.steps, tc.stop_after_steps or tc.steps)
    state = trainer.init_state()
    guard = NonFiniteGuard("stop")
    evaluation = Evaluation(experiment.data, tc, trainer.mesh, trainer.eval_step, trainer.task, end=end,
                            diagnostics=trainer.diagnostics)
    record = RunRecord(trainer.task, tc.log_every, end=end, started=started)
    with Batches(experiment.data, tc, trainer.mesh) as batches:
        record.evaluated(0, {}, evaluation.diagnostics(state))                 # at initialisation
        record.setup_done()
        state, step, _ = _loop(trainer, state, 0, end, batches=batches, log=record, guard=guard,
                               evaluation=evaluation, checkpoints=_NOTHING, preemption=_NOTHING)
    results = record.results(step, guard.diverged_at, trainer.info, evaluation.seconds)
    for split in final_splits:
        results.update({f"final_{name}": value for name, value in evaluation.on_split(state, split).items()})
    return results


def _loop(trainer, state, step: int, end: int, *, batches, log, guard, evaluation, checkpoints, preemption,
          profile: StepProfile | None = None, goodput: Goodput | None = None):
    """Train from ``step`` to ``end``: each step's metrics are logged once per window (``log``: metrics.jsonl and
    the console, or the record's loss curve) after the non-finite ``guard`` has seen them; evaluations, checkpoints
    and a stop (``preemption``) follow at their steps. A divergence (record mode's guard) ends the loop after its
    evaluation. The steps in ``profile``'s range are traced (``profiling``; None: no profiler call); ``goodput``
    (``goodput.Goodput``; None: none) is charged each step, evaluation, save and stop. Returns
    ``(state, step, stopped)``, ``stopped``: ended early by ``preemption``."""
    take_step = step_fn(trainer.train_step, batches, profile)
    goodput = goodput or Goodput(False)
    while step < end:
        state, metrics = take_step(state, step + 1)
        step += 1
        goodput.trained(step, batches.waited_total)
        log.append(step, metrics)
        if log.due(step):
            fetched = log.fetch()
            guard.check(step, fetched)
            log.write(step, fetched, state)
            goodput.record()
        evaluated = evaluation.due(step) or guard.diverged
        if evaluated:
            goodput.trained(step, batches.waited_total, wait_for=state)
            log.evaluated(step, *evaluation(step, state))
            goodput.spent("evaluation")
            goodput.record()
        if checkpoints.due(step):
            goodput.trained(step, batches.waited_total, wait_for=state)
            checkpoints.save(step, state, evaluation.results if evaluated else None, log.pending)
            goodput.spent("checkpoint")
            goodput.record()
        if guard.diverged:
            break
        if preemption.stopped(step, evaluated, state, log.pending):
            goodput.spent("checkpoint")              # the stop's save
            return state, step, True
    return state, step, False


class _Nothing:
    """Record mode's checkpoints and preemption: none."""

    def due(self, step: int) -> bool:
        return False

    def stopped(self, *args) -> bool:
        return False


_NOTHING = _Nothing()


# -- the workdir: what it may hold, the run's start and its results --------------------------------------------------

def _open_workdir(workdir, lock: WorkdirLock, restart: bool, is_primary: bool) -> None:
    """Create ``workdir`` and take its lock; finish an interrupted ``--restart``, or move the earlier run aside for
    this one. A refusal (``workdir.WorkdirError``) stops every process, not only process 0."""
    problem = None
    if is_primary:
        try:
            workdir_lib.create(workdir)
            lock.acquire()
            finished = workdir_lib.finish_restart(workdir)
            if finished is not None:
                print(f"--restart of an earlier start was interrupted; its moves to {finished} are finished now",
                      flush=True)
            moved = workdir_lib.move_aside(workdir) if restart else None
            if moved is not None:
                print(f"--restart: the earlier run's files are moved to {moved}", flush=True)
        except workdir_lib.WorkdirError as err:
            problem = str(err)
    problem = broadcast_from_primary(problem)
    if problem is not None:
        raise workdir_lib.WorkdirError(problem)


def _check_workdir(workdir, config_json: dict, checkpointer: Checkpointer, steps: int, is_primary: bool) -> dict | None:
    """The workdir policy: a run of another config, of more steps, or logs without a checkpoint to resume are
    refused (``workdir.WorkdirError``, on every process); accepted config changes are named. Returns the stored
    results of a finished run of ``steps`` steps (then nothing is trained), else None."""
    accepted, problem = [], None
    if is_primary:
        try:
            has_checkpoints = checkpointer.latest_step() is not None
            workdir_lib.check_stored_config(workdir, config_json, has_checkpoints, write=False)   # fields first
            workdir_lib.check_resumable(workdir, checkpointer.directory, checkpointer.latest_step(), steps)
            accepted = workdir_lib.check_stored_config(workdir, config_json, has_checkpoints)
        except workdir_lib.WorkdirError as err:
            problem = str(err)
    problem = broadcast_from_primary(problem)
    if problem is not None:
        checkpointer.close()
        raise workdir_lib.WorkdirError(problem)
    for change in accepted:
        print(f"config changed since the stored run (accepted): {change}", flush=True)
    results_path = workdir / "results.json"
    if checkpointer.latest_step() != steps or not results_path.exists():
        return None
    results = read_json(results_path, "delete it and rerun: the final checkpoint is evaluated again")
    if results.get("steps") != steps:
        return None
    checkpointer.close()
    if is_primary:
        print(f"{workdir} holds a finished run of {steps} steps (raise train.steps to continue it):\n"
              f"{json.dumps(results, indent=2)}", flush=True)
    return results


def _describe(trainer: Trainer, arch: dict) -> None:
    """What is trained: the architecture, the mesh, the layer-wise learning rates, the fine-tuning mode, the
    parameters' sharding."""
    mode, mesh = trainer.train.finetune, trainer.mesh
    print(f"{_architecture_line(arch)}; mesh {dict(mesh.shape)}; {jax.device_count()} devices, "
          f"{jax.process_count()} processes", flush=True)
    print("layer-wise learning-rate multipliers:\n" + trainer.bundle.table(), flush=True)
    if mode != "full":
        print(finetune_lib.describe(mode, trainer.abstract_model, trainer.optim), flush=True)
    print("parameter sharding:\n" + shard_lib.describe(trainer.param_sharding), flush=True)


class _Start(NamedTuple):
    step: int
    state: dict
    data_state: Any                  # the train iterator's position (None: from the start)
    window: list                     # the metrics not yet logged when the checkpoint was saved
    resumed: bool
    records: int = 0                 # the records in metrics.jsonl (resumed: rebuilt up to the checkpoint's step)
    lost: int = 0                    # the records of this run that metrics.jsonl has lost


def _restore_or_init(trainer: Trainer, checkpointer: Checkpointer, workdir, is_primary: bool) -> _Start:
    """The state to train from: the newest usable checkpoint's (its records after its step dropped from
    metrics.jsonl; a changed ``train.steps`` named, as it changes the schedule from here), or a new one."""
    restored = checkpointer.restore(trainer.abstract_state)
    if restored is None:
        return _Start(0, trainer.init_state(), None, [], False)
    step, state, data_state, window = restored
    print(f"resumed from step {step} in {checkpointer.directory}", flush=True)
    steps = trainer.train.steps
    laid_over = workdir_lib.checkpoint_train_steps(checkpointer.directory, step) if is_primary else None
    if laid_over not in (None, steps):
        print(_schedule_change(trainer.optim, laid_over, steps, step,
                               int(jax.device_get(state["nonfinite_steps"]))), flush=True)
    records = lost = 0
    if is_primary:
        records, lost = workdir_lib.truncate_metrics(workdir / "metrics.jsonl", step, checkpointer.log_path(step))
    return _Start(step, state, data_state, window, True, records, lost)


def _write_results(path, results: dict, task, checkpointer: Checkpointer, writer: MetricsWriter) -> None:
    """``results.json``, and the final lines: the evaluation's metrics, the steps a ``skip`` guard skipped, where
    the checkpoints, metrics, TensorBoard logs and results are."""
    write_text_atomically(path, json.dumps(results, indent=2))
    step = results["steps"]
    tested = ", ".join(f"{k.replace('_', ' ')} {results[k]:.4f}" for k in task.eval_keys if k in results)
    skipped = results["nonfinite_steps"]
    if skipped:                        # train.nonfinite='skip': say so where the result is read, not only in json
        tested += (f" ({skipped} of the {step} steps were skipped, their loss, gradient or update non-finite: "
                   "lower optim.learning_rate or set optim.grad_clip_norm)")
    print(f"{tested} after {step} steps ({results['train_seconds']:.1f} s)\n"
          f"checkpoints: {checkpointer.directory}\nmetrics: {writer.jsonl_path}\n"
          f"TensorBoard: tensorboard --logdir {writer.tb_dir}\nresults: {path}", flush=True)


def _count_parameters(model: nnx.Module) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def _schedule_change(optim_settings: OptimSettings, old_steps: int, new_steps: int, step: int, skipped: int) -> str:
    """One line: a resumed run's ``train.steps`` differs from the one its checkpoint was trained under, so the
    learning-rate schedule (laid over ``train.steps``) changes from the next step on (optimizer count
    ``step - skipped``, the non-finite steps not counted)."""
    count = step - skipped
    new = float(optim.make_schedule(optim_settings, new_steps)(count))
    old = float(optim.make_schedule(optim_settings, old_steps)(count))
    return (f"train.steps {old_steps} → {new_steps}: the {optim_settings.schedule} learning-rate schedule is laid over "
            f"{new_steps} steps now; step {step + 1} runs at {new:.3g} (with train.steps={old_steps}: {old:.3g})")
