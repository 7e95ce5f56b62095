"""The Python API (``layerscale_jax.api``, exported from ``layerscale_jax``): configs in, runs and models out."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from flax import nnx

import layerscale_jax as lsj
from layerscale_jax.errors import UserError
from layerscale_jax.train.__main__ import parse_command_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(ROOT, "configs", "digits_layerscale.py")
TINY = {"model.embed_dim": 16, "model.num_heads": 2, "train.batch_size": 32, "train.log_every": 4,
        "train.eval_every": 6, "optim.warmup_steps": 2}


def tiny_config(**sections):
    return lsj.load_config(f"{DIGITS}:depth=2,steps=12", TINY, **sections)


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory):
    """A finished 12-step run that kept an EMA of its parameters (so its evaluation used the EMA)."""
    config = tiny_config(optim={"ema_decay": 0.5})
    return lsj.fit(config, tmp_path_factory.mktemp("api") / "run")


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """``(workdir, config, the exception)`` of a run (no EMA) that SIGINT stopped after its first logged step."""
    config = tiny_config(train={"steps": 150, "log_every": 1, "eval_every": 0, "checkpoint_every": 0})
    workdir = tmp_path_factory.mktemp("api") / "interrupted"

    def interrupt_after_the_first_logged_step():
        while not (workdir / "metrics.jsonl").exists():
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_after_the_first_logged_step, daemon=True).start()
    with pytest.raises(KeyboardInterrupt) as err:
        lsj.fit(config, workdir)
    return workdir, config, err.value


def _cli_error(argv):
    with pytest.raises((UserError, ValueError)) as err:
        parse_command_line(argv + ["--workdir", "unused"])
    return str(err.value)


def test_an_unknown_field_raises_the_command_lines_message():
    cli = _cli_error(["--config", DIGITS, "--config.train.stepz=3"])
    with pytest.raises(UserError) as err:
        lsj.load_config(DIGITS, {"train.stepz": 3})
    assert str(err.value) == cli and "did you mean 'config.train.steps'" in cli
    with pytest.raises(UserError) as err:
        lsj.load_config(DIGITS, train={"stepz": 3})
    assert str(err.value) == cli


def test_a_bad_value_or_file_raises_the_command_lines_message(tmp_path):
    cli = _cli_error(["--config", DIGITS, "--config.train.steps=-1"])
    with pytest.raises(ValueError) as err:
        lsj.load_config(DIGITS, {"train.steps": -1})
    assert str(err.value) == cli == "train.steps=-1 must be a positive integer"
    missing = str(tmp_path / "nope.py")
    with pytest.raises(UserError) as err:
        lsj.load_config(missing)
    assert str(err.value) == _cli_error(["--config", missing])
    with pytest.raises(ValueError, match=r"config.train.steps='many'"):
        lsj.load_config(DIGITS, {"train.steps": "many"})


def test_overrides_take_the_config_file_argument_syntax_and_leave_the_original_unchanged():
    base = lsj.load_config(f"{DIGITS}:depth=6")
    changed = lsj.override_config(base, {"model.depth": 3}, train={"mesh": {"data": 1}, "steps": 70})
    assert (base.model.depth, base.train.steps, base.train.mesh.data) == (6, 1000, -1)
    assert (changed.model.depth, changed.train.steps, changed.train.mesh.data) == (3, 70, 1)


def test_importing_the_package_needs_no_config_or_data_stack():
    code = ("import sys\n"
            "for name in ('ml_collections', 'tensorflow', 'tensorflow_datasets', 'grain'): sys.modules[name] = None\n"
            "import layerscale_jax\n"
            "assert 'fit' in dir(layerscale_jax) and 'layerscale_jax.api' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_fit_returns_the_results_history_and_model(ema_run):
    results = json.loads((ema_run.workdir / "results.json").read_text())
    assert ema_run.finished and ema_run.results == results and ema_run.step == 12
    steps, loss = ema_run.series("train_loss")
    assert list(steps) == [4, 8, 12] and np.all(np.isfinite(loss))
    assert list(ema_run.series("test_accuracy")[0]) == [6, 12]
    assert isinstance(ema_run.model, nnx.Module) and ema_run.model.deterministic     # eval mode
    with pytest.raises(KeyError, match="did you mean 'train_loss'"):
        ema_run.series("train_los")


@pytest.mark.slow
def test_evaluate_reproduces_the_runs_test_accuracy(ema_run):
    """The model comes back with the weights the run evaluated (its EMA here): the same accuracy, exactly."""
    metrics = lsj.evaluate(ema_run.model, ema_run.config)
    assert metrics["test_accuracy"] == ema_run.results["test_accuracy"]
    assert metrics["test_loss"] == pytest.approx(ema_run.results["test_loss"], rel=1e-5)


@pytest.mark.slow
def test_the_loaded_parameters_are_the_trained_ones(ema_run):
    """The loop logged diagnostics of its final parameters on the seed's first train batch; the loaded
    parameters (not the EMA) give the same values on that batch."""
    model = lsj.load_run(ema_run.workdir, ema=False).model
    diag = lsj.diagnose(model, lsj.example_batch(ema_run.config, "train"))
    logged = ema_run.history[-1]
    assert logged["step"] == 12 and "test_accuracy" in logged
    for quantity in ("attn.ratio", "mlp.scale", "grad_norm"):
        expected = [logged[f"diag/blocks.{i}.{quantity}"] for i in range(2)]
        np.testing.assert_allclose(diag[f"blocks/{quantity}"], expected, rtol=1e-4)
    assert diag["loss"] == pytest.approx(logged["diag/loss"], rel=1e-4)


@pytest.mark.slow
def test_ema_weights_on_request(ema_run, tmp_path):
    ema = nnx.state(lsj.load_run(ema_run.workdir, ema=True).model, nnx.Param)
    params = nnx.state(lsj.load_run(ema_run.workdir, ema=False).model, nnx.Param)
    default = nnx.state(ema_run.model, nnx.Param)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(default)))
    assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(params)))


@pytest.mark.slow
def test_a_run_without_ema_refuses_the_ema_option(interrupted_run):
    with pytest.raises(ValueError, match="holds no EMA"):
        lsj.load_run(interrupted_run[0], ema=True)


@pytest.mark.slow
def test_fitting_again_in_the_same_process_gives_the_same_run(ema_run, tmp_path):
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    again = lsj.fit(ema_run.config, tmp_path / "again")
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert not (tmp_path / "again" / "lock.json").exists()
    assert again.results["test_accuracy"] == ema_run.results["test_accuracy"]
    assert again.series("train_loss")[1].tolist() == ema_run.series("train_loss")[1].tolist()
    # a finished workdir is returned as it is, without training
    assert lsj.fit(ema_run.config, tmp_path / "again").results == again.results


@pytest.mark.slow
def test_ctrl_c_stops_at_a_step_boundary_and_the_workdir_resumes(interrupted_run):
    workdir, config, interrupt = interrupted_run
    assert isinstance(interrupt, lsj.TrainingInterrupted) and 1 <= interrupt.step < config.train.steps
    stopped = lsj.load_run(workdir)
    assert stopped.step == interrupt.step and not stopped.finished
    assert max(record["step"] for record in stopped.history) == interrupt.step
    resumed = lsj.fit(config, workdir)
    assert resumed.results["resumed_from_step"] == stopped.step and resumed.step == config.train.steps


@pytest.mark.slow
def test_a_run_split_by_stop_after_steps_returns_unfinished(interrupted_run, tmp_path):
    config = lsj.override_config(interrupted_run[1], {"train.stop_after_steps": 3})
    run = lsj.fit(config, tmp_path / "slot")
    assert run.step == 3 and not run.finished and run.results is None


def test_example_batch_of_the_eval_split_is_its_first_examples():
    config = tiny_config()
    batch = lsj.example_batch(config, size=5)
    assert batch["image"].shape == (5, 8, 8, 1) and batch["label"].shape == (5,)
    assert np.array_equal(lsj.example_batch(config, size=3)["label"], batch["label"][:3])
    with pytest.raises(ValueError, match="split='test'"):
        lsj.example_batch(config, "test")


@pytest.mark.slow
def test_evaluate_on_another_split_counts_each_of_its_examples_once(ema_run):
    stored = lsj.load_run(ema_run.workdir)          # the config read back from the checkpoint works as well
    metrics = lsj.evaluate(stored.model, stored.config, split="validation")
    assert metrics["val_examples"] == 285 and 0 <= metrics["val_accuracy"] <= 1     # digits' validation split
    with pytest.raises(ValueError, match="data.eval_split='nope'"):
        lsj.evaluate(stored.model, stored.config, split="nope")


def test_progress_watched_live_is_one_line_updated_in_place(tmp_path, monkeypatch):
    import io

    from layerscale_jax.train.metrics import MetricsWriter

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    writer = MetricsWriter(tmp_path, total_steps=4)
    writer.progress(2, {"train_loss": 2.5})
    writer.progress(2, {"test_accuracy": 0.25})
    writer.progress(4, {"train_loss": 1.5})
    writer.close()
    shown = terminal.getvalue()
    assert shown.count("\n") == 1 and shown.endswith("\n") and shown.count("\r") == 3
    last = shown.rsplit("\r", 1)[1]
    assert "4/4" in last and "train_loss 1.5" in last and "test_accuracy 0.25" in last   # newest of each


@pytest.mark.slow
def test_a_torn_metrics_line_is_dropped_and_restart_starts_over_where_no_checkpoint_is_usable(ema_run, tmp_path):
    import shutil

    from layerscale_jax.storage.workdir import WorkdirError

    workdir = tmp_path / "run"
    shutil.copytree(ema_run.workdir, workdir)
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "train_lo')                           # the disk filled in the middle of a line
    assert lsj.load_run(workdir).history == ema_run.history
    shutil.rmtree(workdir / "checkpoints")                           # an earlier run's logs, no checkpoint
    config = tiny_config(optim={"ema_decay": 0.5})
    with pytest.raises(WorkdirError, match="--restart"):
        lsj.fit(config, workdir)
    run = lsj.fit(config, workdir, restart=True)
    assert run.results == {**ema_run.results, "train_seconds": run.results["train_seconds"],
                           "goodput": run.results["goodput"]}                   # timings
    assert run.goodput["attempts"] == 1                            # the earlier run's account moved aside with it
    (previous,) = (workdir / "previous").iterdir()
    assert (previous / "metrics.jsonl").exists()


@pytest.mark.slow
def test_workdirs_are_read_as_the_command_line_reads_them(ema_run, tmp_path, monkeypatch):
    """``~``, ``file://`` and relative workdirs name the directory the CLI would use; another scheme is refused
    before anything is written (it trained into ``<cwd>/file:/...`` or ``<cwd>/memory:/...``)."""
    import shutil
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    shutil.copytree(ema_run.workdir, tmp_path / "home" / "run")
    by_home = lsj.load_run("~/run")
    assert by_home.workdir == tmp_path / "home" / "run" and by_home.step == ema_run.step
    assert lsj.load_run(f"file://{tmp_path}/home/run").step == ema_run.step
    assert lsj.fit(ema_run.config, "file://~/run").results == by_home.results     # finished: returned as it is
    for url, message in (("memory://run", "scheme 'memory://' is not supported"), ("gs://bucket/run", "local")):
        with pytest.raises(UserError, match=message):
            lsj.fit(ema_run.config, url)
        with pytest.raises(UserError, match=message):
            lsj.load_run(url)
    assert sorted(os.listdir(tmp_path)) == ["home"]
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="'weights.safetensors' is a file, not a training workdir"):
        lsj.load_run("weights.safetensors")


@pytest.mark.slow
def test_a_damaged_results_file_is_named_with_what_to_do(ema_run, tmp_path):
    import shutil
    workdir = tmp_path / "damaged"
    shutil.copytree(ema_run.workdir, workdir)
    (workdir / "results.json").write_text('{"test_accuracy": 0.5, steps')
    with pytest.raises(UserError, match=r"results\.json is damaged \(Expecting .*\); delete it and rerun fit"):
        lsj.load_run(workdir)
    (workdir / "results.json").unlink()
    assert lsj.fit(ema_run.config, workdir).results["test_accuracy"] == ema_run.results["test_accuracy"]
