"""The benchmarks: each a function that measures one thing and returns a JSON-able dict, registered by ``@entry``.

``cli`` makes each a subcommand whose flags are its parameters, and ``report.show`` prints its result (``columns``:
the table of its rows). Only ``pipeline`` (tfds, grain) and ``optimizer``/``train_step --config`` (ml_collections)
need more than jax, flax and optax, imported lazily.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import resource
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from layerscale_jax.bench import op_profile, timing, trainer
from layerscale_jax.bench.report import report, show, summarize
from layerscale_jax.bench.step import (
    CompiledStep,
    StepSpec,
    init_state,
    make_optimizer,
    make_step_fn,
    measure_train_step,
    prepare,
    synthetic_batch,
    xla_cost,
)
from layerscale_jax.bench.timing import REPO, compiled_memory, run_fresh
from layerscale_jax.errors import ConfigError

DTYPES, DEPTHS = ("float32", "bfloat16"), (12, 24, 48, 96)
# The depth-ablation model (configs/digits_layerscale.py): 8×8×1 digits, patch 2, width 64, 4 heads.
ABLATION = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, num_heads=4,
                drop_path_rate=0.05, init_values="auto")
# The depth ablation's converged protocol (experiments/depth_ablation_runs.py, PROTOCOL_SIZING) at depth 48: width 32,
# 2 heads, batch 64, scanned layers.
SWEEP_STEP = StepSpec(batch=64, scan=True, overrides=dict(ABLATION, embed_dim=32, num_heads=2, depth=48))
SMALL = dict(img_size=32, patch_size=4, in_chans=3, num_classes=10)     # the depth sweeps: 65 tokens, 10 classes
ENTRIES: dict[str, tuple] = {}                                           # name → (function, columns, hidden)


def entry(name: str, columns: str = "", hidden: bool = False):
    """Register a function as the subcommand ``name``; ``columns``: the table ``show`` prints of its rows."""
    def register(fn):
        ENTRIES[name] = (fn, tuple(columns.split()), hidden)
        return fn
    return register


def display(name: str, result) -> None:
    """Print ``result`` of entry ``name`` (or of the entry its ``benchmark`` key names)."""
    show(result, ENTRIES[result.get("benchmark", name) if isinstance(result, dict) else name][1])


def spec_flags(spec: StepSpec) -> list[str]:
    """The command-line flags that rebuild ``spec`` in a fresh process."""
    return ["--model", spec.model, "--batch", str(spec.batch), "--dtype", spec.dtype, "--remat", spec.remat,
            *(["--scan"] if spec.scan else []), *[a for k, v in spec.overrides.items() for a in ("--set", f"{k}={v}")]]


def medians(rows: list[dict], keys=("step_s", "minor_faults", "system_s")) -> dict:
    return {k: float(np.median([r[k] for r in rows])) if rows else None for k in keys}


@entry("train_step")
def train_step(spec: StepSpec = StepSpec(), vs_timm: bool = False, vs_peer: bool = False,
               timm_python: str | None = None, config: str | None = None, repeats: int = 5,
               min_repeat_s: float = 0.5) -> dict:
    """One training step, alone or against timm and big_vision's ViT architecture (``step.measure_train_step``);
    with ``--config configs/X.py[:ARGS]``, the trainer's own step against the model-only step."""
    if config:
        return trainer.measure_trainer_step(config, repeats=repeats, min_repeat_s=min_repeat_s)
    return measure_train_step(spec, vs_timm=vs_timm, vs_peer=vs_peer, timm_python=timm_python, repeats=repeats,
                              min_repeat_s=min_repeat_s)


@entry("profile", "kind ms_per_step count shape op_name")
def bench_profile(spec: StepSpec = StepSpec(), steps: int = 3, top: int = 25) -> dict:
    """Where the train step's time goes, per XLA operation (``op_profile.profile_step``)."""
    return op_profile.profile_step(spec, steps=steps, top=top)


@entry("matmul")
def matmul(n: int | None = None) -> dict:
    """The matmul peak (the MFU denominator) of jax and torch on this device, float32 and bfloat16."""
    out = {"jax": {dt: timing.matmul_peak(dt, n) for dt in DTYPES}, "torch": "torch not importable"}
    try:
        device = "cpu" if jax.default_backend() == "cpu" else "cuda"     # timm's side runs on the same device
        out["torch"] = {dt: timing.matmul_peak(dt, n, torch_device=device) for dt in DTYPES}
    except ImportError:
        pass
    return out


