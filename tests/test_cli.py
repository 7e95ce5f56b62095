"""Bad input at every command line: one ``error: ...`` line naming the field or the file, exit status 2.

The table runs each bad input through the entry function in this process (``run_cli(main, argv)``, what
``python -m ...`` runs); two cases go through a real subprocess, one of them with the debug switch. Also here: the
config-time checks (finite numbers, unknown fields), flag overrides of every field with the right type, and
exporting a training workdir to timm.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import ml_collections
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from layerscale_jax.bench.cli import main as bench_main
from layerscale_jax.cli import DEBUG_ENV, one_line, run_cli
from layerscale_jax.convert.__main__ import main as convert_main
from layerscale_jax.convert.naming import qkv_timm_order
from layerscale_jax.data.prepare import main as prepare_main
from layerscale_jax.train.__main__ import main as train_main
from layerscale_jax.train.__main__ import parse_command_line
from layerscale_jax.train.config import model_section, validate_experiment_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "configs", "digits_layerscale.py")
TINY = os.path.join(ROOT, "tests", "configs", "tiny_synthetic.py")
CONFIG_FILES = [os.path.join(ROOT, "configs", name) for name in sorted(os.listdir(os.path.join(ROOT, "configs")))
                if name.endswith(".py")] + [TINY]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Bad input files, and a good weights file with the wrong keys."""
    root = tmp_path_factory.mktemp("bad_inputs")
    (root / "text.safetensors").write_text("this is not a safetensors file\n")
    (root / "text.npz").write_text("neither is this an npz file\n")
    (root / "weights.h5").write_bytes(b"\x89HDF\r\n")
    (root / "dir.safetensors").mkdir()
    (root / "emptydir").mkdir()
    (root / "not_python.txt").write_text("x = 1\n")
    (root / "broken_config.py").write_text("def get_config(:\n")
    (root / "no_get_config.py").write_text("X = 1\n")
    (root / "raising_config.py").write_text("def get_config():\n    settings = {}\n    return settings['depth']\n")
    (root / "raising_module.py").write_text("import os\nDEPTH = 1 / 0\n")
    (root / "damaged_model").mkdir()
    (root / "damaged_model" / "model.json").write_text('{"format": "layerscale_jax.save_pretrained/v1", model')
    (root / "locked").mkdir()
    (root / "locked" / "lock.json").write_text(json.dumps({    # a live holder: its heartbeat is recent
        "host": "other-host", "pid": 4242, "started": "2026-01-01T00:00:00", "heartbeat_every": 86400,
        "heartbeat": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    save_file({f"blocks.{i}.unrelated": np.zeros(3, np.float32) for i in range(300)},
              str(root / "wrong_keys.safetensors"))
    return root


def _bad_inputs(f, tmp):
    """(entry function, argv, substrings the one error line must contain)."""
    wd = ["--workdir", str(tmp / "wd")]
    conv_out = ["--export-timm", str(tmp / "out.safetensors")]
    model = ["--model", "deit3_small_patch16_224"]
    return [
        # train: the command line and the config (all before JAX starts)
        (train_main, [], ["--config is required"]),
        (train_main, ["--config", DIGITS], ["--workdir is required"]),
        (train_main, ["--config", str(f / "missing.py"), *wd], ["missing.py", "does not exist"]),
        (train_main, ["--config", str(f / "not_python.txt"), *wd], ["not_python.txt", "not a Python file"]),
        (train_main, ["--config", str(f / "broken_config.py"), *wd], ["broken_config.py", "not valid Python"]),
        (train_main, ["--config", str(f / "no_get_config.py"), *wd], ["no_get_config.py", "get_config"]),
        (train_main, ["--config", str(f / "raising_config.py"), *wd],
         ["raising_config.py", "get_config() failed at line 3: KeyError: 'depth'"]),
        (train_main, ["--config", str(f / "raising_module.py"), *wd],
         ["raising_module.py", "failed at line 2: ZeroDivisionError"]),
        (train_main, ["--config", DIGITS + ":detph=3", *wd], ["'detph'", "did you mean 'depth'"]),
        (train_main, ["--config", DIGITS + ":depth=x", *wd], ["depth='x'", "not an int"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.dept=3"],
         ["config.model.dept", "did you mean 'config.model.depth'"]),
        (train_main, ["--config", DIGITS, *wd, "--config.modle.depth=3"], ["config.modle.depth", "config.model.depth"]),
        (train_main, ["--config", DIGITS, *wd, "--config.train.learning_rate=0.1"],
         ["config.train.learning_rate", "config.optim.learning_rate"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.depth=three"], ["config.model.depth", "three"]),
        (train_main, ["--config", DIGITS, *wd, "--config.optim.learning_rate=nan"], ["optim.learning_rate=nan"]),
        (train_main, ["--config", DIGITS, *wd, "--config.optim.learning_rate=inf"], ["optim.learning_rate=inf"]),
        (train_main, ["--config", DIGITS, *wd, "--config.optim.learning_rate=-1"], ["optim.learning_rate=-1"]),
        (train_main, ["--config", DIGITS, *wd, "--config.data.mixup_alpha=inf"], ["data.mixup_alpha", "inf"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.drop_path_rate=nan"], ["drop_path_rate=nan"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.init_values=often"], ["init_values='often'"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.num_heads=5"], ["num_heads=5"]),
        (train_main, ["--config", DIGITS, *wd, "--config.model.name=deit3_smal_patch16_224"],
         ["deit3_smal_patch16_224", "deit3_small_patch16_224"]),
        (train_main, ["--config", DIGITS, *wd, "--config.train.steps=0"], ["train.steps=0"]),
        (train_main, ["--config", DIGITS, *wd, "--config.train.mesh.data=0"], ["train.mesh.data=0"]),
        (train_main, ["--config", DIGITS, "--workdri", "x"], ["workdri", "workdir"]),
        (train_main, ["--config", DIGITS, *wd, "stray"], ["stray"]),
        # train: found when the run starts (dataset, devices)
        (train_main, ["--config", DIGITS, *wd, "--config.data.name=cifar1"], ["cifar1", "did you mean 'cifar10'"]),
        (train_main, ["--config", DIGITS, *wd, "--config.train.mesh.data=3"], ["mesh", "needs 3 devices"]),
        (train_main, ["--config", TINY, "--workdir", str(f / "locked")], ["in use", "other-host"]),
        # convert: files and models
        (convert_main, model + ["--source", str(f / "text.safetensors"), *conv_out],
         ["text.safetensors", "not a valid safetensors file"]),
        (convert_main, model + ["--source", str(f / "text.npz"), *conv_out], ["text.npz", "not a valid .npz file"]),
        (convert_main, model + ["--source", str(f / "weights.h5"), *conv_out],
         ["weights.h5", "expected a .safetensors"]),
        (convert_main, model + ["--source", str(f / "dir.safetensors"), *conv_out], ["dir.safetensors"]),
        (convert_main, model + ["--source", str(f / "missing.safetensors"), *conv_out],
         ["missing.safetensors", "does not exist"]),
        (convert_main, ["--source", str(f / "emptydir"), *conv_out], ["emptydir", "--model is required"]),
        (convert_main, model + ["--source", str(f / "emptydir"), *conv_out], ["emptydir", "training workdir"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), *conv_out],
         ["wrong_keys.safetensors", "missing", "more characters"]),
        (convert_main, ["--model", "deit3_smal", "--source", str(f / "wrong_keys.safetensors"), *conv_out],
         ["deit3_smal", "deit3_small_patch16_224"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--set", "depth", *conv_out],
         ["--set", "depth"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors")], ["nothing to write"]),
        (convert_main, ["--source", str(f / "damaged_model"), *conv_out],
         ["model.json is damaged", "convert the weights again"]),
        # convert: outputs, checked before anything is read; nothing is overwritten
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--out", str(f / "text.npz")],
         ["--out", "text.npz", "is a file"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--out", str(f / "locked")],
         ["--out", "locked", "is a training workdir"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--export-timm", str(f / "text.npz")],
         ["--export-timm", "text.npz", "exists", "--overwrite"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--out", "/proc/layerscale_out"],
         ["--out", "/proc/layerscale_out", "cannot be written"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--export-timm", "/proc/x.npz"],
         ["--export-timm", "/proc/x.npz", "cannot be written"]),
        (convert_main, model + [*conv_out], ["--source"]),
        (convert_main, model + ["--source", str(f / "wrong_keys.safetensors"), "--step", "3", *conv_out],
         ["--step", "not one"]),
        # data.prepare
        (prepare_main, ["--name", "cifar1", "--data_dir", str(tmp / "tfds")], ["cifar1", "did you mean 'cifar10'"]),
        (prepare_main, ["--data_dir", str(tmp / "tfds")], ["--name"]),
        (prepare_main, ["--name", "imagenet2012", "--manual_dir", str(f / "missing")], ["missing", "not a directory"]),
        # bench (its parser is built elsewhere: argparse errors become one line too)
        (bench_main, ["no_such_benchmark"], ["no_such_benchmark"]),
        (bench_main, ["train_step", "--batch", "x"], ["--batch", "'x'"]),
    ]


@pytest.mark.slow
def test_every_bad_input_gives_one_error_line_and_exit_status_2(files, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    failures = []
    cases = _bad_inputs(files, tmp_path)
    for main, argv, expected in cases:
        status = run_cli(main, argv)
        err = capsys.readouterr().err.strip()
        lines = err.splitlines()
        ok = (status == 2 and len(lines) == 1 and lines[0].startswith("error: ")
              and all(text in lines[0] for text in expected))
        if not ok:
            failures.append(f"{main.__module__} {argv}: status {status}, stderr {err[-600:]!r}, expected {expected}")
    assert not failures, f"{len(failures)} of {len(cases)} bad inputs misreported:\n" + "\n".join(failures)


def _subprocess(module, *args, debug=False, **env_vars):
    env = {k: v for k, v in os.environ.items() if k != DEBUG_ENV}
    env.update(LAYERSCALE_JAX_MALLOC="system", PYTHONPATH=ROOT, **({DEBUG_ENV: "1"} if debug else {}), **env_vars)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


@pytest.mark.slow
def test_unknown_config_field_in_a_real_process_is_one_line(tmp_path):
    proc = _subprocess("layerscale_jax.train", "--config", DIGITS, "--workdir", str(tmp_path),
                       "--config.model.dept=3")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown config field config.model.dept (did you mean 'config.model.depth', 'config.model.remat' or "
        "'config.model.dtype'?)"]


@pytest.mark.slow
def test_missing_device_backend_in_a_real_process_is_one_line(tmp_path):
    # cuda: a backend whose plugin the test install lacks (with the [tpu] extra, libtpu itself prints warnings for tpu)
    proc = _subprocess("layerscale_jax.train", "--config", TINY, "--workdir", str(tmp_path), JAX_PLATFORMS="cuda")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("error: no JAX device backend could start (JAX_PLATFORMS=cuda)")


@pytest.mark.slow
def test_debug_switch_adds_the_traceback(files, tmp_path):
    source = str(files / "text.safetensors")
    args = ("--model", "deit3_small_patch16_224", "--source", source, "--export-timm", str(tmp_path / "x.npz"))
    proc = _subprocess("layerscale_jax.convert", *args, debug=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2
    assert "Traceback (most recent call last):" in lines
    assert lines[-1].startswith("error: ") and "text.safetensors" in lines[-1]
    assert run_cli(convert_main, [*args, "--debug"]) == 2          # the flag works as the variable does


@pytest.mark.parametrize("bug", [KeyError("internal"), ValueError("operands could not be broadcast together"),
                                 TypeError("unsupported operand"), FloatingPointError("overflow")])
def test_a_bug_keeps_its_traceback(bug):
    """Only the user-error types of layerscale_jax.errors (and the environment's OSError) become one line: a
    ValueError from deep in the code is a bug, not a config mistake, and keeps its traceback."""
    def buggy(argv):
        raise bug

    with pytest.raises(type(bug)):
        run_cli(buggy, [])


def test_the_user_error_types_become_one_line(capsys):
    from layerscale_jax.errors import ConfigError, InputFileError, UserError
    from layerscale_jax.train.guard import NonFiniteError

    for err in (ConfigError("train.steps=0 must be a positive integer"), InputFileError("'w.npz' is not valid"),
                UserError("no such dataset"), NonFiniteError("non-finite loss at step 3"),
                FileNotFoundError("'x.py' does not exist")):
        def main(argv, err=err):
            raise err

        assert run_cli(main, []) == 2
        assert capsys.readouterr().err == f"error: {err}\n"
    assert issubclass(ConfigError, ValueError) and issubclass(InputFileError, ValueError)


def test_long_messages_are_joined_and_cut():
    assert one_line("cannot load x:\n  a: 1\n  b: 2\nhint: y") == "cannot load x: a: 1; b: 2; hint: y"
    cut = one_line("k" * 50, limit=10)
    assert cut.startswith("k" * 10 + " ... [40 more characters") and "\n" not in cut


# -- the config where it enters -----------------------------------------------------------------------------------

def _config():
    return parse_command_line(["--config", DIGITS, "--workdir", "unused"]).config


@pytest.mark.parametrize("field, value", [
    ("optim.learning_rate", math.nan), ("optim.learning_rate", math.inf), ("optim.end_learning_rate", math.nan),
    ("optim.b2", math.nan), ("optim.eps", math.inf), ("optim.weight_decay", math.inf),
    ("optim.grad_clip_norm", math.nan), ("optim.sam_rho", math.inf), ("optim.ema_decay", math.nan),
    ("data.mixup_alpha", math.inf), ("data.cutmix_alpha", math.nan), ("data.label_smoothing", math.nan),
    ("data.crop_pct", math.nan), ("data.augment.color_jitter", math.inf),
    ("model.drop_path_rate", math.nan), ("model.mlp_ratio", math.inf), ("model.norm_eps", math.inf),
    ("model.init_values", math.nan), ("model.init_values", math.inf),
    ("train.steps", True), ("train.seed", -1), ("train.mesh.fsdp", 1.5),
])
def test_non_finite_or_out_of_range_numbers_are_refused_when_the_config_enters(field, value):
    config = _config()
    section, _, name = field.rpartition(".")
    node = config
    for key in section.split("."):
        node = node[key]
    with node.ignore_type():
        node[name] = value
    with pytest.raises(ValueError, match=name):
        validate_experiment_config(config)


def test_unknown_fields_in_a_config_file_name_the_closest():
    config = _config()
    config.unlock()
    config.train.learning_rate = 0.1
    with pytest.raises(ValueError, match=r"train\.learning_rate"):
        validate_experiment_config(config)
    del config.train["learning_rate"]
    config.optim.lerning_rate = 0.1
    with pytest.raises(ValueError, match=r"optim\.lerning_rate \(did you mean 'learning_rate'"):
        validate_experiment_config(config)


# -- overrides ----------------------------------------------------------------------------------------------------

def _leaves(config, prefix=""):
    for key in config.keys():
        value = config[key]
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("path", CONFIG_FILES, ids=os.path.basename)
def test_every_field_can_be_overridden_from_the_command_line_with_its_type(path):
    base = parse_command_line(["--config", path, "--workdir", "unused"]).config
    leaves = [(k, v) for k, v in _leaves(base) if v is not None]
    argv = ["--config", path, "--workdir", "unused"]
    argv += [f"--config.{k}={v!r}" if isinstance(v, (tuple, list)) else f"--config.{k}={v}" for k, v in leaves]
    again = dict(_leaves(parse_command_line(argv).config))
    for key, value in leaves:
        assert again[key] == value and type(again[key]) is type(value), key


@pytest.mark.parametrize("path, text, expected", [
    (DIGITS, "1e-4", 1e-4), (DIGITS, "0.1", 0.1), (DIGITS, "auto", "auto"),
    (os.path.join(ROOT, "configs", "imagenet_deit3.py"), "auto", "auto"),
    (os.path.join(ROOT, "configs", "imagenet_deit3.py"), "1e-6", 1e-6),
])
def test_init_values_takes_a_float_or_auto_from_the_command_line(path, text, expected):
    config = parse_command_line(["--config", path, "--workdir", "unused", f"--config.model.init_values={text}"]).config
    assert config.model.init_values == expected and type(config.model.init_values) is type(expected)


def test_float_model_fields_stay_floats():
    section = model_section("deit3_small_patch16_224", mlp_ratio=4, drop_path_rate=0)
    assert type(section.mlp_ratio) is float and type(section.drop_path_rate) is float


# -- exporting a training workdir ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_training_workdir_exports_to_timm(six_step_run, tmp_path, capsys, caplog):
    import shutil

    import jax
    import orbax.checkpoint as ocp

    workdir = tmp_path / "run"                  # a copy of a finished 6-step run of TINY (tests/conftest.py)
    shutil.copytree(six_step_run[0], workdir)

    out = tmp_path / "run.safetensors"
    assert run_cli(convert_main, ["--source", str(workdir), "--export-timm", str(out)]) == 0
    exported = load_file(str(out))
    # What the checkpoint holds, read with orbax directly.
    state_dir = workdir / "checkpoints" / "6" / "state"      # the newest of steps 4 and 6
    tree = ocp.PyTreeCheckpointer().metadata(state_dir).item_metadata.tree
    cpu = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=cpu), tree)
    params = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract)))["params"]
    qkv = np.asarray(params["blocks"]["1"]["attn"]["qkv"]["kernel"]["value"])
    num_heads = json.loads((workdir / "config.json").read_text())["model"]["num_heads"]
    np.testing.assert_array_equal(exported["blocks.1.attn.qkv.weight"], qkv_timm_order(qkv, num_heads).T)
    np.testing.assert_array_equal(exported["blocks.0.ls2.gamma"],
                                  np.asarray(params["blocks"]["0"]["ls2"]["gamma"]["value"]))
    np.testing.assert_array_equal(exported["cls_token"], np.asarray(params["cls_token"]["value"]))
    assert exported["head.weight"].shape == (4, 16)            # the run's 4 classes, not the registry's 1000

    # Errors name the workdir's state: no EMA was kept, no such step. The existing file is replaced only when asked.
    capsys.readouterr()
    assert run_cli(convert_main, ["--source", str(workdir), "--export-timm", str(out), "--step", "4"]) == 2
    assert "exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert all(np.array_equal(load_file(str(out))[k], v) for k, v in exported.items())      # untouched
    again = ["--source", str(workdir), "--export-timm", str(out), "--overwrite"]
    assert run_cli(convert_main, [*again, "--ema"]) == 2
    assert "no EMA" in capsys.readouterr().err
    assert run_cli(convert_main, [*again, "--step", "7"]) == 2
    assert "no complete checkpoint at step 7" in capsys.readouterr().err
    assert run_cli(convert_main, [*again, "--step", "4"]) == 0
    step_4 = load_file(str(out))

    # A checkpoint whose files no longer match the digests the run recorded is never exported: the newest corrupt
    # one is skipped (the export is step 4's), asking for it by step is an error naming the step and the damage.
    for path in sorted(state_dir.rglob("*")):
        if path.is_file() and path.stat().st_size > 64:
            path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 1]))
            break
    with caplog.at_level("WARNING"):
        assert run_cli(convert_main, again) == 0
    assert all(np.array_equal(load_file(str(out))[k], step_4[k]) for k in step_4)
    assert sum("checkpoint at step 6 is corrupt" in r.getMessage() for r in caplog.records) == 1      # said once
    capsys.readouterr()
    assert run_cli(convert_main, [*again, "--step", "6"]) == 2
    assert "step 6: 0 file(s) missing, 1 changed" in capsys.readouterr().err


# -- faults at the command line (docs/reliability.md) --------------------------------------------------------------

@pytest.mark.slow
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_the_old_file_whole(six_step_run, tmp_path, capsys,
                                                                                monkeypatch):
    import safetensors.numpy
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"the previous export")

    def full_disk(tensors, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"half a file")
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
    status = run_cli(convert_main, ["--source", six_step_run[0], "--export-timm", str(out), "--overwrite"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and err[0].startswith(f"error: writing '{out}' failed (")
    assert "No space left on device" in err[0]
    assert out.read_bytes() == b"the previous export" and sorted(os.listdir(tmp_path)) == ["model.safetensors"]


@pytest.mark.slow
def test_a_converted_checkpoint_that_cannot_be_written_stops_at_once_in_one_line(six_step_run, tmp_path, capsys,
                                                                                 monkeypatch, caplog):
    """orbax fails to create --out's params directory (a full disk): one error line, last, and orbax's waiting
    threads end then instead of at its barrier timeout (300 s; 20 s here) logging "Timeout waiting for key"."""
    import threading
    from orbax.checkpoint._src.futures import future as orbax_future
    from orbax.checkpoint._src.path import atomicity

    async def full_disk(tmp_paths, *args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_paths[0].get()))

    monkeypatch.setattr(atomicity, "_create_paths", full_disk)
    monkeypatch.setattr(orbax_future.multihost, "coordination_timeout", lambda: 20)
    with caplog.at_level("ERROR"):
        status = run_cli(convert_main, ["--source", six_step_run[0], "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip().splitlines()
        for thread in threading.enumerate():
            if isinstance(thread, orbax_future._SignalingThread):
                threading.Thread.join(thread)     # until it ends (orbax's join raises for a cancelled thread)
    assert status == 2 and err[-1].startswith(f"error: writing '{tmp_path / 'out'}' failed (")
    assert "No space left on device" in err[-1] and not any(line.startswith("Traceback") for line in err)
    assert "Timeout waiting for key" not in caplog.text
    assert not [p for p in (tmp_path / "out").glob("*") if "orbax-checkpoint-tmp" in p.name]


def test_preparing_a_dataset_whose_host_cannot_be_reached_fails_at_once_naming_the_host(tmp_path, capsys,
                                                                                          monkeypatch):
    import socket

    import tensorflow_datasets as tfds

    attempts = []

    def unreachable(address, *args, **kwargs):
        attempts.append(address)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def download_and_prepare(*args, **kwargs):          # TFDS's downloader retries for about 3.5 minutes
        raise AssertionError("TFDS's download started")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", download_and_prepare)
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    assert run_cli(prepare_main, ["--name", "mnist", "--data_dir", str(tmp_path / "tfds")]) == 2
    assert attempts == [("storage.googleapis.com", 443)]          # one connection, before anything is downloaded
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: cannot download 'mnist': storage.googleapis.com:443 cannot be reached (Name or "
                     "service not known); check the network (or HTTPS_PROXY), or prepare the dataset on a machine "
                     "that has one and copy its data dir here"]


def test_the_timm_worker_runs_in_a_python_with_torch_but_no_jax(tmp_path):
    """``--timm-python`` may name a Python with only torch and timm. Here: a Python in which jax, flax, optax and this
    package cannot be imported, and whose ``torch`` imports ``cProfile`` as the real one does (``cProfile`` imports
    the standard library's ``profile``, which a ``profile.py`` beside the worker script would hide) and then stops
    with its own message. The worker starts as a script, reaches torch, and reports torch's own message."""
    from layerscale_jax.bench import timm_worker
    from layerscale_jax.bench.step import StepSpec

    site = tmp_path / "site"
    for package in ("torch", "timm"):
        (site / package).mkdir(parents=True)
    (site / "timm" / "__init__.py").write_text("import torch  # noqa: F401\n")
    (site / "torch" / "__init__.py").write_text(
        "import cProfile  # noqa: F401\nraise ImportError('fake torch: its standard-library imports worked')\n")
    (site / "sitecustomize.py").write_text(            # run at start-up, before the worker script
        "import importlib.abc, sys\n"
        "class Blocker(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('jax', 'jaxlib', 'flax', 'optax', 'layerscale_jax'):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Blocker())\n")
    python = tmp_path / "python_with_torch_only"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    spec = StepSpec(batch=2, overrides=dict(img_size=16, patch_size=4, depth=1, embed_dim=32, num_heads=2,
                                            num_classes=10))
    timm = timm_worker.start(spec, str(python))
    assert timm["run"] is None
    assert timm["timm_skipped"] == (f"torch/timm not importable by {sys.executable} "
                                    "(ImportError: fake torch: its standard-library imports worked)")


@pytest.mark.slow
def test_an_unprepared_dataset_is_one_line_without_tfds_warnings_before_it(tmp_path, capsys, caplog):
    with caplog.at_level("WARNING"):
        status = run_cli(train_main, ["--config", DIGITS, "--workdir", str(tmp_path / "wd"),
                                      "--config.data.name=cifar10", f"--config.data.data_dir={tmp_path / 'data'}"])
    assert status == 2 and "python -m layerscale_jax.data.prepare --name=cifar10" in capsys.readouterr().err
    assert "has no dataset_info.json" not in caplog.text
