"""The benchmark entries: each a small function that measures one thing and returns a JSON-able dict.

``@entry(name, help, *args, ...)`` registers a function in ``ENTRIES``: the command line (``cli``) makes it the
subcommand ``name`` with ``args`` (``(flag, argparse kwargs)`` pairs whose destinations are the function's
parameters; ``spec`` adds the ``StepSpec`` flags and passes ``spec=``), and ``report.show`` prints its result from
``tables`` and ``fields``. ``all`` runs the CPU suite and writes one results file. Shapes are chosen so the suite
finishes in minutes on 2 cores; every entry states its shapes. Only ``pipeline`` needs the data stack and only
``optimizer``/``trainer_step`` the training stack (ml_collections); both are imported lazily.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import inspect
import json
import os
import resource
import re
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from layerscale_jax.bench import profile, timing, trainer
from layerscale_jax.bench.report import report, show, summarize
from layerscale_jax.bench.step import CompiledStep, StepSpec, init_state, make_optimizer, make_step_fn, \
    measure_train_step, prepare, synthetic_batch, xla_cost
from layerscale_jax.bench.timing import REPO, run_fresh

DTYPES = ("float32", "bfloat16")
# The model of the depth ablations (configs/digits_layerscale.py): 8×8×1 digits, patch 2, width 64, 4 heads.
ABLATION = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, num_heads=4,
                drop_path_rate=0.05, init_values="auto")
# A small ViT for the depth sweeps: 32×32×3, patch 4 (65 tokens), 10 classes.
SMALL = dict(img_size=32, patch_size=4, in_chans=3, num_classes=10)
DEPTH_SHAPE = dict(SMALL, embed_dim=128, num_heads=2)
MEMORY_SHAPE = dict(SMALL, embed_dim=64, num_heads=2)
DEFAULT_DEPTHS = (12, 24, 48, 96)


@dataclasses.dataclass(frozen=True)
class Entry:
    run: Callable[..., dict]
    help: str
    args: tuple = ()                 # (flag, argparse kwargs) pairs
    spec: dict = dataclasses.field(default_factory=dict)    # StepSpec flags taken, with their defaults
    tables: dict = dataclasses.field(default_factory=dict)  # result key → columns printed
    fields: tuple = ()               # scalar paths printed after the tables
    hidden: bool = False


ENTRIES: dict[str, Entry] = {}


def entry(name: str, help: str, *flags, args=(), spec=None, tables=None, fields=(), hidden=False):
    """Register ``fn`` as entry ``name``; ``flags`` and ``args`` are ``(flag, argparse kwargs)`` pairs."""
    def register(fn):
        ENTRIES[name] = Entry(fn, help, flags + tuple(args), spec or {}, tables or {}, fields, hidden)
        return fn
    return register


def call(name: str, options: dict):
    """Run entry ``name`` with the parsed options that are its parameters (and ``spec`` built from them)."""
    e = ENTRIES[name]
    params = inspect.signature(e.run).parameters
    kwargs = {k: v for k, v in options.items() if k in params}
    if e.spec:
        fields = {k: options[k] for k in ("model", "batch", "dtype", "scan", "remat") if k in options}
        kwargs["spec"] = StepSpec(**fields, overrides=parse_overrides(options.get("set")))
    return e.run(**kwargs)


def display(name: str, result) -> None:
    """Print ``result`` of entry ``name`` (or of the entry its ``benchmark`` key names) with ``report.show``."""
    e = ENTRIES.get(result.get("benchmark") if isinstance(result, dict) else None) or ENTRIES[name]
    show(result, e.tables, e.fields)


def parse_overrides(items: list[str] | None) -> dict:
    """``["depth=6", "embed_dim=64", "branch_scaling=none"]`` → ``{"depth": 6, ...}`` (Python literals or strings)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE, e.g. --set depth=6")
        key, value = item.split("=", 1)
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def spec_flags(spec: StepSpec) -> list[str]:
    """The command-line flags that rebuild ``spec`` in a fresh process (model, batch, dtype, scan, remat, --set)."""
    return ["--model", spec.model, "--batch", str(spec.batch), "--dtype", spec.dtype, "--remat", spec.remat,
            *(["--scan"] if spec.scan else []), *[a for k, v in spec.overrides.items() for a in ("--set", f"{k}={v}")]]


def ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(","))


def floats(s: str) -> tuple[float, ...]:
    return tuple(float(x) for x in s.split(","))


def names(s: str) -> tuple[str, ...]:
    return tuple(s.split(","))


def stamp(result: dict) -> dict:
    result.setdefault("machine", timing.machine_info())
    return result


