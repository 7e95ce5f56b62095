"""Compile targets: the accelerators a run is planned for, by the names their users know, and each chip's published
figures (``python -m layerscale_jax.train --compile_for NAME``; ``plan.compile_for``).

Names (case-insensitive):

    v5e-256, v6e-64            Cloud TPU v5e / v6e (Trillium) slices: the number counts **chips** (one TensorCore
                               each); ``v5litepod-N`` is the same as ``v5e-N``
    v4-32, v5p-128             Cloud TPU v4 / v5p slices: the number counts **TensorCores**, two per chip, so
                               v4-32 is 16 chips (2×2×4) and v5p-128 is 64 chips (4×4×4)
    2xv5e-256                  a Multislice job: 2 slices of v5e-256 joined by the data-centre network
    v5e:16x16, v4:2x2x4        a raw topology (chips per dimension), as JAX's ``get_topology_desc`` names it
                               (``v5p:4x4x4``; also ``2xv5e:16x16``)
    8xh100, 8xh200, 2x8xh100   NVIDIA H100 / H200 SXM: GPUs per host, optionally hosts × GPUs per host

Slice shapes follow the Cloud TPU pages: v5e/v6e 1×1, 2×2, 2×4, 4×4, 4×8, 8×8, 8×16, 16×16; v4/v5p 2×2×1, 2×2×2,
2×2×4, 2×4×4, 4×4×4, 4×4×8, ... (double the smallest dimension, the last of equals). Hosts hold 2×2 chips
(v5e/v6e slices of one 8-chip host: 2×4); a 3-D slice has wraparound links when every dimension is a multiple of 4,
a 2-D one at the full 16×16 pod.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re

from layerscale_jax.errors import UserError

GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip's published figures: HBM per chip, dense bf16 matmul peak, HBM bandwidth, and the links
    a collective crosses: ``link_bytes_per_s`` between the chips of a slice (TPU ICI) or of a host (NVLink), and
    ``network_bytes_per_s`` per chip between slices (TPU DCN) or hosts (the GPU's network adapter). Link figures
    are one direction's bytes per second per chip: half of a "bidirectional" figure. ``network_bytes_per_s`` is
    None where no figure is published (v4): the cross-slice term is then left out, and the report says so.

    Memory: the datasheets write "GB"; the memories are binary gigabytes (an "80 GB" H100 shows 81,559 MiB), so
    ``hbm_bytes`` is the datasheet number in GiB. What a program may use is less: the compiler's own limit
    (``compiler_hbm_bytes``, 15.75 GiB of a v5e chip's 16).
    """
    name: str
    platform: str                 # "tpu" or "cuda"
    hbm_bytes: int
    peak_bf16_flop_per_s: float   # dense (no 2:4 sparsity)
    hbm_bytes_per_s: float
    link_bytes_per_s: float       # ICI (TPU) or NVLink (GPU), one direction, per chip
    network_bytes_per_s: float | None     # DCN per chip (TPU) or the network per GPU, one direction
    source: str                   # where the figures are published, one URL per figure group
    link: str = "ICI"             # the names of the two links in the report
    network: str = "DCN"


