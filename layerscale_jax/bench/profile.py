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

_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.-]+) = (\S+?\[[\d,]*\])\S* ")


def hlo_labels(hlo_text: str) -> dict[str, dict]:
    """``{instruction name: {"shape", "op_name"}}`` for every instruction of a compiled HLO module's text."""
    out = {}
    for line in hlo_text.splitlines():
        if m := _INSTRUCTION.match(line):
            op = re.search(r'op_name="([^"]*)"', line)
            out[m.group(1)] = {"shape": m.group(2), "op_name": op.group(1) if op else ""}
    return out


def trace_durations(logdir: str) -> collections.Counter:
    """Total microseconds per event name in the Perfetto trace under ``logdir``."""
    files = glob.glob(f"{logdir}/**/*.json.gz", recursive=True)
    if not files:
        raise FileNotFoundError(f"no Perfetto trace (*.json.gz) under {logdir}")
    with gzip.open(files[0]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            total[e["name"]] += e.get("dur", 0)
    return total


def profile_step(spec: StepSpec, steps: int = 3, top: int = 25) -> dict:
    """Per-operation and per-kind milliseconds per step of ``spec``'s compiled train step."""
    step = CompiledStep(spec)
    labels = hlo_labels(step.compiled.as_text())
    step.run(1)
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            step.run(steps)
        durations = trace_durations(logdir)
    ops, count, kinds = collections.Counter(), collections.Counter(), collections.Counter()
    for name, us in durations.items():
        if name in labels:
            key = (re.sub(r"\.\d+$", "", name), labels[name]["shape"], labels[name]["op_name"])
            ops[key] += us / 1e3 / steps
            count[key] += 1
            kinds[key[0]] += us / 1e3 / steps
    return {"benchmark": "profile", "spec": vars(spec), "steps": steps, "timed_ops_ms_per_step": sum(ops.values()),
            "by_kind": [{"kind": k, "ms_per_step": v} for k, v in kinds.most_common(top)],
            "by_op": [{"kind": k, "shape": s, "op_name": o, "count": count[(k, s, o)], "ms_per_step": v}
                      for (k, s, o), v in ops.most_common(top)]}
