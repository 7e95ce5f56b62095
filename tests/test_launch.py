"""Launching a multi-process job (``train.launch``): the arguments ``jax.distributed.initialize`` gets under mock
SLURM and torchrun environments for one process per GPU and one process per node, checked against JAX 0.12's own
cluster detection; real 2-process CPU jobs started the way each recipe in docs/multihost.md starts them; the
accelerator line; a TPU VM without libtpu."""
import importlib.util
import os
import socket
import subprocess
import sys

import pytest
from jax._src import clusters

from layerscale_jax.cli import run_cli
from layerscale_jax.errors import UserError
from layerscale_jax.train import launch as launch_lib
from layerscale_jax.train.__main__ import main as train_main
from layerscale_jax.train.launch import Launch, resolve_launch

from test_train import TINY, subprocess_env

EIGHT_GPUS = "0,1,2,3,4,5,6,7"


def slurm_env(*, procid, localid, nodeid, tasks_per_node, cuda_visible):
    """What ``srun`` sets in a task of job 812 on 4 nodes gpu[001-004] (the variables JAX and the CLI read)."""
    return {"SLURM_JOB_ID": "812", "SLURM_STEP_NODELIST": "gpu[001-004]", "SLURM_NTASKS": str(4 * tasks_per_node),
            "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid), "SLURM_NODEID": str(nodeid),
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks_per_node}(x4)", "CUDA_VISIBLE_DEVICES": cuda_visible}


def resolve(environ, **flags):
    return resolve_launch(**{"distributed": True, "coordinator_address": None, "num_processes": None,
                             "process_id": None, "local_devices": None, **flags}, environ=environ)


def jax_arguments(launch: Launch | None, environ, monkeypatch):
    """What ``jax.distributed.initialize`` ends up with for ``launch`` (None: called with no arguments, JAX's
    default): JAX 0.12's own detection fills what is unset (``jax/_src/distributed.py`` →
    ``clusters.ClusterEnv.auto_detect_unset_distributed_params``)."""
    for name in [n for n in os.environ if n.startswith(("SLURM_", "OMPI_"))]:
        monkeypatch.delenv(name)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    kwargs = launch.initialize_kwargs() if launch else dict.fromkeys(
        ("coordinator_address", "num_processes", "process_id", "local_device_ids"))
    return clusters.ClusterEnv.auto_detect_unset_distributed_params(
        kwargs["coordinator_address"], kwargs["num_processes"], kwargs["process_id"], kwargs["local_device_ids"],
        None, 300)


def test_slurm_one_task_per_gpu_bound_by_slurm_keeps_the_tasks_own_gpu(monkeypatch):
    """``srun --ntasks-per-node=8 --gpus-per-task=1``: SLURM binds each task to its GPU (CUDA_VISIBLE_DEVICES holds
    one), which the process sees as device 0. JAX's default, ``local_device_ids=[SLURM_LOCALID]``, would ask for
    device 3 of the one it sees."""
    env = slurm_env(procid=11, localid=3, nodeid=1, tasks_per_node=8, cuda_visible="3")
    launch = resolve(env)
    assert launch.source == "slurm" and launch.local_device_ids == ()
    port = 812 % 2**12 + 65535 - 2**12 + 1
    assert jax_arguments(launch, env, monkeypatch) == (f"gpu001:{port}", 32, 11, [])
    assert jax_arguments(None, env, monkeypatch)[3] == [3]    # JAX's own choice


def test_slurm_one_task_per_gpu_seeing_all_gpus_takes_gpu_local_id(monkeypatch):
    """``--ntasks-per-node=8 --gpus-per-node=8`` without binding: every task sees 8 GPUs and takes its own."""
    env = slurm_env(procid=11, localid=3, nodeid=1, tasks_per_node=8, cuda_visible=EIGHT_GPUS)
    assert jax_arguments(resolve(env), env, monkeypatch)[3] == [3]


def test_slurm_one_task_per_node_uses_every_gpu_of_the_node(monkeypatch):
    """``srun --ntasks-per-node=1 --gpus-per-node=8`` (issue 36): JAX's default gives each process one GPU, 4 of
    the 32 devices the mesh needs; the CLI passes every device."""
    env = slurm_env(procid=2, localid=0, nodeid=2, tasks_per_node=1, cuda_visible=EIGHT_GPUS)
    launch = resolve(env)
    assert launch.local_device_ids == ()
    assert jax_arguments(launch, env, monkeypatch)[1:] == (4, 2, [])
    assert jax_arguments(None, env, monkeypatch)[3] == [0]    # JAX's own choice


def test_two_tasks_per_node_split_the_gpus_in_halves():
    env = slurm_env(procid=3, localid=1, nodeid=1, tasks_per_node=2, cuda_visible=EIGHT_GPUS)
    assert resolve(env).local_device_ids == (4, 5, 6, 7)


@pytest.mark.parametrize("elastic, port", [(True, "29501"), (False, "29500")], ids=["torchrun", "static_env"])
def test_torchrun_style_launcher_one_process_per_gpu(monkeypatch, elastic, port):
    """``torchrun --nnodes=4 --nproc-per-node=8`` (its agent's store holds MASTER_PORT: the coordinator takes the
    next port) or a launcher that only sets the variables (e.g. Kubernetes' PyTorchJob: MASTER_PORT is free)."""
    env = {"RANK": "11", "WORLD_SIZE": "32", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "node0",
           "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": EIGHT_GPUS}
    if elastic:
        env["TORCHELASTIC_RUN_ID"] = "deit3"
    launch = resolve(env)
    assert launch == Launch("torchrun", f"node0:{port}", 32, 11, (3,))
    assert jax_arguments(launch, env, monkeypatch) == (f"node0:{port}", 32, 11, [3])     # nothing left to detect
    assert resolve(dict(env, JAX_COORDINATOR_PORT="7000")).coordinator_address == "node0:7000"


