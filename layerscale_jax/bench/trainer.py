"""The trainer's own step and its optimizer, measured against the model-only step and plain optax AdamW (issue 16).

    python -m layerscale_jax.bench train_step --config configs/digits_layerscale.py:depth=24
    python -m layerscale_jax.bench optimizer --config configs/digits_layerscale.py --depths 12,24,48,96

``train_step --config`` times ``create_trainer(config, mesh).train_step`` — the step every run executes: the
config's model options, ``optim.build``'s optimizer (layer decay, masks, clipping, SAM, accumulation, EMA),
Mixup/CutMix and label smoothing, the metrics and the non-finite guard — interleaved with the model-only step of
``bench.step`` (the same model, batch and compute dtype; integer-label cross-entropy and ``optax.adamw``), and the
optimizer's update alone against plain AdamW on the same parameters. Ratios above 1 are the trainer's overhead.

``optimizer`` sweeps depth (both block layouts, layer decay on and off) and times the jitted update
``(grads, opt_state, params) → (params', opt_state')`` of ``optim.build(config.optim, model)`` against

    optax.chain(optax.clip_by_global_norm(c), optax.adamw(schedule, b1, b2, eps, weight_decay=wd))

with the config's own schedule and hyperparameters, both called from Python with the state donated, as the
trainer calls its step (so host-side work per call, such as flattening the state's pytree, is counted).

These need the training stack (ml_collections; the data package for ``--config`` train steps), imported lazily so
the rest of ``layerscale_jax.bench`` still runs on a bare jax/flax/optax machine.
"""
from __future__ import annotations

import time

import jax
import numpy as np
import optax
from flax import nnx

from layerscale_jax.bench import timing
from layerscale_jax.bench.step import CompiledStep, StepSpec

DEFAULT_CONFIG = "configs/digits_layerscale.py"
DEFAULT_DEPTHS = (12, 24, 48, 96)
LAYOUTS = ("unrolled", "scan")
LAYER_DECAYS = (0.75, 1.0)
TARGET_OPTIMIZER_RATIO = 1.2     # ours / plain AdamW update
TARGET_TRAINER_RATIO = 1.15      # trainer step / model-only step


def plain_adamw(optim_config, total_steps: int) -> optax.GradientTransformation:
    """The reference: plain optax AdamW with global-norm clipping, the config's schedule and hyperparameters."""
    from layerscale_jax.optim import make_schedule
    c = optim_config
    adamw = optax.adamw(make_schedule(c, total_steps), b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=c.weight_decay)
    return optax.chain(optax.clip_by_global_norm(float(c.grad_clip_norm)), adamw) if c.grad_clip_norm > 0 else adamw


class CompiledUpdate:
    """``params, opt_state ← update(grads, opt_state, params)`` of one optax transformation, jitted with the state
    donated; ``run(k)`` applies it ``k`` times and synchronises once."""

    def __init__(self, tx: optax.GradientTransformation, params, grads):
        def update(grads, opt_state, params):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        self.grads, self.params = grads, jax.tree.map(lambda x: jax.device_put(np.array(x)), params)
        self.opt_state = tx.init(self.params)
        self.state_nodes = jax.tree.structure(self.opt_state).num_nodes
        t0 = time.perf_counter()
        lowered = jax.jit(update, donate_argnums=(1, 2)).lower(grads, self.opt_state, self.params)
        self.stablehlo_ops = sum(1 for line in lowered.as_text().splitlines()
                                 if " = " in line and "stablehlo." in line)
        self.compiled = lowered.compile()
        self.compile_s = time.perf_counter() - t0

    def run(self, k: int) -> None:
        params, opt_state = self.params, self.opt_state
        for _ in range(k):
            params, opt_state = self.compiled(self.grads, opt_state, params)
        self.params, self.opt_state = params, opt_state
        timing.block(params)


