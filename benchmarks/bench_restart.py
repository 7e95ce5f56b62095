"""Time to the first step of a restarted training job, with and without the persistent compilation cache.

    python benchmarks/bench_restart.py [--config configs/digits_layerscale.py] [--rounds 3] [--json OUT]
                                       [-- --config.model.depth=12 ...]

A run of ``--config`` is trained to its first checkpoint (step ``--checkpoint-step``) in a scratch workdir, filling a
compilation cache as it goes. Then, in fresh processes (``python -m layerscale_jax.train``, as a preempted job is
restarted), the checkpoint is resumed for one step (``train.stop_after_steps=1``) with the cache
(``train.compilation_cache_dir``, warm) and without it (''), alternated round by round so a change of load hits
both. Measured from the launch of the process to the console line of the first step after the restore (the loop
syncs with the device there): Python and JAX start-up, restore, compilation or cache load, one step. One untimed
restart with the cache goes first (it caches the few programs a restore compiles that a fresh start does not).

Prints the CPU kind and the load, the time of every round and the medians side by side; ``--json`` writes them.
This is a benchmark, not a test: run it on a quiet machine (load < 2).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from layerscale_jax.bench.timing import cpu_model, load_average

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_command(config: str, workdir: str, cache: str, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "layerscale_jax.train", f"--config={config}", f"--workdir={workdir}",
            f"--config.train.compilation_cache_dir={cache}", *extra]


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")]))
    return env


def time_to_step(command: list[str], step: int, timeout: float) -> float:
    """Seconds from launching ``command`` to its console line for ``step`` (stderr), then waits for it to exit."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=child_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    seen, tail = None, []
    for line in proc.stderr:
        tail = (tail + [line])[-20:]
        if seen is None and f"] {step}/" in line:
            seen = time.perf_counter() - start
    if proc.wait(timeout=timeout) != 0 or seen is None:
        raise RuntimeError(f"{' '.join(command)} failed (exit {proc.returncode}):\n{''.join(tail)}")
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

    scratch = tempfile.mkdtemp(prefix="bench_restart_")
    try:
        cache, prepared = os.path.join(scratch, "xla_cache"), os.path.join(scratch, "prepared")
        step = args.checkpoint_step
        common = [f"--config.train.checkpoint_every={step}", "--config.train.log_every=1",
                  "--config.train.eval_every=0", *args.overrides]
        first = train_command(args.config, prepared, cache, [*common, f"--config.train.stop_after_steps={step}"])
        subprocess.run(first, env=child_env(), cwd=REPO, check=True, capture_output=True, timeout=args.timeout)
        resume = [*common, "--config.train.stop_after_steps=1"]

        def restart(name: str, cache_dir: str) -> float:
            workdir = os.path.join(scratch, name)
            shutil.copytree(prepared, workdir)
            try:
                return time_to_step(train_command(args.config, workdir, cache_dir, resume), step + 1, args.timeout)
            finally:
                shutil.rmtree(workdir)

        restart("warmup", cache)
        rounds = {"with_cache": [], "without_cache": []}
        for i in range(args.rounds):
            order = [("with_cache", cache), ("without_cache", "")]
            for name, cache_dir in order if i % 2 == 0 else order[::-1]:
                rounds[name].append(round(restart(f"{name}_{i}", cache_dir), 2))
        cached_files = sum(len(files) for _, _, files in os.walk(cache))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    result = {"benchmark": "time to the first step on restart", "config": args.config, "overrides": args.overrides,
              "cpu": cpu_model(), "cpu_threads": len(os.sched_getaffinity(0)),
              "load_average": load_average(), "cache_entries": cached_files,
              "seconds": rounds, "median_s": {k: statistics.median(v) for k, v in rounds.items()}}
    result["speedup"] = round(result["median_s"]["without_cache"] / result["median_s"]["with_cache"], 2)
    print(f"CPU: {result['cpu']} ({result['cpu_threads']} threads), load {result['load_average']}")
    print(f"config: {args.config} {' '.join(args.overrides)}; restart from step {step}, {args.rounds} rounds")
    print(f"{'':15}{'with cache':>12}{'without':>12}")
    for i in range(args.rounds):
        print(f"{'round ' + str(i):15}{rounds['with_cache'][i]:>11.2f}s{rounds['without_cache'][i]:>11.2f}s")
    print(f"{'median':15}{result['median_s']['with_cache']:>11.2f}s{result['median_s']['without_cache']:>11.2f}s"
          f"   ({result['speedup']}× faster with the cache, {cached_files} cache entries)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