# Sources, one row per chip:
#  v4   HBM, peak, HBM bandwidth: https://cloud.google.com/tpu/docs/v4; ICI 2,400 Gbps per chip ("twice ... v4"):
#       https://cloud.google.com/blog/products/ai-machine-learning/introducing-cloud-tpu-v5p-and-ai-hypercomputer
#  v5e  https://cloud.google.com/tpu/docs/v5e: ICI 1,600 Gbps (400 GB/s bidirectional) per chip; data-centre network
#       6.4 Tbps per 256-chip pod = 25 Gbps per chip (2 × 100 Gbps NICs per host)
#  v5p  https://cloud.google.com/tpu/docs/v5p: ICI 1,200 GB/s bidirectional per chip (4,800 Gbps), DCN 50 Gbps per chip
#  v6e  https://cloud.google.com/tpu/docs/v6e: ICI 3,584 Gbps per chip; data-centre network 25.6 Tbps per 256-chip
#       pod = 100 Gbps per chip (4 × 200 Gbps NICs per host)
#  h100 https://www.nvidia.com/en-us/data-center/h100/ (SXM: NVLink 900 GB/s bidirectional); the network: one
#       400 Gb/s ConnectX-7 per GPU, https://www.nvidia.com/en-us/data-center/dgx-h100/ (DGX H100: 8 × 400 Gb/s)
#  h200 https://www.nvidia.com/en-us/data-center/h200/ (SXM: NVLink 900 GB/s); one 400 Gb/s ConnectX-7 per GPU,
#       https://www.nvidia.com/en-us/data-center/dgx-h200/
# NVIDIA's datasheets give bf16 "with sparsity" (1,979 TFLOP/s); dense is half of it.
CHIPS = {
    "v4": Chip("TPU v4", "tpu", 32 * GiB, 275e12, 1200e9, 2400e9 / 8, None,
               "https://cloud.google.com/tpu/docs/v4, https://cloud.google.com/blog/products/ai-machine-learning/"
               "introducing-cloud-tpu-v5p-and-ai-hypercomputer"),
    "v5e": Chip("TPU v5e", "tpu", 16 * GiB, 197e12, 819e9, 1600e9 / 8, 6.4e12 / 8 / 256,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", "tpu", 95 * GiB, 459e12, 2765e9, 1200e9 / 2, 50e9 / 8,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", "tpu", 32 * GiB, 918e12, 1638e9, 3584e9 / 8, 25.6e12 / 8 / 256,
                "https://cloud.google.com/tpu/docs/v6e"),
    "h100": Chip("NVIDIA H100 SXM", "cuda", 80 * GiB, 989e12, 3.35e12, 900e9 / 2, 400e9 / 8,
                 "https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM column), "
                 "https://www.nvidia.com/en-us/data-center/dgx-h100/", "NVLink", "network"),
    "h200": Chip("NVIDIA H200 SXM", "cuda", 141 * GiB, 989e12, 4.8e12, 900e9 / 2, 400e9 / 8,
                 "https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM column), "
                 "https://www.nvidia.com/en-us/data-center/dgx-h200/", "NVLink", "network"),
}
def chip_table() -> str:
    """``CHIPS`` as the markdown table of docs/multihost.md (link figures one direction, per chip)."""
    lines = ["| chip | HBM per chip | dense bf16 peak | HBM bandwidth | chip-to-chip link | network per chip "
             "| source |",
             "|---|---|---|---|---|---|---|"]
    for key, c in CHIPS.items():
        network = f"{c.network} {c.network_bytes_per_s / 1e9:,.2f} GB/s" if c.network_bytes_per_s else "not published"
        lines.append(f"| {c.name} (`{key}`) | {c.hbm_bytes / GiB:.0f} GiB | {c.peak_bf16_flop_per_s / 1e12:,.0f} "
                     f"TFLOP/s | {c.hbm_bytes_per_s / 1e9:,.0f} GB/s | {c.link} {c.link_bytes_per_s / 1e9:,.0f} GB/s "
                     f"| {network} | {c.source} |")
    return "\n".join(lines)


_OOM_LIMIT = re.compile(r"exceeds available HBM \(([\d.]+)([KMGT])\)")
UNITS = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


