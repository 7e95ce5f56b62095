"""Metrics: ``WORKDIR/metrics.jsonl`` (one JSON object per logged step), TensorBoard event files, console lines."""
from __future__ import annotations

import functools
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from layerscale_jax.train.checkpoint import as_path
from layerscale_jax.train.sharding import path_names


class MetricsWriter:
    """Writes from process 0 only; every call is a no-op elsewhere."""

    def __init__(self, workdir, total_steps: int):
        self.enabled = jax.process_index() == 0
        self.total_steps = total_steps
        self.start_time = time.time()
        self.start_step = None
        workdir = as_path(workdir)
        self.jsonl_path = workdir / "metrics.jsonl"
        self.tb_dir = workdir / "tensorboard"
        if self.enabled:
            workdir.mkdir(parents=True, exist_ok=True)
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(str(self.tb_dir), flush_secs=10)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
        with self.jsonl_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in scalars.items():
            self.tb.add_scalar(key, float(value), int(step))

    def progress(self, step: int, scalars: dict[str, float]) -> None:
        """One console line: step, loss, lr, throughput and ETA."""
        if not self.enabled:
            return
        if self.start_step is None:
            self.start_step, self.start_time = step, time.time()
        done = step - self.start_step
        elapsed = time.time() - self.start_time
        eta = (self.total_steps - step) * elapsed / done if done > 0 else float("nan")
        width = 24
        filled = int(width * step / max(self.total_steps, 1))
        bar = "#" * filled + "." * (width - filled)
        parts = [f"[{bar}] {step}/{self.total_steps}"]
        for key in ("train_loss", "learning_rate", "grad_norm", "img_per_s", "test_accuracy"):
            if key in scalars:
                parts.append(f"{key} {scalars[key]:.4g}")
        parts.append(f"ETA {_fmt_seconds(eta)}")
        print(" | ".join(parts), file=sys.stderr, flush=True)

    def flush(self) -> None:
        if self.enabled:
            self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.tb.close()


def _fmt_seconds(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _scale_leaves(params) -> dict[str, tuple]:
    """``{name: (leaf path, stacked)}`` of the LayerScale λ / scalar α leaves (``ls1``, ``ls2`` of each block)."""
    found = {}
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        names = path_names(path)
        if names[-1] not in ("gamma", "alpha") or len(names) < 2 or not names[-2].startswith("ls"):
            continue
        indices = [str(getattr(k, "key", getattr(k, "idx", ""))) for k in path]
        layer_idx = next((i for i in indices if i.isdigit()), None)
        stacked = layer_idx is None and names[0] == "blocks" and (value.ndim == 2 or
                                                                   (names[-1] == "alpha" and value.ndim == 1))
        name = (f"{names[0]}.{layer_idx}.{names[-2]}" if layer_idx is not None else
                f"{names[0]}.{{}}.{names[-2]}" if stacked else f"{names[0]}.{names[-2]}")
        found[name] = (jax.tree_util.keystr(path), stacked)
    return found


@functools.lru_cache(maxsize=None)
def _mean_abs_fn(found: tuple, mesh):
    def mean_abs(params):
        by_path = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(params)}
        out = {}
        for name, (path, stacked) in found:
            value = jnp.abs(by_path[path].astype(jnp.float32))
            out[name] = value.reshape(value.shape[0], -1).mean(axis=1) if stacked else value.mean()
        return out

    out_shardings = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(mean_abs, out_shardings=out_shardings)


def layerscale_statistics(params: nnx.State) -> dict[str, float]:
    """Mean |λ| (or |α|) of each block's two branches: ``layerscale/blocks.<i>.ls<1|2>``.

    Computed in one jitted reduction with replicated outputs, so it works on parameters sharded across processes.
    Stacked (scanned) parameters give one value per layer along the leading axis.
    """
    found = _scale_leaves(params)
    if not found:
        return {}
    shardings = [getattr(x, "sharding", None) for x in jax.tree.leaves(params)]
    mesh = next((s.mesh for s in shardings if isinstance(s, jax.sharding.NamedSharding)), None)
    means = jax.device_get(_mean_abs_fn(tuple(found.items()), mesh)(params))
    stats = {}
    for name, value in means.items():
        if np.ndim(value):
            stats.update({f"layerscale/{name.format(i)}": float(v) for i, v in enumerate(value)})
        else:
            stats[f"layerscale/{name}"] = float(value)
    return stats
