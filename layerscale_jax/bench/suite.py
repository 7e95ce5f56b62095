"""The further benchmarks of issue 7 and ``all``, which runs the CPU suite and writes one results file.

Every entry returns one JSON-able dict (with the machine's facts and load average) and prints a short table.
Shapes are chosen so the whole CPU suite finishes in minutes on 2 cores; each entry states its shapes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from layerscale_jax.bench import timing
from layerscale_jax.bench.step import (CompiledStep, StepSpec, init_state, make_optimizer, make_step_fn,
                                       describe, measure_train_step, prepare, synthetic_batch,
                                       uses_drop_path, xla_cost)

# The model of the depth ablations (configs/digits_layerscale.py): 8×8×1 digits, patch 2, width 64, 4 heads.
ABLATION = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=64, num_heads=4,
                drop_path_rate=0.05, init_values="auto")
# A small ViT for the depth sweeps: 32×32×3, patch 4 (65 tokens), 10 classes.
SMALL = dict(img_size=32, patch_size=4, in_chans=3, num_classes=10)
DEPTH_SHAPE = dict(SMALL, embed_dim=128, num_heads=2)
MEMORY_SHAPE = dict(SMALL, embed_dim=64, num_heads=2)
DEFAULT_DEPTHS = (12, 24, 48, 96)
REPO = Path(__file__).resolve().parents[2]


def _stamp(result: dict) -> dict:
    result.setdefault("machine", timing.machine_info())
    return result


# ---- depth: compile time and step time against depth ---------------------------------------------------------


def bench_depth(depths=DEFAULT_DEPTHS, layouts=("scan", "unrolled"), batch: int = 8, repeats: int = 3) -> dict:
    """Compile time (trace + lower + XLA compile of the whole train step) and step time against depth."""
    rows = []
    for layout in layouts:
        for depth in depths:
            spec = StepSpec(batch=batch, scan=layout == "scan", overrides=dict(DEPTH_SHAPE, depth=depth))
            step = CompiledStep(spec)
            stats = timing.measure(step.run, warmup=1, repeats=repeats, min_repeat_s=0.2)
            rows.append({"layout": layout, "depth": depth, "compile_s": step.compile_s, "lower_s": step.lower_s,
                         "xla_compile_s": step.xla_compile_s, "step_time_s": stats["median_s"],
                         "img_per_s": batch / stats["median_s"]})
            del step
    out = {"benchmark": "depth", "shape": dict(DEPTH_SHAPE, batch=batch), "rows": rows}
    ratios = {}
    for layout in layouts:
        by_depth = {r["depth"]: r for r in rows if r["layout"] == layout}
        lo, hi = min(depths), max(depths)
        if lo in by_depth and hi in by_depth and lo != hi:
            ratios[layout] = {"depths": [hi, lo], "compile_ratio": by_depth[hi]["compile_s"] / by_depth[lo]["compile_s"],
                              "step_ratio": by_depth[hi]["step_time_s"] / by_depth[lo]["step_time_s"]}
    out["ratios"] = ratios
    if "scan" in ratios:
        out["target_scan_compile_ratio"] = 1.5
        out["target_met"] = ratios["scan"]["compile_ratio"] <= 1.5
    return _stamp(out)


def print_depth(r: dict) -> None:
    print(f"compile and step time vs depth — {r['shape']}")
    print(f"{'layout':>9} {'depth':>6} {'compile s':>10} {'(lower s)':>10} {'step ms':>9} {'img/s':>8}")
    for row in r["rows"]:
        print(f"{row['layout']:>9} {row['depth']:>6} {row['compile_s']:>10.2f} {row['lower_s']:>10.2f} "
              f"{row['step_time_s'] * 1e3:>9.1f} {row['img_per_s']:>8.1f}")
    for layout, q in r["ratios"].items():
        print(f"{layout}: depth {q['depths'][0]} / {q['depths'][1]} compile {q['compile_ratio']:.2f}x, "
              f"step {q['step_ratio']:.2f}x")
    if "target_met" in r:
        print(f"target scanned compile ratio <= 1.5: {'met' if r['target_met'] else 'MISSED'}")


# ---- memory: peak memory against depth for each remat policy ------------------------------------------------


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
    peak_steps = timing.device_peak_memory() if jax.default_backend() != "cpu" else timing.peak_rss_bytes()
    return {"depth": step.cfg.depth, "remat": spec.remat, "scan": spec.scan, "xla_memory": step.memory(),
            "xla_peak_bytes": step.memory().get("peak_bytes"), "rss_baseline_bytes": base,
            "rss_resident_before_steps_bytes": resident, "rss_peak_during_steps_bytes": peak_steps,
            "rss_peak_including_compile_bytes": after_compile_peak,
            "rss_step_increase_bytes": peak_steps - base if peak_steps is not None else None,
            "flops_xla": step.flops()["flops_xla"]}


def _run_subprocess(args: list[str], timeout: float) -> dict:
    return _run_with(sys.executable, args, timeout)


def bench_env(extra: dict | None = None) -> dict:
    """This process's environment (plus ``extra``) with the repository on ``PYTHONPATH``, for bench subprocesses."""
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _run_with(python: str, args: list[str], timeout: float, env: dict | None = None) -> dict:
    """``python -m layerscale_jax.bench ARGS`` in a fresh process (``env`` added to this one's environment); its
    last JSON line (or ``{"error": ...}``)."""
    proc = subprocess.run([python, "-m", "layerscale_jax.bench", *args], capture_output=True, text=True,
                          timeout=timeout, env=bench_env(env), cwd=str(REPO))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