@entry("ablation", "overrides.depth step_time_s img_per_s timm_img_per_s ratio_vs_timm ratio_vs_timm_paired mfu "
       "timm_mfu compile_s")
def bench_ablation(depths: tuple[int, ...] = (6, 24), batch: int = 128, timm_python: str | None = None,
                   repeats: int = 7) -> dict:
    """The depth-ablation model (8×8×1 digits, width 64, 4 heads, drop path 0.05) against timm."""
    rows = [measure_train_step(StepSpec(batch=batch, overrides=dict(ABLATION, depth=d)), vs_timm=True,
                               timm_python=timm_python, repeats=repeats) for d in depths]
    out = {"benchmark": "ablation", "shape": dict(ABLATION, batch=batch), "rows": rows}
    if all(r["ratio_vs_timm"] is not None for r in rows):
        out.update(target_ratio=1.0, target_met=all(r["ratio_vs_timm"] >= 1.0 for r in rows))
    return out


# XLA CPU compiler options tried against XLA's defaults, per executable (the fields XLA_FLAGS sets process-wide).
YNN = "xla_cpu_experimental_ynn_fusion_type"
CPU_OPTIONS = {
    "xla_default": {}, "ynn_off": {YNN: ""}, "ynn_dot_only": {YNN: "LIBRARY_FUSION_TYPE_DOT"},
    "ynn_individual_dot": {YNN: "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
    "xnn_dot": {YNN: "", "xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "onednn_dot": {YNN: "", "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "fast_math": {"xla_cpu_enable_fast_math": True}, "vector_width_512": {"xla_cpu_prefer_vector_width": 512}}
LIBRARY_CALLS = {"ynn_fusion": r"%ynn_fusion[.\d]* = ", "xnn_fusion": r"%xnn_fusion[.\d]* = ", "onednn": "onednn",
                 "dot_instructions": r" dot\("}


def race_steps(variants: dict, repeats: int) -> dict:
    """Compile each variant (name → ``(StepSpec, XLA compiler options)``), time them alternately: per variant its
    stats, compile time, XLA's bytes accessed, temporaries, FLOPs and library fusions, or why it did not compile."""
    steps, out = {}, {}
    for name, (spec, options) in variants.items():
        try:
            steps[name] = CompiledStep(spec, compiler_options=options)
        except Exception as e:  # noqa: BLE001 - an option set this jaxlib rejects is a result, not a crash
            out[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    stats = timing.measure({n: s.run for n, s in steps.items()}, warmup=1, repeats=repeats)
    for name, s in steps.items():
        hlo = s.compiled.as_text()
        out[name] = {"step_time_s": stats[name]["median_s"], "stats": stats[name], "compile_s": s.xla_compile_s,
                     "bytes_accessed": xla_cost(s.compiled, "bytes accessed"), "flops_xla": s.flops()["flops_xla"],
                     "temp_bytes": compiled_memory(s.compiled)["temp_size_in_bytes"], "library_calls": {
                         k: len(re.findall(p, hlo, flags=re.IGNORECASE)) for k, p in LIBRARY_CALLS.items()}}
    return out


@entry("layerscale", "case layerscale_step_s none_step_s overhead overhead_ratio_of_medians bytes_accessed_overhead")
def bench_layerscale(repeats: int = 15, cases=None) -> dict:
    """LayerScale against ``branch_scaling=none`` at equal shapes, timed alternately: overhead = median of the
    per-pair time ratios − 1 (target ≤ 2%); XLA's bytes accessed of both."""
    rows = []
    for label, batch, overrides in cases or (("deit3_small_patch16_224 b16", 16, {}), (
            "ablation depth 24 b128", 128, dict(ABLATION, depth=24, drop_path_rate=0.0))):
        without_init = {k: v for k, v in overrides.items() if k != "init_values"}        # `none` has no init value
        v = race_steps({s: (StepSpec(batch=batch, overrides={**o, "branch_scaling": s}), None)
                        for s, o in (("layerscale", overrides), ("none", without_init))}, repeats)
        ls, no = v["layerscale"], v["none"]
        rows.append({"case": label, "batch": batch, "overrides": overrides, "layerscale_step_s": ls["step_time_s"],
                     "none_step_s": no["step_time_s"], "overhead": timing.paired_ratio(ls["stats"], no["stats"]) - 1,
                     "overhead_ratio_of_medians": ls["step_time_s"] / no["step_time_s"] - 1,
                     "bytes_accessed_overhead": ls["bytes_accessed"] / no["bytes_accessed"] - 1, "variants": v})
    return {"benchmark": "layerscale", "rows": rows, "target_overhead": 0.02,
            "target_met": all(r["overhead"] <= 0.02 for r in rows)}


@entry("xla_options", "case option step_time_s speedup_vs_default library_calls error")
def bench_xla_options(options: tuple[str, ...] = tuple(CPU_OPTIONS), repeats: int = 5, cases=None) -> dict:
    """The train step compiled once per XLA CPU option set (``CPU_OPTIONS``), timed alternately in one process;
    speed-up = default step time / the option's; library fusions counted; a rejected option set is an error."""
    names = ["xla_default", *[n for n in options if n != "xla_default"]]
    if unknown := [n for n in names if n not in CPU_OPTIONS]:
        raise ConfigError(f"--options: unknown XLA option set(s) {unknown}; known: {sorted(CPU_OPTIONS)}")
    rows = []
    for case, spec in cases or [("deit3_small b16 fp32", StepSpec(batch=16)),
                                ("ablation d6 b128", StepSpec(batch=128, overrides=dict(ABLATION, depth=6)))]:
        v = race_steps({n: (spec, CPU_OPTIONS[n]) for n in names}, repeats)
        base = v["xla_default"].get("step_time_s")
        rows += [{"case": case, "option": n, "compiler_options": CPU_OPTIONS[n], "error": None, **r,
                  "speedup_vs_default": base / r["step_time_s"] if base and "step_time_s" in r else None}
                 for n, r in v.items()]
    return {"benchmark": "xla_options", "rows": rows, "repeats": repeats}


@entry("seeds")
def bench_seeds(num_seeds: int = 4, depth: int = 6, batch: int = 128, repeats: int = 7) -> dict:
    """Ablation models of ``num_seeds`` seeds (own parameters, optimizer state, dropout key, batch) in one jitted,
    donated ``jax.vmap``-ed step against the same stepped one after another, timed alternately."""
    tx = make_optimizer()
    built = [init_state(StepSpec(batch=batch, seed=s, overrides=dict(ABLATION, depth=depth)), tx)
             for s in range(num_seeds)]
    cfg, states = built[0][0].cfg, [b[2] for b in built]
    fn = make_step_fn(built[0][1], tx, uses_key=cfg.drop_path_rate > 0)
    batches = [synthetic_batch(cfg, batch, s) for s in range(num_seeds)]
    stacked, images, labels = (jax.tree.map(lambda *xs: jnp.stack(xs), *trees) for trees in (states, *zip(*batches)))
    t0 = time.perf_counter()
    one = jax.jit(fn, donate_argnums=0).lower(states[0], *batches[0]).compile()
    t1 = time.perf_counter()
    vmapped = timing.Loop(jax.jit(jax.vmap(fn), donate_argnums=0).lower(stacked, images, labels).compile(),
                          stacked, images, labels)
    t2 = time.perf_counter()

    def one_after_another(states):
        out = [one(s, *b) for s, b in zip(states, batches)]
        return [o[0] for o in out], out[-1][1]
    stats = timing.measure({"sequential": timing.Loop(one_after_another, states).run, "vmapped": vmapped.run},
                           warmup=1, repeats=repeats)
    seq_t, vm_t = stats["sequential"]["median_s"], stats["vmapped"]["median_s"]
    return {"benchmark": "seeds", "num_seeds": num_seeds, "shape": dict(ABLATION, depth=depth, batch=batch),
            "sequential_s_per_round": seq_t, "vmapped_s_per_round": vm_t, "speedup": seq_t / vm_t,
            "sequential_img_per_s": num_seeds * batch / seq_t, "vmapped_img_per_s": num_seeds * batch / vm_t,
            "sequential_compile_s": t1 - t0, "vmapped_compile_s": t2 - t1, "stats": stats}


@entry("depth", "layout depth compile_s lower_s step_time_s img_per_s")
def bench_depth(depths: tuple[int, ...] = DEPTHS, batch: int = 8, repeats: int = 3) -> dict:
    """Compile time (trace + lower + XLA compile) and step time against depth, scanned and unrolled (width 128);
    ``ratios``: deepest / shallowest (target: scanned compile ratio ≤ 1.5)."""
    rows, ratios, shape = [], {}, dict(SMALL, embed_dim=128, num_heads=2)
    for layout in ("scan", "unrolled"):
        for depth in depths:
            step = CompiledStep(StepSpec(batch=batch, scan=layout == "scan", overrides=dict(shape, depth=depth)))
            t = timing.measure({"step": step.run}, warmup=1, repeats=repeats, min_repeat_s=0.2)["step"]["median_s"]
            rows.append({"layout": layout, "depth": depth, "compile_s": step.compile_s, "lower_s": step.lower_s,
                         "xla_compile_s": step.xla_compile_s, "step_time_s": t, "img_per_s": batch / t})
            del step
        if len(depths) > 1:
            lo, hi = rows[-len(depths)], rows[-1]
            ratios[layout] = {"depths": [hi["depth"], lo["depth"]], "compile_ratio": hi["compile_s"] / lo["compile_s"],
                              "step_ratio": hi["step_time_s"] / lo["step_time_s"]}
    out = {"benchmark": "depth", "shape": dict(shape, batch=batch), "rows": rows, "ratios": ratios}
    if "scan" in ratios:
        out.update(target_scan_compile_ratio=1.5, target_met=ratios["scan"]["compile_ratio"] <= 1.5)
    return out


@entry("probe", hidden=True)
def probe(spec: StepSpec = StepSpec(), steps: int = 3) -> dict:
    """(in a fresh process, for ``memory`` and ``page_faults``) XLA's planned peak; the RSS before the model, after
    compiling and its peak during 1 + ``steps`` steps; per timed step: time, minor page faults, CPU time."""
    jax.block_until_ready(jnp.zeros(()) + 1)          # start the backend first: its memory is not the step's
    base = timing.rss_baseline()
    step = CompiledStep(spec)
    compile_peak, resident, rows = timing.rss_bytes(peak=True), timing.rss_baseline(), []
    step.run(1)
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step.run(1)
        t, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"step_s": t, "minor_faults": r1.ru_minflt - r0.ru_minflt, "system_s": r1.ru_stime - r0.ru_stime,
                     "user_s": r1.ru_utime - r0.ru_utime})
    peak, xla = timing.rss_bytes(peak=True), compiled_memory(step.compiled)
    return {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "depth": step.cfg.depth, "remat": spec.remat,
            "xla_memory": xla, "xla_peak_bytes": xla["peak_bytes"], "rss_baseline_bytes": base,
            "rss_resident_before_steps_bytes": resident, "rss_peak_during_steps_bytes": peak,
            "rss_peak_including_compile_bytes": compile_peak, "rss_step_increase_bytes": peak - base,
            "flops_xla": step.flops()["flops_xla"], "steps": rows, **medians(rows)}


@entry("memory", "depth remat xla_peak_bytes rss_step_increase_bytes error")
def bench_memory(depths: tuple[int, ...] = DEPTHS, batch: int = 32) -> dict:
    """Peak memory against depth per remat policy, scanned (width 64): a fresh ``probe`` process, two steps, per
    configuration; XLA's plan (target: remat ``full`` ≤ 1/3 of ``none`` at the deepest) and the RSS increase."""
    from layerscale_jax.models.stack import REMAT_POLICIES
    shape = dict(SMALL, embed_dim=64, num_heads=2)
    rows = [{**run_fresh(["probe", "--steps", "1", "--json", *spec_flags(StepSpec(
        batch=batch, scan=True, remat=policy, overrides=dict(shape, depth=depth)))], 600), "depth": depth,
        "remat": policy} for depth in depths for policy in REMAT_POLICIES]
    out = {"benchmark": "memory", "shape": dict(shape, batch=batch, scan=True), "rows": rows}
    ok = {r["remat"]: r for r in rows if r["depth"] == max(depths) and "error" not in r}
    if none := ok.get("none"):
        out["ratios_at_max_depth"] = {p: {k: r[f"{key}_bytes"] / none[f"{key}_bytes"] for k, key in (
            ("xla_peak", "xla_peak"), ("rss", "rss_step_increase"))} for p, r in ok.items()}
    if full := out.get("ratios_at_max_depth", {}).get("full"):
        out.update(target_remat_ratio=1 / 3, target_met=full["xla_peak"] <= 1 / 3)
    return out


@entry("pipeline")
def bench_pipeline(batch: int = 128, num_batches: int = 100, depth: int = 6) -> dict:
    """Images/s of the digits train pipeline alone (``data.measure_pipeline``) against the ablation train step."""
    out = {"benchmark": "pipeline", "batch": batch}
    try:
        from layerscale_jax.data import default_data_config, measure_pipeline  # lazy: needs tfds/grain
        out["pipeline"] = measure_pipeline(default_data_config("digits"), batch, num_batches)
    except Exception as e:  # noqa: BLE001 - without the data stack or its data: skipped, with the reason
        return {**out, "skipped": f"the digits pipeline did not run ({type(e).__name__}: {e})"}
    step, _ = prepare(StepSpec(batch=batch, overrides=dict(ABLATION, depth=depth)))
    out.update(train_step_img_per_s=batch / timing.measure({"s": step.run}, warmup=1)["s"]["median_s"],
               pipeline_img_per_s=out["pipeline"]["images_per_s"])
    return {**out, "pipeline_over_step": out["pipeline_img_per_s"] / out["train_step_img_per_s"]}


@entry("page_faults")
def bench_page_faults(spec: StepSpec = StepSpec(), rounds: int = 2) -> dict:
    """``probe`` with glibc's malloc as it starts (4 KiB pages), with its huge-page tunable, and with TCMalloc where
    the system has it (``layerscale_jax.runtime``): fresh processes alternated (default, huge pages, TCMalloc,
    default, ...); medians over all timed steps of each setting."""
    from layerscale_jax.runtime.malloc import MALLOC_VARIABLE, TUNABLE, tcmalloc_library
    plain = {MALLOC_VARIABLE: "system", "GLIBC_TUNABLES": "", "LD_PRELOAD": ""}
    settings = {"default_4k_pages": plain, "huge_page_malloc": dict(plain, GLIBC_TUNABLES=TUNABLE)}
    if tcmalloc := tcmalloc_library():
        settings["tcmalloc"] = dict(plain, LD_PRELOAD=tcmalloc)
    runs = {name: [] for name in settings}
    for _ in range(rounds):
        for name, env in settings.items():
            runs[name].append(run_fresh(["probe", "--json", *spec_flags(spec)], 900, env=env))
    out = {"benchmark": "page_faults", "spec": spec.describe(), "rounds": rounds, "runs": runs,
           "tcmalloc_library": tcmalloc, **{name: medians([r for run in runs[name] for r in run.get("steps", [])])
                                    for name in settings}}
    base = out["default_4k_pages"]
    for name, prefix in (("huge_page_malloc", ""), ("tcmalloc", "tcmalloc_")):
        if name in settings and base["step_s"] and out[name]["step_s"]:
            out.update({f"{prefix}speedup": base["step_s"] / out[name]["step_s"],
                        f"{prefix}fault_ratio": base["minor_faults"] / max(out[name]["minor_faults"], 1.0)})
    return out


@entry("trainer_step", "config depth batch trainer_step_s model_only_step_s trainer_over_model_only "
       "trainer_over_model_only_paired optimizer_update.ratio trainer_target_met")
def bench_trainer_step() -> dict:
    """The trainer's own step against the model-only step (configs/digits_layerscale.py, depth 4 and 24)."""
    return {"rows": [trainer.measure_trainer_step(str(REPO / trainer.DEFAULT_CONFIG) + a) for a in ("", ":depth=24")]}


entry("optimizer", "layout depth layer_decay leaves ours_s plain_s ratio ratio_paired state_nodes plain_state_nodes "
      "stablehlo_ops compile_s")(trainer.bench_optimizer)


@entry("report")
def read_report(*results_json: str) -> str:
    """docs/performance.md's table (markdown) from results files of ``all`` (one per CPU kind, rows side by side)."""
    return report(*(json.loads(Path(path).read_text()) for path in results_json))


def results_name(machine: dict) -> str:
    """The results file's machine part: the kind of CPU (or accelerator) and the thread count, so that two machine
    kinds measured on one day never share (and a ``--only`` rerun never merges into) one file."""
    kind = machine["cpu"] if machine["backend"] == "cpu" else machine["device"]
    kind = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)", "", kind.lower())).strip("-")
    return f"cpu{machine['cpu_threads']}-{kind}" if machine["backend"] == "cpu" else f"{machine['backend']}-{kind}"


