"""``train_and_evaluate(config, workdir)``: the main job, readable top to bottom. The same loop trains a classifier
(from scratch, or fine-tuned fully, with LoRA or as a linear probe: ``train.finetune``) or pre-trains an MAE; the
task (``train.tasks``) supplies the loss, the evaluation and what is written at each evaluation.

mesh → data → model (abstract) → optimizer → shardings → state (created sharded, or restored) → jitted step →
loop (metrics, evaluation, checkpoints, preemption) → results.json.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx

from layerscale_jax import data as data_lib
from layerscale_jax import optim
from layerscale_jax.models import create_model
from layerscale_jax.paths import as_path, read_json, write_text_atomically
from layerscale_jax.runtime import stop_signals
from layerscale_jax.cli import UserError
from layerscale_jax.data.sharding import process_batch_rows, read_plan
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.train import finetune as finetune_lib
from layerscale_jax.train import tasks as tasks_lib
from layerscale_jax.train import workdir as workdir_lib
from layerscale_jax.train.workdir import CACHE_IN_WORKDIR
from layerscale_jax.train.workdir_lock import WorkdirLock
from layerscale_jax.train.checkpoint import Checkpointer, broadcast_from_primary, gather_from_all, to_jsonable
from layerscale_jax.train.config import (DEFAULT_CACHE_DIR, model_overrides, validate_experiment_config,
                                         validate_train_config)
from layerscale_jax.train.diagnostics import make_diagnostics_fn, to_floats
from layerscale_jax.train.metrics import MetricsWriter
from layerscale_jax.train.step import init_train_state, make_eval_step, make_train_step
from layerscale_jax.errors import ConfigError

log = logging.getLogger(__name__)


class NonFiniteError(UserError, FloatingPointError):
    pass


def _check_model_matches_data(model_cfg, info) -> None:
    from layerscale_jax.models.mae import MAEConfig
    from layerscale_jax.models.registry import get_entry
    pretraining = get_entry(model_cfg.name).config_cls is MAEConfig          # no classifier: labels unused
    for field, expected in ((("num_classes", info.num_classes),) * (not pretraining) +
                            (("img_size", info.image_size), ("in_chans", info.channels))):
        if model_cfg.get(field) != expected:
            raise ConfigError(f"model.{field}={model_cfg.get(field)!r} does not match dataset {info.name!r} "
                              f"({field} = {expected}); set config.model.{field}={expected}")


def _check_batch(name: str, batch_size: int, mesh) -> None:
    batch_devices = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % batch_devices:
        raise ConfigError(f"train.{name}={batch_size} is not divisible by the {batch_devices} devices of the "
                          f"mesh's batch axes (data={mesh.shape['data']} × fsdp={mesh.shape['fsdp']})")


def build_model_fns(config):
    """The abstract model and its train/eval graph definitions (no parameters allocated)."""
    name, overrides = config.model.name, model_overrides(config.model)

    def make(seed: int):
        return finetune_lib.add_adapters(config, create_model(name, rngs=nnx.Rngs(seed), **overrides), seed)

    abstract = nnx.eval_shape(lambda: make(config.train.seed))
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


def evaluate(eval_step_fn, params, config, mesh, task=None) -> dict[str, float]:
    """The task's test metrics over the whole test split (each example counted once, whatever the process layout):
    test loss and accuracy for classification, the masked-patch reconstruction loss for MAE."""
    sums = {"count": 0.0}
    size = config.train.eval_batch_size
    iterator = data_lib.make_eval_iterator(config.data, global_batch_size=size, rows=process_batch_rows(mesh, size))
    for batch in iterator:
        out = eval_step_fn(params, data_lib.to_global_batch(batch, mesh, size))
        for k, v in jax.device_get(out).items():
            sums[k] = sums.get(k, 0.0) + float(v)
    task = task if task is not None else tasks_lib.ClassificationTask()
    return task.summarize({**dict.fromkeys(("loss_sum", "correct"), 0.0), **sums})


@dataclasses.dataclass
class Trainer:
    """Everything the loop needs, built from a config for a mesh (usable on its own in notebooks and tests)."""
    config: Any
    mesh: Any
    info: Any
    make_model: Callable
    abstract_model: nnx.Module
    graphdef_train: Any
    bundle: Any
    param_sharding: Any
    state_shardings: dict
    abstract_state: dict          # ShapeDtypeStructs carrying the target shardings (for restores)
    init_fn: Callable
    train_step: Callable          # jitted, donates the state
    eval_step: Callable           # jitted
    task: Any = None              # train.tasks: classification or MAE
    graphdef_eval: Any = None
    optim_config: Any = None      # config.optim with the fine-tuning mode's frozen parameters
    diagnostics: Callable | None = None   # jitted (params, batch) → train.diagnostics (classification), replicated

    def init_state(self) -> dict:
        """The initial train state, created already sharded; ``train.init_from`` weights replace the random ones."""
        tc = self.config.train
        params = jax.jit(lambda: nnx.state(self.make_model(tc.seed), nnx.Param),
                         out_shardings=self.param_sharding)()
        if tc.init_from:
            from layerscale_jax.convert import load_pretrained
            model = load_pretrained(nnx.merge(self.graphdef_train, params), tc.init_from)
            params = jax.device_put(nnx.state(model, nnx.Param), self.param_sharding)
        return jax.jit(self.init_fn, out_shardings=self.state_shardings)(params)


def create_trainer(config, mesh, info=None) -> Trainer:
    """Validate ``config`` against ``mesh`` and the dataset, and build the sharded, jitted steps. ``info``: the
    dataset's ``DatasetInfo`` (default: read from the dataset; ``compile_for`` declares it from the config)."""
    validate_train_config(config.train)
    tc = config.train
    _check_batch("batch_size", tc.batch_size, mesh)
    _check_batch("eval_batch_size", tc.eval_batch_size, mesh)
    info = info if info is not None else data_lib.get_dataset_info(config.data)
    _check_model_matches_data(config.model, info)

    make_model, abstract_model, graphdef_train, graphdef_eval, abstract_params = build_model_fns(config)
    task = tasks_lib.for_model(abstract_model, info.eval_split)
    optim_config = finetune_lib.optim_config(config, abstract_model)
    bundle = optim.build(optim_config, abstract_model, total_steps=tc.steps)
    shard_lib.check_tensor_parallelism(config.model.name, abstract_model, mesh, tc.sharding_rules)
    param_sharding = shard_lib.param_shardings(abstract_params, mesh, tc.sharding_rules)
    use_ema = config.optim.ema_decay > 0

    def init_fn(params):
        return init_train_state(params, bundle.tx, tc.seed, use_ema)

    abstract_state = jax.eval_shape(init_fn, abstract_params)
    shardings = state_shardings(abstract_state, param_sharding, mesh, tc.sharding_rules)
    abstract_sharded = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                    abstract_state, shardings)
    batch_sharding = {"image": shard_lib.batch_sharding(mesh), "label": shard_lib.batch_sharding(mesh)}
    train_step = jax.jit(
        shard_lib.with_activation_sharding(
            make_train_step(graphdef_train, bundle.tx, bundle.schedule, optim_config=config.optim,
                            data_config=config.data, num_classes=info.num_classes,
                            trainable_mask=bundle.trainable_mask, task=task), mesh, tc.sharding_rules),
        in_shardings=(shardings, batch_sharding), out_shardings=(shardings, shard_lib.replicated(mesh)),
        donate_argnums=(0,))
    eval_batch_sharding = dict(batch_sharding, mask=shard_lib.batch_sharding(mesh))
    eval_step = jax.jit(shard_lib.with_activation_sharding(make_eval_step(graphdef_eval, task), mesh,
                                                           tc.sharding_rules),
                        in_shardings=(param_sharding, eval_batch_sharding),
                        out_shardings=shard_lib.replicated(mesh))
    diagnostics = (make_diagnostics_fn(graphdef_train, mesh, param_sharding, batch_sharding, tc.sharding_rules)
                   if task.uses_labels else None)
    return Trainer(config, mesh, info, make_model, abstract_model, graphdef_train, bundle, param_sharding, shardings,
                   abstract_sharded, init_fn, train_step, eval_step, task=task, graphdef_eval=graphdef_eval,
                   optim_config=optim_config, diagnostics=diagnostics)


