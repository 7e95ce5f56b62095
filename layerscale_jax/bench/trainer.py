"""The trainer's own step and optimizer against the model-only step and plain optax AdamW; the training
stack (ml_collections, the data package) imported lazily. The reference update, on the same parameters:

    optax.chain(optax.clip_by_global_norm(c), optax.adamw(schedule, b1, b2, eps, weight_decay=wd))
"""
from __future__ import annotations

import time

import jax
import numpy as np
import optax
from flax import nnx

from layerscale_jax.bench import timing
from layerscale_jax.bench.step import CompiledStep, StepSpec, num_params

DEFAULT_CONFIG = "configs/digits_layerscale.py"
DEFAULT_DEPTHS = (12, 24, 48, 96)
TARGET_OPTIMIZER_RATIO = 1.2     # ours / plain AdamW update
TARGET_TRAINER_RATIO = 1.15      # trainer step / model-only step


def plain_adamw(c, total_steps: int) -> optax.GradientTransformation:
    """The reference: optax AdamW with global-norm clipping and the optimizer config ``c``'s schedule."""
    from layerscale_jax.optim import make_schedule
    adamw = optax.adamw(make_schedule(c, total_steps), b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay)
    return optax.chain(optax.clip_by_global_norm(float(c.grad_clip_norm)), adamw) if c.grad_clip_norm > 0 else adamw


def compiled_update(tx: optax.GradientTransformation, params, grads) -> tuple[timing.Loop, dict]:
    """``tx``'s update jitted with ``(params, opt_state)`` donated, as a ``timing.Loop``, and facts about it."""
    def update(state, grads):
        updates, opt_state = tx.update(grads, state[1], state[0])
        return (optax.apply_updates(state[0], updates), opt_state), None

    params = jax.tree.map(lambda x: jax.device_put(np.array(x)), params)     # its own copy: it is donated
    state, t0 = (params, tx.init(params)), time.perf_counter()
    lowered = jax.jit(update, donate_argnums=0).lower(state, grads)
    ops = sum(1 for line in lowered.as_text().splitlines() if " = " in line and "stablehlo." in line)
    loop = timing.Loop(lowered.compile(), state, grads)
    return loop, {"state_nodes": jax.tree.structure(state[1]).num_nodes, "stablehlo_ops": ops,
                  "compile_s": time.perf_counter() - t0}


def compare_updates(ours_tx, plain_tx, abstract_params, *, repeats: int = 5, min_repeat_s: float = 0.3) -> dict:
    """``ours_tx`` against ``plain_tx``, timed alternately on random parameters and gradients (drawn on the host)."""
    rng = np.random.default_rng(0)
    params, grads = (jax.tree.map(lambda x: jax.device_put((s * rng.standard_normal(x.shape)).astype(x.dtype)),
                                  abstract_params) for s in (0.02, 1e-3))
    (ours, o), (plain, p) = compiled_update(ours_tx, params, grads), compiled_update(plain_tx, params, grads)
    stats = timing.measure({"ours": ours.run, "plain": plain.run}, warmup=1, repeats=repeats,
                           min_repeat_s=min_repeat_s)
    return {"leaves": len(jax.tree.leaves(abstract_params)), "ours_s": stats["ours"]["median_s"],
            "plain_s": stats["plain"]["median_s"], "ratio": stats["ours"]["median_s"] / stats["plain"]["median_s"],
            "ratio_paired": timing.paired_ratio(stats["ours"], stats["plain"]), **o,
            **{f"plain_{k}": v for k, v in p.items()}, "times": stats}


