"""What each mesh layout costs, read from the compiled train step: memory per device and communication per step.

    python benchmarks/mesh_costs.py [--model deit3_small_patch16_224] [--batch 64] [--devices 8] [--out FILE]

Builds the trainer's own step (``create_trainer``: model, optimizer, loss, guards) on ``--devices`` virtual CPU
devices for several ``data × fsdp × tensor`` meshes, compiles it (nothing runs), and reports per device:

- the bytes of train state it holds (parameters, AdamW moments, step, RNG; from the state's shardings);
- the collectives in the compiled program, by kind, and the bytes they produce per step (XLA:CPU's program; GPU and
  TPU compilers combine and schedule collectives differently, but move the same arrays).

The numbers are properties of the program, not timings, so any machine gives the same table.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import platform
import sys
import time
from layerscale_jax.train.config import validate_experiment_config

MESHES = [(8, 1, 1), (1, 8, 1), (2, 4, 1), (4, 1, 2), (1, 4, 2), (2, 2, 2)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="deit3_small_patch16_224")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--depth", type=int, default=0, help="override the model's depth (0: the model's own)")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    os.environ["JAX_NUM_CPU_DEVICES"] = str(args.devices)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import jax.numpy as jnp
    import ml_collections

    from layerscale_jax.data.config import default_data_config
    from layerscale_jax.data.sharding import batch_sharding
    from layerscale_jax.optim import default_config as default_optim_config
    from layerscale_jax.train import loop as loop_lib
    from layerscale_jax.plan import hlo as hlo_lib
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train.config import default_train_config, model_section

    overrides = {"depth": args.depth} if args.depth else {}
    rows = []
    for data, fsdp, tensor in MESHES:
        if data * fsdp * tensor != args.devices:
            continue
        config = ml_collections.ConfigDict()
        config.model = model_section(args.model, **overrides)
        config.data = default_data_config("synthetic")
        config.data.image_size = config.model.img_size
        config.data.num_classes = config.model.num_classes
        config.optim = default_optim_config()
        config.train = default_train_config()
        config.train.batch_size = args.batch
        config.train.mesh = {"data": data, "fsdp": fsdp, "tensor": tensor}
        mesh = shard_lib.make_mesh(config.train.mesh)
        trainer = loop_lib.create_trainer(validate_experiment_config(config), mesh)
        sharding = batch_sharding(mesh)
        size = config.model.img_size
        batch = {"image": jax.ShapeDtypeStruct((args.batch, size, size, 3), jnp.float32, sharding=sharding),
                 "label": jax.ShapeDtypeStruct((args.batch,), jnp.int32, sharding=sharding)}
        start = time.perf_counter()
        hlo = trainer.train_step.lower(trainer.abstract_state, batch).compile().as_text()
        compile_s = time.perf_counter() - start
        state_bytes = sum(math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
                          for leaf in jax.tree.leaves(trainer.abstract_state))
        by_op = collections.defaultdict(lambda: [0, 0])
        for c in hlo_lib.collectives(hlo):
            by_op[c.op][0] += 1
            by_op[c.op][1] += c.bytes
        rows.append({"mesh": {"data": data, "fsdp": fsdp, "tensor": tensor},
                     "state_mib_per_device": state_bytes / 2**20,
                     "collectives": {op: {"count": n, "mib": b / 2**20} for op, (n, b) in sorted(by_op.items())},
                     "collective_mib_total": sum(b for _, b in by_op.values()) / 2**20,
                     "compile_seconds": compile_s})
        print(f"mesh {data}x{fsdp}x{tensor}: {rows[-1]['state_mib_per_device']:.1f} MiB state/device, "
              f"{rows[-1]['collective_mib_total']:.1f} MiB of collectives/step ({compile_s:.0f} s compile)",
              file=sys.stderr, flush=True)

    result = {"benchmark": "mesh_costs", "model": args.model, "depth_override": args.depth or None,
              "global_batch": args.batch, "devices": args.devices, "date": datetime.date.today().isoformat(),
              "jax": jax.__version__, "machine": platform.machine(), "rows": rows,
              "command": "python benchmarks/mesh_costs.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


def table(result) -> str:
    ops = sorted({op for row in result["rows"] for op in row["collectives"]})
    lines = [f"{result['model']}{' depth ' + str(result['depth_override']) if result['depth_override'] else ''}, "
             f"global batch {result['global_batch']}, {result['devices']} devices (jax {result['jax']}):", "",
             "| data × fsdp × tensor | train state / device (MiB) | " + " | ".join(f"{op} (n, MiB)" for op in ops)
             + " | all collectives (MiB / step) |",
             "|---|---|" + "---|" * len(ops) + "---|"]
    for row in result["rows"]:
        m = row["mesh"]
        cells = [f"{row['collectives'][op]['count']}, {row['collectives'][op]['mib']:.1f}"
                 if op in row["collectives"] else "–" for op in ops]
        lines.append(f"| {m['data']} × {m['fsdp']} × {m['tensor']} | {row['state_mib_per_device']:.1f} | "
                     + " | ".join(cells) + f" | {row['collective_mib_total']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
