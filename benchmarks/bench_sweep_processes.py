"""How should a sweep of small runs use a machine's cores: one process using every core, or one process per core
(``--shard I/N`` pinned with ``taskset``)?

    python benchmarks/bench_sweep_processes.py [--depths 24 96] [--steps 30] [--rounds 2] [--json OUT]

Each contender runs the depth ablation's own train step (``bench_seed_vmap.programs``: width 32, batch 64, scanned
layers) in fresh processes: ``one process`` unpinned (XLA's thread pool over every core), and ``one per core``: as
many processes as cores at once, each pinned to its own core (``os.sched_setaffinity`` before JAX starts, so XLA
sizes its pool to one core). Prints per depth the throughput of the whole machine in steps/s of each and the ratio
(per core / one process: > 1 means shards pinned to cores finish a sweep sooner), with the CPU kind and the load;
``--json`` writes them. A benchmark, not a test: run it on a quiet machine (load < 2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys


def child(depth: int, steps: int, core: int | None) -> None:
    """Times ``steps`` steps of one run in this process and prints seconds per step as one JSON line."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    import jax

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_seed_vmap import programs, timed

    step, state, batches, *_ = programs(depth, 2, steps)
    jax.block_until_ready(state)
    _, seconds = timed(step, state, batches)
    print(json.dumps({"seconds_per_step": seconds}))


def launch(depth: int, steps: int, cores: list[int | None]) -> float:
    """Runs one child per entry of ``cores`` at once; the machine's throughput in steps/s."""
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(depth), str(steps), str(c)],
                              stdout=subprocess.PIPE, text=True) for c in cores]
    per_step = [json.loads(p.communicate()[0].strip().splitlines()[-1])["seconds_per_step"] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"error: a child process failed at depth {depth}")
    return sum(1 / s for s in per_step)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 96])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        depth, steps, core = args.child
        return child(int(depth), int(steps), None if core == "None" else int(core))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_seed_vmap import finish

    from layerscale_jax.bench.timing import cpu_model, load_average

    cores = sorted(os.sched_getaffinity(0))
    result = {"benchmark": "sweep_processes", "cpu": cpu_model(), "cores": len(cores),
              "load_average_start": load_average(), "settings": vars(args), "depths": {}}
    print(f"CPU: {result['cpu']} ({len(cores)} cores), load {result['load_average_start']}")
    for depth in args.depths:
        one, per_core = [], []
        for r in range(args.rounds):
            for which in (("one", "per_core") if r % 2 == 0 else ("per_core", "one")):
                if which == "one":
                    one.append(launch(depth, args.steps, [None]))
                else:
                    per_core.append(launch(depth, args.steps, cores))
        row = {"one_process_steps_per_s": statistics.median(one),
               "one_per_core_steps_per_s": statistics.median(per_core), "rounds_one_process": one,
               "rounds_one_per_core": per_core}
        row["ratio"] = row["one_per_core_steps_per_s"] / row["one_process_steps_per_s"]
        result["depths"][depth] = row
        print(f"depth {depth}: one process {row['one_process_steps_per_s']:.2f} steps/s, one per core "
              f"{row['one_per_core_steps_per_s']:.2f} steps/s → {row['ratio']:.2f}× ({result['cpu']})")
    finish(result, args.json)


if __name__ == "__main__":
    main()
