"""The benchmarked training step: functional, self-contained, and its measurement (``train_step``).

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

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from layerscale_jax.bench import flops as flops_lib
from layerscale_jax.bench import timing, timm_worker
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

    def describe(self) -> dict:
        return {"model": self.model, "batch": self.batch, "dtype": self.dtype, "scan": self.scan,
                "remat": self.remat, "overrides": dict(self.overrides)}


def make_optimizer() -> optax.GradientTransformation:
    """AdamW as timm trains DeiT III (a constant learning rate: the schedule does not change the step's cost)."""
    return optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.05)


def make_step_fn(graphdef, tx: optax.GradientTransformation, uses_key: bool):
    """The pure (un-jitted) step ``(state, images, labels) -> (state, loss)``."""

    def loss_fn(params, rest, images, labels, key):
        logits = nnx.merge(graphdef, params, rest)(images, key=key)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    def step(state, images, labels):
        key, sub = jax.random.split(state["key"]) if uses_key else (state["key"], None)
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], state["rest"], images, labels, sub)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "rest": state["rest"], "opt_state": opt_state, "key": key}, loss

    return step


def init_state(spec: StepSpec, tx=None):
    """``(model, graphdef, state)`` for ``spec``: the model built with ``create_model`` and its optimizer state."""
    model = create_model(spec.model, rngs=nnx.Rngs(spec.seed),
                         **{**spec.overrides, "dtype": spec.dtype, "scan_layers": spec.scan, "remat": spec.remat})
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = {"params": params, "rest": rest, "opt_state": (tx or make_optimizer()).init(params),
             "key": jax.random.key(spec.seed)}
    return model, graphdef, state


def synthetic_batch(cfg, batch: int, seed: int = 0):
    """Random NHWC float32 images and integer labels of the model's input geometry."""
    ki, kl = jax.random.split(jax.random.key(seed + 1))
    images = jax.random.normal(ki, (batch, cfg.img_size, cfg.img_size, cfg.in_chans), jnp.float32)
    return images, jax.random.randint(kl, (batch,), 0, cfg.num_classes)


def xla_cost(compiled, key: str = "flops") -> float | None:
    """One entry (``"flops"``, ``"bytes accessed"``) of XLA's cost analysis of a compiled executable (None where
    the backend has none)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    return float(cost[key]) if cost and key in cost else None


class CompiledStep:
    """A compiled train step with its state and a synthetic batch: ``run(k)`` runs ``k`` steps and synchronises.

    ``compile_s`` is trace + lower + XLA compile (``lower_s`` and ``xla_compile_s`` its parts);
    ``compiler_options`` are XLA's per-executable options (``lowered.compile(compiler_options=...)``)."""

    def __init__(self, spec: StepSpec, tx=None, compiler_options: dict | None = None):
        self.spec = spec
        self.model, graphdef, self.state = init_state(spec, tx)
        self.cfg = self.model.cfg
        self.images, self.labels = synthetic_batch(self.cfg, spec.batch, spec.seed)
        fn = make_step_fn(graphdef, tx or make_optimizer(), self.cfg.drop_path_rate > 0)
        t0 = time.perf_counter()
        lowered = jax.jit(fn, donate_argnums=0).lower(self.state, self.images, self.labels)
        t1 = time.perf_counter()
        self.compiled = lowered.compile(compiler_options=compiler_options) if compiler_options else lowered.compile()
        t2 = time.perf_counter()
        self.lower_s, self.xla_compile_s, self.compile_s = t1 - t0, t2 - t1, t2 - t0
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
        analytic, xla = flops_lib.train_step_flops(self.cfg, self.spec.batch), xla_cost(self.compiled)
        out = {"flops_analytic": analytic, "flops_xla": xla,
               "flops_xla_over_analytic": None if not xla else xla / analytic}
        if self.spec.scan and xla:
            out.update(flops_xla=None, flops_xla_over_analytic=None, flops_xla_scan_body_once=xla)
        return out

    def memory(self) -> dict:
        return timing.compiled_memory(self.compiled)