STEP = dict(model="deit3_small_patch16_224", batch=16, dtype="float32", scan=False, remat="none", set=None)
TRAIN_STEP_FIELDS = ("model", "batch", "dtype", "scan", "remat", "overrides", "num_params", "step_time_s",
                     "img_per_s", "flops_per_step", "flops_per_step_source", "flops_analytic",
                     "flops_xla_over_analytic", "achieved_flop_per_s", "matmul_peak_flop_per_s", "mfu",
                     "peak_memory_bytes", "peak_memory_source", "xla_memory.peak_bytes", "compile_s", "lower_s",
                     "timm_img_per_s", "timm_step_time_s", "timm_mfu", "timm_threads", "torch_version",
                     "ratio_vs_timm", "ratio_vs_timm_paired", "machine.load_average")
TRAINER_COLUMNS = ("config", "depth", "batch", "trainer_step_s", "model_only_step_s", "trainer_over_model_only",
                   "trainer_over_model_only_paired", "optimizer_update.ratio", "trainer_target_met")


# ---- the train step, its profile, the matmul peak ----------------------------------------------------------------


@entry("train_step", "one training step, optionally against timm", spec=STEP, fields=TRAIN_STEP_FIELDS, args=(
    ("--config", dict(dest="config_spec", default=None, metavar="configs/X.py[:ARGS]",
                      help="time the trainer's own step (create_trainer) for this config against the model-only "
                           "step and its optimizer against plain AdamW (the model options are then ignored)")),
    ("--vs-timm", dict(action="store_true", help="time timm's model of the same name side by side")),
    ("--timm-adamw", dict(choices=("default", "fused", "foreach"), default="default",
                          help="torch AdamW implementation for the timm side")),
    ("--repeats", dict(type=int, default=5)), ("--min-repeat-s", dict(type=float, default=0.5))))
def train_step(spec: StepSpec, config_spec: str | None = None, vs_timm: bool = False, timm_adamw: str = "default",
               repeats: int = 5, min_repeat_s: float = 0.5) -> dict:
    """``step.measure_train_step`` of ``spec`` (with ``config_spec``: ``trainer.measure_trainer_step``)."""
    if config_spec:
        return trainer.measure_trainer_step(config_spec, repeats=repeats, min_repeat_s=min_repeat_s)
    r = measure_train_step(spec, vs_timm=vs_timm, repeats=repeats, min_repeat_s=min_repeat_s,
                           timm_kwargs={"adamw": timm_adamw})
    return stamp(r)


@entry("profile", "where the train step's time goes, per XLA operation", fields=("spec", "timed_ops_ms_per_step"),
       spec={k: STEP[k] for k in ("model", "batch", "dtype", "set")},
       tables={"by_kind": ("kind", "ms_per_step"), "by_op": ("ms_per_step", "count", "kind", "shape", "op_name")},
       args=(("--steps", dict(type=int, default=3)), ("--top", dict(type=int, default=25))))
def bench_profile(spec: StepSpec, steps: int = 3, top: int = 25) -> dict:
    """``profile.profile_step``: milliseconds per step of each XLA operation, from ``jax.profiler``'s trace."""
    return profile.profile_step(spec, steps=steps, top=top)


@entry("matmul", "matmul peak of jax (and torch) on this device", ("--n", dict(type=int, default=None)),
       fields=tuple(f"{side}.{dt}.flop_per_s" for side in ("jax", "torch") for dt in DTYPES))
def matmul(n: int | None = None) -> dict:
    """``timing.matmul_peak`` (the MFU denominator) for jax and torch, float32 and bfloat16."""
    out = {"machine": timing.machine_info(), "jax": {dt: timing.matmul_peak(dt, n=n) for dt in DTYPES}}
    try:
        import torch  # noqa: F401
        out["torch"] = {dt: timing.torch_matmul_peak(dt, n=n or 2048) for dt in DTYPES}
    except ImportError:
        out["torch"] = "torch not importable"
    return out


# ---- the model against timm and against itself --------------------------------------------------------------------


@entry("ablation", "the depth-ablation model (digits, width 64, depth 6 and 24) vs timm",
       ("--depths", dict(type=ints, default=(6, 24))), ("--batch", dict(type=int, default=128)),
       ("--no-timm", dict(dest="vs_timm", action="store_false")), fields=("shape", "target_met"),
       tables={"rows": ("overrides.depth", "step_time_s", "img_per_s", "timm_img_per_s", "ratio_vs_timm",
                        "ratio_vs_timm_paired", "mfu", "timm_mfu", "compile_s")})
