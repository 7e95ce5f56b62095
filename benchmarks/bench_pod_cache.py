"""Time to the first step of a restarted 2-process job: one compilation cache shared by both processes, against a
cache per host (each process its own directory, the per-host default of ``train.compilation_cache_dir``).

    python benchmarks/bench_pod_cache.py [--config configs/digits_layerscale.py] [--rounds 3] [--json OUT]
                                         [-- --config.model.depth=12 ...]

JAX writes cache entries from process 0 only. A 2-process job (``--coordinator_address`` on this machine, 2 CPU
devices each, gloo collectives) is trained to its first checkpoint once per cache layout, filling the caches as a
first job would. Then, in fresh processes, each checkpoint is resumed for one step (``train.stop_after_steps=1``),
the layouts in turn, their order reversed every other round. The layouts:

- ``per_host``: each process its own directory (process 1's stays empty);
- ``shared``: one directory, JAX's own cache keys. On CPU these differ between the processes (their
  ``accelerator_config`` component hashes XLA's CPU topology, which lists the calling process's devices with its
  process index: ``layerscale_jax.bench.cache_keys``), so process 1 finds none of process 0's entries and this
  layout saves process 1 nothing here;
- ``shared_pod_keys``: one directory, and keys without the process index (``python -m
  layerscale_jax.bench.cache_keys``), as every host of a TPU slice computes them: what a pod's shared cache gives.

The time of a restart is from the launch to the console line of the first step after the restore, on process 0 (it
prints the progress): the pod steps when its slowest process is ready, so process 1 compiling keeps process 0
waiting at the first collective. Prints the CPU kind and the load, every round side by side and the medians;
``--json`` writes them. A benchmark, not a test: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from layerscale_jax.bench.timing import cpu_model, load_average

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")])))
    return env


def run_job(config: str, workdir: str, caches: list[str], extra: list[str], timeout: float, step: int,
            module: str = "layerscale_jax.train") -> float:
    """Start the 2 processes (``python -m module``); seconds from their launch to process 0's console line of
    ``step``."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    log = tempfile.TemporaryFile("w+")               # process 1's stderr: a pipe nobody reads could fill and stall it
    start = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", module, f"--config={config}", f"--workdir={workdir}",
         f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
         f"--config.train.compilation_cache_dir={caches[i]}", *extra],
        env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE if i == 0 else log, text=True)
        for i in range(2)]
    seen, tail = None, []
    for line in procs[0].stderr:
        tail = (tail + [line])[-20:]
        if seen is None and f"] {step}/" in line:
            seen = time.perf_counter() - start
    codes = [p.wait(timeout=timeout) for p in procs]
    log.seek(0)
    other = log.read()[-3000:]
    log.close()
    if any(codes) or seen is None:
        raise RuntimeError(f"the 2-process job in {workdir} failed (exit {codes}):\n{''.join(tail)}{other}")
    return seen


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=os.path.join(REPO, "configs", "digits_layerscale.py"))
    parser.add_argument("--checkpoint-step", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("overrides", nargs="*", help="--config.X=V flags for every run (after --)")
    args = parser.parse_args(argv)

    load_before = load_average()
    scratch = tempfile.mkdtemp(prefix="bench_pod_cache_")
    step = args.checkpoint_step
    common = [f"--config.train.checkpoint_every={step}", "--config.train.log_every=1", "--config.train.eval_every=0",
              *args.overrides]
    layouts = {"per_host": [os.path.join(scratch, f"host{i}") for i in range(2)],
               "shared": [os.path.join(scratch, "shared")] * 2,
               "shared_pod_keys": [os.path.join(scratch, "shared_pod_keys")] * 2}
    modules = {name: "layerscale_jax.train" for name in layouts}
    modules["shared_pod_keys"] = "layerscale_jax.bench.cache_keys"
    try:
        for name, caches in layouts.items():       # the first job of each layout: trains to step, fills its caches
            run_job(args.config, os.path.join(scratch, f"prepared_{name}"), caches,
                    [*common, f"--config.train.stop_after_steps={step}"], args.timeout, step, modules[name])
        rounds = {name: [] for name in layouts}
        for i in range(args.rounds):
            for name in (list(layouts) if i % 2 == 0 else list(layouts)[::-1]):
                workdir = os.path.join(scratch, f"{name}_{i}")
                shutil.copytree(os.path.join(scratch, f"prepared_{name}"), workdir)
                seconds = run_job(args.config, workdir, layouts[name], [*common, "--config.train.stop_after_steps=1"],
                                  args.timeout, step + 1, modules[name])
                rounds[name].append(round(seconds, 2))
                shutil.rmtree(workdir)
        entries = {name: [len(os.listdir(c)) if os.path.isdir(c) else 0 for c in caches]
                   for name, caches in layouts.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = {"benchmark": "time to the first step of a restarted 2-process job", "config": args.config,
              "overrides": args.overrides, "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(),
              "cpu_threads": len(os.sched_getaffinity(0)), "load_average_before": load_before,
              "load_average": load_average(),
              "cache_entries_per_process": entries, "seconds": rounds,
              "median_s": {k: statistics.median(v) for k, v in rounds.items()}}
    result["speedup_over_per_host"] = {k: round(result["median_s"]["per_host"] / v, 2)
                                       for k, v in result["median_s"].items() if k != "per_host"}
    names = list(layouts)
    print(f"CPU: {result['cpu']} ({result['cpu_threads']} threads), load average {load_before} before, "
          f"{result['load_average']} after")
    print(f"config: {args.config} {' '.join(args.overrides)}; 2 processes × 2 CPU devices, restart from step {step}")
    print(f"cache entries per process: {entries}")
    print(f"{'':15}" + "".join(f"{n:>18}" for n in names))
    for i in range(args.rounds):
        print(f"{'round ' + str(i):15}" + "".join(f"{rounds[n][i]:>17.2f}s" for n in names))
    print(f"{'median':15}" + "".join(f"{result['median_s'][n]:>17.2f}s" for n in names))
    print("faster to the first step than per host: " + ", ".join(
        f"{k} {v}×" for k, v in result["speedup_over_per_host"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
