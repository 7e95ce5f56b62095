"""Inputs checked where they enter (issue 49 item 3): an empty workdir, a bad ``--compile_for``, a launcher's or JAX's
environment variable with a bad value, ``train.init_from`` / ``data.data_dir`` / ``train.compilation_cache_dir``
that cannot be read — each one ``error:`` line naming the field, flag or variable (or, for the cache, one warning),
before a model is built."""
import dataclasses
import os
import re
import shutil

import numpy as np
import pytest
from flax import nnx

import layerscale_jax as lsj
from layerscale_jax import network
from layerscale_jax.cli import check_environment, run_cli
from layerscale_jax.errors import UserError
from layerscale_jax.train.__main__ import main as train_main
from layerscale_jax.train.launch import resolve_launch

from cloud_bucket import cloud_bucket
from test_param_roles import by_name, load_tiny_config

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TINY = os.path.join(HERE, "configs", "tiny_synthetic.py")
OFFLINE = "https://storage.googleapis.com/ cannot be reached (Name or service not known)"
OFFLINE_RE = re.escape(OFFLINE)


def one_error_line(argv, capsys):
    status = run_cli(train_main, argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, lines)
    return lines[0]


def test_an_empty_workdir_is_refused_by_fit_and_load_run_as_by_the_command_line(tmp_path, monkeypatch):
    """``lsj.fit(cfg, "")`` trained into the current directory (the CLI refused ``--workdir ''``)."""
    monkeypatch.chdir(tmp_path)
    for call in (lambda: lsj.fit(load_tiny_config("steps=4"), ""), lambda: lsj.load_run(""),
                 lambda: lsj.fit(load_tiny_config("steps=4"), " ")):
        with pytest.raises(UserError, match=r"workdir='\s?' is empty: give a path"):
            call()
    assert os.listdir(tmp_path) == []


def test_an_empty_compile_for_names_the_flag(capsys):
    """``--compile_for ''`` was "--workdir is required"."""
    line = one_error_line([f"--config={TINY}", "--compile_for", ""], capsys)
    assert line.startswith("error: --compile_for '': unknown target; known names: v5e-256")


def test_a_topology_libtpu_cannot_lay_out_is_one_line_naming_compile_for():
    """``--compile_for v5e:3x3`` was a 41-line JaxRuntimeError from libtpu."""
    pytest.importorskip("libtpu")
    from layerscale_jax.plan.targets import parse_target, target_devices
    with pytest.raises(UserError, match=r"^--compile_for v5e:3x3: libtpu has no such slice \(Topology layout "
                                        r"\"v5e:3x3\" is not divisible .*\); name one by its chip count"):
        target_devices(parse_target("v5e:3x3"))


TORCHRUN = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "RANK": "0", "WORLD_SIZE": "2"}


@pytest.mark.parametrize("changes, message", [
    ({"RANK": "2"}, "RANK=2 with WORLD_SIZE=2: the process index must be in 0..1"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0: the number of processes must be at least 1"),
    ({"RANK": "-1"}, "RANK=-1 with WORLD_SIZE=2: the process index must be in 0..1"),
    ({"RANK": "one"}, "RANK='one' in the environment is not an integer"),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=3 with LOCAL_WORLD_SIZE=2"),
    ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000: a port is in 1..65535"),
], ids=["rank_too_large", "world_size_0", "rank_negative", "rank_not_a_number", "local_rank", "port"])
def test_a_torchrun_environment_with_a_bad_value_names_the_variable(changes, message):
    """``RANK=2 WORLD_SIZE=2`` (also ``WORLD_SIZE=0``, ``RANK=-1``) was "no SLURM, torchrun-style, ... environment
    found" from JAX."""
    with pytest.raises(UserError) as raised:
        resolve_launch(distributed=True, coordinator_address=None, num_processes=None, process_id=None,
                       local_devices=None, environ={**TORCHRUN, **changes})
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("flags, message", [
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, "--process_id=2 with --num_processes=2"),
    ({"num_processes": 0}, "--num_processes=0: the number of processes must be at least 1"),
    ({"process_id": -1}, "--process_id=-1: a process index is 0 or more"),
])
def test_process_flags_out_of_range_name_the_flag(flags, message):
    with pytest.raises(UserError, match="^" + message):
        resolve_launch(**{"distributed": True, "coordinator_address": None, "num_processes": None,
                          "process_id": None, "local_devices": None, **flags}, environ={})


