"""Versions, the GPU (nvidia-smi) and JAX's devices, as one JSON line: the `env` step of benchmarks/gpu_check*.sh."""
import json
import platform
import subprocess

import jax

info = {"python": platform.python_version(), "jax": jax.__version__}
for mod in ("jaxlib", "flax", "optax", "orbax.checkpoint", "torch", "timm", "pytest", "safetensors",
            "jax_cuda12_plugin", "jax_cuda13_plugin"):
    try:
        m = __import__(mod, fromlist=["_"])
        info[mod] = getattr(m, "__version__", "present")
    except Exception as e:  # noqa: BLE001
        info[mod] = f"missing ({type(e).__name__})"
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                                         "--format=csv,noheader"], capture_output=True, text=True,
                                        timeout=20).stdout.strip()
except Exception as e:  # noqa: BLE001
    info["nvidia_smi"] = f"unavailable ({e})"
info["backend"] = jax.default_backend()
info["devices"] = [str(d) for d in jax.devices()]
info["device_kind"] = jax.devices()[0].device_kind
try:
    import torch
    info["torch_cuda"] = torch.cuda.is_available()
    info["torch_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception:  # noqa: BLE001
    pass
print(json.dumps(info))