def bench_memory(depths=DEFAULT_DEPTHS, policies=None, batch: int = 32, timeout: float = 600) -> dict:
    """Peak memory against depth for each remat policy, scanned layers, one fresh subprocess per configuration."""
    from layerscale_jax.models.stack import REMAT_POLICIES
    policies = policies or tuple(REMAT_POLICIES)
    rows = []
    for depth in depths:
        for policy in policies:
            overrides = json.dumps(dict(MEMORY_SHAPE, depth=depth))
            r = _run_subprocess(["_memory_probe", "--batch", str(batch), "--remat", policy, "--overrides",
                                 overrides], timeout)
            r.update({"depth": depth, "remat": policy})
            rows.append(r)
    out = {"benchmark": "memory", "shape": dict(MEMORY_SHAPE, batch=batch, scan=True), "rows": rows,
           "method": "one fresh subprocess per configuration; xla_peak_bytes = argument + output - aliased + "
                     "temporary bytes from compiled.memory_analysis() (XLA's buffer assignment, deterministic); "
                     "rss_step_increase_bytes = peak RSS during two steps minus RSS before the model was built "
                     "(backend started, freed heap returned to the OS with malloc_trim before both readings)"}
    hi = max(depths)
    none = next((r for r in rows if r["depth"] == hi and r["remat"] == "none" and "error" not in r), None)
    if none:
        out["ratios_at_max_depth"] = {
            r["remat"]: {"xla_peak": r["xla_peak_bytes"] / none["xla_peak_bytes"],
                         "rss": (r["rss_step_increase_bytes"] / none["rss_step_increase_bytes"]
                                 if none.get("rss_step_increase_bytes") else None)}
            for r in rows if r["depth"] == hi and "error" not in r}
        full = out["ratios_at_max_depth"].get("full")
        if full:
            out["target_remat_ratio"] = 1 / 3
            out["target_met"] = full["xla_peak"] <= 1 / 3
    return _stamp(out)


def print_memory(r: dict) -> None:
    print(f"peak memory vs depth per remat policy — {r['shape']}")
    print(f"{'depth':>6} {'remat':>34} {'XLA plan MiB':>13} {'RSS incr. MiB':>14}")
    for row in r["rows"]:
        if "error" in row:
            print(f"{row['depth']:>6} {row['remat']:>34} error: {row['error'][-200:]}")
            continue
        rss = row.get("rss_step_increase_bytes")
        print(f"{row['depth']:>6} {row['remat']:>34} {row['xla_peak_bytes'] / 2 ** 20:>13.1f} "
              f"{'n/a' if rss is None else f'{rss / 2 ** 20:.1f}':>14}")
    for policy, q in r.get("ratios_at_max_depth", {}).items():
        rss = q["rss"]
        print(f"  {policy:>34} / none at max depth: XLA plan {q['xla_peak']:.3f}, RSS "
              f"{'n/a' if rss is None else f'{rss:.3f}'}")
    if "target_met" in r:
        print(f"target full remat <= 1/3 of none (XLA plan): {'met' if r['target_met'] else 'MISSED'}")


# ---- LayerScale against none ----------------------------------------------------------------------------------


def bench_layerscale(cases=None, repeats: int = 15) -> dict:
    """Step time of LayerScale against ``branch_scaling='none'`` at equal shapes, measured interleaved."""
    cases = cases or [
        ("deit3_small_patch16_224 b16", "deit3_small_patch16_224", 16, {}),
        ("ablation depth 24 b128", "deit3_small_patch16_224", 128, dict(ABLATION, depth=24, drop_path_rate=0.0)),
    ]
    rows = []
    for label, model, batch, overrides in cases:
        steps = {}
        for scaling in ("layerscale", "none"):
            o = dict(overrides, branch_scaling=scaling)
            if scaling == "none":
                o.pop("init_values", None)
            steps[scaling], _ = prepare(StepSpec(model=model, batch=batch, overrides=o))
        stats = timing.measure_interleaved({k: s.run for k, s in steps.items()}, warmup=1, repeats=repeats,
                                           min_repeat_s=0.5)
        ls, none = stats["layerscale"]["median_s"], stats["none"]["median_s"]
        # Each repeat of LayerScale is paired with the repeat of `none` that ran right after it, under the same
        # load: the median of the per-pair ratios is the overhead (steadier than the ratio of the two medians).
        pairs = [a / b for a, b in zip(stats["layerscale"]["times_s"], stats["none"]["times_s"])]
        rows.append({"case": label, "model": model, "batch": batch, "overrides": overrides,
                     "layerscale_step_s": ls, "none_step_s": none, "overhead": float(np.median(pairs)) - 1,
                     "overhead_ratio_of_medians": ls / none - 1, "paired_ratios": pairs,
                     "layerscale": stats["layerscale"], "none": stats["none"],
                     "flops_xla": {k: s.flops()["flops_xla"] for k, s in steps.items()},
                     "bytes_accessed_xla": {k: xla_cost(s.compiled, "bytes accessed") for k, s in steps.items()},
                     "temp_bytes_xla": {k: s.memory().get("temp_size_in_bytes") for k, s in steps.items()}})
        b = rows[-1]["bytes_accessed_xla"]
        rows[-1]["bytes_accessed_overhead"] = b["layerscale"] / b["none"] - 1 if b["none"] else None
        del steps
    out = {"benchmark": "layerscale", "rows": rows, "target_overhead": 0.02,
           "target_met": all(r["overhead"] <= 0.02 for r in rows)}
    return _stamp(out)