def describe_architecture(config, n_params: int) -> dict:
    """What was actually built: the registry name is only the starting point of the overrides."""
    m = config.model
    arch = {"name": m.name, "parameters": n_params}
    for field in ("depth", "embed_dim", "num_heads", "patch_size", "img_size", "in_chans", "num_classes",
                  "branch_scaling", "init_values", "scan_layers", "dtype"):
        if field in m:
            arch[field] = m[field]
    return arch


def _architecture_line(arch: dict) -> str:
    return (f"model {arch['name']} with depth {arch.get('depth')}, width {arch.get('embed_dim')}, "
            f"{arch.get('num_heads')} heads, patch {arch.get('patch_size')} on {arch.get('img_size')}×"
            f"{arch.get('img_size')} images, branch scaling {arch.get('branch_scaling')} "
            f"(init {arch.get('init_values')}): {arch['parameters']:,} parameters")


def use_compilation_cache(directory: str, workdir=None) -> str:
    """JAX's persistent compilation cache in ``directory`` (``train.compilation_cache_dir``; '' leaves it off): a
    restarted job loads its compiled programs instead of compiling them again. Every program is cached however fast
    it compiled (JAX's default skips those under 1 s: the restore's small ones add up); the minimum entry size stays
    JAX's choice for the filesystem. Takes effect only before the process's first compilation. A damaged entry heals
    (``_replace_damaged_cache_entries``).

    JAX writes cache entries from process 0 only, so on a pod a per-host directory leaves hosts 1…N−1 compiling at
    every restart while the pod waits for them. A job of several processes whose ``directory`` is the per-host
    default uses ``<workdir>/xla_cache`` instead, which every process reaches (their checkpoints are there too).
    Returns the directory used ('' for none)."""
    if directory == DEFAULT_CACHE_DIR and workdir is not None and jax.process_count() > 1:
        directory = os.fspath(as_path(workdir) / CACHE_IN_WORKDIR)
    if directory:
        jax.config.update("jax_compilation_cache_dir", os.fspath(as_path(directory, "train.compilation_cache_dir")))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    _replace_damaged_cache_entries()
    return directory


