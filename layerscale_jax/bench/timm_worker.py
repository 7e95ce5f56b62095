"""timm's model of the same name, batch and dtype, trained by the same protocol: the ``--vs-timm`` side.

    loss = cross_entropy(model(x), y) ; loss.backward() ; AdamW(lr 1e-3, wd 0.05).step()     (autocast for bf16)

It runs in a worker process driven step by step (``start``: ``PYTHON .../bench/timm_worker.py REQUEST``, PYTHON
being ``--timm-python`` or this one): one process for both slowed XLA's step. The worker runs this file as a script
and loads ``timing.py`` beside it by path, not the package (whose ``__init__`` imports jax and flax): that Python
needs only torch and timm (and numpy, which torch uses), and both files keep to Python 3.11 syntax.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path


def _load_timing():
    """``timing.py`` beside this file, as the package's module when the package is imported, else loaded by path."""
    if __package__:
        from layerscale_jax.bench import timing
        return timing
    spec = importlib.util.spec_from_file_location("timing", Path(__file__).with_name("timing.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


timing = _load_timing()

# Our override names that timm's ViT / CaiT constructors take under the same name.
SHARED = {"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
          "qkv_bias", "drop_path_rate", "depth_token_only", "global_pool", "init_values"}


def timm_kwargs(spec) -> tuple[dict | None, str | None]:
    """timm constructor kwargs equivalent to ``spec``'s overrides, or ``None`` and why there is none."""
    o = {k: v for k, v in spec.overrides.items()
         if k not in ("drop_path_rule", "norm_eps", "param_dtype", "attention_impl")}
    scaling = o.pop("branch_scaling", "layerscale")
    if scaling == "none":
        o["init_values"] = None
    elif o.get("init_values") == "auto":
        from layerscale_jax.layers.scaling import cait_init_value
        from layerscale_jax.models import model_config
        o["init_values"] = cait_init_value(model_config(spec.model, **spec.overrides).depth)
    if scaling not in ("none", "layerscale") or set(o) - SHARED:
        return None, f"no timm equivalent for branch_scaling={scaling!r} and overrides {sorted(set(o) - SHARED)}"
    return o, None


def check_python(path: str | None) -> None:
    """``--timm-python`` must name an executable file (checked before anything is compiled)."""
    if path is not None and not (os.path.isfile(path) and os.access(path, os.X_OK)):
        from layerscale_jax.errors import ConfigError  # here: the worker script runs without the package
        raise ConfigError(f"--timm-python {path!r}: no executable file there (give the Python that has torch and "
                          "timm)")


def prepare(model: str, batch: int, dtype: str, remat: str, seed: int, kwargs: dict, device: str, **_) -> dict:
    """timm's model, AdamW and a random batch, two steps run: ``{"run": run(k), ...facts}`` or ``{"run": None,
    "timm_skipped": why}``."""
    try:
        import timm
        import torch
    except Exception as e:  # noqa: BLE001 - e.g. a torchvision built for another torch raises RuntimeError
        return {"run": None, "timm_skipped": f"torch/timm not importable by {sys.executable} ({type(e).__name__}: {e})"}
    torch.set_num_threads(len(os.sched_getaffinity(0)))          # as many threads as XLA's CPU pool
    torch.manual_seed(seed)
    rss_before, cuda = timing.rss_baseline(), device == "cuda"
    net = timm.create_model(model, pretrained=False, **kwargs).to(device).train()
    net.set_grad_checkpointing(remat != "none")
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05)
    img, gen = kwargs.get("img_size", 224), torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, kwargs.get("in_chans", 3), img, img, generator=gen).to(device)
    y = torch.randint(0, kwargs.get("num_classes", 1000), (batch,), generator=gen).to(device)

    def run(k: int) -> None:
        for _ in range(k):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
                loss = torch.nn.functional.cross_entropy(net(x).float(), y)
            loss.backward()
            opt.step()
        if cuda:
            torch.cuda.synchronize()

    run(2)
    return {"run": run, "timm_version": timm.__version__, "torch_version": torch.__version__,
            "timm_python": sys.executable, "timm_python_version": platform.python_version(), "timm_device": device,
            "timm_threads": torch.get_num_threads(), "timm_kwargs": kwargs,
            "timm_num_params": int(sum(p.numel() for p in net.parameters())),
            "timm_peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda
            else timing.rss_bytes(peak=True) - rss_before,
            "timm_peak_memory_source": "cuda_max_memory_allocated" if cuda else "peak_rss_increase",
            "timm_matmul_peak_flop_per_s": timing.matmul_peak(dtype, torch_device=device)["flop_per_s"]}


def start(spec, python: str | None = None, device: str = "cpu") -> dict:
    """``prepare`` in a worker process run by ``python`` (default: this one): the same result plus ``close()``;
    ``run(k)`` sends the worker ``k`` and waits for its ``done``."""
    kwargs, why = timm_kwargs(spec)
    if python is None and not all(importlib.util.find_spec(m) for m in ("torch", "timm")):
        why = f"torch/timm not importable by {sys.executable} (see --timm-python)"
    if why:
        return {"run": None, "timm_skipped": why}
    request = json.dumps({**dataclasses.asdict(spec), "kwargs": kwargs, "device": device})
    proc = subprocess.Popen(**worker_process(request, python), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    info = json.loads(proc.stdout.readline() or "null") or {
        "timm_skipped": f"the timm worker ({python or sys.executable}) exited with {proc.wait()} before it was ready"}
    if info.get("timm_skipped"):
        proc.stdin.close()
        proc.wait()
        return {"run": None, **info}

    def run(k: int) -> None:
        proc.stdin.write(f"{k}\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"the timm worker failed (exit code {proc.poll()})")

    def close() -> None:
        proc.stdin.close()
        proc.wait(timeout=60)
    return {"run": run, "close": close, **info, "timm_process": "separate worker process"}


def worker_process(request: str, python: str | None = None) -> dict:
    """``subprocess`` arguments that run this file as a script (the package is not imported) by ``python``."""
    return {"args": [python or sys.executable, str(Path(__file__).resolve()), request], "env": dict(os.environ),
            "cwd": str(timing.REPO), "text": True}


if __name__ == "__main__":      # the worker: prepare, print the facts as one JSON line, then run k steps per line
    info = prepare(**json.loads(sys.argv[1]))
    run = info.pop("run")
    print(json.dumps(info), flush=True)
    for line in sys.stdin if run else ():
        run(int(line))
        print("done", flush=True)
