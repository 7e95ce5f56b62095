"""How a process joins a multi-process job: the arguments of ``jax.distributed.initialize``, resolved from the
command line and the launcher's environment before JAX starts, and which accelerator the job found.

``jax.distributed.initialize`` detects SLURM, Open MPI, Kubernetes and Cloud TPU itself, but whenever any of its
arguments is left unset on SLURM or Open MPI (not on a Cloud TPU VM) it also sets ``local_device_ids=[local rank]``
(``jax/_src/clusters/cluster.py``): one GPU per process, even for one task per node with 8 GPUs, and the wrong GPU
where SLURM already bound each task to its own (``--gpus-per-task=1`` leaves one GPU visible, which is device 0).
So the command resolves ``local_device_ids`` itself and always passes it (``[]``: every device the process sees):

- ``--local_device_ids=all`` or ``0,1,...`` (or JAX's ``JAX_LOCAL_DEVICE_IDS``): as given;
- otherwise from the local rank ``r`` and the number ``t`` of processes on this node (SLURM: ``SLURM_LOCALID`` and
  the node's entry of ``SLURM_STEP_TASKS_PER_NODE``; torchrun: ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``) and the ``g``
  GPUs the process sees (``CUDA_VISIBLE_DEVICES``, else ``/dev/nvidia0``, ``/dev/nvidia1``, ...): every device
  when ``t == 1``, no GPU is seen (CPU, TPU) or one is (the launcher bound it); ``r·g/t … (r+1)·g/t − 1`` when
  ``t`` divides ``g`` (one process per GPU: GPU ``r``); anything else is an error naming the counts.

Launchers: SLURM (``srun``; JAX's own detection gives the coordinator — the first node of ``SLURM_STEP_NODELIST``
on a port from the job id, or ``JAX_COORDINATOR_PORT`` — the process count and id); a torchrun-style launcher
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, optionally ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``: torchrun,
Kubernetes' PyTorchJob, many cluster wrappers), whose coordinator is ``MASTER_ADDR`` on ``MASTER_PORT + 1`` under
torchrun itself (its agent's rendezvous store listens on ``MASTER_PORT``) and on ``MASTER_PORT`` otherwise, unless
``JAX_COORDINATOR_PORT`` is set; Cloud TPU, Open MPI, Kubernetes: JAX's detection; or the three flags.

The connect (``jax.distributed.initialize``) waits until every process of the job has reached the coordinator, which
process 0 runs. Each process says what it waits for as it starts waiting (``describe_connect``: the coordinator's
address, its process id and the process count) and gives up after ``--connect_timeout`` seconds (default
``DEFAULT_CONNECT_TIMEOUT``, JAX's own) with one ``error:`` line and exit status 2; JAX's timeout, which aborts the
process with a trace ("another task died"), is set a minute later. A stop signal while it waits ends it within
``runtime.signals.CONNECT_GRACE_SECONDS`` (sooner when the connect completes: then the job stops at one point).
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
from typing import Mapping

from layerscale_jax.errors import UserError

DEFAULT_CONNECT_TIMEOUT = 300.0        # seconds; jax.distributed.initialize's own initialization_timeout
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclasses.dataclass(frozen=True)
class Launch:
    """``jax.distributed.initialize``'s arguments (None: JAX detects it) and where they came from."""
    source: str                            # "flags", "slurm", "torchrun" or "auto" (JAX's detection)
    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    local_device_ids: tuple[int, ...]      # () = every device the process sees

    def initialize_kwargs(self) -> dict:
        return {"coordinator_address": self.coordinator_address, "num_processes": self.num_processes,
                "process_id": self.process_id, "local_device_ids": list(self.local_device_ids)}


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        raise UserError(f"{name}={environ.get(name)!r} in the environment is not an integer") from None


def _check_rank(rank_name: str, rank: int, size_name: str, size: int) -> None:
    """A process count of at least 1 and a process index in ``[0, count)``, else one error naming the variable or
    flag and its value (JAX's own message for them was "no ... environment found" or an abort)."""
    if size < 1:
        raise UserError(f"{size_name}={size}: the number of processes must be at least 1")
    if not 0 <= rank < size:
        raise UserError(f"{rank_name}={rank} with {size_name}={size}: the process index must be in 0..{size - 1} "
                        "(every process of the job gets its own)")