def bench_ablation(depths=(6, 24), batch: int = 128, vs_timm: bool = True, repeats: int = 7) -> dict:
    """``train_step`` of the depth-ablation model (8×8×1 digits, width 64, 4 heads, drop path 0.05) vs timm."""
    rows = [measure_train_step(StepSpec(batch=batch, overrides=dict(ABLATION, depth=d)), vs_timm=vs_timm,
                               repeats=repeats) for d in depths]
    out = {"benchmark": "ablation", "shape": dict(ABLATION, batch=batch), "rows": rows}
    if all(r.get("ratio_vs_timm") is not None for r in rows):
        out.update(target_ratio=1.0, target_met=all(r["ratio_vs_timm"] >= 1.0 for r in rows))
    return stamp(out)


@entry("layerscale", "LayerScale vs none at equal shapes", ("--repeats", dict(type=int, default=7)),
       fields=("target_met",), tables={"rows": ("case", "layerscale_step_s", "none_step_s", "overhead",
                                                "overhead_ratio_of_medians", "bytes_accessed_overhead")})
def bench_layerscale(cases=None, repeats: int = 15) -> dict:
    """Step time of LayerScale against ``branch_scaling='none'`` at equal shapes, timed alternately; the overhead
    is the median of the per-pair ratios (steadier than the ratio of medians, also reported), with XLA's bytes
    accessed and temporaries of both executables."""
    cases = cases or [("deit3_small_patch16_224 b16", "deit3_small_patch16_224", 16, {}),
                      ("ablation depth 24 b128", "deit3_small_patch16_224", 128,
                       dict(ABLATION, depth=24, drop_path_rate=0.0))]
    rows = []
    for label, model, batch, overrides in cases:
        steps = {}
        for scaling in ("layerscale", "none"):
            o = {k: v for k, v in overrides.items() if not (scaling == "none" and k == "init_values")}
            steps[scaling], _ = prepare(StepSpec(model=model, batch=batch, overrides=dict(o, branch_scaling=scaling)))
        stats = timing.measure({k: s.run for k, s in steps.items()}, warmup=1, repeats=repeats)
        ls, none = stats["layerscale"]["median_s"], stats["none"]["median_s"]
        pairs = [a / b for a, b in zip(stats["layerscale"]["times_s"], stats["none"]["times_s"])]
        b = {k: xla_cost(s.compiled, "bytes accessed") for k, s in steps.items()}
        rows.append({"case": label, "model": model, "batch": batch, "overrides": overrides,
                     "layerscale_step_s": ls, "none_step_s": none, "overhead": float(np.median(pairs)) - 1,
                     "overhead_ratio_of_medians": ls / none - 1, "paired_ratios": pairs,
                     "layerscale": stats["layerscale"], "none": stats["none"],
                     "flops_xla": {k: s.flops()["flops_xla"] for k, s in steps.items()}, "bytes_accessed_xla": b,
                     "temp_bytes_xla": {k: s.memory().get("temp_size_in_bytes") for k, s in steps.items()},
                     "bytes_accessed_overhead": b["layerscale"] / b["none"] - 1 if b["none"] else None})
        del steps
    return stamp({"benchmark": "layerscale", "rows": rows, "target_overhead": 0.02,
                  "target_met": all(r["overhead"] <= 0.02 for r in rows)})


@entry("seeds", "several seeds in one vmapped step vs one after another", ("--num-seeds", dict(type=int, default=4)),
       ("--depth", dict(type=int, default=6)), ("--batch", dict(type=int, default=128)),
       fields=("num_seeds", "shape", "sequential_s_per_round", "vmapped_s_per_round", "sequential_img_per_s",
               "vmapped_img_per_s", "speedup"))