def print_layerscale(r: dict) -> None:
    print("LayerScale vs none at equal shapes (interleaved)")
    for row in r["rows"]:
        b = row.get("bytes_accessed_overhead")
        print(f"  {row['case']:>30}: layerscale {row['layerscale_step_s'] * 1e3:8.1f} ms, none "
              f"{row['none_step_s'] * 1e3:8.1f} ms, overhead {100 * row['overhead']:+.2f}% "
              f"(XLA bytes accessed {'n/a' if b is None else f'{100 * b:+.2f}%'})")
    print(f"target <= 2%: {'met' if r['target_met'] else 'MISSED'}")


# ---- the ablation model against timm -------------------------------------------------------------------------


def bench_ablation(depths=(6, 24), batch: int = 128, vs_timm: bool = True, repeats: int = 7) -> dict:
    """The depth-ablation model (8×8×1 digits, width 64, 4 heads, batch 128, drop path 0.05) against timm."""
    rows = []
    for depth in depths:
        spec = StepSpec(batch=batch, overrides=dict(ABLATION, depth=depth))
        rows.append(measure_train_step(spec, vs_timm=vs_timm, repeats=repeats, min_repeat_s=0.5))
    out = {"benchmark": "ablation", "shape": dict(ABLATION, batch=batch), "rows": rows}
    ratios = [r.get("ratio_vs_timm") for r in rows]
    if all(x is not None for x in ratios):
        out["target_ratio"] = 1.0
        out["target_met"] = all(x >= 1.0 for x in ratios)
    return _stamp(out)


def print_ablation(r: dict) -> None:
    print(f"depth-ablation model vs timm — {r['shape']}")
    for row in r["rows"]:
        depth = row["overrides"]["depth"]
        ratio = row.get("ratio_vs_timm")
        timm_s = row.get("timm_img_per_s")
        print(f"  depth {depth:>3}: ours {row['img_per_s']:9.1f} img/s ({row['step_time_s'] * 1e3:.1f} ms), timm "
              f"{'n/a' if timm_s is None else f'{timm_s:9.1f} img/s'}, ratio "
              f"{'n/a' if ratio is None else f'{ratio:.3f}x'}, compile {row['compile_s']:.1f} s")
    if "target_met" in r:
        print(f"target >= 1.0x timm: {'met' if r['target_met'] else 'MISSED'}")


# ---- several seeds in one vmapped step ------------------------------------------------------------------------


def bench_seeds(num_seeds: int = 4, depth: int = 6, batch: int = 128, repeats: int = 7) -> dict:
    """``num_seeds`` models trained in one ``jax.vmap``-ed step against the same models stepped one after another.

    Each seed has its own parameters, optimizer state, dropout key and batch; the vmapped step stacks them on a
    leading axis (``in_axes=0``) and is one jitted, donated call.
    """
    tx = make_optimizer()
    specs = [StepSpec(batch=batch, seed=s, overrides=dict(ABLATION, depth=depth)) for s in range(num_seeds)]
    built = [init_state(s, tx) for s in specs]
    graphdef = built[0][1]
    cfg = built[0][0].cfg
    fn = make_step_fn(graphdef, tx, uses_drop_path(cfg))
    batches = [synthetic_batch(cfg, batch, seed=s) for s in range(num_seeds)]

    seq_step = jax.jit(fn, donate_argnums=0)
    seq_states = [jax.tree.map(jnp.copy, b[2]) for b in built]
    t0 = time.perf_counter()
    seq_compiled = seq_step.lower(seq_states[0], *batches[0]).compile()
    seq_compile = time.perf_counter() - t0

    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[b[2] for b in built])
    images = jnp.stack([b[0] for b in batches])
    labels = jnp.stack([b[1] for b in batches])
    vm_step = jax.jit(jax.vmap(fn, in_axes=(0, 0, 0)), donate_argnums=0)
    t0 = time.perf_counter()
    vm_compiled = vm_step.lower(stacked, images, labels).compile()
    vm_compile = time.perf_counter() - t0
    holder = {"seq": seq_states, "vm": stacked}

    def run_seq(k):
        states, loss = holder["seq"], None
        for _ in range(k):
            for i in range(num_seeds):
                states[i], loss = seq_compiled(states[i], *batches[i])
        timing.block(loss)

    def run_vm(k):
        state, loss = holder["vm"], None
        for _ in range(k):
            state, loss = vm_compiled(state, images, labels)
        holder["vm"] = state
        timing.block(loss)

    stats = timing.measure_interleaved({"sequential": run_seq, "vmapped": run_vm}, warmup=1, repeats=repeats,
                                       min_repeat_s=0.5)
    seq_t, vm_t = stats["sequential"]["median_s"], stats["vmapped"]["median_s"]
    out = {"benchmark": "seeds", "num_seeds": num_seeds, "shape": dict(ABLATION, depth=depth, batch=batch),
           "sequential_s_per_round": seq_t, "vmapped_s_per_round": vm_t, "speedup": seq_t / vm_t,
           "sequential_img_per_s": num_seeds * batch / seq_t, "vmapped_img_per_s": num_seeds * batch / vm_t,
           "sequential_compile_s": seq_compile, "vmapped_compile_s": vm_compile, "stats": stats}
    return _stamp(out)


