"""The benchmarked train step (not the trainer's: no Mixup, no data package) and its measurement (``train_step``).

    step(state, images, labels) -> (state', loss)       jitted, state = {params, rest, opt_state, key} donated
    L(θ) = mean_n −log softmax(f_θ(x_n))_{y_n} ;  θ' = AdamW(θ, ∇L(θ))      (lr 1e-3, wd 0.05, as timm's DeiT III)
    MFU = model FLOPs per step (``flops``) / step time / matmul peak measured on the same device
"""
from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from layerscale_jax.bench import peer, timing, timm_worker
from layerscale_jax.bench.flops import train_step_flops
from layerscale_jax.models import create_model, model_config


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
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "seed"}


def make_optimizer() -> optax.GradientTransformation:
    return optax.adamw(1e-3, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.05)


def make_step_fn(graphdef, tx: optax.GradientTransformation, uses_key: bool):
    """The pure step ``(state, images, labels) -> (state, loss)``."""
    def loss_fn(params, rest, images, labels, key):
        logits = nnx.merge(graphdef, params, rest)(images, key=key)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()

    def step(state, images, labels):
        key, sub = jax.random.split(state["key"]) if uses_key else (state["key"], None)
        loss, grads = jax.value_and_grad(loss_fn)(state["params"], state["rest"], images, labels, sub)
        updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
        return {**state, "params": optax.apply_updates(state["params"], updates), "opt_state": opt_state,
                "key": key}, loss
    return step


def init_state(spec: StepSpec, tx):
    """``(model, graphdef, state)`` for ``spec``."""
    model = create_model(spec.model, rngs=nnx.Rngs(spec.seed),
                         **{**spec.overrides, "dtype": spec.dtype, "scan_layers": spec.scan, "remat": spec.remat})
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return model, graphdef, {"params": params, "rest": rest, "opt_state": tx.init(params),
                             "key": jax.random.key(spec.seed)}


def synthetic_batch(cfg, batch: int, seed: int = 0):
    """Random NHWC float32 images and integer labels of the model's input geometry."""
    ki, kl = jax.random.split(jax.random.key(seed + 1))
    return (jax.random.normal(ki, (batch, cfg.img_size, cfg.img_size, cfg.in_chans)),
            jax.random.randint(kl, (batch,), 0, cfg.num_classes))


def xla_cost(compiled, key: str = "flops") -> float | None:
    """One entry (``"flops"``, ``"bytes accessed"``) of XLA's cost analysis (None where the backend has none)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    return float(cost[key]) if cost and key in cost else None


def num_params(tree) -> int:
    return int(sum(x.size for x in jax.tree.leaves(tree)))


class CompiledStep(timing.Loop):
    """``spec``'s compiled step on a synthetic batch; ``compile_s`` = ``lower_s`` (trace, lower) + ``xla_compile_s``."""

    def __init__(self, spec: StepSpec, tx=None, compiler_options: dict | None = None):
        self.spec, tx = spec, tx or make_optimizer()
        model, graphdef, state = init_state(spec, tx)
        self.cfg, (self.images, self.labels) = model.cfg, synthetic_batch(model.cfg, spec.batch, spec.seed)
        t0 = time.perf_counter()
        lowered = jax.jit(make_step_fn(graphdef, tx, self.cfg.drop_path_rate > 0), donate_argnums=0).lower(
            state, self.images, self.labels)
        t1 = time.perf_counter()
        self.compiled = lowered.compile(compiler_options=compiler_options)
        self.lower_s, self.xla_compile_s, self.compile_s = t1 - t0, time.perf_counter() - t1, time.perf_counter() - t0
        super().__init__(self.compiled, state, self.images, self.labels)

    def flops(self) -> dict:
        """The analytic count and XLA's (set aside when scanned: XLA counts a loop body once)."""
        analytic, xla = train_step_flops(self.cfg, self.spec.batch), xla_cost(self.compiled)
        if self.spec.scan:
            return {"flops_analytic": analytic, "flops_xla": None, "flops_xla_scan_body_once": xla}
        return {"flops_analytic": analytic, "flops_xla": xla, "flops_xla_over_analytic": xla and xla / analytic}


