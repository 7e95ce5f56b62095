"""Where a train step's time goes: XLA's per-operation timings from ``jax.profiler``'s trace, summed per operation
over a few steps, labelled with the shape and JAX op name of the compiled HLO, grouped by kind. On the CPU, Eigen
dots may finish on the thread pool after their event ends (undercounted); fusions and copies are timed in full.
"""
from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile

import jax

from layerscale_jax.bench.step import CompiledStep, StepSpec


def profile_step(spec: StepSpec, steps: int = 3, top: int = 25) -> dict:
    """Per-operation and per-kind milliseconds per step of ``spec``'s compiled train step."""
    step, labels = CompiledStep(spec), {}
    for line in step.compiled.as_text().splitlines():          # instruction name → its shape and JAX op name
        if m := re.match(r"\s*(?:ROOT )?%([\w.-]+) = (\S+?\[[\d,]*\])\S* ", line):
            op = re.search(r'op_name="([^"]*)"', line)
            labels[m.group(1)] = (m.group(2), op.group(1) if op else "")
    step.run(1)
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            step.run(steps)
        if not (files := glob.glob(f"{logdir}/**/*.json.gz", recursive=True)):
            raise FileNotFoundError(f"no Perfetto trace (*.json.gz) under {logdir}")
        with gzip.open(files[0]) as f:
            trace = json.load(f)
    ops, kinds, names = collections.Counter(), collections.Counter(), collections.defaultdict(set)
    for e in trace["traceEvents"] if isinstance(trace, dict) else trace:
        if e.get("ph") == "X" and e["name"] in labels:
            key = (re.sub(r"\.\d+$", "", e["name"]), *labels[e["name"]])
            ops[key] += e.get("dur", 0) / 1e3 / steps
            kinds[key[0]] += e.get("dur", 0) / 1e3 / steps
            names[key].add(e["name"])
    return {"benchmark": "profile", "spec": vars(spec), "steps": steps, "timed_ops_ms_per_step": sum(ops.values()),
            "by_kind": [{"kind": k, "ms_per_step": v} for k, v in kinds.most_common(top)],
            "by_op": [{"kind": k, "shape": s, "op_name": o, "count": len(names[(k, s, o)]), "ms_per_step": v}
                      for (k, s, o), v in ops.most_common(top)]}