def tasks_per_node(spec: str) -> list[int]:
    """SLURM's ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``"8(x4)"``, ``"2(x3),1"``) per node."""
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            raise UserError(f"SLURM_STEP_TASKS_PER_NODE={spec!r} is not SLURM's 'N(xM),...' form")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def visible_gpus(environ: Mapping[str, str]) -> int:
    """How many NVIDIA GPUs this process sees: ``CUDA_VISIBLE_DEVICES``'s entries if set, else the ``/dev/nvidiaN``
    device files (0 on machines without NVIDIA GPUs, e.g. CPU hosts and TPU VMs)."""
    if "CUDA_VISIBLE_DEVICES" in environ:
        return len([d for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()])
    return len([p for p in glob.glob("/dev/nvidia*") if re.fullmatch(r"/dev/nvidia\d+", p)])


def local_device_ids(local_rank: int, local_processes: int, gpus: int, where: str) -> tuple[int, ...]:
    """The devices of process ``local_rank`` of ``local_processes`` on a node whose processes each see ``gpus``
    GPUs (see the module docstring; ``where`` names the variables in an error)."""
    if local_processes <= 1 or gpus <= 1:
        return ()
    if gpus % local_processes:
        raise UserError(f"{where}: {local_processes} processes on this node and {gpus} visible GPUs, which they cannot "
                        f"share evenly; start one process per GPU or per node, or pass --local_device_ids")
    per = gpus // local_processes
    return tuple(range(local_rank * per, (local_rank + 1) * per))


def parse_local_device_ids(text: str) -> tuple[int, ...]:
    if text == "all":
        return ()
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        ids = ()
    if not ids or any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise UserError(f"--local_device_ids={text!r}: expected 'all' or distinct device numbers like 0,1,2,3")
    return ids


def resolve_launch(*, distributed: bool, coordinator_address: str | None, num_processes: int | None,
                   process_id: int | None, local_devices: str | None,
                   environ: Mapping[str, str]) -> Launch | None:
    """The job's ``Launch`` from the command's flags and the environment; None for a single process."""
    if not (distributed or coordinator_address):
        if local_devices is not None or num_processes is not None or process_id is not None:
            raise UserError("--num_processes, --process_id and --local_device_ids need --distributed or "
                            "--coordinator_address")
        return None
    torchrun = all(name in environ for name in TORCHRUN_VARIABLES)
    slurm = all(name in environ for name in SLURM_VARIABLES)
    if torchrun:
        _check_rank("RANK", _int(environ, "RANK"), "WORLD_SIZE", _int(environ, "WORLD_SIZE"))
        if not 0 < _int(environ, "MASTER_PORT") < 65536:
            raise UserError(f"MASTER_PORT={environ['MASTER_PORT']}: a port is in 1..65535")
        rank = _int(environ, "LOCAL_RANK") if "LOCAL_RANK" in environ else 0
        local_processes = _int(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else 1
        _check_rank("LOCAL_RANK", rank, "LOCAL_WORLD_SIZE", local_processes)
        where = "LOCAL_RANK/LOCAL_WORLD_SIZE"
    elif slurm:
        per_node = tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
                                  or "1")
        node = _int(environ, "SLURM_NODEID") if "SLURM_NODEID" in environ else 0
        rank, local_processes = _int(environ, "SLURM_LOCALID"), per_node[min(node, len(per_node) - 1)]
        where = "SLURM_LOCALID/SLURM_STEP_TASKS_PER_NODE"
    else:
        rank, local_processes, where = 0, 1, ""
    if local_devices is None and environ.get("JAX_LOCAL_DEVICE_IDS"):       # JAX's own variable for it
        local_devices = environ["JAX_LOCAL_DEVICE_IDS"]
    devices = (parse_local_device_ids(local_devices) if local_devices is not None
               else local_device_ids(rank, local_processes, visible_gpus(environ), where))
    if coordinator_address:
        if num_processes is None or process_id is None:
            raise UserError("--coordinator_address needs --num_processes and --process_id as well (or use "
                            "--distributed alone to read them from the launcher)")
        _check_rank("--process_id", process_id, "--num_processes", num_processes)
        return Launch("flags", coordinator_address, num_processes, process_id, devices)
    if torchrun:
        port = _int(environ, "MASTER_PORT") + (1 if "TORCHELASTIC_RUN_ID" in environ else 0)
        port = environ.get("JAX_COORDINATOR_PORT") or port
        return Launch("torchrun", f"{environ['MASTER_ADDR']}:{port}", _int(environ, "WORLD_SIZE"),
                      _int(environ, "RANK"), devices)
    if num_processes is not None:                                 # the rest comes from JAX's detection
        _check_rank("--process_id", process_id or 0, "--num_processes", num_processes)
    elif process_id is not None and process_id < 0:
        raise UserError(f"--process_id={process_id}: a process index is 0 or more")
    return Launch("slurm" if slurm else "auto", None, num_processes, process_id, devices)