def print_seeds(r: dict) -> None:
    print(f"{r['num_seeds']} seeds, one vmapped step vs one after another — {r['shape']}")
    print(f"  sequential {r['sequential_s_per_round'] * 1e3:8.1f} ms per round ({r['sequential_img_per_s']:.0f} img/s)")
    print(f"  vmapped    {r['vmapped_s_per_round'] * 1e3:8.1f} ms per round ({r['vmapped_img_per_s']:.0f} img/s)")
    print(f"  speed-up   {r['speedup']:.2f}x")


# ---- input pipeline against the train step -------------------------------------------------------------------


def bench_pipeline(batch: int = 128, num_batches: int = 100, depth: int = 6, data_dir: str | None = None) -> dict:
    """Images/s of the digits train pipeline alone against the ablation train step (depth ``depth``)."""
    out = {"benchmark": "pipeline", "batch": batch}
    try:
        from layerscale_jax.data import default_data_config, measure_pipeline  # lazy: needs tfds/grain
    except Exception as e:  # noqa: BLE001 - any import problem means: skip with the reason
        out["skipped"] = f"layerscale_jax.data not importable ({type(e).__name__}: {e})"
        return _stamp(out)
    cfg = default_data_config("digits")
    if data_dir:
        cfg.data_dir = data_dir
    try:
        out["pipeline"] = measure_pipeline(cfg, batch, num_batches)
    except Exception as e:  # noqa: BLE001
        out["skipped"] = f"measure_pipeline failed ({type(e).__name__}: {e})"
        return _stamp(out)
    step, _ = prepare(StepSpec(batch=batch, overrides=dict(ABLATION, depth=depth)))
    stats = timing.measure(step.run, warmup=1, repeats=5, min_repeat_s=0.5)
    out["train_step_img_per_s"] = batch / stats["median_s"]
    out["pipeline_img_per_s"] = out["pipeline"]["images_per_s"]
    out["pipeline_over_step"] = out["pipeline_img_per_s"] / out["train_step_img_per_s"]
    return _stamp(out)


def print_pipeline(r: dict) -> None:
    if "skipped" in r:
        print(f"pipeline: skipped — {r['skipped']}")
        return
    print(f"digits pipeline {r['pipeline_img_per_s']:,.0f} img/s vs ablation train step "
          f"{r['train_step_img_per_s']:,.0f} img/s: pipeline/step {r['pipeline_over_step']:.2f}x "
          f"({'the step is the bottleneck' if r['pipeline_over_step'] > 1 else 'the pipeline is the bottleneck'})")


# ---- XLA CPU options ------------------------------------------------------------------------------------------


def bench_xla_options(names=None, cases=None, repeats: int = 5) -> dict:
    """The train step compiled once per XLA CPU option set (``xla_options.CANDIDATE_CPU_OPTIONS``) in one
    process, the executables timed interleaved; speed-up = XLA-default step time / the option's."""
    from layerscale_jax.bench.xla_options import CANDIDATE_CPU_OPTIONS, library_calls
    names = list(names or CANDIDATE_CPU_OPTIONS)
    if "xla_default" not in names:
        names.insert(0, "xla_default")
    unknown = [n for n in names if n not in CANDIDATE_CPU_OPTIONS]
    if unknown:
        raise ValueError(f"unknown XLA option set(s) {unknown}; known: {sorted(CANDIDATE_CPU_OPTIONS)}")
    cases = cases or [("deit3_small b16 fp32", StepSpec(batch=16)),
                      ("ablation d6 b128", StepSpec(batch=128, overrides=dict(ABLATION, depth=6)))]
    rows = []
    for case, spec in cases:
        model, graphdef, state = init_state(spec)
        images, labels = synthetic_batch(model.cfg, spec.batch, spec.seed)
        jitted = jax.jit(make_step_fn(graphdef, make_optimizer(), uses_drop_path(model.cfg)), donate_argnums=0)
        lowered = jitted.lower(state, images, labels)
        compiled, calls, errors, info = {}, {}, {}, {}
        for name in names:
            try:
                t0 = time.perf_counter()
                compiled[name] = lowered.compile(compiler_options=CANDIDATE_CPU_OPTIONS[name])
                info[name] = {"compile_s": time.perf_counter() - t0,
                              "library_calls": library_calls(compiled[name].as_text())}
            except Exception as e:  # noqa: BLE001 - an option this jaxlib rejects is a result, not a crash
                errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
        holders = {name: {"state": jax.tree.map(jnp.copy, state)} for name in compiled}

        def make_call(name):
            def call(k):
                h, loss = holders[name], None
                for _ in range(k):
                    h["state"], loss = compiled[name](h["state"], images, labels)
                timing.block(loss)
            return call

        for name in compiled:
            calls[name] = make_call(name)
        stats = timing.measure_interleaved(calls, warmup=1, repeats=repeats, min_repeat_s=0.5)
        base = stats["xla_default"]["median_s"] if "xla_default" in stats else None
        for name in names:
            t = stats[name]["median_s"] if name in stats else None
            rows.append({"case": case, "option": name, "compiler_options": CANDIDATE_CPU_OPTIONS[name],
                         "step_time_s": t, "speedup_vs_default": base / t if base and t else None,
                         "stats": stats.get(name), **info.get(name, {}), "error": errors.get(name)})
        del compiled, holders, state
    return _stamp({"benchmark": "xla_options", "rows": rows, "repeats": repeats,
                   "method": "one process; the same lowered step compiled with each option set; executables "
                             "timed interleaved (A, B, C, A, B, C, ...); median of repeats"})