def _replace_damaged_cache_entries() -> None:
    """A damaged entry of the persistent compilation cache (a job killed or a disk filled while JAX wrote it, a
    changed file) fails to load on every run: JAX warns and compiles again, but never replaces it (it writes no key
    that exists). Here an entry that fails to load is deleted first, so that JAX's one warning is followed by the
    compiled program replacing it: the next run loads it."""
    from jax._src import compilation_cache

    load = compilation_cache.get_executable_and_time
    if getattr(load, "replaces_damaged_entries", False):
        return

    def load_or_delete(cache_key, *args, **kwargs):
        try:
            return load(cache_key, *args, **kwargs)
        except Exception:
            root = getattr(compilation_cache._cache, "path", None)
            if root is not None:
                (root / f"{cache_key}-cache").unlink(missing_ok=True)
            raise                                          # JAX warns once, compiles, and writes the entry again

    load_or_delete.replaces_damaged_entries = True
    compilation_cache.get_executable_and_time = load_or_delete


def train_and_evaluate(config, workdir, devices=None, *, restart: bool = False) -> dict:
    """Train ``config`` in ``workdir`` (local or any ``etils.epath`` path; resuming from its latest checkpoint) and
    return the final results.

    ``devices`` (default: all) are arranged into the config's mesh. A finished workdir returns its stored results
    without training; a workdir of a different config, a shorter ``train.steps`` than the run it holds, or an
    earlier run's logs without a checkpoint to resume are refused (``workdir.WorkdirError``). ``restart``
    (``--restart``): the earlier run's files are moved to ``<workdir>/previous/<time>/`` and training starts afresh.
    """
    validate_experiment_config(config)
    workdir = as_path(workdir, "workdir")
    cache = use_compilation_cache(config.train.compilation_cache_dir, workdir)
    is_primary = jax.process_index() == 0
    if is_primary and cache != config.train.compilation_cache_dir:
        print(f"compilation cache: {cache}, shared by the job's {jax.process_count()} processes (set "
              "train.compilation_cache_dir to a shared path to share it between runs too)", flush=True)
    lock = WorkdirLock(workdir)
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
    problem = broadcast_from_primary(problem)      # every process stops, not only process 0
    if problem is not None:
        raise workdir_lib.WorkdirError(problem)
    try:
        with stop_signals:         # SIGTERM / Ctrl-C stop every process at one sync point (layerscale_jax.runtime)
            return _train_and_evaluate(config, workdir, devices, is_primary)
    finally:
        lock.release()