def partial_torchrun(environ: Mapping[str, str]) -> str:
    """`` (RANK, WORLD_SIZE set; MASTER_ADDR, MASTER_PORT missing)`` when some but not all of a torchrun-style
    launch's variables are set (why it was not taken for one), else ``""``."""
    present = [name for name in TORCHRUN_VARIABLES if name in environ]
    if not present or len(present) == len(TORCHRUN_VARIABLES):
        return ""
    missing = [name for name in TORCHRUN_VARIABLES if name not in environ]
    return (f" (torchrun-style: {', '.join(f'{n}={environ[n]}' for n in present)} set but {', '.join(missing)} "
            "missing; a torchrun-style launch sets all of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")


def describe_connect(launch: Launch, timeout: float, environ: Mapping[str, str]) -> tuple[str, str]:
    """What a process waits for while the job connects (``the coordinator at HOST:PORT as process 1 of 2 (SLURM)``),
    and the ``error:`` line it gives up with after ``timeout`` seconds."""
    address, count, index = launch.coordinator_address, launch.num_processes, launch.process_id
    address = address or environ.get("JAX_COORDINATOR_ADDRESS")
    if launch.source == "slurm":               # JAX's own SLURM detection, from the environment alone
        try:
            from jax._src.clusters.slurm_cluster import SlurmCluster
            address = address or SlurmCluster.get_coordinator_address(None, environ.get("JAX_COORDINATOR_PORT"))
            count = SlurmCluster.get_process_count() if count is None else count
            index = SlurmCluster.get_process_id() if index is None else index
        except Exception:                      # noqa: BLE001 - only the description is missing then
            pass
    source = {"flags": "--coordinator_address", "slurm": "SLURM", "torchrun": "RANK/WORLD_SIZE/MASTER_ADDR",
              "auto": "JAX's detection"}[launch.source]
    where = f"the coordinator at {address}" if address else "the job's coordinator"
    who = f"process {index} of {count}" if index is not None and count is not None else "this process"
    waiting_for = f"{where} as {who} ({source}; process 0 runs the coordinator)"
    gave_up = (f"error: --distributed: {who} could not join the job: {where} did not see all "
               f"{count if count is not None else 'its'} processes connect within {timeout:g} s (--connect_timeout); "
               "start every process of the job (process 0 runs the coordinator), check the address, or raise "
               "--connect_timeout")
    return waiting_for, gave_up


def missing_accelerator_package(chips: tuple[int, str | None] | None = None, nvidia: bool | None = None) -> str | None:
    """What to install when this machine has an accelerator that JAX cannot use without a package that is missing,
    or None. ``chips`` (TPU chips found on the PCI bus, their version) and ``nvidia`` (an NVIDIA device file exists)
    default to JAX's own hardware probes (``jax._src.hardware_utils``), which read no accelerator runtime."""
    from jax._src import hardware_utils
    if chips is None:
        count, version = hardware_utils.num_available_tpu_chips_and_device_id()
        chips = (count, version.name if version is not None else None)
    if nvidia is None:
        nvidia = hardware_utils.has_visible_nvidia_gpu()
    libtpu = importlib.util.find_spec("libtpu") is not None or os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", ""))
    if chips[0] and not libtpu:
        return (f"this machine has {chips[0]} TPU chip(s) ({chips[1] or 'unknown version'}) but libtpu is not "
                "installed, so JAX sees no TPU (and --distributed cannot find the pod): pip install -e '.[tpu]'")
    if nvidia and importlib.util.find_spec("jax_cuda12_plugin") is None:
        return ("this machine has an NVIDIA GPU but jax's CUDA plugin is not installed, so JAX sees no GPU: "
                "pip install -e '.[cuda12]'")
    return None


def accelerator_line(jax) -> str:
    """One line: the platform, device kind and counts the job runs on."""
    local = jax.local_devices()
    kind = local[0].device_kind if local else "?"
    line = f"accelerator: {jax.default_backend()} ({kind}), {len(local)} device(s) in this process"
    if jax.process_count() > 1:
        line += f", {jax.device_count()} in the job's {jax.process_count()} processes"
    return line