def bench_seeds(num_seeds: int = 4, depth: int = 6, batch: int = 128, repeats: int = 7) -> dict:
    """``num_seeds`` ablation models trained in one ``jax.vmap``-ed step against the same models stepped one after
    another, timed alternately. Each seed has its own parameters, optimizer state, dropout key and batch; the
    vmapped step stacks them on a leading axis and is one jitted, donated call."""
    tx = make_optimizer()
    built = [init_state(StepSpec(batch=batch, seed=s, overrides=dict(ABLATION, depth=depth)), tx)
             for s in range(num_seeds)]
    cfg = built[0][0].cfg
    fn = make_step_fn(built[0][1], tx, cfg.drop_path_rate > 0)
    batches = [synthetic_batch(cfg, batch, seed=s) for s in range(num_seeds)]
    seq_states = [jax.tree.map(jnp.copy, b[2]) for b in built]
    t0 = time.perf_counter()
    seq_compiled = jax.jit(fn, donate_argnums=0).lower(seq_states[0], *batches[0]).compile()
    seq_compile = time.perf_counter() - t0
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[b[2] for b in built])
    images, labels = jnp.stack([b[0] for b in batches]), jnp.stack([b[1] for b in batches])
    t0 = time.perf_counter()
    vm_compiled = jax.jit(jax.vmap(fn), donate_argnums=0).lower(stacked, images, labels).compile()
    vm_compile = time.perf_counter() - t0
    holder = {"vm": stacked}

    def run_seq(k):
        loss = None
        for _ in range(k):
            for i in range(num_seeds):
                seq_states[i], loss = seq_compiled(seq_states[i], *batches[i])
        timing.block(loss)

    def run_vm(k):
        loss = None
        for _ in range(k):
            holder["vm"], loss = vm_compiled(holder["vm"], images, labels)
        timing.block(loss)

    stats = timing.measure({"sequential": run_seq, "vmapped": run_vm}, warmup=1, repeats=repeats)
    seq_t, vm_t = stats["sequential"]["median_s"], stats["vmapped"]["median_s"]
    return stamp({"benchmark": "seeds", "num_seeds": num_seeds, "shape": dict(ABLATION, depth=depth, batch=batch),
                  "sequential_s_per_round": seq_t, "vmapped_s_per_round": vm_t, "speedup": seq_t / vm_t,
                  "sequential_img_per_s": num_seeds * batch / seq_t, "vmapped_img_per_s": num_seeds * batch / vm_t,
                  "sequential_compile_s": seq_compile, "vmapped_compile_s": vm_compile, "stats": stats})


# ---- depth, memory --------------------------------------------------------------------------------------------------


@entry("depth", "compile time and step time vs depth, with and without scan",
       ("--depths", dict(type=ints, default=DEFAULT_DEPTHS, help="comma-separated, e.g. 12,24,48,96")),
       ("--layouts", dict(type=names, default=("scan", "unrolled"))), ("--batch", dict(type=int, default=8)),
       fields=("shape", "ratios", "target_met"),
       tables={"rows": ("layout", "depth", "compile_s", "lower_s", "step_time_s", "img_per_s")})
def bench_depth(depths=DEFAULT_DEPTHS, layouts=("scan", "unrolled"), batch: int = 8, repeats: int = 3) -> dict:
    """Compile time (trace + lower + XLA compile of the whole train step) and step time against depth, scanned and
    unrolled; ``ratios`` are deepest over shallowest per layout (target: scanned compile ratio ≤ 1.5)."""
    rows = []
    for layout in layouts:
        for depth in depths:
            step = CompiledStep(StepSpec(batch=batch, scan=layout == "scan", overrides=dict(DEPTH_SHAPE, depth=depth)))
            t = timing.measure({"step": step.run}, warmup=1, repeats=repeats, min_repeat_s=0.2)["step"]["median_s"]
            rows.append({"layout": layout, "depth": depth, "compile_s": step.compile_s, "lower_s": step.lower_s,
                         "xla_compile_s": step.xla_compile_s, "step_time_s": t, "img_per_s": batch / t})
            del step
    out = {"benchmark": "depth", "shape": dict(DEPTH_SHAPE, batch=batch), "rows": rows, "ratios": {}}
    lo, hi = min(depths), max(depths)
    for layout in layouts:
        by_depth = {r["depth"]: r for r in rows if r["layout"] == layout}
        if lo != hi:
            out["ratios"][layout] = {"depths": [hi, lo],
                                     "compile_ratio": by_depth[hi]["compile_s"] / by_depth[lo]["compile_s"],
                                     "step_ratio": by_depth[hi]["step_time_s"] / by_depth[lo]["step_time_s"]}
    if "scan" in out["ratios"]:
        out.update(target_scan_compile_ratio=1.5, target_met=out["ratios"]["scan"]["compile_ratio"] <= 1.5)
    return stamp(out)


@entry("_memory_probe", "(internal) one memory measurement, run by `memory`", hidden=True,
       spec=dict(STEP, batch=32))
