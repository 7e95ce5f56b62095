"""The timing core: the repeat protocol, the matmul peak, memory, machine facts and fresh processes.

``measure``: each contender runs ``warmup`` calls; one timed call picks ``k`` so that a repeat of ``k`` calls lasts
about ``min_repeat_s``; then ``repeats`` rounds time one repeat of every contender in turn (A, B, A, B, ...), so a
change of load hits all alike. ``call(k)`` runs ``k`` steps and synchronises once (dispatch overlaps the next step,
as in training). Time = median over repeats of elapsed / k; ``paired_ratio`` = median of the per-round ratios.

jax is imported where it is used: the timm worker (``timm_worker``, run by a Python that may have only torch and
timm) loads this file for ``measure``, the memory readings and PyTorch's matmul peak.
"""
from __future__ import annotations

import ctypes
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def measure(calls: dict, *, warmup: int = 2, repeats: int = 5, min_repeat_s: float = 0.5, max_k: int = 64) -> dict:
    """``{name: {"median_s", "min_s", "max_s", "repeats", "calls_per_repeat", "times_s"}}`` by the protocol above."""
    ks = {}
    for name, call in calls.items():
        for _ in range(warmup):
            call(1)
        t = time.perf_counter()
        call(1)
        ks[name] = int(max(1, min(max_k, round(min_repeat_s / max(time.perf_counter() - t, 1e-6)))))
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            t = time.perf_counter()
            call(ks[name])
            times[name].append((time.perf_counter() - t) / ks[name])
    return {name: {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts),
                   "calls_per_repeat": ks[name], "times_s": [round(x, 6) for x in ts]} for name, ts in times.items()}


def paired_ratio(a: dict, b: dict) -> float:
    """Median over back-to-back repeat pairs of ``a``'s time over ``b``'s (two results of ``measure``)."""
    return float(statistics.median(x / y for x, y in zip(a["times_s"], b["times_s"])))


class Loop:
    """``run(k)``: ``state, out = fn(state, *args)`` ``k`` times, then wait for ``out`` (``state`` if it is None)."""

    def __init__(self, fn, state, *args):
        self.fn, self.state, self.args, self.out = fn, state, args, None

    def run(self, k: int) -> None:
        import jax
        for _ in range(k):
            self.state, self.out = self.fn(self.state, *self.args)
        jax.block_until_ready(self.state if self.out is None else self.out)


def matmul_peak(dtype: str = "float32", n: int | None = None, torch_device: str | None = None) -> dict:
    """FLOP/s (``2n³`` per call) of a square matmul, the MFU denominator: jax's on its default device, or
    PyTorch's on ``torch_device`` (timm's side). n = 2048 on the CPU, 8192 on accelerators."""
    if not torch_device:
        import jax
        import jax.numpy as jnp
    n = n or (2048 if (torch_device or jax.default_backend()) == "cpu" else 8192)
    if torch_device:
        import torch
        a, b = (torch.randn(n, n, dtype=getattr(torch, dtype), device=torch_device) for _ in range(2))

        def call(k):
            for _ in range(k):
                a @ b
            if torch_device == "cuda":
                torch.cuda.synchronize()
    else:
        a, b = (jax.random.normal(k, (n, n), jnp.dtype(dtype)) for k in jax.random.split(jax.random.key(0)))
        mm = jax.jit(jnp.matmul)

        def call(k):
            jax.block_until_ready([mm(a, b) for _ in range(k)])
    t = measure({"mm": call}, warmup=1, min_repeat_s=0.3, max_k=50)["mm"]["median_s"]
    return {"n": n, "dtype": dtype, "flop_per_s": 2 * n ** 3 / t, "seconds": t}


def rss_bytes(peak: bool = False) -> int:
    """The process's resident set size (``VmRSS``), or its peak since ``rss_baseline`` (``VmHWM``)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:" if peak else "VmRSS:"))


def rss_baseline() -> int:
    """Return freed heap to the OS (glibc ``malloc_trim``), reset the peak RSS (``clear_refs`` 5): the RSS now."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return rss_bytes()


def compiled_memory(compiled) -> dict:
    """XLA's buffer assignment of one executable; ``peak_bytes`` = argument + output − aliased + temporary bytes."""
    m = compiled.memory_analysis()
    out = {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                           "temp_size_in_bytes", "generated_code_size_in_bytes")}
    return {**out, "peak_bytes": out["argument_size_in_bytes"] + out["output_size_in_bytes"]
            - out["alias_size_in_bytes"] + out["temp_size_in_bytes"]}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` where that file has none)."""
    with open("/proc/cpuinfo") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())


def cpu_family_model() -> str | None:
    """``family F model M`` from ``/proc/cpuinfo``: the CPU's generation, which its model name may not give (two
    "AMD EPYC" machines: family 25 is Zen 3/4, family 26 Zen 5); None where the file does not say."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = dict(ln.split(":", 1) for ln in itertools.takewhile(str.strip, f) if ":" in ln)
    except OSError:
        return None
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else None


def machine_info() -> dict:
    """What the numbers were measured on: host, CPU model and generation, accelerator, versions, XLA flags, the
    malloc (``runtime.malloc_in_use``), load average."""
    import flax
    import jax
    import optax

    from layerscale_jax.runtime import malloc_in_use
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu": cpu_model(), "cpu_family_model": cpu_family_model(), "malloc": malloc_in_use(),
            "cpu_threads": len(os.sched_getaffinity(0)), "backend": jax.default_backend(),
            "device": jax.devices()[0].device_kind, "num_devices": jax.device_count(), "jax": jax.__version__,
            "flax": flax.__version__, "optax": optax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "load_average": load_average()}


def fresh_process(module: str, args: list[str], python: str | None = None, env: dict | None = None) -> dict:
    """``subprocess`` arguments for ``PYTHON -m MODULE ARGS`` (this Python and environment plus ``env`` by default),
    the repository first on ``PYTHONPATH`` so that any Python imports this checkout."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {"args": [python or sys.executable, "-m", module, *args], "env": env, "cwd": str(REPO), "text": True}


def run_fresh(args: list[str], timeout: float, env: dict | None = None, python: str | None = None) -> dict:
    """The last JSON line of ``python -m layerscale_jax.bench ARGS`` in a fresh process, or ``{"error": ...}``."""
    proc = subprocess.run(**fresh_process("layerscale_jax.bench", args, python, env), capture_output=True,
                          timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])