def test_torchrun_inside_a_slurm_allocation_uses_torchruns_ranks():
    env = dict(slurm_env(procid=1, localid=0, nodeid=1, tasks_per_node=1, cuda_visible=EIGHT_GPUS),
               RANK="13", WORLD_SIZE="32", LOCAL_RANK="5", LOCAL_WORLD_SIZE="8", MASTER_ADDR="gpu001",
               MASTER_PORT="29500", TORCHELASTIC_RUN_ID="x")
    assert resolve(env) == Launch("torchrun", "gpu001:29501", 32, 13, (5,))


def test_explicit_flags_and_device_ids():
    env = slurm_env(procid=0, localid=0, nodeid=0, tasks_per_node=8, cuda_visible=EIGHT_GPUS)
    launch = resolve(env, coordinator_address="10.0.0.1:1234", num_processes=32, process_id=0, local_devices="all")
    assert launch == Launch("flags", "10.0.0.1:1234", 32, 0, ())
    assert resolve({}, local_devices="2,3").local_device_ids == (2, 3)
    assert resolve({"JAX_LOCAL_DEVICE_IDS": "1"}).local_device_ids == (1,)
    assert resolve_launch(distributed=False, coordinator_address=None, num_processes=None, process_id=None,
                          local_devices=None, environ=env) is None


@pytest.mark.parametrize("flags, message", [
    ({"local_devices": "0,0"}, "--local_device_ids='0,0': expected 'all' or distinct device numbers"),
    ({"local_devices": "gpu0"}, "--local_device_ids='gpu0'"),
    ({"coordinator_address": "h:1"}, "--coordinator_address needs --num_processes and --process_id"),
    ({"distributed": False, "process_id": 1}, "need --distributed or --coordinator_address"),
])
def test_bad_launch_flags_are_one_error_naming_them(flags, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve({}, **flags)


def test_processes_that_cannot_share_the_gpus_evenly_are_refused():
    env = slurm_env(procid=0, localid=0, nodeid=0, tasks_per_node=3, cuda_visible=EIGHT_GPUS)
    with pytest.raises(UserError, match="3 processes on this node and 8 visible GPUs"):
        resolve(env)


def test_slurm_task_counts_per_node():
    assert launch_lib.tasks_per_node("8(x4)") == [8] * 4
    assert launch_lib.tasks_per_node("2(x3),1") == [2, 2, 2, 1]


def test_a_tpu_vm_without_libtpu_says_what_to_install(monkeypatch):
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)            # importing jax sets it where libtpu is
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else
                        real_find_spec(name, *a))
    message = launch_lib.missing_accelerator_package(chips=(4, "v5e"), nvidia=False)
    assert message.startswith("this machine has 4 TPU chip(s) (v5e) but libtpu is not installed")
    assert message.endswith("pip install -e '.[tpu]'")
    assert launch_lib.missing_accelerator_package(chips=(0, None), nvidia=False) is None
    monkeypatch.setattr(importlib.util, "find_spec", real_find_spec)
    assert launch_lib.missing_accelerator_package(chips=(4, "v5e"), nvidia=False) is None     # libtpu installed here


def test_distributed_on_a_tpu_vm_without_libtpu_is_one_error_line(monkeypatch, tmp_path, capsys):
    """Instead of JAX's 'coordinator_address should be defined' (it does not recognise the TPU VM)."""
    from jax._src import hardware_utils
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(hardware_utils, "num_available_tpu_chips_and_device_id",
                        lambda: (4, hardware_utils.TpuVersion.v5e))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else
                        real_find_spec(name, *a))
    status = run_cli(train_main, ["--config", TINY, "--workdir", str(tmp_path / "w"), "--distributed"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err == ["error: this machine has 4 TPU chip(s) (v5e) but libtpu is not installed, so JAX "
                                   "sees no TPU (and --distributed cannot find the pod): pip install -e '.[tpu]'"]


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("layout", ["slurm_one_task_per_device", "torchrun_one_process_per_node"])
def test_a_two_process_cpu_job_starts_as_the_recipe_writes_it(tmp_path, layout):
    """Two real processes started with ``--distributed`` and nothing else, as ``srun`` (1 device per task) or a
    torchrun-style launcher (2 devices per process) would start them; the mesh spans the job's devices."""
    port, devices = _free_port(), (1 if layout.startswith("slurm") else 2)
    procs = []
    for rank in range(2):
        if layout.startswith("slurm"):
            launcher = {"SLURM_JOB_ID": "812", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
                        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
                        "SLURM_STEP_TASKS_PER_NODE": "2", "JAX_COORDINATOR_PORT": str(port)}
        else:
            launcher = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "localhost", "MASTER_PORT": str(port)}
        env = {k: v for k, v in subprocess_env(devices).items() if not k.startswith(("SLURM_", "OMPI_"))}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=3", f"--workdir={tmp_path}",
             "--distributed", "--config.train.eval_every=0"],
            env={**env, **launcher}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate()[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    line = f"accelerator: cpu (cpu), {devices} device(s) in this process, {2 * devices} in the job's 2 processes"
    assert line in outputs[0] and "accelerator:" not in outputs[1]
    assert f"{2 * devices} devices, 2 processes" in outputs[0]
    assert "] 3/3 | train_loss" in outputs[0] and "train_loss" not in outputs[1]     # progress: process 0 only