def print_xla_options(r: dict) -> None:
    print(f"XLA CPU options (one process, interleaved, {r['repeats']} repeats)")
    for row in r["rows"]:
        t, s = row["step_time_s"], row["speedup_vs_default"]
        lib = row.get("library_calls") or {}
        libs = ", ".join(f"{k} {v}" for k, v in lib.items() if v)
        print(f"  {row['case']:>22} {row['option']:>20}: {'error' if t is None else f'{t * 1e3:9.1f} ms'} "
              f"{'' if s is None else f'{s:.3f}x'}  [{libs}] {row['error'][-120:] if row['error'] else ''}")


# ---- huge pages for XLA's buffers ------------------------------------------------------------------------------


def page_fault_probe(spec: StepSpec, steps: int = 3) -> dict:
    """Per step of ``spec``: wall time, minor page faults and kernel (system) CPU time (run in a fresh process)."""
    import resource
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


def bench_page_faults(spec: StepSpec | None = None, rounds: int = 2, timeout: float = 900) -> dict:
    """The train step with and without glibc's huge-page malloc (``layerscale_jax.runtime``), fresh processes
    alternated (off, on, off, on, ...); medians over all steps of each setting."""
    spec = spec or StepSpec(batch=16)
    args = ["page_fault_probe", "--model", spec.model, "--batch", str(spec.batch),
            *[a for k, v in spec.overrides.items() for a in ("--set", f"{k}={v}")], "--json"]
    settings = {"default_4k_pages": {"LAYERSCALE_JAX_HUGEPAGES": "0", "GLIBC_TUNABLES": ""},
                "huge_page_malloc": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}
    runs = {name: [] for name in settings}
    for _ in range(rounds):
        for name, env in settings.items():
            runs[name].append(_run_with(sys.executable, args, timeout, env=env))
    out = {"benchmark": "page_faults", "spec": describe(spec), "rounds": rounds, "runs": runs}
    for name in settings:
        steps = [r for run in runs[name] for r in run.get("steps", [])]
        out[name] = {k: float(np.median([r[k] for r in steps])) if steps else None
                     for k in ("step_s", "minor_faults", "system_s")}
    a, b = out["default_4k_pages"], out["huge_page_malloc"]
    if a["step_s"] and b["step_s"]:
        out["speedup"] = a["step_s"] / b["step_s"]
        out["fault_ratio"] = a["minor_faults"] / max(b["minor_faults"], 1.0)
    return _stamp(out)


def print_page_faults(r: dict) -> None:
    print(f"glibc huge-page malloc for XLA's buffers — {r['spec']}")
    for name in ("default_4k_pages", "huge_page_malloc"):
        v = r[name]
        if v["step_s"] is None:
            print(f"  {name:>17}: error {[run.get('error') for run in r['runs'][name]]}")
            continue
        print(f"  {name:>17}: step {v['step_s'] * 1e3:8.1f} ms, {v['minor_faults']:9.0f} minor faults, "
              f"{v['system_s']:.2f} s kernel time per step")
    if "speedup" in r:
        print(f"  speed-up {r['speedup']:.3f}x, {r['fault_ratio']:.0f}x fewer page faults")


# ---- all ------------------------------------------------------------------------------------------------------


def wait_for_load(max_load: float | None, max_wait_s: float, poll_s: float = 15.0) -> float:
    """Sleep until the 1-minute load average is at most ``max_load`` (or ``max_wait_s`` passed); seconds waited.

    The machine may be shared: timing under contention penalises PyTorch's spinning OpenMP threads far more
    than XLA's thread pool, so side-by-side ratios are only meaningful on a quiet machine."""
    if max_load is None:
        return 0.0
    t0 = time.time()
    while time.time() - t0 < max_wait_s and os.getloadavg()[0] > max_load:
        time.sleep(poll_s)
    return time.time() - t0


ENTRIES = ("train_step", "ablation", "layerscale", "seeds", "depth", "memory", "pipeline", "xla_options",
           "page_faults", "trainer_step", "optimizer")
# The trainer's own step (configs/digits_layerscale.py, the main job) at the main depth and a deep ablation depth.
TRAINER_CONFIGS = ("configs/digits_layerscale.py", "configs/digits_layerscale.py:depth=24")