def _train_and_evaluate(config, workdir, devices, is_primary) -> dict:
    tc = config.train
    mesh = shard_lib.make_mesh(tc.mesh, devices)
    trainer = create_trainer(config, mesh)
    use_ema = config.optim.ema_decay > 0
    train_step, eval_step = trainer.train_step, trainer.eval_step
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(trainer.abstract_model, nnx.Param)))
    arch = describe_architecture(config, n_params)
    config_json = to_jsonable(config.to_dict())
    checkpointer = Checkpointer(workdir / "checkpoints", keep=tc.keep_checkpoints,
                                best_metric=trainer.task.best_metric, best_mode=trainer.task.best_mode)
    results_path = workdir / "results.json"

    accepted, problem = [], None
    if is_primary:
        try:
            has_checkpoints = checkpointer.latest_step() is not None
            workdir_lib.check_stored_config(workdir, config_json, has_checkpoints, write=False)   # fields first
            workdir_lib.check_resumable(workdir, checkpointer.directory, checkpointer.latest_step(), tc.steps)
            accepted = workdir_lib.check_stored_config(workdir, config_json, has_checkpoints)
        except workdir_lib.WorkdirError as err:
            problem = str(err)
    problem = broadcast_from_primary(problem)
    if problem is not None:
        checkpointer.close()
        raise workdir_lib.WorkdirError(problem)
    for change in accepted:
        print(f"config changed since the stored run (accepted): {change}", flush=True)
    if checkpointer.latest_step() == tc.steps and results_path.exists():
        results = read_json(results_path, "delete it and rerun: the final checkpoint is evaluated again")
        if results.get("steps") == tc.steps:
            checkpointer.close()
            if is_primary:
                print(f"{workdir} holds a finished run of {tc.steps} steps (raise train.steps to continue it):\n"
                      f"{json.dumps(results, indent=2)}", flush=True)
            return results

    if is_primary:
        print(f"{_architecture_line(arch)}; mesh {dict(mesh.shape)}; {jax.device_count()} devices, "
              f"{jax.process_count()} processes", flush=True)
        print("layer-wise learning-rate multipliers:\n" + trainer.bundle.table(), flush=True)
        if tc.finetune != "full":
            print(finetune_lib.describe(config, trainer.abstract_model, trainer.optim_config), flush=True)
        print("parameter sharding:\n" + shard_lib.describe(trainer.param_sharding), flush=True)

    # State: restored from the workdir, or created already sharded.
    restored = checkpointer.restore(trainer.abstract_state)
    pending: list = []                       # per-step metrics not yet logged
    if restored is not None:
        start_step, state, data_state, pending = restored
        print(f"resumed from step {start_step} in {checkpointer.directory}", flush=True)
        laid_over = workdir_lib.checkpoint_train_steps(checkpointer.directory, start_step) if is_primary else None
        if laid_over not in (None, tc.steps):
            print(_schedule_change(trainer.optim_config, laid_over, tc.steps, start_step,
                                   int(jax.device_get(state["nonfinite_steps"]))), flush=True)
        if is_primary:
            workdir_lib.truncate_metrics(workdir / "metrics.jsonl", start_step)
    else:
        start_step, data_state = 0, None
        state = trainer.init_state()

    # Input pipeline, positioned where the checkpoint left it; this process reads the rows its devices hold.
    train_iter = data_lib.make_train_iterator(config.data, global_batch_size=tc.batch_size, seed=tc.seed,
                                              rows=process_batch_rows(mesh, tc.batch_size))
    if data_state is not None:
        train_iter.set_state(data_state)
    waited_from = time.perf_counter()
    first_batch = data_lib.to_global_batch(next(train_iter), mesh, tc.batch_size)
    first_batch_wait = time.perf_counter() - waited_from   # counted in the first progress line's input wait
    # The train step compiles here, before its first run: a stop signal during start-up, restore or this compile
    # (minutes for a large model on a pod) ends the job before that step, with nothing new to save.
    train_step.lower(state, first_batch).compile()
    if stop_signals.stopped_before(start_step + 1) or stop_signals.requested_anywhere():
        train_iter.close()
        checkpointer.close()
        print(f"stopped before step {start_step + 1}: nothing new to save", flush=True)
        return {"preempted_at_step": start_step}
    diagnostics_batch = _diagnostics_batch(config, mesh) if trainer.diagnostics is not None else None

    writer = MetricsWriter(workdir, tc.steps)
    last_saved = [start_step if restored is not None else None]
    plan = read_plan(mesh.devices, mesh.axis_names, tc.batch_size)
    replicated_rows = config.data.skip_bad_records and len({repr(rows) for rows in plan.values()}) < len(plan)

    def check_replicas(step):
        """Processes that read the same rows (``tensor`` across hosts) must have skipped the same bad records."""
        problem = replica_mismatch(plan, gather_from_all(train_iter.bad_records)) if replicated_rows else None
        if problem is not None:
            raise UserError(f"by step {step}, {problem}: their copies of the dataset differ, so one batch shard got "
                            "different examples on different hosts; give every host the same dataset files (e.g. "
                            "one data.data_dir on gs://) and resume from the last checkpoint")

    def save(step, metrics=None, window=None):
        if last_saved[0] == step:
            return
        check_replicas(step)
        nonfinite = int(jax.device_get(state["nonfinite_steps"]))
        if nonfinite and tc.nonfinite == "raise":
            raise NonFiniteError(_nonfinite_message(step, checkpointer))
        writer.flush()                         # the records up to `step` are in metrics.jsonl before its checkpoint
        checkpointer.save(step, state, train_iter.get_state(), config_json, metrics=metrics, window=window)
        last_saved[0] = step

    try:
        step = start_step
        last_log_time, last_log_step = time.time(), step
        input_wait = first_batch_wait              # seconds spent in next(train_iter) since the last log step
        train_start = time.time()
        eval_results: dict[str, float] = {}
        preempted = False
        while step < tc.steps:
            waited_from = time.perf_counter()       # the step is dispatched asynchronously: time spent here
            if first_batch is not None:             # is time the input pipeline kept the loop waiting
                batch, first_batch = first_batch, None
            else:
                batch = data_lib.to_global_batch(next(train_iter), mesh, tc.batch_size)
            input_wait += time.perf_counter() - waited_from
            state, metrics = train_step(state, batch)
            step += 1
            pending.append(metrics)

            if step % tc.log_every == 0 or step == tc.steps:
                fetched = jax.device_get(pending)
                pending = []
                if not all(m["finite"] for m in fetched) and tc.nonfinite == "raise":
                    bad = step - len(fetched) + next(i for i, m in enumerate(fetched) if not m["finite"])
                    raise NonFiniteError(_nonfinite_message(bad + 1, checkpointer))
                now = time.time()
                scalars = {k: _window_mean([m[k] for m in fetched]) for k in fetched[0]
                           if k.startswith("train_") or k == "grad_norm"}
                scalars["learning_rate"] = float(fetched[-1]["learning_rate"])
                scalars["img_per_s"] = (step - last_log_step) * tc.batch_size / max(now - last_log_time, 1e-9)
                scalars["nonfinite_steps"] = float(jax.device_get(state["nonfinite_steps"]))
                scalars["bad_records"] = float(train_iter.bad_records)
                wait_ms = 1e3 * input_wait / max(step - last_log_step, 1)   # console only: timing, not a record
                last_log_time, last_log_step, input_wait = now, step, 0.0
                writer.write(step, scalars)
                writer.progress(step, {**scalars, "input_wait_ms": wait_ms})
                check_replicas(step)

            is_eval = (tc.eval_every and step % tc.eval_every == 0) or step == tc.steps
            if is_eval:
                eval_params = state["ema"] if use_ema else state["params"]
                eval_results = evaluate(eval_step, eval_params, config, mesh, trainer.task)
                trainer.task.after_evaluation(trainer, eval_params, step, workdir)
                eval_scalars = dict(eval_results)
                if trainer.diagnostics is not None:
                    eval_scalars.update(to_floats(trainer.diagnostics(state["params"], diagnostics_batch)))
                writer.write(step, eval_scalars)
                writer.progress(step, eval_results)
            if (tc.checkpoint_every and step % tc.checkpoint_every == 0) or step == tc.steps:
                save(step, metrics=eval_results if is_eval else None, window=_host_window(pending))

            stop_slot = tc.stop_after_steps and step - start_step >= tc.stop_after_steps
            stop = stop_signals.reached_sync_point(step + 1)
            if not stop and is_eval and step < tc.steps:    # a notice during the evaluation: stop now, not later
                stop = stop_signals.requested_anywhere()
            if (stop or stop_slot) and step < tc.steps:
                preempted = True
                no_time = _no_time_to_save(tc.stop_deadline_seconds, checkpointer) if last_saved[0] != step else None
                if no_time is not None:
                    print(f"stopped at step {step} without saving it ({no_time}); the last checkpoint is step "
                          f"{checkpointer.last_complete} in {checkpointer.directory}", flush=True)
                    break
                save(step, window=_host_window(pending))
                print(f"stopped at step {step}; checkpoint saved in {checkpointer.directory}", flush=True)
                break

        if not preempted and step == start_step:    # restored at the last step: the run ended before its results
            eval_results = evaluate(eval_step, state["ema"] if use_ema else state["params"], config, mesh,
                                    trainer.task)
    finally:
        writer.close()
        train_iter.close()
    checkpointer.close()
    train_seconds = time.time() - train_start
    if preempted:
        return {"preempted_at_step": step}
    results = {**eval_results, "steps": step,
               "train_seconds": train_seconds, "nonfinite_steps": int(jax.device_get(state["nonfinite_steps"])),
               "model": arch, "resumed_from_step": start_step if restored is not None else None}
    if is_primary:
        write_text_atomically(results_path, json.dumps(results, indent=2))
        metrics = (f"{trainer.task.prefix}_accuracy", f"{trainer.task.prefix}_loss")
        tested = ", ".join(f"{k.replace('_', ' ')} {results[k]:.4f}" for k in metrics if k in results)
        skipped = results["nonfinite_steps"]
        if skipped:                    # train.nonfinite='skip': say so where the result is read, not only in json
            tested += (f" ({skipped} of the {step} steps were skipped, their loss, gradient or update non-finite: "
                       "lower optim.learning_rate or set optim.grad_clip_norm)")
        print(f"{tested} after {step} steps ({train_seconds:.1f} s)\n"
              f"checkpoints: {checkpointer.directory}\nmetrics: {writer.jsonl_path}\n"
              f"TensorBoard: tensorboard --logdir {writer.tb_dir}\nresults: {results_path}",
              flush=True)
    return results


