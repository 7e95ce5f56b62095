"""The benchmarked training step: functional, self-contained, and measured by the shared protocol.

    state = {"params", "rest", "opt_state", "key"}      (``nnx.split(model, nnx.Param, ...)`` + optax state)
    step(state, images, labels) -> (state', loss)        jitted, ``state`` donated (updated in place)

    L(θ) = mean_n −log softmax(f_θ(x_n))_{y_n} ;  θ' = AdamW(θ, ∇L(θ))

This is deliberately not ``layerscale_jax.train``'s step (which brings Mixup/CutMix, the data package and
ml_collections): it is the smallest step that trains, so it runs on a bare jax/flax/optax machine and measures the
model, the autodiff and the optimizer update.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layerscale_jax.bench import flops as flops_lib
from layerscale_jax.bench import timing
from layerscale_jax.models import create_model


@dataclasses.dataclass
class StepSpec:
    """One benchmark configuration: a registered model name, its overrides, batch and compute dtype."""
    model: str = "deit3_small_patch16_224"
    batch: int = 16
    dtype: str = "float32"
    scan: bool = False
    remat: str = "none"
    overrides: dict = dataclasses.field(default_factory=dict)
    seed: int = 0

    def model_kwargs(self) -> dict:
        return {**self.overrides, "dtype": self.dtype, "scan_layers": self.scan, "remat": self.remat}


def make_optimizer() -> optax.GradientTransformation:
    """AdamW as timm trains DeiT III (a constant learning rate: the schedule does not change the step's cost)."""
    return optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.05)


def loss_fn(graphdef, params, rest, images, labels, key):
    model = nnx.merge(graphdef, params, rest)
    logits = model(images, key=key)
    return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()


def make_step_fn(graphdef, tx: optax.GradientTransformation, uses_key: bool):
    """The pure (un-jitted) step ``(state, images, labels) -> (state, loss)``."""

    def step(state, images, labels):
        key, sub = jax.random.split(state["key"]) if uses_key else (state["key"], None)
        loss, grads = jax.value_and_grad(loss_fn, argnums=1)(graphdef, state["params"], state["rest"], images,
                                                            labels, sub)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "rest": state["rest"], "opt_state": opt_state, "key": key}, loss

    return step


def init_state(spec: StepSpec, tx=None):
    """``(model, graphdef, state)`` for ``spec``: the model built with ``create_model`` and its optimizer state."""
    model = create_model(spec.model, rngs=nnx.Rngs(spec.seed), **spec.model_kwargs())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = tx or make_optimizer()
    state = {"params": params, "rest": rest, "opt_state": tx.init(params), "key": jax.random.key(spec.seed)}
    return model, graphdef, state


def synthetic_batch(cfg, batch: int, seed: int = 0):
    """Random NHWC float32 images and integer labels of the model's input geometry."""
    ki, kl = jax.random.split(jax.random.key(seed + 1))
    images = jax.random.normal(ki, (batch, cfg.img_size, cfg.img_size, cfg.in_chans), jnp.float32)
    labels = jax.random.randint(kl, (batch,), 0, cfg.num_classes)
    return images, labels


def uses_drop_path(cfg) -> bool:
    return cfg.drop_path_rate > 0