def prepare(spec: StepSpec, tx=None) -> tuple[CompiledStep, int | None]:
    """Compile ``spec``, run two steps: the step and its peak memory (the device's peak bytes in use; on the CPU
    the peak RSS increase from before the model was built: parameters, optimizer state, executable, temporaries)."""
    base = timing.rss_baseline()
    step = CompiledStep(spec, tx)
    timing.rss_baseline()
    step.run(2)
    if jax.default_backend() == "cpu":
        return step, timing.rss_bytes(peak=True) - base
    return step, (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")


def measure_train_step(spec: StepSpec, *, vs_timm: bool = False, vs_peer: bool = False, timm_python: str | None = None,
                       repeats: int = 5, min_repeat_s: float = 0.5, peak: dict | None = None) -> dict:
    """img/s, step time, FLOPs, MFU (against ``peak``, measured now if not given), peak memory and compile time of
    ``spec``'s step; timed alternately with it, timm's step (``ratio_vs_timm`` = timm time / ours) and big_vision's
    ViT architecture (``ours_over_peer`` = peer time / ours); ``*_paired``: the median over repeat pairs."""
    timm_worker.check_python(timm_python)
    if vs_peer:
        peer.check(model_config(spec.model, **spec.overrides), spec.model)
    step, peak_memory = prepare(spec)
    calls, timm, cpu = {"ours": step.run}, {}, jax.default_backend() == "cpu"
    if vs_peer:
        peer_loop, peer_params = peer.compile_step(step.cfg, step.images, step.labels, make_optimizer(), spec.seed)
        calls["peer"] = peer_loop.run
    if vs_timm:
        timm = timm_worker.start(spec, timm_python, "cpu" if cpu else "cuda")
        calls.update({"timm": timm["run"]} if timm["run"] else {})
    try:
        stats = timing.measure(calls, warmup=1, repeats=repeats, min_repeat_s=min_repeat_s)
    finally:
        timm.pop("close", lambda: None)()
    peak, f, t = peak or timing.matmul_peak(spec.dtype), step.flops(), stats["ours"]["median_s"]
    model_flops, xla_flops = f["flops_analytic"], f["flops_xla"]
    out = {**spec.describe(), "num_params": num_params(step.state["params"]), "img_per_s": spec.batch / t,
           "step_time_s": t, "step_time": stats["ours"], "flops_per_step": xla_flops or model_flops,
           "flops_per_step_source": "xla_cost_analysis" if xla_flops else "analytic",
           "model_flops_per_step": model_flops, **f, "achieved_flop_per_s": model_flops / t,
           "compile_s": step.compile_s, "lower_s": step.lower_s, "xla_compile_s": step.xla_compile_s,
           "peak_memory_bytes": peak_memory,
           "peak_memory_source": "process_peak_rss_increase" if cpu else "device_memory_stats",
           "xla_memory": timing.compiled_memory(step.compiled), "final_loss": float(step.out),
           "matmul_peak_flop_per_s": peak["flop_per_s"], "mfu": model_flops / t / peak["flop_per_s"],
           "hfu": xla_flops and xla_flops / t / peak["flop_per_s"]}
    if vs_peer:
        pt, pf = stats["peer"]["median_s"], train_step_flops(step.cfg, spec.batch, class_token=False)
        out.update(peer=peer.LABEL, peer_step_s=pt, peer_img_per_s=spec.batch / pt, peer_step_time=stats["peer"],
                   ours_over_peer=pt / t, ours_over_peer_paired=timing.paired_ratio(stats["peer"], stats["ours"]),
                   peer_num_params=peer_params, peer_flops_analytic=pf, flops_ours_over_peer=model_flops / pf)
    if vs_timm:
        out.update({k: v for k, v in timm.items() if k != "run"}, timm_img_per_s=None, ratio_vs_timm=None)
    if "timm" in stats:
        tt = stats["timm"]["median_s"]
        out.update(timm_img_per_s=spec.batch / tt, timm_step_time_s=tt, timm_step_time=stats["timm"],
                   ratio_vs_timm=tt / t, ratio_vs_timm_paired=timing.paired_ratio(stats["timm"], stats["ours"]),
                   timm_mfu=model_flops / tt / timm["timm_matmul_peak_flop_per_s"])
    return out