def memory_probe(spec: StepSpec) -> dict:
    """Run in a fresh process: XLA's planned peak for the compiled step and the process's peak RSS."""
    timing.block(jnp.zeros(()) + 1)          # start the backend first: its memory is not the step's
    timing.malloc_trim()
    base = timing.current_rss_bytes()
    step = CompiledStep(spec)
    after_compile_peak = timing.peak_rss_bytes()
    timing.malloc_trim()
    timing.reset_peak_rss()
    resident = timing.current_rss_bytes()
    step.run(1)
    step.run(1)
    peak = timing.device_peak_memory() if jax.default_backend() != "cpu" else timing.peak_rss_bytes()
    return {"depth": step.cfg.depth, "remat": spec.remat, "scan": spec.scan, "xla_memory": step.memory(),
            "xla_peak_bytes": step.memory().get("peak_bytes"), "rss_baseline_bytes": base,
            "rss_resident_before_steps_bytes": resident, "rss_peak_during_steps_bytes": peak,
            "rss_peak_including_compile_bytes": after_compile_peak,
            "rss_step_increase_bytes": peak - base if peak is not None else None,
            "flops_xla": step.flops()["flops_xla"]}


def remat_policies() -> tuple[str, ...]:
    from layerscale_jax.models.stack import REMAT_POLICIES
    return tuple(REMAT_POLICIES)


@entry("memory", "peak memory vs depth per remat policy (fresh subprocess each)",
       ("--depths", dict(type=ints, default=DEFAULT_DEPTHS)),
       ("--policies", dict(type=names, default=remat_policies())), ("--batch", dict(type=int, default=32)),
       fields=("shape", "ratios_at_max_depth", "target_met"),
       tables={"rows": ("depth", "remat", "xla_peak_bytes", "rss_step_increase_bytes", "error")})
def bench_memory(depths=DEFAULT_DEPTHS, policies=None, batch: int = 32, timeout: float = 600) -> dict:
    """Peak memory against depth for each remat policy, scanned layers, one fresh subprocess per configuration."""
    rows = []
    for depth in depths:
        for policy in policies or remat_policies():
            spec = StepSpec(batch=batch, scan=True, remat=policy, overrides=dict(MEMORY_SHAPE, depth=depth))
            probe = run_fresh(["_memory_probe", *spec_flags(spec), "--json"], timeout)
            rows.append({**probe, "depth": depth, "remat": policy})
    out = {"benchmark": "memory", "shape": dict(MEMORY_SHAPE, batch=batch, scan=True), "rows": rows,
           "method": "one fresh subprocess per configuration; xla_peak_bytes = argument + output - aliased + "
                     "temporary bytes from compiled.memory_analysis() (XLA's buffer assignment, deterministic); "
                     "rss_step_increase_bytes = peak RSS during two steps minus RSS before the model was built "
                     "(backend started, freed heap returned to the OS with malloc_trim before both readings)"}
    ok = [r for r in rows if r["depth"] == max(depths) and "error" not in r]
    none = next((r for r in ok if r["remat"] == "none"), None)
    if none:
        out["ratios_at_max_depth"] = {r["remat"]: {
            "xla_peak": r["xla_peak_bytes"] / none["xla_peak_bytes"],
            "rss": (r["rss_step_increase_bytes"] / none["rss_step_increase_bytes"]
                    if none.get("rss_step_increase_bytes") else None)} for r in ok}
        full = out["ratios_at_max_depth"].get("full")
        if full:
            out.update(target_remat_ratio=1 / 3, target_met=full["xla_peak"] <= 1 / 3)
    return stamp(out)


# ---- input pipeline, XLA options, huge pages ------------------------------------------------------------------------


@entry("pipeline", "digits input pipeline vs the ablation train step", ("--batch", dict(type=int, default=128)),
       ("--num-batches", dict(type=int, default=100)), ("--data-dir", dict(default=None)),
       fields=("batch", "pipeline_img_per_s", "train_step_img_per_s", "pipeline_over_step"))
def bench_pipeline(batch: int = 128, num_batches: int = 100, depth: int = 6, data_dir: str | None = None) -> dict:
    """Images/s of the digits train pipeline alone (``data.measure_pipeline``) against the ablation train step at
    depth ``depth`` (> 1: the step is the bottleneck)."""
    out = {"benchmark": "pipeline", "batch": batch}
    try:
        from layerscale_jax.data import default_data_config, measure_pipeline  # lazy: needs tfds/grain
    except Exception as e:  # noqa: BLE001 - any import problem means: skip with the reason
        return stamp({**out, "skipped": f"layerscale_jax.data not importable ({type(e).__name__}: {e})"})
    cfg = default_data_config("digits")
    if data_dir:
        cfg.data_dir = data_dir
    try:
        out["pipeline"] = measure_pipeline(cfg, batch, num_batches)
    except Exception as e:  # noqa: BLE001
        return stamp({**out, "skipped": f"measure_pipeline failed ({type(e).__name__}: {e})"})
    step, _ = prepare(StepSpec(batch=batch, overrides=dict(ABLATION, depth=depth)))
    out["train_step_img_per_s"] = batch / timing.measure({"step": step.run}, warmup=1)["step"]["median_s"]
    out["pipeline_img_per_s"] = out["pipeline"]["images_per_s"]
    out["pipeline_over_step"] = out["pipeline_img_per_s"] / out["train_step_img_per_s"]
    return stamp(out)