def bench_optimizer(config: str = DEFAULT_CONFIG, depths: tuple[int, ...] = DEFAULT_DEPTHS,
                    layouts: tuple[str, ...] = ("unrolled", "scan"), layer_decays: tuple[float, ...] = (0.75, 1.0),
                    repeats: int = 7, min_repeat_s: float = 0.5) -> dict:
    """The trainer's optimizer update against plain AdamW + clipping, per block layout, depth and layer decay."""
    from layerscale_jax import optim
    from layerscale_jax.models import create_model
    from layerscale_jax.train.config import load_config, model_overrides
    rows = []
    for layout in layouts:
        for depth in depths:
            for decay in layer_decays:
                c = load_config(config)
                c.model.depth, c.model.scan_layers = int(depth), layout == "scan"
                c.optim.layer_decay = float(decay)
                model = nnx.eval_shape(lambda: create_model(c.model.name, **model_overrides(c.model)))
                bundle = optim.build(c.optim, model, total_steps=c.train.steps)
                row = compare_updates(bundle.tx, plain_adamw(c.optim, c.train.steps),
                                      nnx.to_pure_dict(nnx.state(model, nnx.Param)), repeats=repeats,
                                      min_repeat_s=min_repeat_s)
                rows.append({"layout": layout, "depth": int(depth), "layer_decay": float(decay),
                             "optimizer": c.optim.name, "layer_groups": len(bundle.rows), **row})
                print(f"  {layout:>8} depth {depth:>3} layer decay {decay:<4g} ours {row['ours_s'] * 1e3:8.2f} ms  "
                      f"plain {row['plain_s'] * 1e3:8.2f} ms  ratio {row['ratio']:.2f}", flush=True)
    worst = max(r["ratio"] for r in rows)
    return {"benchmark": "optimizer", "config": config, "rows": rows, "worst_ratio": worst,
            "target_ratio": TARGET_OPTIMIZER_RATIO, "target_met": worst <= TARGET_OPTIMIZER_RATIO,
            "machine": timing.machine_info()}


def measure_trainer_step(config_spec: str, *, repeats: int = 5, min_repeat_s: float = 0.5) -> dict:
    """``create_trainer(experiment).train_step`` against the model-only step (same model, batch), timed alternately."""
    from layerscale_jax import data as data_lib
    from layerscale_jax.data.sharding import process_batch_rows
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train.config import load_config, model_overrides, validate_experiment_config
    from layerscale_jax.train.loop import create_trainer

    config = load_config(config_spec)
    experiment = validate_experiment_config(config)
    tc, optim = experiment.train, experiment.optim
    mesh = shard_lib.make_mesh(tc.mesh)
    t0 = time.perf_counter()
    trainer = create_trainer(experiment, mesh)
    state = trainer.init_state()
    iterator = data_lib.make_train_iterator(experiment.data, global_batch_size=tc.batch_size, seed=tc.seed,
                                            rows=process_batch_rows(mesh, tc.batch_size))
    batch = data_lib.to_global_batch(next(iterator), mesh, tc.batch_size)
    trainer_loop = timing.Loop(trainer.train_step.lower(state, batch).compile(), state, batch)
    trainer_compile_s = time.perf_counter() - t0
    overrides = model_overrides(config.model)
    dtype, scan, remat = overrides.pop("dtype"), overrides.pop("scan_layers"), overrides.pop("remat")
    model_only = CompiledStep(StepSpec(config.model.name, tc.batch_size, dtype, scan, remat, overrides, tc.seed))
    stats = timing.measure({"trainer": trainer_loop.run, "model_only": model_only.run}, warmup=1, repeats=repeats,
                           min_repeat_s=min_repeat_s)
    abstract = nnx.to_pure_dict(nnx.state(trainer.abstract_model, nnx.Param))
    update = compare_updates(trainer.bundle.tx, plain_adamw(optim, tc.steps), abstract, repeats=repeats)
    t, m = stats["trainer"]["median_s"], stats["model_only"]["median_s"]
    return {"benchmark": "trainer_step", "config": config_spec, "model": config.model.name,
            "depth": config.model.depth, "scan": scan, "batch": tc.batch_size, "dtype": dtype,
            "optimizer": optim.name, "layer_decay": optim.layer_decay, "num_params": num_params(abstract),
            "trainer_step_s": t, "model_only_step_s": m, "trainer_img_per_s": tc.batch_size / t,
            "trainer_over_model_only": t / m,
            "trainer_over_model_only_paired": timing.paired_ratio(stats["trainer"], stats["model_only"]),
            "target_trainer_ratio": TARGET_TRAINER_RATIO, "trainer_target_met": t / m <= TARGET_TRAINER_RATIO,
            "optimizer_update": {k: v for k, v in update.items() if k != "times"},
            "optimizer_target_met": update["ratio"] <= TARGET_OPTIMIZER_RATIO,
            "trainer_compile_s": trainer_compile_s, "model_only_compile_s": model_only.compile_s,
            "final_train_loss": float(jax.device_get(trainer_loop.out)["train_loss"]), "times": stats,
            "machine": timing.machine_info()}