def xla_cost(compiled, key: str = "flops") -> float | None:
    """One entry (``"flops"``, ``"bytes accessed"``) of XLA's cost analysis of a compiled executable (None where
    the backend has none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost or key not in cost:
        return None
    return float(cost[key])


class CompiledStep:
    """A compiled train step with its state and batch, ready to be timed: ``run(k)`` runs ``k`` steps."""

    def __init__(self, spec: StepSpec, tx=None):
        self.spec = spec
        rss_before = timing.current_rss_bytes()
        self.model, graphdef, self.state = init_state(spec, tx)
        self.cfg = self.model.cfg
        self.images, self.labels = synthetic_batch(self.cfg, spec.batch, spec.seed)
        fn = make_step_fn(graphdef, tx or make_optimizer(), uses_drop_path(self.cfg))
        jitted = jax.jit(fn, donate_argnums=0)
        t0 = time.perf_counter()
        lowered = jitted.lower(self.state, self.images, self.labels)
        t1 = time.perf_counter()
        self.compiled = lowered.compile()
        t2 = time.perf_counter()
        self.lower_s, self.compile_s = t1 - t0, t2 - t0
        self.xla_compile_s = t2 - t1
        self.rss_before_model = rss_before
        self.loss = None

    def run(self, k: int) -> None:
        state, loss = self.state, None
        for _ in range(k):
            state, loss = self.compiled(state, self.images, self.labels)
        self.state, self.loss = state, loss
        timing.block(loss)

    def flops(self) -> dict:
        """The analytic count and XLA's. XLA's cost analysis counts a while loop's body once, so with scanned
        layers it misses ``depth - 1`` blocks: there it is reported as ``None`` (with the raw value aside)."""
        analytic = flops_lib.train_step_flops(self.cfg, self.spec.batch)
        xla = xla_cost(self.compiled)
        out = {"flops_analytic": analytic, "flops_xla": xla,
               "flops_xla_over_analytic": None if not xla else xla / analytic}
        if self.spec.scan and xla:
            out.update(flops_xla=None, flops_xla_over_analytic=None, flops_xla_scan_body_once=xla)
        return out

    def memory(self) -> dict:
        return timing.compiled_memory(self.compiled)

    def num_params(self) -> int:
        return int(sum(np.prod(x.shape) for x in jax.tree.leaves(self.state["params"])))


def describe(spec: StepSpec) -> dict:
    return {"model": spec.model, "batch": spec.batch, "dtype": spec.dtype, "scan": spec.scan, "remat": spec.remat,
            "overrides": dict(spec.overrides)}


def step_metrics(step: CompiledStep, stats: dict, peak: dict | None, peak_memory: int | None) -> dict[str, Any]:
    """The reported numbers of one measured step (img/s, FLOPs, FLOP/s, MFU, memory, compile time)."""
    f = step.flops()
    t = stats["median_s"]
    model_flops = f["flops_analytic"]
    out = {
        **describe(step.spec),
        "num_params": step.num_params(),
        "img_per_s": step.spec.batch / t, "step_time_s": t, "step_time": stats,
        "flops_per_step": f["flops_xla"] if f["flops_xla"] else model_flops,
        "flops_per_step_source": "xla_cost_analysis" if f["flops_xla"] else "analytic",
        "model_flops_per_step": model_flops, **f,
        "achieved_flop_per_s": model_flops / t,
        "compile_s": step.compile_s, "lower_s": step.lower_s, "xla_compile_s": step.xla_compile_s,
        "peak_memory_bytes": peak_memory,
        "peak_memory_source": ("device_memory_stats" if jax.default_backend() != "cpu"
                               else "process_peak_rss_increase"),
        "xla_memory": step.memory(),
        "final_loss": float(step.loss) if step.loss is not None else None,
    }
    if peak:
        out["matmul_peak_flop_per_s"] = peak["flop_per_s"]
        out["mfu"] = model_flops / t / peak["flop_per_s"]
        if f["flops_xla"]:
            out["hfu"] = f["flops_xla"] / t / peak["flop_per_s"]
    else:
        out["mfu"] = None
    return out


def prepare(spec: StepSpec, tx=None) -> tuple[CompiledStep, int | None]:
    """Compile ``spec`` and run its warm-up; returns the step and its peak memory.

    GPU: the device's peak bytes in use. CPU: the peak RSS during two steps minus the RSS before the model was
    built (freed heap is returned to the OS before both readings, so earlier work in the process does not count):
    parameters, optimizer state, batch, executable and the step's temporaries.
    """
    timing.malloc_trim()
    base = timing.current_rss_bytes()
    step = CompiledStep(spec, tx)
    timing.malloc_trim()
    timing.reset_peak_rss()
    step.run(1)
    step.run(1)
    if jax.default_backend() == "cpu":
        peak_memory = timing.peak_rss_bytes() - base
    else:
        peak_memory = timing.device_peak_memory()
    return step, peak_memory


def measure_train_step(spec: StepSpec, *, vs_timm: bool = False, repeats: int = 5, min_repeat_s: float = 0.5,
                       peak: dict | None = None, timm_kwargs: dict | None = None) -> dict[str, Any]:
    """Everything ``train_step`` reports for ``spec`` (and timm's numbers, interleaved, with ``vs_timm``)."""
    step, peak_memory = prepare(spec)
    calls = {"ours": step.run}
    timm_info = None
    if vs_timm:
        from layerscale_jax.bench import timm_side
        if jax.default_backend() == "cpu":
            timm_info = timm_side.prepare_worker(spec, **(timm_kwargs or {}))
        else:
            timm_info = timm_side.prepare(spec, **(timm_kwargs or {}))
        if timm_info.get("run") is not None:
            calls["timm"] = timm_info["run"]
    try:
        stats = timing.measure_interleaved(calls, warmup=1, repeats=repeats, min_repeat_s=min_repeat_s)
    finally:
        if timm_info and timm_info.get("close"):
            timm_info.pop("close")()
    if peak is None:
        peak = timing.matmul_peak(spec.dtype)
    out = step_metrics(step, stats["ours"], peak, peak_memory)
    if vs_timm:
        if "timm" in stats:
            t = stats["timm"]["median_s"]
            out.update({"timm_img_per_s": spec.batch / t, "timm_step_time_s": t, "timm_step_time": stats["timm"],
                        "ratio_vs_timm": out["img_per_s"] / (spec.batch / t),
                        # timm's time over ours, repeat by repeat (each pair ran back to back, under the same load)
                        "ratio_vs_timm_paired": float(np.median([b / a for a, b in zip(
                            stats["ours"]["times_s"], stats["timm"]["times_s"])])),
                        **{k: v for k, v in timm_info.items() if k not in ("run", "close")}})
            if timm_info.get("timm_matmul_peak_flop_per_s"):
                out["timm_mfu"] = out["model_flops_per_step"] / t / timm_info["timm_matmul_peak_flop_per_s"]
        else:
            out.update({"timm_img_per_s": None, "ratio_vs_timm": None,
                        **{k: v for k, v in timm_info.items() if k not in ("run", "close")}})
    return out