# XLA CPU compiler options tried against XLA's defaults, per executable (``compile(compiler_options=...)``, the
# fields ``XLA_FLAGS`` sets process-wide). None is a default of the library: on the development CPU no option helped
# every model (YNNPACK fusions off helped DeiT III-S/16 and slowed the ablation model by about as much).
CANDIDATE_CPU_OPTIONS: dict[str, dict] = {
    "xla_default": {},
    "ynn_off": {"xla_cpu_experimental_ynn_fusion_type": ""},
    "ynn_dot_only": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "ynn_individual_dot": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "xnn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "onednn_dot": {"xla_cpu_experimental_ynn_fusion_type": "",
                   "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "fast_math": {"xla_cpu_enable_fast_math": True},
    "vector_width_512": {"xla_cpu_prefer_vector_width": 512},
}


def library_calls(hlo_text: str) -> dict[str, int]:
    """How many YNNPACK / XNNPACK / oneDNN fusions a compiled program contains, and its dot instructions."""
    return {name: len(re.findall(pattern, hlo_text, flags=re.IGNORECASE))
            for name, pattern in (("ynn_fusion", r"%ynn_fusion[.\d]* = "), ("xnn_fusion", r"%xnn_fusion[.\d]* = "),
                                  ("onednn", r"onednn"), ("dot_instructions", r" dot\("))}


@entry("xla_options", "the train step under XLA CPU compiler options (interleaved)", fields=("repeats",),
       tables={"rows": ("case", "option", "step_time_s", "speedup_vs_default", "library_calls", "error")},
       args=(("--options", dict(dest="option_names", type=names, default=None, metavar="OPTIONS",
                                help="comma-separated names from entries.CANDIDATE_CPU_OPTIONS")),
             ("--repeats", dict(type=int, default=5))))
def bench_xla_options(option_names=None, cases=None, repeats: int = 5) -> dict:
    """The train step compiled once per XLA CPU option set in one process, the executables timed alternately;
    speed-up = XLA-default step time / the option's. An option set this jaxlib rejects is recorded as an error."""
    option_names = list(option_names or CANDIDATE_CPU_OPTIONS)
    if "xla_default" not in option_names:
        option_names.insert(0, "xla_default")
    unknown = [n for n in option_names if n not in CANDIDATE_CPU_OPTIONS]
    if unknown:
        raise ValueError(f"unknown XLA option set(s) {unknown}; known: {sorted(CANDIDATE_CPU_OPTIONS)}")
    cases = cases or [("deit3_small b16 fp32", StepSpec(batch=16)),
                      ("ablation d6 b128", StepSpec(batch=128, overrides=dict(ABLATION, depth=6)))]
    rows = []
    for case, spec in cases:
        steps, errors = {}, {}
        for name in option_names:
            try:
                steps[name] = CompiledStep(spec, compiler_options=CANDIDATE_CPU_OPTIONS[name])
            except Exception as e:  # noqa: BLE001 - an option this jaxlib rejects is a result, not a crash
                errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
        stats = timing.measure({n: s.run for n, s in steps.items()}, warmup=1, repeats=repeats)
        base = stats["xla_default"]["median_s"] if "xla_default" in stats else None
        for name in option_names:
            t, s = (stats[name]["median_s"], steps[name]) if name in stats else (None, None)
            rows.append({"case": case, "option": name, "compiler_options": CANDIDATE_CPU_OPTIONS[name],
                         "step_time_s": t, "speedup_vs_default": base / t if base and t else None,
                         "stats": stats.get(name), **({"compile_s": s.xla_compile_s, "library_calls": library_calls(
                             s.compiled.as_text())} if s else {}), "error": errors.get(name)})
        del steps
    return stamp({"benchmark": "xla_options", "rows": rows, "repeats": repeats,
                  "method": "one process; the same lowered step compiled with each option set; executables "
                            "timed interleaved (A, B, C, A, B, C, ...); median of repeats"})


@entry("page_fault_probe", "(internal) one page-fault measurement, run by `page_faults`", hidden=True,
       spec={k: STEP[k] for k in ("model", "batch", "dtype", "scan", "remat", "set")},
       args=(("--steps", dict(type=int, default=3)),))