def replica_mismatch(plan: dict, skipped: list[int]) -> str | None:
    """Processes reading the same rows of every batch (``plan``: ``data.sharding.read_plan``; with ``tensor`` across
    hosts) feed one batch shard, so with ``data.skip_bad_records`` they must have skipped the same records: the same
    content gives the same decisions. ``skipped``: each process's count, in process order. The mismatch in words (a
    dataset copy that differs between hosts), or None."""
    groups = collections.defaultdict(list)
    for process, rows in plan.items():
        groups[repr(rows)].append(process)
    for processes in groups.values():
        if len({skipped[p] for p in processes}) > 1:
            counts = ", ".join(f"process {p}: {skipped[p]}" for p in processes)
            return f"processes that read the same rows skipped different numbers of bad records ({counts})"
    return None


def _no_time_to_save(deadline: float, checkpointer: Checkpointer) -> str | None:
    """Why the stop's save is skipped, or None: ``train.stop_deadline_seconds`` (the time a preemption notice gives
    before the machine is reclaimed; 0: none) would pass before a save as long as the last one measured in this job
    ends, counted from the notice. Process 0 decides for all (a save is collective); the last sealed checkpoint stays
    the one to resume from. Without a measured save, or a notice (``train.stop_after_steps``), it saves."""
    if not deadline:
        return None
    checkpointer.wait()               # a save still in flight ends first either way: then its time is known
    reason = None
    if jax.process_index() == 0:
        notice, estimate = stop_signals.notice_time(), checkpointer.last_save_seconds
        if notice is not None and estimate is not None:
            left = deadline - (time.time() - notice)
            if estimate > left:
                reason = (f"a save takes about {estimate:.1f} s and {max(left, 0.0):.1f} s of "
                          f"train.stop_deadline_seconds={deadline:g} are left")
    return broadcast_from_primary(reason)