@functools.cache
def compiler_hbm_bytes(chip_key: str) -> int:
    """The HBM libtpu lets one program use on a ``chip_key`` TPU chip, as its compiler reports it: the limit in its
    compile-time out-of-memory error ("... exceeds available HBM (15.75G)"), provoked by compiling, for one chip of
    the target, a program that holds twice the chip's HBM (0.1 s, nothing runs). v5e: 15.75 GiB of 16; v4 30.75 of
    32, v6e 31.24 of 32, v5p 95.73 (libtpu 0.0.50.1)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    target = parse_target(f"{chip_key}-{8 if chip_key in _MEGACORE else 1}")
    sharding = NamedSharding(Mesh(target_devices(target)[:1], ("x",)), PartitionSpec())
    rows = 2 * CHIPS[chip_key].hbm_bytes // 4 // 1024

    def hold(x):
        return jax.lax.optimization_barrier(jnp.broadcast_to(x, (rows, 1024)) + jnp.arange(1024.0)).sum()

    try:
        jax.jit(hold, in_shardings=sharding, out_shardings=sharding).lower(
            jax.ShapeDtypeStruct((), jnp.float32, sharding=sharding)).compile()
    except Exception as err:            # noqa: BLE001 - the out-of-memory error is the answer
        found = _OOM_LIMIT.search(str(err))
        if found:
            return int(float(found.group(1)) * UNITS[found.group(2)])
        raise
    raise RuntimeError(f"libtpu compiled {2 * CHIPS[chip_key].hbm_bytes / GiB:.0f} GiB for one {chip_key} chip")

# JAX's topology names for the generations (``get_topology_desc(topology_name=...)``), and whether a chip's two
# TensorCores act as one device ("megacore": v4, v5p).
_TOPOLOGY_PREFIX = {"v4": "v4", "v5e": "v5e", "v5p": "v5", "v6e": "v6e"}
_MEGACORE = {"v4", "v5p"}
_TWO_D_SHAPES = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e", "v5": "v5p"}
EXAMPLES = ("v5e-256", "v4-32", "v5p-128", "v6e-64", "2xv5e-256", "v5e:16x16", "8xh100", "8xh200", "2x8xh100")


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target: ``num_slices`` × a slice of ``shape`` chips (TPU), or ``num_hosts`` × ``per_host`` GPUs."""
    name: str
    chip_key: str
    shape: tuple[int, ...]        # chips per dimension of one slice (TPU); (per_host,) for GPUs
    num_slices: int = 1
    num_hosts: int = 1            # GPUs only (TPU hosts follow from the shape)

    @property
    def chip(self) -> Chip:
        return CHIPS[self.chip_key]

    @property
    def num_chips(self) -> int:
        return math.prod(self.shape) * self.num_slices * self.num_hosts

    @property
    def hosts_per_slice(self) -> int:
        if self.chip.platform != "tpu":
            return self.num_hosts
        return self.num_chips // self.num_slices // math.prod(self.host_bounds)

    @property
    def host_bounds(self) -> tuple[int, int, int]:
        """Chips per host along each dimension (JAX's ``chips_per_host_bounds``)."""
        shape = tuple(self.shape) + (1,) * (3 - len(self.shape))
        if len(self.shape) == 2 and math.prod(self.shape) <= 8:
            return shape                                   # v5e/v6e slices of up to 8 chips: one host
        return tuple(min(s, b) for s, b in zip(shape, (2, 2, 1)))

    @property
    def wrap(self) -> tuple[bool, bool, bool]:
        """Wraparound links per dimension: a 3-D slice whose every dimension is a multiple of 4 (full cubes), a 2-D
        one at the full 16×16 pod."""
        if len(self.shape) == 3:
            return (all(s % 4 == 0 for s in self.shape),) * 3
        full = tuple(self.shape) == (16, 16)
        return (full, full, False)

    @property
    def topology(self) -> str:
        """JAX's topology name, e.g. ``v5e:16x16``."""
        return f"{_TOPOLOGY_PREFIX[self.chip_key]}:{'x'.join(map(str, self.shape))}"

    @property
    def memory_per_chip(self) -> int:
        """Bytes a program may use on one chip: on a TPU what libtpu allows (``compiler_hbm_bytes``); on a GPU, the
        share of its memory JAX lets XLA use (``gpu_targets.usable_memory_bytes``: 0.75 of what XLA's target
        description gives, by default)."""
        if self.chip.platform == "cuda":
            from layerscale_jax.plan import gpu_targets
            return gpu_targets.usable_memory_bytes(self.chip_key)
        return compiler_hbm_bytes(self.chip_key)

    @property
    def memory_note(self) -> str:
        """Where ``memory_per_chip`` comes from."""
        if self.chip.platform != "cuda":
            return f"what libtpu allows of the chip's {self.chip.hbm_bytes / GiB:.0f} GiB"
        from layerscale_jax.plan import gpu_targets
        device = gpu_targets.device_memory_bytes(self.chip_key) / GiB
        return f"JAX's {gpu_targets.memory_fraction():.2f} of the {device:.2f} GiB a GPU has: XLA_CLIENT_MEM_FRACTION"

    def describe(self) -> str:
        if self.chip.platform != "tpu":
            return f"{self.num_hosts} host{'s' if self.num_hosts > 1 else ''} × {self.shape[0]} GPUs"
        slices = f"{self.num_slices} slices × " if self.num_slices > 1 else ""
        hosts = f"{self.hosts_per_slice} host{'s' if self.hosts_per_slice > 1 else ''}"
        return (f"{slices}{self.chip.name} {'×'.join(map(str, self.shape))} ({self.num_chips // self.num_slices} "
                f"chips, {hosts}{' per slice' if self.num_slices > 1 else ''})")


def _three_d_shape(chips: int) -> tuple[int, int, int]:
    """v4/v5p slice shapes: 2×2×1 for 4 chips, then double the smallest dimension (the last of equals)."""
    shape = [2, 2, 1]
    while math.prod(shape) < chips:
        smallest = min(shape)
        i = max(j for j, s in enumerate(shape) if s == smallest)
        shape[i] *= 2
    return tuple(shape)


def _unknown(name: str, why: str = "") -> UserError:
    return UserError(f"--compile_for {name!r}: {why or 'unknown target'}; known names: {', '.join(EXAMPLES)} "
                     f"(TPU generations {', '.join(_TOPOLOGY_PREFIX)}, GPUs h100, h200; a raw topology "
                     f"GEN:AxB[xC])")