def page_fault_probe(spec: StepSpec, steps: int = 3) -> dict:
    """Per step of ``spec``: wall time, minor page faults and kernel (system) CPU time (run in a fresh process)."""
    step = CompiledStep(spec)
    step.run(1)
    rows = []
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step.run(1)
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"step_s": t, "minor_faults": r1.ru_minflt - r0.ru_minflt, "system_s": r1.ru_stime - r0.ru_stime,
                     "user_s": r1.ru_utime - r0.ru_utime})
    return {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "steps": rows,
            **{k: float(np.median([r[k] for r in rows])) for k in ("step_s", "minor_faults", "system_s")}}


@entry("page_faults", "the train step with and without glibc's huge-page malloc",
       spec={k: STEP[k] for k in ("model", "batch", "set")}, args=(("--rounds", dict(type=int, default=2)),),
       fields=("spec", *(f"{s}.{k}" for s in ("default_4k_pages", "huge_page_malloc")
                         for k in ("step_s", "minor_faults", "system_s")), "speedup", "fault_ratio"))
def bench_page_faults(spec: StepSpec | None = None, rounds: int = 2, timeout: float = 900) -> dict:
    """``page_fault_probe`` with and without glibc's huge-page malloc (``layerscale_jax.runtime``), fresh processes
    alternated (off, on, off, on, ...); medians over all steps of each setting."""
    spec = spec or StepSpec(batch=16)
    settings = {"default_4k_pages": {"LAYERSCALE_JAX_HUGEPAGES": "0", "GLIBC_TUNABLES": ""},
                "huge_page_malloc": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}
    runs = {name: [] for name in settings}
    for _ in range(rounds):
        for name, env in settings.items():
            runs[name].append(run_fresh(["page_fault_probe", *spec_flags(spec), "--json"], timeout, env=env))
    out = {"benchmark": "page_faults", "spec": spec.describe(), "rounds": rounds, "runs": runs}
    for name in settings:
        steps = [r for run in runs[name] for r in run.get("steps", [])]
        out[name] = {k: float(np.median([r[k] for r in steps])) if steps else None
                     for k in ("step_s", "minor_faults", "system_s")}
    a, b = out["default_4k_pages"], out["huge_page_malloc"]
    if a["step_s"] and b["step_s"]:
        out.update(speedup=a["step_s"] / b["step_s"], fault_ratio=a["minor_faults"] / max(b["minor_faults"], 1.0))
    return stamp(out)


# ---- the trainer's own step and optimizer (training stack) ----------------------------------------------------------

# The trainer's own step (configs/digits_layerscale.py, the main job) at the main depth and a deep ablation depth.
TRAINER_CONFIGS = ("configs/digits_layerscale.py", "configs/digits_layerscale.py:depth=24")


@entry("trainer_step", "the trainer's own step vs the model-only step, for each config",
       ("--configs", dict(type=names, default=TRAINER_CONFIGS)), tables={"rows": TRAINER_COLUMNS})
def bench_trainer_step(configs=TRAINER_CONFIGS) -> dict:
    """``trainer.measure_trainer_step`` for each config (paths relative to the repository)."""
    return {"rows": [trainer.measure_trainer_step(str(REPO / c)) for c in configs]}


entry("optimizer", "the trainer's optimizer update vs plain AdamW, against depth",
      ("--config", dict(dest="config_spec", default=trainer.DEFAULT_CONFIG, metavar="configs/X.py[:ARGS]")),
      ("--depths", dict(type=ints, default=trainer.DEFAULT_DEPTHS)), ("--layouts", dict(type=names,
                                                                                           default=trainer.LAYOUTS)),
      ("--layer-decays", dict(type=floats, default=trainer.LAYER_DECAYS)), ("--repeats", dict(type=int, default=7)),
      fields=("config", "growth_hi_over_lo", "worst_ratio", "target_met"),
      tables={"rows": ("layout", "depth", "layer_decay", "leaves", "ours_s", "plain_s", "ratio", "ratio_paired",
                       "state_nodes", "plain_state_nodes", "stablehlo_ops", "compile_s")})(trainer.bench_optimizer)


# ---- the suite ------------------------------------------------------------------------------------------------------


@entry("report", "the README Performance table (markdown) from a results file", ("results_json", {}))
def read_report(results_json: str) -> str:
    return report(json.loads(Path(results_json).read_text()))


def wait_for_load(max_load: float | None, max_wait_s: float, poll_s: float = 15.0) -> float:
    """Sleep until the 1-minute load average is at most ``max_load`` (or ``max_wait_s`` passed); seconds waited.

    The machine may be shared: timing under contention penalises PyTorch's spinning OpenMP threads far more
    than XLA's thread pool, so side-by-side ratios are only meaningful on a quiet machine."""
    t0 = time.time()
    while max_load is not None and time.time() - t0 < max_wait_s and os.getloadavg()[0] > max_load:
        time.sleep(poll_s)
    return time.time() - t0 if max_load is not None else 0.0


