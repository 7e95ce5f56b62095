"""The timing core every benchmark uses: the repeat protocol, the matmul peak, memory, machine facts, fresh processes.

Protocol (``measure``): each contender runs ``warmup`` calls, then one timed call picks ``k`` so that a repeat of
``k`` calls lasts about ``min_repeat_s``; then ``repeats`` rounds time one repeat of every contender in turn
(A, B, A, B, ...), so a change of machine load hits all alike. ``call(k)`` runs ``k`` steps and synchronises the
device once at the end, so async dispatch overlaps the host-side work of the next step, as in training. A
contender's time is the median over repeats of ``elapsed / k``; ``paired_ratio`` is the median of the per-round
ratios of two contenders (each pair ran back to back, under the same load).

Settings fixed per process (huge pages, a memory baseline) are measured in fresh processes (``run_fresh``).
"""
from __future__ import annotations

import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

REPO = Path(__file__).resolve().parents[2]


def measure(calls: dict[str, Callable[[int], None]], *, warmup: int = 2, repeats: int = 5,
            min_repeat_s: float = 0.5, max_k: int = 64) -> dict[str, dict]:
    """Per-call seconds of each contender by the protocol above: ``{name: {"median_s", "min_s", "max_s",
    "repeats", "calls_per_repeat", "times_s"}}``."""
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
                   "calls_per_repeat": ks[name], "times_s": [round(x, 6) for x in ts]}
            for name, ts in times.items()}


def paired_ratio(a: dict, b: dict) -> float:
    """Median over back-to-back repeat pairs of ``a``'s time over ``b``'s (two results of ``measure``)."""
    return float(statistics.median(x / y for x, y in zip(a["times_s"], b["times_s"])))


def block(tree) -> None:
    jax.block_until_ready(tree)


def matmul_peak(dtype: str = "float32", n: int | None = None, repeats: int = 5) -> dict:
    """FLOP/s (``2n³`` per call) of a jitted square ``n × n`` matmul on jax's default device: the MFU denominator
    (n = 2048 on the CPU, 8192 on accelerators)."""
    n = n or (2048 if jax.default_backend() == "cpu" else 8192)
    a, b = (jax.random.normal(k, (n, n), jnp.dtype(dtype)) for k in jax.random.split(jax.random.key(0)))
    mm = jax.jit(lambda a, b: a @ b)
    block(mm(a, b))

    def call(k):
        block([mm(a, b) for _ in range(k)][-1])

    return _peak(call, n, dtype, repeats, 0.3 if jax.default_backend() == "cpu" else 0.2)


def torch_matmul_peak(dtype: str = "float32", n: int = 2048, device: str = "cpu", repeats: int = 5) -> dict:
    """The same for PyTorch (timm's side), so each framework's MFU has its own measured peak."""
    import torch
    a, b = (torch.randn(n, n, dtype=getattr(torch, dtype), device=device) for _ in range(2))

    def call(k):
        for _ in range(k):
            a @ b
        if device == "cuda":
            torch.cuda.synchronize()

    return _peak(call, n, dtype, repeats, 0.3)


def _peak(call, n: int, dtype: str, repeats: int, min_repeat_s: float) -> dict:
    t = measure({"mm": call}, warmup=1, repeats=repeats, min_repeat_s=min_repeat_s, max_k=50)["mm"]["median_s"]
    return {"n": n, "dtype": dtype, "flop_per_s": 2 * n ** 3 / t, "seconds": t}


# ---- memory ---------------------------------------------------------------------------------------------------


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":")), None)
    except OSError:  # pragma: no cover - not Linux
        return None


def current_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS") or 0


def peak_rss_bytes() -> int:
    """The process's peak resident set size (``VmHWM``) in bytes."""
    return _proc_status_bytes("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux ``clear_refs`` 5), so a later peak excludes compilation."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc), so RSS afterwards counts live memory, not leftovers."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def device_peak_memory() -> int | None:
    """Peak bytes in use on the default accelerator (None on the CPU, which has no memory stats)."""
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    return int(stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0))) if stats else None


def compiled_memory(compiled) -> dict:
    """XLA's buffer assignment of one executable: argument, output, aliased, temporary and code bytes, and
    ``peak_bytes`` = argument + output − aliased + temporary."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return {}
    out = {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                                           "temp_size_in_bytes", "generated_code_size_in_bytes") if hasattr(m, k)}
    if {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= set(out):
        out["peak_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                             - out.get("alias_size_in_bytes", 0) + out["temp_size_in_bytes"])
    return out


# ---- the machine --------------------------------------------------------------------------------------------


def num_threads() -> int:
    """CPU cores this process may run on (the size of XLA's CPU thread pool; torch gets the same)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        return []


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:  # pragma: no cover
        model = None
    return model or platform.processor() or "unknown"


def machine_info() -> dict:
    """What the numbers were measured on: host, CPU, accelerator, versions, XLA flags and the load average."""
    import flax
    import optax
    dev = jax.devices()[0]
    return {"hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "cpu": cpu_model(), "cpu_threads": num_threads(), "backend": jax.default_backend(),
            "device": getattr(dev, "device_kind", str(dev)), "num_devices": jax.device_count(),
            "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
            "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_average": load_average()}


def machine_name() -> str:
    """A short file-name-safe machine label: ``cpu<threads>`` or ``<backend>-<device kind>``."""
    label = (f"cpu{num_threads()}" if jax.default_backend() == "cpu"
             else jax.default_backend() + "-" + getattr(jax.devices()[0], "device_kind", "device"))
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in label).strip("-").lower()


# ---- fresh processes ------------------------------------------------------------------------------------------


def bench_env(extra: dict | None = None) -> dict:
    """This process's environment (plus ``extra``) with the repository on ``PYTHONPATH``, for bench subprocesses."""
    env = dict(os.environ, **(extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_fresh(args: list[str], timeout: float, env: dict | None = None, python: str | None = None) -> dict:
    """``python -m layerscale_jax.bench ARGS`` in a fresh process (``env`` added to this one's environment): its
    last JSON line, or ``{"error": ...}``."""
    proc = subprocess.run([python or sys.executable, "-m", "layerscale_jax.bench", *args], capture_output=True,
                          text=True, timeout=timeout, env=bench_env(env), cwd=str(REPO))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])
