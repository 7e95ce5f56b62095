"""The bench's train step (``layerscale_jax.bench.step``) compiled for an NVIDIA GPU with and without one, and its
attention implementations raced on a real GPU.

    python benchmarks/gpu_compile_check.py predict --target h200 [--real] [--attention xla|cudnn|auto]
    python benchmarks/gpu_compile_check.py attention [--impls xla,cudnn] [--repeats 5]

``predict``: the step ``(state, images, labels) -> (state, loss)`` (AdamW, donated state) of ``--model`` at
``--batch`` in ``--dtype``, lowered from abstract inputs and compiled deviceless for ``--target``
(``plan.gpu_targets``: XLA's stored target description, one GPU), and with ``--real`` also for this machine's GPU;
for each, ``memory_analysis()`` (arguments, outputs, aliased, temporaries), the compile seconds and the count of
cuDNN fused-attention custom calls (``__cudnn$fmha``: forward and backward kernels) in the compiled HLO.
``attention``: per implementation, the same model, initial parameters and batch; the first step's loss (parity:
the implementations compute one function) and img/s timed alternately (``bench.timing.measure``).

Prints one JSON object (the last line). Needs only jax, flax, optax (no TensorFlow, TFDS, grain or ml_collections).
``benchmarks/gpu_check.sh`` runs both on a real GPU; ``GPU_CHECK_SMALL=1`` shapes try the flow on a CPU.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from layerscale_jax.bench import timing
from layerscale_jax.bench.step import CompiledStep, StepSpec, make_optimizer, make_step_fn
from layerscale_jax.models import create_model

CUDNN_FMHA = re.compile(r'custom_call_target="(__cudnn\$fmha[A-Za-z]*)"')


def spec_of(args, attention: str) -> StepSpec:
    overrides = {"attention_impl": attention, **json.loads(args.overrides)}
    return StepSpec(model=args.model, batch=args.batch, dtype=args.dtype, scan=args.scan, overrides=overrides)


def abstract_step(spec: StepSpec, sharding):
    """The step function and its abstract inputs (``ShapeDtypeStruct``s on ``sharding``; nothing allocated)."""
    tx = make_optimizer()
    model = nnx.eval_shape(lambda: create_model(spec.model, rngs=nnx.Rngs(0), **{
        **spec.overrides, "dtype": spec.dtype, "scan_layers": spec.scan, "remat": spec.remat}))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = {"params": params, "rest": rest, "opt_state": jax.eval_shape(tx.init, params),
             "key": jax.eval_shape(lambda: jax.random.key(0))}
    cfg = model.cfg
    inputs = (state, jax.ShapeDtypeStruct((spec.batch, cfg.img_size, cfg.img_size, cfg.in_chans), np.float32),
              jax.ShapeDtypeStruct((spec.batch,), np.int32))
    place = (lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)) if sharding else (lambda x: x)
    return make_step_fn(graphdef, tx, cfg.drop_path_rate > 0), jax.tree.map(place, inputs)


def compile_report(fn, inputs, sharding) -> dict:
    shardings = {"in_shardings": sharding, "out_shardings": sharding} if sharding else {}
    start = time.perf_counter()
    compiled = jax.jit(fn, donate_argnums=0, **shardings).lower(*inputs).compile()
    seconds = time.perf_counter() - start
    kernels = CUDNN_FMHA.findall(compiled.as_text())
    return {"compile_s": seconds, "xla_memory": timing.compiled_memory(compiled),
            "cudnn_fmha_calls": len(kernels), "cudnn_fmha_kernels": sorted(set(kernels)),
            "device_kind": (sharding.mesh.devices.flat[0] if sharding else jax.devices()[0]).device_kind,
            "hlo": compiled.as_text()}


def step_range(text: str, args) -> dict:
    """The step-time range of the compiled step on ``--target`` (``plan.step_time``) and the MFU it gives."""
    from layerscale_jax.bench.flops import train_step_flops
    from layerscale_jax.models import create_model
    from layerscale_jax.plan.step_time import step_time
    from layerscale_jax.plan.targets import CHIPS
    chip = CHIPS[args.target]
    terms = step_time(text, chip)
    model = nnx.eval_shape(lambda: create_model(args.model, rngs=nnx.Rngs(0)))
    flops = train_step_flops(model.cfg, args.batch)
    return {"seconds": terms.seconds, "lower_s": terms.lower, "upper_s": terms.upper, "dominant": terms.dominant,
            "flops_per_chip": terms.flops_per_chip, "hbm_bytes_per_chip": terms.hbm_bytes_per_chip,
            "model_flops": flops, "mfu_range": [flops / chip.peak_bf16_flop_per_s / terms.upper,
                                                flops / chip.peak_bf16_flop_per_s / terms.lower]}


def predict(args) -> dict:
    out = {"spec": spec_of(args, args.attention).describe(), "jax": jax.__version__}
    from layerscale_jax.plan import gpu_targets
    try:
        devices = gpu_targets.gpu_devices(args.target, 1, 1)
        sharding = NamedSharding(Mesh(np.array(devices), ("data",)), P())
        out["deviceless"] = compile_report(*abstract_step(spec_of(args, args.attention), sharding), sharding)
        out["deviceless"]["target"] = args.target
        out["deviceless"]["device_memory_bytes"] = gpu_targets.device_memory_bytes(args.target)
        out["deviceless"]["step_time"] = step_range(out["deviceless"].pop("hlo"), args)
    except Exception as err:  # noqa: BLE001 - recorded: what this jax can and cannot do deviceless
        out["deviceless_error"] = f"{type(err).__name__}: {str(err)[:600]}"
    if args.real:
        out["real"] = compile_report(*abstract_step(spec_of(args, args.attention), None), None)
        out["real"].pop("hlo")
        stats = jax.devices()[0].memory_stats() or {}
        out["real"]["device_bytes_limit"] = stats.get("bytes_limit")
    return out


def attention(args) -> dict:
    """First-step loss and img/s of each implementation, same parameters and batch."""
    steps, out = {}, {"spec": spec_of(args, "auto").describe(), "jax": jax.__version__, "backend":
                      jax.default_backend(), "impls": {}}
    for impl in args.impls:
        try:
            step = CompiledStep(spec_of(args, impl))
            step.run(1)
            steps[impl] = step
            out["impls"][impl] = {"first_loss": float(step.out), "compile_s": step.compile_s,
                                  "xla_memory": timing.compiled_memory(step.compiled),
                                  "cudnn_fmha_calls": len(CUDNN_FMHA.findall(step.compiled.as_text()))}
        except Exception as err:  # noqa: BLE001 - recorded, the other implementations still run
            out["impls"][impl] = {"error": f"{type(err).__name__}: {str(err)[:600]}"}
    stats = timing.measure({k: s.run for k, s in steps.items()}, warmup=1, repeats=args.repeats) if steps else {}
    for impl, s in stats.items():
        out["impls"][impl].update(step_time_s=s["median_s"], img_per_s=args.batch / s["median_s"], timing=s)
    losses = [r["first_loss"] for r in out["impls"].values() if "first_loss" in r]
    if len(losses) > 1:
        out["first_loss_max_abs_diff"] = float(np.ptp(losses))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("predict", "attention"))
    parser.add_argument("--model", default="deit3_base_patch16_224")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--overrides", default="{}", help='JSON model overrides, e.g. {"img_size": 32}')
    parser.add_argument("--target", default="h200", help="predict: the stored GPU target description")
    parser.add_argument("--real", action="store_true", help="predict: also compile for this machine's GPU")
    parser.add_argument("--attention", default="auto", help="predict: the model's attention_impl")
    parser.add_argument("--impls", default="xla,cudnn", type=lambda s: s.split(","),
                        help="attention: the implementations to race")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = predict(args) if args.command == "predict" else attention(args)
    print(json.dumps(result, default=float))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
