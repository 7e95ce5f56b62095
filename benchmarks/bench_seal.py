"""The time the checkpoint seal (SHA-256 of every file, ``layerscale_jax/checksums.py``) adds to a save, at DeiT III-S
size: 22M parameters and AdamW's two moments (about 265 MB of float32).

    python benchmarks/bench_seal.py [--model deit3_small_patch16_224] [--rounds 3] [--json OUT]

Each round saves the same train state with the ``Checkpointer`` twice, with the seal and with sealing switched off
(alternated, in this order and then reversed, so a change of load hits both), and times ``save`` + ``wait`` (the
save is asynchronous; the seal runs in orbax's finalisation, before the step is committed). It also times hashing
one saved step alone, on 1 thread and on ``checksums.THREADS`` threads, from a warm page cache. One process: on a
pod every host hashes only the files it wrote, so the added time per save is about this figure divided by the
number of hosts, plus process 0's merged index.

Prints the CPU kind and the load, every round and the medians; ``--json`` writes them. A benchmark, not a test: run
it on a quiet machine (load < 2).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import jax
import numpy as np
import optax
from flax import nnx

from layerscale_jax import create_model
from layerscale_jax.bench.timing import cpu_model, load_average
from layerscale_jax.checksums import THREADS, file_digests
from layerscale_jax.storage.checkpoint import Checkpointer


def train_state(model_name: str, overrides: dict) -> dict:
    model = create_model(model_name, rngs=nnx.Rngs(0), **overrides)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    rng = np.random.default_rng(0)
    # Moments as after training (not AdamW's zeros, which compress to nothing on disk).
    opt_state = jax.tree.map(lambda x: rng.standard_normal(x.shape).astype(x.dtype) if x.ndim else x,
                             optax.adamw(1e-3).init(params))
    return jax.device_put({"params": params, "opt_state": opt_state, "step": np.int32(0)})


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deit3_small_patch16_224")
    parser.add_argument("--depth", type=int, default=None, help="override the model's depth (a quick check)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)          # orbax's "waiting for the previous save" notes

    state = train_state(args.model, {} if args.depth is None else {"depth": args.depth})
    n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
    state_mb = sum(x.nbytes for x in jax.tree.leaves(state)) / 2**20
    sealed = Checkpointer._seal_in_flight
    times = {"with_seal": [], "without_seal": []}
    hashing = {"threads_1": [], f"threads_{THREADS}": []}
    with tempfile.TemporaryDirectory(prefix="bench_seal_") as scratch:
        checkpointer = Checkpointer(os.path.join(scratch, "checkpoints"), keep=1)
        step = 0

        def save(seal: bool) -> float:
            nonlocal step
            step += 1
            Checkpointer._seal_in_flight = sealed if seal else (lambda self: None)
            try:
                start = time.perf_counter()
                checkpointer.save(step, state, {"next_batch": step, "offset": 0}, {})
                checkpointer.wait()
                return time.perf_counter() - start
            finally:
                Checkpointer._seal_in_flight = sealed

        save(True)                                              # warm-up: orbax's first save compiles and plans
        for i in range(args.rounds):
            order = [("with_seal", True), ("without_seal", False)]
            for name, seal in order if i % 2 == 0 else order[::-1]:
                times[name].append(round(save(seal), 3))
            root = checkpointer.directory / str(step)
            for threads in (1, THREADS):
                start = time.perf_counter()
                file_digests(root, threads=threads)
                hashing[f"threads_{threads}"].append(round(time.perf_counter() - start, 3))
        checkpointer.close()
        root = os.fspath(checkpointer.directory / str(step))
        step_mb = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(root) for f in files)
    medians = {k: statistics.median(v) for k, v in {**times, **hashing}.items()}
    result = {"benchmark": "checkpoint seal: added time per save", "model": args.model, "parameters": n_params,
              "state_mb": round(state_mb, 1), "step_files_mb": round(step_mb / 2**20, 1), "cpu": cpu_model(),
              "cpu_threads": len(os.sched_getaffinity(0)), "load_average": load_average(),
              "save_s": times, "hash_s": hashing, "median_s": medians,
              "added_per_save_s": round(medians["with_seal"] - medians["without_seal"], 3)}
    print(f"CPU: {result['cpu']} ({result['cpu_threads']} threads), load {result['load_average']}")
    print(f"{args.model}: {n_params:,} parameters, train state {state_mb:.0f} MB (params + AdamW moments), "
          f"{result['step_files_mb']} MB on disk per step; {args.rounds} rounds")
    print(f"{'':10}{'save+wait, sealed':>19}{'unsealed':>11}{'hash, 1 thread':>16}{f'{THREADS} threads':>12}")
    for i in range(args.rounds):
        print(f"{'round ' + str(i):10}{times['with_seal'][i]:>18.2f}s{times['without_seal'][i]:>10.2f}s"
              f"{hashing['threads_1'][i]:>15.2f}s{hashing[f'threads_{THREADS}'][i]:>11.2f}s")
    print(f"{'median':10}{medians['with_seal']:>18.2f}s{medians['without_seal']:>10.2f}s"
          f"{medians['threads_1']:>15.2f}s{medians[f'threads_{THREADS}']:>11.2f}s")
    print(f"the seal adds {result['added_per_save_s']:.2f} s per save (median sealed − median unsealed)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
