"""Time to the first step of a restarted 2-process job: one compilation cache shared by both processes, against a
cache per host (each process its own directory, the per-host default of ``train.compilation_cache_dir``).

    python benchmarks/bench_pod_cache.py [--config configs/digits_layerscale.py] [--rounds 3] [--json OUT]
                                         [-- --config.model.depth=12 ...]

JAX writes cache entries from process 0 only. A 2-process job (``--coordinator_address`` on this machine, 2 CPU
devices each, gloo collectives) is trained to its first checkpoint twice, once with each cache layout, filling the
caches as a first job would. Then, in fresh processes, each checkpoint is resumed for one step
(``train.stop_after_steps=1``), alternating the layouts round by round. The time of a restart is from the launch
to the console line of the first step after the restore, on process 0 (it prints the progress): the pod steps when
its slowest process is ready, so process 1 recompiling with a per-host cache keeps process 0 waiting at the first
collective. Prints the CPU kind and the load, every round and the medians; ``--json`` writes them. A benchmark, not
a test: run it on a quiet machine.
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


def run_job(config: str, workdir: str, caches: list[str], extra: list[str], timeout: float, step: int) -> float:
    """Start the 2 processes; seconds from their launch to process 0's console line of ``step``."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    start = time.perf_counter()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "layerscale_jax.train", f"--config={config}", f"--workdir={workdir}",
         f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}",
         f"--config.train.compilation_cache_dir={caches[i]}", *extra],
        env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    seen, tail = None, []
    for line in procs[0].stderr:
        tail = (tail + [line])[-20:]
        if seen is None and f"] {step}/" in line:
            seen = time.perf_counter() - start
    codes = [p.wait(timeout=timeout) for p in procs]
    if any(codes) or seen is None:
        raise RuntimeError(f"the 2-process job in {workdir} failed (exit {codes}):\n{''.join(tail)}"
                           f"{procs[1].stderr.read()[-3000:]}")
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

    scratch = tempfile.mkdtemp(prefix="bench_pod_cache_")
    step = args.checkpoint_step
    common = [f"--config.train.checkpoint_every={step}", "--config.train.log_every=1", "--config.train.eval_every=0",
              *args.overrides]
    layouts = {"shared": [os.path.join(scratch, "shared")] * 2,
               "per_host": [os.path.join(scratch, f"host{i}") for i in range(2)]}
    try:
        for name, caches in layouts.items():       # the first job of each layout: trains to step, fills its caches
            run_job(args.config, os.path.join(scratch, f"prepared_{name}"), caches,
                    [*common, f"--config.train.stop_after_steps={step}"], args.timeout, step)
        rounds = {name: [] for name in layouts}
        for i in range(args.rounds):
            for name in (list(layouts) if i % 2 == 0 else list(layouts)[::-1]):
                workdir = os.path.join(scratch, f"{name}_{i}")
                shutil.copytree(os.path.join(scratch, f"prepared_{name}"), workdir)
                seconds = run_job(args.config, workdir, layouts[name], [*common, "--config.train.stop_after_steps=1"],
                                  args.timeout, step + 1)
                rounds[name].append(round(seconds, 2))
                shutil.rmtree(workdir)
        entries = {name: [len(os.listdir(c)) if os.path.isdir(c) else 0 for c in caches]
                   for name, caches in layouts.items()}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = {"benchmark": "time to the first step of a restarted 2-process job", "config": args.config,
              "overrides": args.overrides, "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(),
              "cpu_threads": len(os.sched_getaffinity(0)), "load_average": load_average(),
              "cache_entries_per_process": entries, "seconds": rounds,
              "median_s": {k: statistics.median(v) for k, v in rounds.items()}}
    result["speedup"] = round(result["median_s"]["per_host"] / result["median_s"]["shared"], 2)
    print(f"CPU: {result['cpu']} ({result['cpu_threads']} threads), load {result['load_average']}")
    print(f"config: {args.config} {' '.join(args.overrides)}; 2 processes × 2 CPU devices, restart from step {step}")
    print(f"cache entries per process: {entries}")
    print(f"{'':15}{'shared':>12}{'per host':>12}")
    for i in range(args.rounds):
        print(f"{'round ' + str(i):15}{rounds['shared'][i]:>11.2f}s{rounds['per_host'][i]:>11.2f}s")
    print(f"{'median':15}{result['median_s']['shared']:>11.2f}s{result['median_s']['per_host']:>11.2f}s"
          f"   ({result['speedup']}× faster to the first step with a shared cache)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
