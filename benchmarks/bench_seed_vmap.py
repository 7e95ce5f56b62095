"""Is it faster to train K seeds of one depth-ablation cell in one compiled program (``jax.vmap`` of the train step
over stacked parameters, optimizer states, data batches and random streams) than one after the other?

    python benchmarks/bench_seed_vmap.py [--depths 24 96] [--members 5] [--steps 20] [--rounds 3] [--json OUT]

Both sides run the depth ablation's own train step (``experiments/depth_ablation_runs.py``' config: width 32, 2 heads,
patch 2, batch 64, scanned layers, ``layerscale``), jitted once and warmed up; each round times ``--steps`` steps of
one run, then ``--steps`` steps of the K-member vmapped program, alternating the order between rounds so a change
of load hits both. Prints per depth the milliseconds per member-step of each and the ratio (sequential / vmapped:
> 1 means one program is faster), with the CPU kind and the load; ``--json`` writes them. A benchmark, not a test:
run it on a quiet machine (load < 2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import depth_ablation_runs as da  # noqa: E402
from layerscale_jax import optim  # noqa: E402
from layerscale_jax.bench.timing import cpu_model, load_average  # noqa: E402
from layerscale_jax.train import finetune as finetune_lib  # noqa: E402
from layerscale_jax.train.config import validate_experiment_config  # noqa: E402
from layerscale_jax.train.loop import build_model_fns  # noqa: E402
from layerscale_jax.train.step import init_train_state, make_train_step  # noqa: E402


def programs(depth: int, members: int, steps: int):
    """The ablation's train step for one run and its K-member vmap, with their initial states and batches."""
    spec = da.RunSpec(depth, "layerscale", True, 0, 1e-2, protocol="rates", steps=1000)
    experiment = validate_experiment_config(da.make_config(spec, da.PROTOCOL_SIZING))
    make, abstract, graphdef, _, _ = build_model_fns(experiment)
    optim_settings = finetune_lib.optim_settings(experiment, abstract)
    bundle = optim.build(optim_settings, abstract, total_steps=experiment.train.steps)
    step = make_train_step(graphdef, bundle.tx, bundle.schedule, optim_config=optim_settings,
                           data_config=experiment.data, num_classes=10)

    def init(seed):
        return init_train_state(nnx.state(make(seed), nnx.Param), bundle.tx, seed, False)

    rng = np.random.default_rng(0)
    size, batch = experiment.model.img_size, experiment.train.batch_size

    def batches(*lead):                                       # lead: () for one run, (K,) for K members
        return [{"image": jnp.asarray(rng.normal(size=(*lead, batch, size, size, 1)), jnp.float32),
                 "label": jnp.asarray(rng.integers(0, 10, (*lead, batch)))} for _ in range(steps)]
    single_state = jax.jit(init, static_argnums=0)(0)
    member_state = jax.tree.map(lambda *x: jnp.stack(x), *[jax.jit(init, static_argnums=0)(k)
                                                            for k in range(members)])
    return (jax.jit(step, donate_argnums=(0,)), single_state, batches(),
            jax.jit(jax.vmap(step), donate_argnums=(0,)), member_state, batches(members))


def timed(step, state, batches):
    state, _ = step(state, batches[0])                       # compile and warm up
    jax.block_until_ready(state)
    start = time.perf_counter()
    for batch in batches:
        state, _ = step(state, batch)
    jax.block_until_ready(state)
    return state, (time.perf_counter() - start) / len(batches)


def finish(result: dict, path: str | None) -> None:
    """Records the load at the end, prints it and writes ``result`` to ``path`` (when given) as JSON."""
    result["load_average_end"] = load_average()
    print(f"load at the end {result['load_average_end']}")
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", type=int, nargs="+", default=[24, 96])
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.members < 2 or args.steps < 1 or args.rounds < 1:
        raise SystemExit(f"error: --members={args.members} must be ≥ 2, --steps={args.steps} and "
                         f"--rounds={args.rounds} ≥ 1")
    result = {"benchmark": "seed_vmap", "cpu": cpu_model(), "cpu_threads": os.cpu_count(),
              "load_average_start": load_average(), "settings": vars(args), "depths": {}}
    print(f"CPU: {result['cpu']} ({os.cpu_count()} threads), load {result['load_average_start']}")
    for depth in args.depths:
        single, s_state, s_batches, multi, m_state, m_batches = programs(depth, args.members, args.steps)
        seq, vm = [], []
        for r in range(args.rounds):
            order = ("single", "vmap") if r % 2 == 0 else ("vmap", "single")
            for which in order:
                if which == "single":
                    s_state, t = timed(single, s_state, s_batches)
                    seq.append(1000 * t)
                else:
                    m_state, t = timed(multi, m_state, m_batches)
                    vm.append(1000 * t / args.members)
        row = {"sequential_ms_per_member_step": statistics.median(seq),
               "vmapped_ms_per_member_step": statistics.median(vm), "rounds_sequential": seq, "rounds_vmapped": vm}
        row["speedup"] = row["sequential_ms_per_member_step"] / row["vmapped_ms_per_member_step"]
        result["depths"][depth] = row
        print(f"depth {depth}, {args.members} members: sequential {row['sequential_ms_per_member_step']:.1f} ms, "
              f"vmapped {row['vmapped_ms_per_member_step']:.1f} ms per member-step → speed-up "
              f"{row['speedup']:.2f}× ({result['cpu']})")
    finish(result, args.json)


if __name__ == "__main__":
    main()