def prepare(spec: StepSpec, tx=None) -> tuple[CompiledStep, int | None]:
    """Compile ``spec`` and run two warm-up steps; returns the step and its peak memory.

    GPU: the device's peak bytes in use. CPU: the peak RSS during the two steps minus the RSS before the model was
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
    cpu = jax.default_backend() == "cpu"
    return step, timing.peak_rss_bytes() - base if cpu else timing.device_peak_memory()


def measure_train_step(spec: StepSpec, *, vs_timm: bool = False, repeats: int = 5, min_repeat_s: float = 0.5,
                       peak: dict | None = None, timm_kwargs: dict | None = None) -> dict:
    """img/s, step time, FLOPs per step (XLA's cost analysis, and the analytic count of ``flops``), achieved
    FLOP/s, MFU = model FLOPs / step time / matmul peak (``peak``, measured now if not given), peak memory and
    compile time of ``spec``'s step; with ``vs_timm``, timm's step timed alternately with ours (``timm_worker``),
    ours/timm as the ratio of medians and ``ratio_vs_timm_paired`` (median of timm/ours over repeat pairs)."""
    step, peak_memory = prepare(spec)
    calls, timm = {"ours": step.run}, {}
    if vs_timm:
        cpu = jax.default_backend() == "cpu"
        timm = (timm_worker.start if cpu else timm_worker.prepare)(spec, **(timm_kwargs or {}))
        if timm.get("run") is not None:
            calls["timm"] = timm["run"]
    try:
        stats = timing.measure(calls, warmup=1, repeats=repeats, min_repeat_s=min_repeat_s)
    finally:
        if timm.get("close"):
            timm.pop("close")()
    peak = peak or timing.matmul_peak(spec.dtype)
    f, t = step.flops(), stats["ours"]["median_s"]
    model_flops = f["flops_analytic"]
    out = {**spec.describe(), "num_params": int(sum(np.prod(x.shape) for x in jax.tree.leaves(step.state["params"]))),
           "img_per_s": spec.batch / t, "step_time_s": t, "step_time": stats["ours"],
           "flops_per_step": f["flops_xla"] or model_flops,
           "flops_per_step_source": "xla_cost_analysis" if f["flops_xla"] else "analytic",
           "model_flops_per_step": model_flops, **f, "achieved_flop_per_s": model_flops / t,
           "compile_s": step.compile_s, "lower_s": step.lower_s, "xla_compile_s": step.xla_compile_s,
           "peak_memory_bytes": peak_memory,
           "peak_memory_source": "device_memory_stats" if jax.default_backend() != "cpu"
           else "process_peak_rss_increase",
           "xla_memory": step.memory(), "final_loss": float(step.loss) if step.loss is not None else None,
           "matmul_peak_flop_per_s": peak["flop_per_s"], "mfu": model_flops / t / peak["flop_per_s"]}
    if f["flops_xla"]:
        out["hfu"] = f["flops_xla"] / t / peak["flop_per_s"]
    if not vs_timm:
        return out
    info = {k: v for k, v in timm.items() if k not in ("run", "close")}
    if "timm" not in stats:
        return {**out, "timm_img_per_s": None, "ratio_vs_timm": None, **info}
    tt = stats["timm"]["median_s"]
    out.update({"timm_img_per_s": spec.batch / tt, "timm_step_time_s": tt, "timm_step_time": stats["timm"],
                "ratio_vs_timm": tt / t, "ratio_vs_timm_paired": timing.paired_ratio(stats["timm"], stats["ours"]),
                **info})
    if info.get("timm_matmul_peak_flop_per_s"):
        out["timm_mfu"] = model_flops / tt / info["timm_matmul_peak_flop_per_s"]
    return out