def _random_like(tree, seed: int, scale: float):
    """Normal numbers shaped like ``tree``, drawn on the host (a jitted draw of thousands of leaves compiles for
    minutes on the CPU)."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jax.device_put((scale * rng.standard_normal(x.shape)).astype(x.dtype)), tree)


def compare_updates(bundle_tx, reference_tx, abstract_params, *, repeats: int = 5,
                    min_repeat_s: float = 0.3) -> dict:
    """Time ``bundle_tx`` against ``reference_tx`` on random parameters and gradients shaped like
    ``abstract_params`` (a pure dict of ``ShapeDtypeStruct``s), interleaved."""
    params, grads = _random_like(abstract_params, 0, 0.02), _random_like(abstract_params, 1, 1e-3)
    ours, plain = CompiledUpdate(bundle_tx, params, grads), CompiledUpdate(reference_tx, params, grads)
    stats = timing.measure({"ours": ours.run, "plain": plain.run}, warmup=1, repeats=repeats,
                                       min_repeat_s=min_repeat_s)
    return {"leaves": len(jax.tree.leaves(abstract_params)),
            "ours_s": stats["ours"]["median_s"], "plain_s": stats["plain"]["median_s"],
            "ratio": stats["ours"]["median_s"] / stats["plain"]["median_s"],
            "ratio_paired": timing.paired_ratio(stats["ours"], stats["plain"]),
            "state_nodes": ours.state_nodes, "plain_state_nodes": plain.state_nodes,
            "stablehlo_ops": ours.stablehlo_ops, "plain_stablehlo_ops": plain.stablehlo_ops,
            "compile_s": ours.compile_s, "plain_compile_s": plain.compile_s,
            "times": {"ours": stats["ours"], "plain": stats["plain"]}}


def _abstract_model(config):
    from layerscale_jax.models import create_model
    from layerscale_jax.train.config import model_overrides
    return nnx.eval_shape(lambda: create_model(config.model.name, **model_overrides(config.model)))


def bench_optimizer(config_spec: str = DEFAULT_CONFIG, depths=DEFAULT_DEPTHS, layouts=LAYOUTS,
                    layer_decays=LAYER_DECAYS, repeats: int = 7, min_repeat_s: float = 0.5) -> dict:
    """The trainer's optimizer update against plain AdamW + clipping, per depth × layout × layer decay.

    The config's model (only ``depth`` and ``scan_layers`` are changed; the width is the config's) and optimizer
    (only ``layer_decay`` is changed); ``total_steps`` is ``config.train.steps``."""
    from layerscale_jax import optim
    from layerscale_jax.train.config import load_config
    rows = []
    for layout in layouts:
        for depth in depths:
            for decay in layer_decays:
                config = load_config(config_spec)
                config.model.depth, config.model.scan_layers = int(depth), layout == "scan"
                config.optim.layer_decay = float(decay)
                model = _abstract_model(config)
                bundle = optim.build(config.optim, model, total_steps=config.train.steps)
                abstract = nnx.to_pure_dict(nnx.state(model, nnx.Param))
                row = compare_updates(bundle.tx, plain_adamw(config.optim, config.train.steps), abstract,
                                      repeats=repeats, min_repeat_s=min_repeat_s)
                rows.append({"layout": layout, "depth": int(depth), "layer_decay": float(decay),
                             "optimizer": config.optim.name, "layer_groups": len(bundle.rows), **row})
                print(f"  {layout:>8} depth {depth:>3} layer decay {decay:<4g} ours {row['ours_s'] * 1e3:8.2f} ms  "
                      f"plain {row['plain_s'] * 1e3:8.2f} ms  ratio {row['ratio']:.2f}", flush=True)
    worst = max(r["ratio"] for r in rows)
    growth = {}
    for layout in layouts:
        for decay in layer_decays:
            by_depth = {r["depth"]: r for r in rows if r["layout"] == layout and r["layer_decay"] == decay}
            lo, hi = min(by_depth), max(by_depth)
            if lo != hi:
                growth[f"{layout}_{decay:g}"] = {
                    "depths": [lo, hi], "time": by_depth[hi]["ours_s"] / by_depth[lo]["ours_s"],
                    "leaves": by_depth[hi]["leaves"] / by_depth[lo]["leaves"],
                    "state_nodes": by_depth[hi]["state_nodes"] / by_depth[lo]["state_nodes"]}
    return {"benchmark": "optimizer", "config": config_spec, "rows": rows, "worst_ratio": worst,
            "target_ratio": TARGET_OPTIMIZER_RATIO, "target_met": worst <= TARGET_OPTIMIZER_RATIO,
            "growth_hi_over_lo": growth, "machine": timing.machine_info()}


def measure_trainer_step(config_spec: str, *, repeats: int = 5, min_repeat_s: float = 0.5) -> dict:
    """The trainer's jitted step against the model-only step (``bench.step``) of the same model and batch, and
    the trainer's optimizer update against plain AdamW, interleaved in one process."""
    from layerscale_jax import data as data_lib
    from layerscale_jax.data.sharding import process_batch_rows
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train.config import load_config, model_overrides
    from layerscale_jax.train.loop import create_trainer

    config = load_config(config_spec)
    tc = config.train
    mesh = shard_lib.make_mesh(tc.mesh)
    t0 = time.perf_counter()
    trainer = create_trainer(config, mesh)
    state = trainer.init_state()
    iterator = data_lib.make_train_iterator(config.data, global_batch_size=tc.batch_size, seed=tc.seed,
                                            rows=process_batch_rows(mesh, tc.batch_size))
    batch = data_lib.to_global_batch(next(iterator), mesh, tc.batch_size)
    compiled = trainer.train_step.lower(state, batch).compile()
    trainer_compile_s = time.perf_counter() - t0
    box = {"state": state, "metrics": None}

    def run_trainer(k: int) -> None:
        s, m = box["state"], None
        for _ in range(k):
            s, m = compiled(s, batch)
        box["state"], box["metrics"] = s, m
        timing.block(m)

    overrides = model_overrides(config.model)
    dtype, scan, remat = overrides.pop("dtype"), overrides.pop("scan_layers"), overrides.pop("remat")
    spec = StepSpec(model=config.model.name, batch=tc.batch_size, dtype=dtype, scan=scan, remat=remat,
                    overrides=overrides, seed=tc.seed)
    model_only = CompiledStep(spec)
    stats = timing.measure({"trainer": run_trainer, "model_only": model_only.run}, warmup=1,
                                       repeats=repeats, min_repeat_s=min_repeat_s)
    abstract = nnx.to_pure_dict(nnx.state(trainer.abstract_model, nnx.Param))
    update = compare_updates(trainer.bundle.tx, plain_adamw(config.optim, tc.steps), abstract, repeats=repeats)
    metrics = jax.device_get(box["metrics"])
    t, m = stats["trainer"]["median_s"], stats["model_only"]["median_s"]
    ratio = t / m
    return {"benchmark": "trainer_step", "config": config_spec, "model": config.model.name,
            "depth": config.model.depth, "scan": scan, "batch": tc.batch_size, "dtype": dtype,
            "optimizer": config.optim.name, "layer_decay": config.optim.layer_decay,
            "num_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract))),
            "trainer_step_s": t, "model_only_step_s": m, "trainer_img_per_s": tc.batch_size / t,
            "trainer_over_model_only": ratio,
            "trainer_over_model_only_paired": timing.paired_ratio(stats["trainer"], stats["model_only"]),
            "target_trainer_ratio": TARGET_TRAINER_RATIO, "trainer_target_met": ratio <= TARGET_TRAINER_RATIO,
            "optimizer_update": {k: v for k, v in update.items() if k != "times"},
            "optimizer_target_met": update["ratio"] <= TARGET_OPTIMIZER_RATIO,
            "trainer_compile_s": trainer_compile_s, "model_only_compile_s": model_only.compile_s,
            "final_train_loss": float(metrics["train_loss"]),
            "times": stats, "machine": timing.machine_info()}

