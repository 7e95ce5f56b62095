"""NVIDIA GPU compile targets without a GPU: device descriptions for XLA's GPU compiler on a CPU machine.

``gpu_devices("h100", num_hosts=2, gpus_per_host=8)`` returns 16 compile-only CUDA devices (process index = host),
from ``jax.experimental.topologies.get_topology_desc(platform="cuda", target_config=TEXT, topology="1x2x8")``
(slices × hosts × GPUs per host). ``TEXT`` is XLA's target description of the GPU (a ``GpuTargetConfigProto`` in
protobuf text: compute capability, memory, cores, clocks, cuDNN version), kept in ``gpu_specs/``:

    h100_sxm.txtpb, h200.txtpb   XLA's own, byte for byte as jax-cuda12-plugin 0.12.0.1 embeds them
                                 (openxla/xla, xla/backends/gpu/target_config/specs/; Apache-2.0, their headers and
                                 gpu_specs/README.md say so; ``tests/test_gpu_compile.py`` checks they equal the
                                 installed plugin's copy)

A jit over a ``Mesh`` of these devices, lowered with ``jax.ShapeDtypeStruct`` inputs, compiles with the CUDA
compiler (NCCL collectives, cuDNN custom calls, Triton fusions) on this machine. Needs the CUDA plugin and cuDNN
(cuDNN's fused attention is traced against the local library): ``pip install -e ".[gpu-compile]"``; set
``JAX_PLATFORMS=cpu`` on a machine without a GPU (else JAX tries, and logs its failure, to start the CUDA backend).
XLA's GPU compiler raises no out-of-memory error: ``compile_for`` compares ``memory_analysis()`` with
``usable_memory_bytes``. ``cost_analysis()`` is None for these executables.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from layerscale_jax.errors import UserError

SPEC_DIR = Path(__file__).with_name("gpu_specs")
SPECS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb"}
INSTALL = "pip install -e \".[gpu-compile]\" (jax-cuda12-plugin and jax-cuda12-pjrt 0.12.0.1, nvidia-cudnn-cu12)"
# JAX's GPU client lets XLA use this fraction of the device memory (XLA_CLIENT_MEM_FRACTION, formerly
# XLA_PYTHON_CLIENT_MEM_FRACTION; jax's GPU memory-allocation docs): the rest is left to cuDNN, NCCL and CUDA.
DEFAULT_MEM_FRACTION = 0.75
MEM_FRACTION_VARS = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")
_PLUGIN_MODULES = (("jax-cuda{}-plugin", "jax_cuda{}_plugin"), ("jax-cuda{}-pjrt", "jax_plugins.xla_cuda{}"))


def _spec_path(chip: str) -> Path:
    if chip not in SPECS:
        raise UserError(f"GPU {chip!r} has no target description here; known GPUs: {', '.join(SPECS)}")
    return SPEC_DIR / SPECS[chip]


def target_config(chip: str) -> str:
    """XLA's ``GpuTargetConfigProto`` text of ``chip`` (``h100``, ``h200``)."""
    return _spec_path(chip).read_text()


def device_memory_bytes(chip: str) -> int:
    """The device memory XLA's target description gives (``gpu_device_info.device_memory_size``)."""
    match = re.search(r"^\s*device_memory_size:\s*(\d+)", target_config(chip), re.MULTILINE)
    return int(match.group(1))


def memory_fraction() -> float:
    """The fraction of device memory a JAX process may use: the environment's setting or JAX's default 0.75."""
    for var in MEM_FRACTION_VARS:
        value = os.environ.get(var, "")
        if value:
            try:
                fraction = float(value)
            except ValueError:
                raise UserError(f"{var}={value!r} is not a number") from None
            if not 0.0 < fraction <= 1.0:
                raise UserError(f"{var}={value!r} must lie in (0, 1]")
            return fraction
    return DEFAULT_MEM_FRACTION


def usable_memory_bytes(chip: str) -> int:
    """What XLA's buffers may take on one GPU of ``chip`` in a JAX process: device memory × ``memory_fraction()``."""
    return int(device_memory_bytes(chip) * memory_fraction())


def missing_requirements() -> list[str]:
    """What this installation lacks to compile for a GPU (empty when nothing)."""
    plugins = [[name.format(cuda) for name, module in _PLUGIN_MODULES if _find_spec(module.format(cuda)) is None]
               for cuda in ("12", "13")]
    missing = min(plugins, key=len)               # CUDA 12's, or CUDA 13's where that is installed
    if not missing and cudnn_version() is None:
        missing.append("cuDNN (nvidia-cudnn-cu12)")
    return missing


def _find_spec(module: str):
    try:
        return importlib.util.find_spec(module)
    except ModuleNotFoundError:                   # a parent package is missing
        return None


def cudnn_version() -> int | None:
    """The version of the cuDNN library JAX's CUDA plugin loads (e.g. 92800), None without one. cuDNN's fused
    attention is traced against it (``jax.nn.dot_product_attention(implementation="cudnn")``)."""
    from jax._src.lib import cuda_versions  # what jax's own cuDNN attention asks (no public API)
    try:
        return None if cuda_versions is None else int(cuda_versions.cudnn_get_version())
    except Exception:                             # noqa: BLE001 - libcudnn absent or unloadable
        return None


def gpu_devices(chip: str, num_hosts: int, gpus_per_host: int) -> list:
    """Compile-only CUDA devices of ``num_hosts`` hosts × ``gpus_per_host`` GPUs of ``chip`` (``h100``, ``h200``);
    device ``i`` belongs to process ``i // gpus_per_host``. ``UserError`` with the install line when the CUDA plugin
    or cuDNN is missing."""
    text = target_config(chip)
    if num_hosts < 1 or gpus_per_host < 1:
        raise UserError(f"a GPU target needs at least one host and one GPU per host, got {num_hosts} × {gpus_per_host}")
    missing = missing_requirements()
    if missing:
        raise UserError(f"compiling for {chip.upper()} GPUs needs {', '.join(missing)}, not installed here: {INSTALL}")
    from jax.experimental import topologies
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=text,
                                                topology=f"1x{num_hosts}x{gpus_per_host}")
    except NotImplementedError as err:            # the plugin did not register: it failed to start, or mismatches jax
        raise UserError(f"JAX's CUDA plugin cannot describe GPU targets here ({err}); on a machine without a GPU set "
                        f"JAX_PLATFORMS=cpu (else the plugin tries to start the GPU and fails), or reinstall: {INSTALL}"
                        ) from err
    return list(topology.devices)
