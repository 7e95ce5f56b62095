"""The measurement protocol shared by every benchmark, the matmul peak, memory and the machine's facts.

Protocol: run ``warmup`` calls, then ``repeats`` timed repeats of ``k`` calls each (``k`` chosen so one repeat lasts
about ``min_repeat_s``; the device is synchronised only at the end of a repeat, so async dispatch overlaps the
host-side work of the next step); the step time is the median over repeats of ``elapsed / k``. Two contenders are
compared by interleaving their repeats (A, B, A, B, ...) so a change of machine load hits both alike.
"""
from __future__ import annotations

import os
import platform
import resource
import socket
import statistics
import time
from typing import Callable

import jax
import jax.numpy as jnp


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
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """What the numbers were measured on: host, CPU, accelerator, versions, XLA flags and the load average."""
    import flax
    import optax
    dev = jax.devices()[0]
    return {
        "hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
        "cpu": cpu_model(), "cpu_threads": num_threads(), "backend": jax.default_backend(),
        "device": getattr(dev, "device_kind", str(dev)), "num_devices": jax.device_count(),
        "jax": jax.__version__, "flax": flax.__version__, "optax": optax.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""), "load_average": load_average(),
    }


def machine_name() -> str:
    """A short file-name-safe machine label: ``cpu2-<hostname>`` or ``gpu-<device kind>``."""
    if jax.default_backend() == "cpu":
        label = f"cpu{num_threads()}"
    else:
        label = jax.default_backend() + "-" + getattr(jax.devices()[0], "device_kind", "device")
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in label).strip("-").lower()


def block(tree) -> None:
    jax.block_until_ready(tree)


def measure(call: Callable[[int], None], *, warmup: int = 2, repeats: int = 5, min_repeat_s: float = 0.5,
            max_k: int = 64) -> dict:
    """Per-call seconds of ``call(k)`` (which runs ``k`` calls and synchronises once) by the protocol above."""
    for _ in range(warmup):
        call(1)
    t = time.perf_counter()
    call(1)
    first = time.perf_counter() - t
    k = int(max(1, min(max_k, round(min_repeat_s / max(first, 1e-6)))))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call(k)
        times.append((time.perf_counter() - t) / k)
    return summarize(times, k)


def summarize(times: list[float], k: int) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "repeats": len(times), "calls_per_repeat": k, "times_s": [round(x, 6) for x in times]}


def measure_interleaved(calls: dict[str, Callable[[int], None]], *, warmup: int = 2, repeats: int = 5,
                        min_repeat_s: float = 0.5, max_k: int = 64) -> dict[str, dict]:
    """``measure`` for several contenders with their repeats interleaved (A, B, A, B, ...)."""
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
    return {name: summarize(times[name], ks[name]) for name in calls}


def matmul_peak(dtype: str = "float32", n: int | None = None, repeats: int = 5) -> dict:
    """FLOP/s of a square ``n × n`` matmul on the default device (the MFU denominator), median of ``repeats``."""
    backend = jax.default_backend()
    n = n or (2048 if backend == "cpu" else 8192)
    dt = jnp.dtype(dtype)
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), dt)
    b = jax.random.normal(kb, (n, n), dt)
    mm = jax.jit(lambda a, b: a @ b)
    block(mm(a, b))

    def call(k):
        out = None
        for _ in range(k):
            out = mm(a, b)
        block(out)

    stats = measure(call, warmup=1, repeats=repeats, min_repeat_s=0.3 if backend == "cpu" else 0.2, max_k=50)
    return {"n": n, "dtype": dtype, "flop_per_s": 2 * n ** 3 / stats["median_s"], "seconds": stats["median_s"]}


def torch_matmul_peak(dtype: str = "float32", n: int = 2048, device: str = "cpu", repeats: int = 5) -> dict:
    """The same for PyTorch (timm's side), so each framework's MFU has its own measured peak."""
    import torch
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a = torch.randn(n, n, dtype=dt, device=device)
    b = torch.randn(n, n, dtype=dt, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def call(k):
        for _ in range(k):
            a @ b
        sync()

    stats = measure(call, warmup=1, repeats=repeats, min_repeat_s=0.3, max_k=50)
    return {"n": n, "dtype": dtype, "flop_per_s": 2 * n ** 3 / stats["median_s"], "seconds": stats["median_s"]}


# ---- memory -------------------------------------------------------------------------------------------------


def _proc_status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return None


def peak_rss_bytes() -> int:
    """The process's peak resident set size (``VmHWM``) in bytes."""
    peak = _proc_status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc), so RSS afterwards counts live memory, not leftovers."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def current_rss_bytes() -> int:
    return _proc_status_bytes("VmRSS") or 0


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux ``clear_refs`` 5), so a later peak excludes compilation."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def device_peak_memory() -> int | None:
    """Peak bytes in use on the default accelerator (None on CPU, where there are no memory stats)."""
    stats = jax.devices()[0].memory_stats() if jax.default_backend() != "cpu" else None
    if not stats:
        return None
    return int(stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0)))


def compiled_memory(compiled) -> dict:
    """XLA's buffer-assignment view of one compiled executable: arguments, outputs, temporaries, aliasing."""
    try:
        m = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return {}
    if m is None:
        return {}
    out = {k: int(getattr(m, k)) for k in ("argument_size_in_bytes", "output_size_in_bytes",
                                           "alias_size_in_bytes", "temp_size_in_bytes",
                                           "generated_code_size_in_bytes") if hasattr(m, k)}
    if {"argument_size_in_bytes", "output_size_in_bytes", "temp_size_in_bytes"} <= set(out):
        out["peak_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"]
                             - out.get("alias_size_in_bytes", 0) + out["temp_size_in_bytes"])
    return out