def run_all(out_dir: str | None = None, quick: bool = False, max_load: float | None = None,
            max_wait_s: float = 600.0, only: tuple[str, ...] | None = None,
            pipeline_python: str | None = None) -> dict:
    """The whole CPU suite, written to ``benchmarks/results/<machine>_<date>.json`` (returned too).

    With ``max_load``, each entry first waits (up to ``max_wait_s``) for the 1-minute load average to drop to it.
    ``only`` runs some entries and merges them into that day's file. ``pipeline_python`` runs the pipeline entry
    with another interpreter (one with the data dependencies, when this one only has torch/timm).
    """
    started = time.time()
    path = _results_path(out_dir)
    results = {"suite": "layerscale_jax.bench all", "started": datetime.datetime.now().isoformat(timespec="seconds"),
               "command": " ".join(["python -m layerscale_jax.bench", *sys.argv[1:]]),
               "machine": timing.machine_info(), "load_average_start": timing.load_average(), "entries": {}}
    if only and path.exists():
        results = json.loads(path.read_text())
        results.setdefault("reruns", []).append({"entries": list(only), "started": datetime.datetime.now().isoformat(
            timespec="seconds"), "command": " ".join(["python -m layerscale_jax.bench", *sys.argv[1:]]),
            "load_average_start": timing.load_average()})
    wanted = set(only or ENTRIES)
    mm = {"float32": timing.matmul_peak("float32"), "bfloat16": timing.matmul_peak("bfloat16")}
    if not only:
        results["entries"]["matmul"] = mm

    def record(name, fn, printer):
        if name.split("_deit3")[0] not in wanted:
            return
        waited = wait_for_load(max_load, max_wait_s)
        load_before = timing.load_average()
        t0 = time.time()
        try:
            r = fn()
            printer(r)
        except Exception as e:  # noqa: BLE001 - keep going, record the failure
            r = {"error": f"{type(e).__name__}: {e}"}
            print(f"{name}: error {r['error']}")
        r["elapsed_s"] = time.time() - t0
        r["waited_for_load_s"] = waited
        r["load_average_before"] = load_before
        r["load_average_after"] = timing.load_average()
        results["entries"][name] = r
        _write(path, results)
        sys.stdout.flush()

    from layerscale_jax.bench.cli import print_train_step
    for dtype in ("float32", "bfloat16"):
        spec = StepSpec(model="deit3_small_patch16_224", batch=16, dtype=dtype)
        record(f"train_step_deit3_small_b16_{dtype}",
               lambda spec=spec: measure_train_step(spec, vs_timm=True, repeats=5, peak=mm[spec.dtype]),
               print_train_step)
    record("ablation", lambda: bench_ablation(), print_ablation)
    record("layerscale", lambda: bench_layerscale(), print_layerscale)
    record("seeds", lambda: bench_seeds(), print_seeds)
    record("depth", lambda: bench_depth(depths=(12, 96) if quick else DEFAULT_DEPTHS), print_depth)
    record("memory", lambda: bench_memory(depths=(12, 96) if quick else DEFAULT_DEPTHS), print_memory)
    if pipeline_python:
        record("pipeline", lambda: _run_with(pipeline_python, ["pipeline", "--json"], 900), print_pipeline)
    else:
        record("pipeline", lambda: bench_pipeline(), print_pipeline)
    record("xla_options", lambda: bench_xla_options(), print_xla_options)
    record("page_faults", lambda: bench_page_faults(), print_page_faults)
    from layerscale_jax.bench import trainer
    record("trainer_step", lambda: {"rows": [trainer.measure_trainer_step(str(REPO / c)) for c in TRAINER_CONFIGS]},
           lambda r: [trainer.print_trainer_step(row) for row in r["rows"]])
    record("optimizer", lambda: trainer.bench_optimizer(str(REPO / trainer.DEFAULT_CONFIG),
                                                        depths=(12, 96) if quick else trainer.DEFAULT_DEPTHS),
           trainer.print_optimizer)
    results["load_average_end"] = timing.load_average()
    results["elapsed_s" if not only else "rerun_elapsed_s"] = time.time() - started
    results["summary"] = summarize(results)
    _write(path, results)
    print(f"wrote {path}")
    return results


def summarize(results: dict) -> dict:
    """The issue's targets and the measured values, from a results dict."""
    e = results["entries"]
    s = {}
    ts = e.get("train_step_deit3_small_b16_float32", {})
    if ts.get("ratio_vs_timm") is not None:
        s["deit3_small_b16_fp32_vs_timm"] = {"measured": ts["ratio_vs_timm"], "target": ">= 1.0",
                                             "met": ts["ratio_vs_timm"] >= 1.0}
    ab = e.get("ablation", {})
    for row in ab.get("rows", []):
        if row.get("ratio_vs_timm") is not None:
            s[f"ablation_depth{row['overrides']['depth']}_vs_timm"] = {
                "measured": row["ratio_vs_timm"], "target": ">= 1.0", "met": row["ratio_vs_timm"] >= 1.0}
    for row in e.get("layerscale", {}).get("rows", []):
        s[f"layerscale_overhead_{row['case']}"] = {"measured": row["overhead"], "target": "<= 0.02",
                                                   "met": row["overhead"] <= 0.02}
    dep = e.get("depth", {}).get("ratios", {}).get("scan")
    if dep:
        s["scan_compile_depth96_over_12"] = {"measured": dep["compile_ratio"], "target": "<= 1.5",
                                             "met": dep["compile_ratio"] <= 1.5}
    for row in e.get("trainer_step", {}).get("rows", []):
        s[f"trainer_over_model_only_depth{row['depth']}"] = {
            "measured": row["trainer_over_model_only"], "target": "<= 1.15", "met": row["trainer_target_met"]}
    opt = e.get("optimizer", {})
    if "worst_ratio" in opt:
        s["optimizer_update_over_plain_adamw_worst"] = {"measured": opt["worst_ratio"], "target": "<= 1.2",
                                                        "met": opt["target_met"]}
    mem = e.get("memory", {}).get("ratios_at_max_depth", {}).get("full")
    if mem:
        s["remat_full_peak_memory_depth96_over_none"] = {"measured": mem["xla_peak"], "rss": mem["rss"],
                                                         "target": "<= 0.333", "met": mem["xla_peak"] <= 1 / 3}
    return s