def parse_target(name: str) -> Target:
    """The ``Target`` a name denotes (see the module docstring); an unknown name raises ``UserError`` listing the
    known ones."""
    text = name.strip().lower()
    gpu = re.fullmatch(r"(?:(\d+)x)?(\d+)x(h100|h200)", text)
    if gpu:
        hosts, per_host = int(gpu.group(1) or 1), int(gpu.group(2))
        if hosts < 1 or per_host < 1:
            raise _unknown(name, "hosts and GPUs per host must be positive")
        return Target(name, gpu.group(3), (per_host,), num_hosts=hosts)
    tpu = re.fullmatch(r"(?:(\d+)x)?(v\d+[a-z]*)([-:])(\d+(?:x\d+)*)", text)
    if not tpu:
        raise _unknown(name)
    slices = int(tpu.group(1) or 1)
    generation = _ALIASES.get(tpu.group(2), tpu.group(2))
    if generation not in _TOPOLOGY_PREFIX:
        raise _unknown(name, f"unknown TPU generation {tpu.group(2)!r}")
    if slices < 1:
        raise _unknown(name, "the number of slices must be positive")
    two_d = generation in ("v5e", "v6e")
    if tpu.group(3) == ":":                                 # a raw topology
        shape = tuple(int(d) for d in tpu.group(4).split("x"))
        if len(shape) != (2 if two_d else 3) or min(shape) < 1:
            raise _unknown(name, f"a {generation} topology has {2 if two_d else 3} positive dimensions")
        return Target(name, generation, shape, num_slices=slices)
    if "x" in tpu.group(4):
        raise _unknown(name)
    count = int(tpu.group(4))
    if two_d:
        if count not in _TWO_D_SHAPES:
            raise _unknown(name, f"{generation} slices have {', '.join(map(str, _TWO_D_SHAPES))} chips")
        return Target(name, generation, _TWO_D_SHAPES[count], num_slices=slices)
    chips = count // 2                                      # v4/v5p names count TensorCores, two per chip
    if count % 8 or chips & (chips - 1):
        raise _unknown(name, f"{generation}-N counts TensorCores (2 per chip): N is 8, 16, 32, 64, ...")
    return Target(name, generation, _three_d_shape(chips), num_slices=slices)


_TPU_HOST_VARIABLES = ("TPU_WORKER_HOSTNAMES", "TPU_HOST_BOUNDS", "TPU_ACCELERATOR_TYPE", "TPU_CHIPS_PER_HOST_BOUNDS")


def target_devices(target: Target) -> list:
    """Device descriptions of every chip of ``target``, without the hardware: TPU ones from libtpu's topology
    (``jax.experimental.topologies``), GPU ones from ``plan.gpu_targets`` (XLA's GPU target descriptions)."""
    if target.chip.platform == "cuda":
        try:
            from layerscale_jax.plan import gpu_targets
        except ImportError as err:
            raise UserError(f"--compile_for {target.name}: GPU targets need layerscale_jax/plan/gpu_targets.py, "
                            f"which this installation lacks ({err})") from err
        return gpu_targets.gpu_devices(target.chip_key, target.num_hosts, target.shape[0])
    if importlib.util.find_spec("libtpu") is None:
        raise UserError(f"--compile_for {target.name}: compiling for TPU needs libtpu, not installed here: "
                        "pip install -e '.[tpu]' (jax[tpu]==0.12.0.1)")
    # libtpu takes a lock file so that one process at a time drives the local TPU chips; describing a topology
    # drives none, so a compile may run while another process holds it.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    # libtpu reads this host's place in a TPU slice from the environment (a Cloud TPU VM's metadata sets it); on a
    # machine without TPUs it finds none and prints five lines (Failed to find host bounds ..., E0000 ... unexpected
    # worker hostname ..., libtpu_init_utils.cc:370). A one-host placeholder keeps it quiet: the topology described
    # is the target's, passed below (the report of v5e-4 and v5e-16 is the same with and without it).
    from layerscale_jax.cli import no_accelerator_here
    if no_accelerator_here() and not any(name in os.environ for name in _TPU_HOST_VARIABLES):
        os.environ.update(TPU_WORKER_HOSTNAMES="localhost", TPU_HOST_BOUNDS="1,1,1")
    import jax
    from jax.experimental import topologies
    try:
        topology = topologies.get_topology_desc(
            platform="tpu", topology_name=target.topology,
            chip_config_name="megacore" if target.chip_key in _MEGACORE else "default",
            chips_per_host_bounds=target.host_bounds, num_slices=target.num_slices, wrap=target.wrap)
    except jax.errors.JaxRuntimeError as err:   # a raw topology libtpu has no layout for (v5e:3x3)
        if "INVALID_ARGUMENT" not in str(err):
            raise
        raise UserError(f"--compile_for {target.name}: libtpu has no such slice "
                        f"({str(err).splitlines()[0].replace('INVALID_ARGUMENT: ', '')}); name one by its chip "
                        f"count ({', '.join(EXAMPLES[:4])}) or a topology of whole hosts") from None
    return list(topology.devices)