def _diagnostics_batch(config, mesh) -> dict:
    """The batch the per-block diagnostics are measured on at every evaluation: the first train batch of the seed,
    before augmentation by Mixup/CutMix, the same one after a resume."""
    tc = config.train
    with data_lib.make_train_iterator(config.data, global_batch_size=tc.batch_size, seed=tc.seed,
                                      rows=process_batch_rows(mesh, tc.batch_size)) as iterator:
        return data_lib.to_global_batch(next(iterator), mesh, tc.batch_size)


def _window_mean(values: list) -> float:
    """The mean of a logging window's per-step values, accumulated in float64: the same number whether every value
    came from the devices (float32) or the window's first steps came from a checkpoint after a stop (Python floats,
    ``_host_window``), so a resumed run logs exactly what an uninterrupted one does."""
    return float(np.mean(np.asarray(values, dtype=np.float64)))


def _schedule_change(optim_config, old_steps: int, new_steps: int, step: int, skipped: int) -> str:
    """One line: a resumed run's ``train.steps`` differs from the one its checkpoint was trained under, so the
    learning-rate schedule (laid over ``train.steps``) changes from the next step on (optimizer count
    ``step - skipped``, the non-finite steps not counted)."""
    count = step - skipped
    new = float(optim.make_schedule(optim_config, new_steps)(count))
    old = float(optim.make_schedule(optim_config, old_steps)(count))
    return (f"train.steps {old_steps} → {new_steps}: the {optim_config.schedule} learning-rate schedule is laid over "
            f"{new_steps} steps now; step {step + 1} runs at {new:.3g} (with train.steps={old_steps}: {old:.3g})")


def _host_window(pending: list) -> list[dict]:
    """The not-yet-logged per-step metrics as JSON-able floats (carried in the checkpoint across a preemption)."""
    return [{k: float(v) for k, v in m.items()} for m in jax.device_get(pending)]


def _nonfinite_message(step: int, checkpointer: Checkpointer) -> str:
    checkpointer.wait()                           # an async save in flight: only a complete checkpoint is named
    last = checkpointer.last_complete
    where = (f"the last complete checkpoint is step {last} in {checkpointer.directory}" if last is not None
             else "no checkpoint has been saved yet")
    return (f"non-finite loss, gradient norm or update at step {step}; the update was not applied and the run stops "
            f"(train.nonfinite='raise'); {where}")