SUITE = ("train_step", "ablation", "layerscale", "seeds", "depth", "memory", "pipeline", "xla_options",
         "page_faults", "trainer_step", "optimizer")


@entry("all")
def run_all(quick: bool = False, only: tuple[str, ...] | None = None, max_load: float | None = None,
            max_wait_s: float = 600.0, timm_python: str | None = None, pipeline_python: str | None = None) -> dict:
    """The CPU suite → benchmarks/results/<machine>_<date>.json (``results_name``). ``--quick``: depths 12 and 96 only;
    ``--only A,B``: those entries, merged into the day's file of this machine kind; ``--max-load``: wait (≤
    ``--max-wait-s``) for the 1-minute load average to drop to it before each entry; ``--pipeline-python``: a Python
    with tfds and grain for ``pipeline``."""
    from layerscale_jax.bench.timm_worker import check_python
    check_python(timm_python)
    if unknown := set(only or ()) - set(SUITE):
        raise ConfigError(f"--only: unknown entries {sorted(unknown)}; the suite: {','.join(SUITE)}")
    now, t_start = lambda: datetime.datetime.now().isoformat("T", "seconds"), time.time()
    info = timing.machine_info()
    path = REPO / f"benchmarks/results/{results_name(info)}_{datetime.date.today()}.json"
    command = " ".join(["python -m layerscale_jax.bench", *sys.argv[1:]])
    results = {"suite": "layerscale_jax.bench all", "started": now(), "command": command, "machine": info,
               "load_average_start": timing.load_average(), "entries": {}}
    if only and path.exists():
        results = json.loads(path.read_text())
        results.setdefault("reruns", []).append({"entries": list(only), "started": now(), "command": command,
                                                 "load_average_start": timing.load_average()})
    mm = {dt: timing.matmul_peak(dt) for dt in DTYPES}
    results["entries"]["matmul"] = mm                    # the MFU denominator of this run, also on --only reruns

    def save():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_text(json.dumps(results, indent=1, default=float))
        path.with_suffix(".tmp").replace(path)

    def record(name, fn):
        if not any(name == e or name.startswith(f"{e}_") for e in (only or SUITE)):
            return
        t0 = time.time()
        while max_load is not None and time.time() - t0 < max_wait_s and os.getloadavg()[0] > max_load:
            time.sleep(15)
        waited, load_before, t0 = time.time() - t0, timing.load_average(), time.time()
        try:
            r = fn()
            display(next(e for e in SUITE if name == e or name.startswith(f"{e}_")), r)
        except Exception as e:  # noqa: BLE001 - keep going, record the failure
            r = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: error {r['error']}")
        results["entries"][name] = {**r, "machine": r.get("machine") or timing.machine_info(), "elapsed_s":
                                    time.time() - t0, "waited_for_load_s": waited, "load_average_before": load_before,
                                    "load_average_after": timing.load_average()}
        save()

    for dtype in DTYPES:      # float32 also against big_vision's ViT architecture (the peer)
        record(f"train_step_deit3_small_b16_{dtype}", lambda dtype=dtype: measure_train_step(
            StepSpec(dtype=dtype), vs_timm=True, vs_peer=dtype == "float32", timm_python=timm_python, peak=mm[dtype]))
    depths = (12, 96) if quick else DEPTHS
    record("ablation", lambda: bench_ablation(timm_python=timm_python))
    record("layerscale", bench_layerscale)
    record("seeds", bench_seeds)
    record("depth", lambda: bench_depth(depths=depths))
    record("memory", lambda: bench_memory(depths=depths))
    record("pipeline", (lambda: run_fresh(["pipeline", "--json"], 900, python=pipeline_python)) if pipeline_python
           else bench_pipeline)
    record("xla_options", bench_xla_options)
    record("page_faults", bench_page_faults)
    record("page_faults_ablation_depth48", lambda: bench_page_faults(SWEEP_STEP, rounds=3))
    record("trainer_step", bench_trainer_step)
    record("optimizer", lambda: trainer.bench_optimizer(str(REPO / trainer.DEFAULT_CONFIG), depths=depths))
    results.update(load_average_end=timing.load_average(), summary=summarize(results))
    results["elapsed_s" if not only else "rerun_elapsed_s"] = time.time() - t_start
    save()
    print(f"wrote {path}")
    return results
