"""Metrics: ``WORKDIR/metrics.jsonl`` (one JSON object per logged step), TensorBoard event files, console lines."""
from __future__ import annotations

import json
import os
import sys
import time

import jax
import numpy as np
from flax import nnx

from layerscale_jax.train.sharding import path_names


class MetricsWriter:
    """Writes from process 0 only; every call is a no-op elsewhere."""

    def __init__(self, workdir: str, total_steps: int):
        self.enabled = jax.process_index() == 0
        self.total_steps = total_steps
        self.start_time = time.time()
        self.start_step = None
        if self.enabled:
            os.makedirs(workdir, exist_ok=True)
            self.jsonl_path = os.path.join(workdir, "metrics.jsonl")
            self.tb_dir = os.path.join(workdir, "tensorboard")
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(self.tb_dir, flush_secs=10)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: float(v) for k, v in scalars.items()}}
        with open(self.jsonl_path, "a") as f:
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


def layerscale_statistics(params: nnx.State) -> dict[str, float]:
    """Mean |λ| (or |α|) of each block's two branches: ``layerscale/blocks.<i>.ls<1|2>``.

    Stacked (scanned) parameters give one value per layer along the leading axis.
    """
    stats = {}
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        names = path_names(path)
        if names[-1] not in ("gamma", "alpha") or len(names) < 2 or not names[-2].startswith("ls"):
            continue
        indices = [str(getattr(k, "key", getattr(k, "idx", ""))) for k in path]
        group = names[0]
        value = np.abs(np.asarray(jax.device_get(value), np.float32))
        layer_idx = next((i for i in indices if i.isdigit()), None)
        if layer_idx is not None:                       # unrolled: blocks.<i>.ls1.gamma
            stats[f"layerscale/{group}.{layer_idx}.{names[-2]}"] = float(value.mean())
        elif value.ndim >= 1 and group == "blocks" and value.shape[0] > 0 and (value.ndim == 2 or names[-1] == "alpha"):
            per_layer = value.reshape(value.shape[0], -1).mean(axis=1)   # scanned: leading layer axis
            for i, v in enumerate(per_layer):
                stats[f"layerscale/{group}.{i}.{names[-2]}"] = float(v)
        else:
            stats[f"layerscale/{group}.{names[-2]}"] = float(value.mean())
    return stats
