"""timm's PyTorch model of the same name, batch and dtype, trained by the same protocol (the ``--vs-timm`` side).

    loss = cross_entropy(model(x), y) ; loss.backward() ; AdamW.step()      (torch.autocast for bfloat16)

torch and timm are imported lazily; without them the side is skipped with the reason. torch gets as many threads
as XLA's CPU thread pool. On the CPU the model runs in a worker process (``start``, then
``python -m layerscale_jax.bench.timm_worker REQUEST``) that the benchmark drives step by step, so the two sides
still alternate: sharing one process made XLA's step visibly slower than alone in development runs (two runtimes'
allocators and thread pools in one address space), which would bias the ratio against ours. On an accelerator it
runs in this process (``prepare``). A spec is any object with ``model, batch, dtype, remat, overrides, seed``.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
import types

from layerscale_jax.bench import timing

# Our override names that timm's ViT / CaiT constructors take under the same name.
_SHARED_KWARGS = ("img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
                  "mlp_ratio", "qkv_bias", "drop_path_rate", "depth_token_only", "global_pool")


def timm_kwargs(spec) -> tuple[dict | None, str | None]:
    """timm constructor kwargs equivalent to ``spec`` (or ``None`` and the reason when there is no equivalent)."""
    o = dict(spec.overrides)
    kwargs = {k: o.pop(k) for k in _SHARED_KWARGS if k in o}
    scaling, init_values = o.pop("branch_scaling", "layerscale"), o.pop("init_values", None)
    for ignored in ("drop_path_rule", "norm_eps", "param_dtype"):
        o.pop(ignored, None)
    if o:
        return None, f"no timm equivalent for overrides {sorted(o)}"
    if scaling == "none":
        kwargs["init_values"] = None
    elif scaling == "layerscale":
        if init_values == "auto":
            from layerscale_jax.layers.scaling import cait_init_value
            from layerscale_jax.models import model_config
            init_values = cait_init_value(model_config(spec.model, **spec.overrides).depth)
        if init_values is not None:
            kwargs["init_values"] = float(init_values)
    else:
        return None, f"timm has no branch_scaling={scaling!r}"
    return kwargs, None


def prepare(spec, *, device: str | None = None, adamw: str = "default") -> dict:
    """Build timm's model, AdamW (lr 1e-3, wd 0.05) and a random batch in this process and run two warm-up steps;
    returns ``{"run": run(k), ...info}`` (peak memory, torch's matmul peak) or ``{"run": None, "timm_skipped"}``."""
    try:
        import timm
        import torch
    except ImportError as e:
        return {"run": None, "timm_skipped": f"torch/timm not importable ({e}); timm side skipped"}
    kwargs, why = timm_kwargs(spec)
    if kwargs is None:
        return {"run": None, "timm_skipped": why}
    import jax
    device = device or ("cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu")
    torch.set_num_threads(timing.num_threads())
    torch.manual_seed(spec.seed)
    timing.malloc_trim()
    if device != "cuda":
        timing.reset_peak_rss()
    rss_before = timing.current_rss_bytes()
    model = timm.create_model(spec.model, pretrained=False, **kwargs).to(device).train()
    if spec.remat != "none":
        model.set_grad_checkpointing(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.05,
                            **{"default": {}, "fused": {"fused": True}, "foreach": {"foreach": True}}[adamw])
    img, chans = kwargs.get("img_size", 224), kwargs.get("in_chans", 3)
    gen = torch.Generator().manual_seed(spec.seed + 1)
    x = torch.randn(spec.batch, chans, img, img, generator=gen).to(device)
    y = torch.randint(0, kwargs.get("num_classes", 1000), (spec.batch,), generator=gen).to(device)

    def run(k: int) -> None:
        for _ in range(k):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=spec.dtype == "bfloat16"):
                loss = torch.nn.functional.cross_entropy(model(x).float(), y)
            loss.backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    run(2)
    peak_mem = int(torch.cuda.max_memory_allocated()) if device == "cuda" else timing.peak_rss_bytes() - rss_before
    peak = timing.torch_matmul_peak(spec.dtype, n=2048 if device == "cpu" else 8192, device=device)
    cfg = getattr(model, "pretrained_cfg", {})
    return {"run": run, "timm_version": timm.__version__, "torch_version": torch.__version__, "timm_device": device,
            "timm_threads": torch.get_num_threads(), "timm_kwargs": kwargs,
            "timm_cfg_architecture": cfg.get("architecture") if isinstance(cfg, dict) else None,
            "timm_num_params": int(sum(p.numel() for p in model.parameters())),
            "timm_peak_memory_bytes": peak_mem,
            "timm_peak_memory_source": "cuda_max_memory_allocated" if device == "cuda" else "peak_rss_increase",
            "timm_matmul_peak_flop_per_s": peak["flop_per_s"], "timm_adamw": adamw}


def start(spec, *, adamw: str = "default") -> dict:
    """``prepare`` in a worker process (CPU): the same ``{"run": run(k), "close": close(), ...info}``, where
    ``run`` sends the worker a step count and waits for its ``done``."""
    missing = [m for m in ("torch", "timm") if importlib.util.find_spec(m) is None]
    if missing:
        return {"run": None, "timm_skipped": f"{' and '.join(missing)} not importable; timm side skipped"}
    kwargs, why = timm_kwargs(spec)
    if kwargs is None:
        return {"run": None, "timm_skipped": why}
    request = json.dumps({"spec": dataclasses.asdict(spec), "adamw": adamw})
    proc = subprocess.Popen([sys.executable, "-m", "layerscale_jax.bench.timm_worker", request],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=timing.bench_env({"JAX_PLATFORMS": "cpu"}), cwd=str(timing.REPO))
    line = proc.stdout.readline()
    if not line:
        proc.wait()
        return {"run": None, "timm_skipped": f"timm worker exited with {proc.returncode} before it was ready"}
    info = json.loads(line)
    if info.get("timm_skipped"):
        proc.stdin.close()
        proc.wait()
        return {"run": None, **info}

    def run(k: int) -> None:
        proc.stdin.write(f"{k}\n")
        proc.stdin.flush()
        if proc.stdout.readline().strip() != "done":
            raise RuntimeError(f"timm worker failed (exit code {proc.poll()})")

    def close() -> None:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=60)

    return {"run": run, "close": close, **info, "timm_process": "separate worker process"}


def worker_main(request: str) -> None:
    """The worker: build and warm up timm's step, print its info as one JSON line, then run ``k`` steps for each
    ``k`` read from stdin, answering ``done`` after each."""
    req = json.loads(request)
    info = prepare(types.SimpleNamespace(**req["spec"]), device="cpu", adamw=req["adamw"])
    run = info.pop("run")
    print(json.dumps(info), flush=True)
    if run is None:
        return
    for line in sys.stdin:
        run(int(line))
        print("done", flush=True)


if __name__ == "__main__":
    worker_main(sys.argv[1])