def test_a_partial_torchrun_environment_names_what_is_missing():
    from layerscale_jax.train.launch import partial_torchrun
    assert partial_torchrun({"RANK": "2", "WORLD_SIZE": "2"}) == (
        " (torchrun-style: RANK=2, WORLD_SIZE=2 set but MASTER_ADDR, MASTER_PORT missing; a torchrun-style launch "
        "sets all of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)")
    assert partial_torchrun(TORCHRUN) == partial_torchrun({}) == ""


@pytest.mark.parametrize("name", ["XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"])
@pytest.mark.parametrize("value", ["abc", "0", "1.5", "nan"])
def test_a_bad_memory_fraction_in_the_environment_is_one_line_naming_it(name, value, capsys, monkeypatch):
    """``XLA_CLIENT_MEM_FRACTION=abc`` was an 11-line plugin traceback with a wrong cause, on the first device use."""
    monkeypatch.setenv(name, value)
    line = one_error_line([f"--config={TINY}", "--workdir=/nonexistent/never"], capsys)
    assert line.startswith(f"error: {name}='{value}' in the environment: the fraction of each GPU's memory JAX "
                           "takes is a number in (0, 1]")
    check_environment({name: "0.9"})


def experiment(**train):
    from layerscale_jax.train.config import validate_experiment_config
    config = load_tiny_config("steps=4")
    for key, value in train.items():
        section, field = key.split("__")
        setattr(config[section], field, value)
    return validate_experiment_config(config)


def offline(monkeypatch):
    monkeypatch.setattr(network, "cloud_storage_problem", lambda: OFFLINE)


def test_a_missing_init_from_is_refused_before_the_model_is_built(tmp_path, monkeypatch):
    """``train.init_from`` that does not exist was reported after the model was built (and ``gs://b/model`` read
    as ``gs:/b/model``)."""
    from layerscale_jax.train import loop
    monkeypatch.setattr(loop, "create_trainer", lambda *a: pytest.fail("the model was built"))
    with pytest.raises(UserError, match=f"^train.init_from={tmp_path}/none does not exist: give a timm weights"):
        loop.train_and_evaluate(experiment(train__init_from=str(tmp_path / "none")), tmp_path / "run")
    offline(monkeypatch)
    with pytest.raises(UserError, match=f"^train.init_from=gs://b/model: {OFFLINE_RE}; check the network"):
        loop.train_and_evaluate(experiment(train__init_from="gs://b/model"), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_data_dir_on_unreachable_cloud_storage_is_one_line(tmp_path, monkeypatch):
    """``data.data_dir=gs://...`` offline was TFDS's 56-line FailedPreconditionError."""
    from layerscale_jax.train import loop
    offline(monkeypatch)
    config = experiment()
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, name="digits", data_dir="gs://b/tfds"))
    with pytest.raises(UserError, match=f"^data.data_dir=gs://b/tfds: {OFFLINE_RE}; check the network .*, or prepare "
                                        "the dataset in a local data.data_dir"):
        loop._check_sources(config)


def test_a_compilation_cache_on_unreachable_cloud_storage_is_off_with_one_warning(monkeypatch, capsys):
    """``train.compilation_cache_dir=gs://...`` offline: 8 warnings from JAX and the cache silently off."""
    from layerscale_jax.train import loop
    offline(monkeypatch)
    assert loop._check_sources(experiment(train__compilation_cache_dir="gs://b/cache")) == ""
    assert capsys.readouterr().out.strip().splitlines() == [
        f"warning: train.compilation_cache_dir=gs://b/cache: {OFFLINE}; check the network (or HTTPS_PROXY) and the "
        "credentials (gcloud auth application-default login); the compilation cache is off for this run"]
    monkeypatch.setattr(network, "cloud_storage_problem", lambda: None)
    assert loop._check_sources(experiment(train__compilation_cache_dir="gs://b/cache")) == "gs://b/cache"