def report(results: dict) -> str:
    """The README's Performance table (markdown) from a results file of ``all``."""
    e = results["entries"]
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f}%"          # noqa: E731
    lines = ["| benchmark | ours | timm | ours / timm | MFU ours / timm | target |", "|---|---|---|---|---|---|"]
    for dtype in ("float32", "bfloat16"):
        r = e.get(f"train_step_deit3_small_b16_{dtype}", {})
        if "img_per_s" in r:
            lines.append(f"| DeiT III-S/16 train step, {dtype}, batch 16 | {r['img_per_s']:.2f} img/s | "
                         f"{r['timm_img_per_s']:.2f} img/s | **{r['ratio_vs_timm']:.2f}×** (paired "
                         f"{r['ratio_vs_timm_paired']:.2f}×) | {pct(r['mfu'])} / {pct(r.get('timm_mfu'))} | "
                         f"{'≥ 1.0×' if dtype == 'float32' else '—'} |")
    for row in e.get("ablation", {}).get("rows", []):
        lines.append(f"| ablation model, depth {row['overrides']['depth']}, batch 128, float32 | "
                     f"{row['img_per_s']:.0f} img/s | {row['timm_img_per_s']:.0f} img/s | "
                     f"**{row['ratio_vs_timm']:.2f}×** (paired {row['ratio_vs_timm_paired']:.2f}×) | "
                     f"{pct(row['mfu'])} / {pct(row.get('timm_mfu'))} | ≥ 1.0× |")
    for row in e.get("layerscale", {}).get("rows", []):
        lines.append(f"| LayerScale vs `none` step time, {row['case']} | {row['layerscale_step_s'] * 1e3:.0f} ms vs "
                     f"{row['none_step_s'] * 1e3:.0f} ms | | overhead **{100 * row['overhead']:+.1f}%** (XLA bytes "
                     f"accessed {100 * row['bytes_accessed_overhead']:+.1f}%) | | ≤ 2% |")
    dep = e.get("depth", {}).get("ratios", {})
    if "scan" in dep:
        lines.append(f"| compile time, scanned depth 96 / depth 12 | {dep['scan']['compile_ratio']:.2f}× | | | | "
                     f"≤ 1.5× |")
    if "unrolled" in dep:
        lines.append(f"| compile time, unrolled depth 96 / depth 12 | {dep['unrolled']['compile_ratio']:.2f}× | | | "
                     f"| — |")
    mem = e.get("memory", {}).get("ratios_at_max_depth", {})
    for policy, q in mem.items():
        if policy == "none":
            continue
        rss = "n/a" if q["rss"] is None else f"{q['rss']:.2f}×"
        lines.append(f"| peak memory at depth 96, remat `{policy}` / none | {q['xla_peak']:.2f}× (XLA plan), "
                     f"{rss} (RSS) | | | | "
                     f"{'≤ 0.33×' if policy == 'full' else '—'} |")
    sd = e.get("seeds", {})
    if "speedup" in sd:
        lines.append(f"| {sd['num_seeds']} seeds in one vmapped step vs one after another | {sd['speedup']:.2f}× | | | "
                     f"| — |")
    pl = e.get("pipeline", {})
    if "pipeline_over_step" in pl:
        lines.append(f"| digits input pipeline / ablation train step | {pl['pipeline_img_per_s']:,.0f} vs "
                     f"{pl['train_step_img_per_s']:,.0f} img/s = {pl['pipeline_over_step']:.0f}× | | | | > 1× |")
    pf = e.get("page_faults", {})
    if "speedup" in pf:
        lines.append(f"| huge-page malloc vs 4 KiB pages, DeiT III-S/16 step | {pf['speedup']:.2f}× faster, "
                     f"{pf['fault_ratio']:.0f}× fewer page faults | | | | — |")
    mm = e.get("matmul", {})
    if mm:
        lines.append(f"| matmul peak (MFU denominator), 2048², float32 / bfloat16 | "
                     f"{mm['float32']['flop_per_s'] / 1e9:.0f} / {mm['bfloat16']['flop_per_s'] / 1e9:.0f} GFLOP/s | "
                     f"| | | — |")
    for row in e.get("trainer_step", {}).get("rows", []):
        u = row["optimizer_update"]
        name = row["config"].split("configs/")[-1]
        lines.append(f"| trainer step / model-only step, `{name}` (depth {row['depth']}, batch {row['batch']}) | "
                     f"{row['trainer_step_s'] * 1e3:.1f} ms vs {row['model_only_step_s'] * 1e3:.1f} ms | | "
                     f"**{row['trainer_over_model_only']:.2f}×** (paired {row['trainer_over_model_only_paired']:.2f}×;"
                     f" optimizer update vs plain AdamW {u['ratio']:.2f}×) | | ≤ 1.15× |")
    opt = e.get("optimizer", {})
    for layout in ("unrolled", "scan"):
        for decay in (0.75, 1.0):
            rows = [r for r in opt.get("rows", []) if r["layout"] == layout and r["layer_decay"] == decay]
            if rows:
                times = ", ".join(f"{r['ours_s'] * 1e3:.1f}/{r['plain_s'] * 1e3:.1f}" for r in rows)
                ratios = ", ".join(f"{r['ratio']:.2f}" for r in rows)
                lines.append(f"| optimizer update / plain AdamW + clipping, {layout}, layer decay {decay:g}, depth "
                             f"{'/'.join(str(r['depth']) for r in rows)} | {times} ms | | **{ratios}×** | | "
                             f"≤ 1.2× |")
    m = results.get("machine", {})
    lines.append("")
    commands = [c for c in [results.get("command")] + [r.get("command") for r in results.get("reruns", [])] if c]
    if commands:
        lines.append("Command(s): " + "; then ".join(f"`{c}`" for c in commands) + ".")
    lines.append(f"Measured {results.get('started', '?')} on {m.get('cpu', '?')} ({m.get('cpu_threads', '?')} threads, "
                 f"{m.get('backend', '?')}), jax {m.get('jax', '?')}; load average {results.get('load_average_start')} "
                 f"at the start, {results.get('load_average_end')} at the end.")
    return "\n".join(lines)