SUITE = ("train_step", "ablation", "layerscale", "seeds", "depth", "memory", "pipeline", "xla_options",
         "page_faults", "trainer_step", "optimizer")


def _write(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=float))
    tmp.replace(path)


@entry("all", "the whole CPU suite → benchmarks/results/<machine>_<date>.json", fields=("summary",), args=(
    ("--out-dir", dict(default=None)),
    ("--quick", dict(action="store_true", help="depths 12 and 96 only in the depth, memory and optimizer sweeps")),
    ("--max-load", dict(type=float, default=None,
                        help="before each entry wait for the 1-minute load average to drop to this (shared machines)")),
    ("--max-wait-s", dict(type=float, default=600.0, help="the longest such wait per entry")),
    ("--only", dict(type=names, default=None, help=f"comma-separated subset of {','.join(SUITE)}, merged into "
                                                   "the day's results file")),
    ("--pipeline-python", dict(default=None,
                               help="interpreter for the pipeline entry (one with tensorflow-datasets and grain)"))))
def run_all(out_dir: str | None = None, quick: bool = False, max_load: float | None = None,
            max_wait_s: float = 600.0, only: tuple[str, ...] | None = None,
            pipeline_python: str | None = None) -> dict:
    """The whole CPU suite, written to ``benchmarks/results/<machine>_<date>.json`` (returned too).

    With ``max_load``, each entry first waits (up to ``max_wait_s``) for the 1-minute load average to drop to it.
    ``only`` runs some entries and merges them into that day's file. ``pipeline_python`` runs the pipeline entry
    with another interpreter (one with the data dependencies, when this one only has torch/timm).
    """
    started, now = time.time(), lambda: datetime.datetime.now().isoformat(timespec="seconds")
    out = Path(out_dir) if out_dir else REPO / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{timing.machine_name()}_{datetime.date.today().isoformat()}.json"
    command = " ".join(["python -m layerscale_jax.bench", *sys.argv[1:]])
    results = {"suite": "layerscale_jax.bench all", "started": now(), "command": command,
               "machine": timing.machine_info(), "load_average_start": timing.load_average(), "entries": {}}
    if only and path.exists():
        results = json.loads(path.read_text())
        results.setdefault("reruns", []).append({"entries": list(only), "started": now(), "command": command,
                                                 "load_average_start": timing.load_average()})
    mm = {dt: timing.matmul_peak(dt) for dt in DTYPES}
    if not only:
        results["entries"]["matmul"] = mm

    def record(name, fn):
        entry_name = name.split("_deit3")[0]
        if entry_name not in (only or SUITE):
            return
        waited, load_before, t0 = wait_for_load(max_load, max_wait_s), timing.load_average(), time.time()
        try:
            r = fn()
            display(entry_name, r)
        except Exception as e:  # noqa: BLE001 - keep going, record the failure
            r = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: error {r['error']}")
        r.update(elapsed_s=time.time() - t0, waited_for_load_s=waited, load_average_before=load_before,
                 load_average_after=timing.load_average())
        results["entries"][name] = r
        _write(path, results)
        sys.stdout.flush()

    for dtype in DTYPES:
        spec = StepSpec(model="deit3_small_patch16_224", batch=16, dtype=dtype)
        record(f"train_step_deit3_small_b16_{dtype}",
               lambda spec=spec: measure_train_step(spec, vs_timm=True, repeats=5, peak=mm[spec.dtype]))
    depths = (12, 96) if quick else DEFAULT_DEPTHS
    record("ablation", bench_ablation)
    record("layerscale", bench_layerscale)
    record("seeds", bench_seeds)
    record("depth", lambda: bench_depth(depths=depths))
    record("memory", lambda: bench_memory(depths=depths))
    record("pipeline", (lambda: run_fresh(["pipeline", "--json"], 900, python=pipeline_python)) if pipeline_python
           else bench_pipeline)
    record("xla_options", bench_xla_options)
    record("page_faults", bench_page_faults)
    record("trainer_step", bench_trainer_step)
    record("optimizer", lambda: trainer.bench_optimizer(str(REPO / trainer.DEFAULT_CONFIG), depths=depths))
    results["load_average_end"] = timing.load_average()
    results["elapsed_s" if not only else "rerun_elapsed_s"] = time.time() - started
    results["summary"] = summarize(results)
    _write(path, results)
    print(f"wrote {path}")
    return results