def test_init_from_reads_weights_and_training_workdirs_on_gs(tmp_path):
    """``train.init_from=gs://...`` is read as a bucket path (pathlib made it ``gs:/...``): a timm file and a
    training workdir (tests/fixtures/workdir_v1, in a local stand-in for a bucket)."""
    from layerscale_jax.convert import load_pretrained, read_state_dict, write_state_dict
    from layerscale_jax.models.registry import create_from_config
    from layerscale_jax.train import loop
    from layerscale_jax.train.config import validate_experiment_config

    config = load_tiny_config("steps=4,scan_layers=True")
    config.optim.ema_decay = 0.9
    local = os.path.join(HERE, "fixtures", "workdir_v1")
    with cloud_bucket(tmp_path / "bucket"):
        shutil.copytree(local, tmp_path / "bucket" / "b" / "run")
        config.train.init_from = "gs://b/run"
        experiment = validate_experiment_config(config)
        assert loop._check_sources(experiment) == config.train.compilation_cache_dir
        from_gs = by_name(nnx.state(load_pretrained(create_from_config(experiment.model), "gs://b/run"), nnx.Param))
        write_state_dict({"head.weight": np.zeros((4, 16), np.float32)}, tmp_path / "w.safetensors")
        shutil.copy(tmp_path / "w.safetensors", tmp_path / "bucket" / "b" / "w.safetensors")
        assert read_state_dict("gs://b/w.safetensors").keys() == {"head.weight"}
    from_disk = by_name(nnx.state(load_pretrained(create_from_config(experiment.model), local), nnx.Param))
    assert from_gs.keys() == from_disk.keys()
    for key in from_disk:
        np.testing.assert_array_equal(from_gs[key], from_disk[key])


def test_a_batch_the_host_cannot_hold_is_one_line_naming_the_batch_size():
    """``--config.train.batch_size=1099511627776`` was a 35-line ``_ArrayMemoryError`` from numpy."""
    from layerscale_jax.train import sharding as shard_lib
    from layerscale_jax.train.feed import Batches
    config = experiment()
    train = dataclasses.replace(config.train, batch_size=2 ** 40)
    with pytest.raises(UserError, match=r"^train.batch_size=1099511627776: this host's memory cannot hold the batch "
                                        r"\(Unable to allocate .*\); lower train.batch_size$"):
        Batches(config.data, train, shard_lib.make_mesh(config.train.mesh, jax_devices()[:1]))


def jax_devices():
    import jax
    return jax.devices()


def test_a_results_file_that_is_not_an_object_is_named_with_what_to_do(tmp_path):
    """``results.json`` = ``[1,2]`` was a 25-line ``AttributeError``."""
    from etils import epath
    from layerscale_jax.paths import read_json
    (tmp_path / "results.json").write_text("[1,2]")
    with pytest.raises(UserError, match=r"results.json is damaged \(not a JSON object: \[1, 2\]\); delete it"):
        read_json(epath.Path(tmp_path) / "results.json", "delete it and rerun")


def test_a_metrics_log_of_random_bytes_is_one_error_naming_the_file(tmp_path):
    """``metrics.jsonl`` of random bytes was a 31-line ``UnicodeDecodeError`` at the resume (and in load_run)."""
    from etils import epath
    from layerscale_jax.storage import workdir as workdir_lib
    path = epath.Path(tmp_path) / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n\x8f\xfe\x00\xc3random')
    for read in (lambda: workdir_lib.truncate_metrics(path, 4), lambda: workdir_lib.metrics_lines(path),
                 lambda: workdir_lib.earlier_run(epath.Path(tmp_path), epath.Path(tmp_path) / "checkpoints")):
        with pytest.raises(workdir_lib.WorkdirError, match=f"^{path} is not a metrics log \\(byte 12 is not UTF-8 "
                                                           "text\\); move it aside or delete it"):
            read()


@pytest.mark.slow
@pytest.mark.parametrize("argv, message", [
    (["--measure", "0"], "--measure=[0]: depths must be ≥ 1 and seeds ≥ 0"),
    (["--protocol", "early", "--quick", "--dataset", "nonexistent_ds"],
     "data.name='nonexistent_ds' is neither 'digits', 'synthetic' nor a TFDS dataset name"),
], ids=["measure_0", "unknown_dataset"])
def test_the_depth_ablations_mistakes_are_one_line_and_status_2(argv, message, tmp_path, capsys):
    """``experiments/depth_ablation.py --measure 0`` and ``--dataset nonexistent_ds`` were 35-37-line tracebacks,
    and its own errors exited with status 1 (the package's commands: 2)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "depth_ablation.py"), *argv, "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [f"error: {message}"], done.stderr[-2000:]