def _results_path(out_dir: str | None) -> Path:
    d = Path(out_dir) if out_dir else REPO / "benchmarks" / "results"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{timing.machine_name()}_{datetime.date.today().isoformat()}.json"


def _write(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results, indent=1, default=float))
    tmp.replace(path)


def print_all(r: dict) -> None:
    print(json.dumps(r.get("summary", {}), indent=1))


# ---- command line ---------------------------------------------------------------------------------------------


def _spec_parser(sub, name: str, **kwargs):
    """A subcommand taking one train step's ``--model``, ``--batch``, ``--set KEY=VALUE`` and ``--json``."""
    p = sub.add_parser(name, **kwargs)
    p.add_argument("--model", default="deit3_small_patch16_224")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="model override, repeatable")
    p.add_argument("--json", action="store_true")
    return p


def _spec(args) -> StepSpec:
    from layerscale_jax.bench.cli import parse_overrides
    return StepSpec(model=args.model, batch=args.batch, overrides=parse_overrides(args.set))


def add_subcommands(sub) -> None:
    from layerscale_jax.models.stack import REMAT_POLICIES

    def ints(s):
        return tuple(int(x) for x in s.split(","))

    p = sub.add_parser("depth", help="compile time and step time vs depth, with and without scan")
    p.add_argument("--depths", type=ints, default=DEFAULT_DEPTHS, help="comma-separated, e.g. 12,24,48,96")
    p.add_argument("--layouts", default="scan,unrolled")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_depth(a.depths, tuple(a.layouts.split(",")), a.batch), show=print_depth)

    p = sub.add_parser("memory", help="peak memory vs depth per remat policy (fresh subprocess each)")
    p.add_argument("--depths", type=ints, default=DEFAULT_DEPTHS)
    p.add_argument("--policies", default=",".join(REMAT_POLICIES))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_memory(a.depths, tuple(a.policies.split(",")), a.batch), show=print_memory)

    p = sub.add_parser("_memory_probe", help="(internal) one memory measurement, run by `memory`")
    p.add_argument("--model", default="deit3_small_patch16_224")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--remat", default="none")
    p.add_argument("--no-scan", action="store_true")
    p.add_argument("--overrides", default="{}")
    p.set_defaults(json=True, run=lambda a: memory_probe(StepSpec(
        model=a.model, batch=a.batch, scan=not a.no_scan, remat=a.remat, overrides=json.loads(a.overrides))),
        show=print)

    p = sub.add_parser("layerscale", help="LayerScale vs none at equal shapes")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_layerscale(repeats=a.repeats), show=print_layerscale)

    p = sub.add_parser("ablation", help="the depth-ablation model (digits, width 64, depth 6 and 24) vs timm")
    p.add_argument("--depths", type=ints, default=(6, 24))
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--no-timm", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_ablation(a.depths, a.batch, not a.no_timm), show=print_ablation)

    p = sub.add_parser("seeds", help="several seeds in one vmapped step vs one after another")
    p.add_argument("--num-seeds", type=int, default=4)
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_seeds(a.num_seeds, a.depth, a.batch), show=print_seeds)

    p = sub.add_parser("pipeline", help="digits input pipeline vs the ablation train step")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--num-batches", type=int, default=100)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_pipeline(a.batch, a.num_batches, data_dir=a.data_dir), show=print_pipeline)

    p = sub.add_parser("xla_options", help="the train step under XLA CPU compiler options (interleaved)")
    p.add_argument("--options", default=None, help="comma-separated names from xla_options.CANDIDATE_CPU_OPTIONS")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: bench_xla_options(a.options.split(",") if a.options else None,
                                                   repeats=a.repeats), show=print_xla_options)

    p = _spec_parser(sub, "page_faults", help="the train step with and without glibc's huge-page malloc")
    p.add_argument("--rounds", type=int, default=2)
    p.set_defaults(run=lambda a: bench_page_faults(_spec(a), a.rounds), show=print_page_faults)

    p = _spec_parser(sub, "page_fault_probe", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=3)
    p.set_defaults(run=lambda a: page_fault_probe(_spec(a), a.steps), show=print)

    p = sub.add_parser("report", help="the README Performance table (markdown) from a results file")
    p.add_argument("results_json")
    p.set_defaults(run=lambda a: report(json.loads(Path(a.results_json).read_text())), show=print)

    p = sub.add_parser("all", help="the whole CPU suite → benchmarks/results/<machine>_<date>.json")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--quick", action="store_true", help="depths 12 and 96 only in the depth and memory sweeps")
    p.add_argument("--max-load", type=float, default=None,
                   help="before each entry wait for the 1-minute load average to drop to this (shared machines)")
    p.add_argument("--max-wait-s", type=float, default=600.0, help="the longest such wait per entry")
    p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(ENTRIES)}, merged into "
                                                "the day's results file")
    p.add_argument("--pipeline-python", default=None,
                   help="interpreter for the pipeline entry (one with tensorflow-datasets and grain)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=lambda a: run_all(a.out_dir, a.quick, a.max_load, a.max_wait_s,
                                         tuple(a.only.split(",")) if a.only else None, a.pipeline_python),
                   show=print_all)

