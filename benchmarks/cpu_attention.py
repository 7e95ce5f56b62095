"""Attention forms in the full CPU train step, compiled in one process and timed alternately.

    python benchmarks/cpu_attention.py [--repeats 7] [--out FILE]

Every form computes ``softmax(q kᵀ / √d_h) v`` per head from the fused projection ``(b, n, h, 3, d_h)``:

- ``einsum``: the library's CPU default (``layers/attention.py``): heads-major einsums, the scale on the logits;
- ``einsum_scaled_q``: the same with ``q / √d_h`` before the product (an ``n × d_h`` multiply instead of ``n × n``);
- ``xla``: ``jax.nn.dot_product_attention`` (XLA's implementation, token-major), as on accelerators.

Cases: DeiT III-S/16 batch 16 and the ablation model at depth 24, batch 128 (float32). Speed-up = einsum's median
step time / the form's (and the median of back-to-back pairs). Prints one JSON object, with the CPU it ran on.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

from layerscale_jax.bench import timing
from layerscale_jax.bench.entries import ABLATION
from layerscale_jax.bench.step import CompiledStep, StepSpec
from layerscale_jax.layers import attention

LIBRARY_FORM = attention.fused_qkv_attention


def einsum_scaled_q(qkv: jnp.ndarray, impl: str) -> jnp.ndarray:
    q, k, v = (t[0] for t in jnp.split(qkv.transpose(3, 0, 2, 1, 4), 3, axis=0))   # each (b, h, n, d_h)
    logits = jnp.einsum("bhqd,bhkd->bhqk", q * q.shape[-1] ** -0.5, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", weights, v).transpose(0, 2, 1, 3)


FORMS = {"einsum": (LIBRARY_FORM, "einsum"), "einsum_scaled_q": (einsum_scaled_q, "einsum"),
         "xla": (LIBRARY_FORM, "xla")}            # form: (the function, the model's attention_impl)
CASES = {"deit3_small b16": StepSpec(batch=16),
         "ablation d24 b128": StepSpec(batch=128, overrides=dict(ABLATION, depth=24))}


def race(spec: StepSpec, repeats: int) -> dict:
    steps = {}
    for name, (form, implementation) in FORMS.items():
        attention.fused_qkv_attention = form
        try:                                             # traced here, with this form
            steps[name] = CompiledStep(dataclasses.replace(spec, overrides={**spec.overrides,
                                                                            "attention_impl": implementation}))
        finally:
            attention.fused_qkv_attention = LIBRARY_FORM
    stats = timing.measure({n: s.run for n, s in steps.items()}, warmup=1, repeats=repeats)
    base = stats["einsum"]
    return {n: {"step_time_s": s["median_s"], "speedup_vs_einsum": base["median_s"] / s["median_s"],
                "paired_speedup_vs_einsum": timing.paired_ratio(base, s), "stats": s} for n, s in stats.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    result = {"benchmark": "cpu_attention", "machine": timing.machine_info(), "load_average_start":
              timing.load_average(), "repeats": args.repeats,
              "cases": {case: race(spec, args.repeats) for case, spec in CASES.items()},
              "load_average_end": timing.load_average()}
    for case, forms in result["cases"].items():
        for name, r in forms.items():
            print(f"{case:20s} {name:16s} {r['step_time_s']:.4f} s  speed-up vs einsum {r['speedup_vs_einsum']:.3f}"
                  f" (paired {r['paired_speedup_vs_einsum']:.3f})", file=sys.stderr)
    text = json.dumps(result, indent=1, default=float)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
