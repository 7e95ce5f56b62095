"""The train loop: sharded = single-device, multi-process = single-process, exact resume, fallback, guards."""
import glob
import json
import os
import re
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from layerscale_jax import data as data_lib
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train import sharding as shard_lib
from layerscale_jax.storage.checkpoint import Checkpointer
from layerscale_jax.train.guard import NonFiniteError
from layerscale_jax.train.config import validate_experiment_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "configs", "tiny_synthetic.py")
STEPS = 24
CHECKPOINT_EVERY = 8        # checkpoints at 8, 16 and 24: a save costs more than the steps between them here


def tiny_config(arg=None):
    import importlib.util
    spec = importlib.util.spec_from_file_location("tiny_synthetic", TINY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def run_config():
    """The 24-step run the tests here train, interrupt and resume."""
    config = tiny_config(f"steps={STEPS}")
    config.train.checkpoint_every = CHECKPOINT_EVERY
    return config


def read_metrics(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def train_losses(workdir):
    return {r["step"]: r["train_loss"] for r in read_metrics(workdir) if "train_loss" in r}


def subprocess_env(num_devices=8):
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(num_devices), JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def cli(workdir, *extra):
    return [sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps={STEPS}", f"--workdir={workdir}",
            *extra]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted run on 8 devices (data parallel), in this process."""
    workdir = str(tmp_path_factory.mktemp("reference"))
    results = loop_lib.train_and_evaluate(validate_experiment_config(run_config()), workdir)
    return workdir, results


def final_params(workdir, config=None):
    config = config or run_config()
    mesh = shard_lib.make_mesh(config.train.mesh)
    trainer = loop_lib.create_trainer(validate_experiment_config(config), mesh)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=10)
    step, state, _, _ = checkpointer.restore(trainer.abstract_state)
    checkpointer.close()
    assert step == STEPS
    return jax.device_get(state["params"])


# -- metrics and results ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_run_writes_metrics_tensorboard_and_results(reference_run):
    workdir, results = reference_run
    records = read_metrics(workdir)
    steps = [r["step"] for r in records if "train_loss" in r]
    assert steps == list(range(1, STEPS + 1))
    for key in ("train_loss", "learning_rate", "grad_norm", "img_per_s"):
        assert all(np.isfinite(r[key]) for r in records if "train_loss" in r), key
    eval_record = [r for r in records if "test_accuracy" in r][-1]
    params = final_params(workdir)                 # the evaluated step's parameters, from its checkpoint
    for layer, branch, scale in ((0, "attn", "ls1"), (1, "mlp", "ls2")):
        gamma = np.asarray(params["blocks"][layer][scale]["gamma"])
        assert eval_record[f"diag/blocks.{layer}.{branch}.scale"] == pytest.approx(np.abs(gamma).mean(), rel=1e-6)
        assert eval_record[f"diag/blocks.{layer}.{branch}.ratio"] > 0
        assert eval_record[f"diag/blocks.{layer}.grad_norm"] > 0
    assert glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))
    with open(os.path.join(workdir, "results.json")) as f:
        saved = json.load(f)
    for key in ("test_accuracy", "test_loss", "steps", "train_seconds"):
        assert key in saved
    assert saved["steps"] == STEPS
    assert saved["test_examples"] == 40          # every test example counted exactly once


# -- sharding ----------------------------------------------------------------------------------------------------

def _sharded_run(scan_layers, mesh_axes, devices, initial_state=None, n_steps=2):
    """``n_steps`` train steps on ``mesh_axes`` from ``initial_state`` (host arrays) or a fresh init."""
    config = tiny_config(f"scan_layers={scan_layers}")
    config.train.mesh = mesh_axes
    mesh = shard_lib.make_mesh(config.train.mesh, devices)
    trainer = loop_lib.create_trainer(validate_experiment_config(config), mesh)
    if initial_state is None:
        state = trainer.init_state()
        initial_state = jax.device_get(state)
    else:
        state = jax.device_put(initial_state, trainer.state_shardings)
    iterator = data_lib.make_train_iterator(config.data, global_batch_size=config.train.batch_size, seed=0)
    losses = []
    for _ in range(n_steps):
        state, metrics = trainer.train_step(state, data_lib.to_global_batch(next(iterator), mesh))
        losses.append(float(metrics["train_loss"]))
    return losses, jax.device_get(state["params"]), initial_state


@pytest.mark.parametrize("scan_layers,layouts", [
    (False, [{"data": 8, "fsdp": 1, "tensor": 1}, {"data": 1, "fsdp": 8, "tensor": 1},
             {"data": 2, "fsdp": 2, "tensor": 2}]),
    (True, [{"data": 2, "fsdp": 2, "tensor": 2}]),
], ids=["unrolled", "scanned"])
@pytest.mark.slow
def test_sharded_steps_equal_single_device_steps(scan_layers, layouts):
    single_losses, single_params, initial = _sharded_run(scan_layers, {"data": 1}, jax.devices()[:1])
    for layout in layouts:
        losses, params, _ = _sharded_run(scan_layers, layout, jax.devices(), initial)
        np.testing.assert_allclose(losses, single_losses, atol=1e-5, err_msg=str(layout))
        diffs = jax.tree.map(lambda a, b: float(np.max(np.abs(a - b))), params, single_params)
        assert max(jax.tree.leaves(diffs)) < 1e-5, (layout, diffs)


def test_fsdp_and_tensor_rules_shard_parameters():
    config = tiny_config()
    mesh = shard_lib.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    trainer = loop_lib.create_trainer(validate_experiment_config(config), mesh)
    specs = trainer.param_sharding
    assert tuple(specs["blocks"][0]["mlp"]["fc1"]["kernel"].value.spec) == ("fsdp", "tensor")
    assert tuple(specs["blocks"][0]["attn"]["proj"]["kernel"].value.spec) == ("tensor", "fsdp")
    opt_specs = [s.spec for s in jax.tree.leaves(trainer.state_shardings["opt_state"])]
    assert any(tuple(s) == ("fsdp", "tensor") for s in opt_specs)   # optimizer moments sharded like params


# -- errors at the boundary -------------------------------------------------------------------------------------

def test_mesh_that_does_not_match_device_count_is_rejected():
    with pytest.raises(ValueError, match=r"needs 6 devices but 8"):
        shard_lib.make_mesh({"data": 3, "fsdp": 2, "tensor": 1})


def test_batch_that_does_not_divide_the_mesh_is_rejected():
    config = tiny_config()
    config.train.batch_size = 12
    with pytest.raises(ValueError, match=r"train.batch_size=12 is not divisible by the 8 devices"):
        loop_lib.create_trainer(validate_experiment_config(config), shard_lib.make_mesh({"data": -1}))


def test_model_that_does_not_match_the_dataset_is_rejected():
    config = tiny_config()
    config.model.num_classes = 7
    with pytest.raises(ValueError, match=r"model.num_classes=7 does not match"):
        loop_lib.create_trainer(validate_experiment_config(config), shard_lib.make_mesh({"data": -1}))


def test_bad_train_field_is_rejected():
    config = tiny_config()
    config.train.nonfinite = "ignore"
    with pytest.raises(ValueError, match=r"train.nonfinite='ignore'"):
        loop_lib.create_trainer(validate_experiment_config(config), shard_lib.make_mesh({"data": -1}))


# -- resume ------------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_then_resume_gives_identical_losses_and_parameters(reference_run, tmp_path):
    ref_dir, _ = reference_run
    workdir = str(tmp_path / "interrupted")
    proc = subprocess.Popen(cli(workdir, "--config.train.checkpoint_every=0"), env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []                      # metrics.jsonl is flushed every 10 s and at checkpoints: watch the progress lines
    for line in proc.stdout:
        seen.append(line)
        if (shown := re.search(r"\] (\d+)/", line)) and int(shown.group(1)) >= 3:
            break
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    output = "".join(seen) + output
    assert proc.returncode == 143, output                # stopped by a preemption notice: rerun to resume
    interrupted_at = max(train_losses(workdir))
    assert interrupted_at < STEPS, "the run finished before it could be interrupted"
    assert "stopped at step" in output
    loop_lib.train_and_evaluate(validate_experiment_config(run_config()), workdir)
    resumed, reference = train_losses(workdir), train_losses(ref_dir)
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [resumed[s] for s in range(1, STEPS + 1)] == [reference[s] for s in range(1, STEPS + 1)]
    ours, theirs = final_params(workdir), final_params(ref_dir)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), ours, theirs)))


@pytest.mark.slow
def test_resume_onto_a_smaller_mesh(reference_run, tmp_path):
    ref_dir, _ = reference_run
    workdir = str(tmp_path / "remesh")
    config = run_config()
    config.train.stop_after_steps = 10
    assert loop_lib.train_and_evaluate(validate_experiment_config(config), workdir) == {"preempted_at_step": 10}
    config = run_config()
    config.train.mesh = {"data": 2, "fsdp": 2, "tensor": 1}
    loop_lib.train_and_evaluate(validate_experiment_config(config), workdir, devices=jax.devices()[:4])
    resumed, reference = train_losses(workdir), train_losses(ref_dir)
    np.testing.assert_allclose([resumed[s] for s in range(11, STEPS + 1)],
                               [reference[s] for s in range(11, STEPS + 1)], atol=1e-5)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(reference_run, tmp_path, caplog):
    import shutil
    ref_dir, _ = reference_run
    workdir = str(tmp_path / "corrupt")
    shutil.copytree(os.path.join(ref_dir, "checkpoints"), os.path.join(workdir, "checkpoints"))
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=10)
    steps = sorted(checkpointer.manager.all_steps())
    assert steps[-1] == STEPS and len(steps) >= 2
    for path in glob.glob(os.path.join(workdir, "checkpoints", str(STEPS), "state", "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "wb") as f:
                f.write(b"garbage")
    trainer = loop_lib.create_trainer(validate_experiment_config(run_config()), shard_lib.make_mesh({"data": -1}))
    with caplog.at_level("WARNING"):
        step, state, data_state, _ = checkpointer.restore(trainer.abstract_state)
    checkpointer.close()
    assert step == steps[-2]
    assert f"checkpoint at step {STEPS}" in caplog.text


# -- non-finite guard --------------------------------------------------------------------------------------------

def _exploding_config(mode):
    config = run_config()
    config.optim.name = "sgd"
    config.optim.learning_rate = 1e30
    config.optim.warmup_steps = 0
    config.optim.schedule = "constant"
    config.optim.grad_clip_norm = 0.0
    config.train.nonfinite = mode
    return config


@pytest.mark.slow
def test_nonfinite_loss_stops_the_run_naming_step_and_checkpoint(tmp_path):
    workdir = str(tmp_path / "nan")
    with pytest.raises(NonFiniteError, match=r"non-finite loss, gradient norm or update at step \d+"):
        loop_lib.train_and_evaluate(validate_experiment_config(_exploding_config("raise")), workdir)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), keep=10)
    experiment = validate_experiment_config(_exploding_config("raise"))
    trainer = loop_lib.create_trainer(experiment, shard_lib.make_mesh({"data": -1}))
    restored = checkpointer.restore(trainer.abstract_state)
    checkpointer.close()
    if restored is not None:                     # whatever was saved is finite
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(restored[1]["params"]))


@pytest.mark.slow
def test_nonfinite_skip_mode_skips_updates_and_counts_them(tmp_path, capsys):
    """The count is in the final line (it was only in results.json)."""
    results = loop_lib.train_and_evaluate(validate_experiment_config(_exploding_config("skip")), str(tmp_path / "skip"))
    assert results["nonfinite_steps"] > 0
    assert results["steps"] == STEPS
    final = [line for line in capsys.readouterr().out.splitlines() if line.startswith("test accuracy")]
    assert f"({results['nonfinite_steps']} of the {STEPS} steps were skipped" in final[-1]


def test_a_non_finite_loss_is_logged_without_a_tensorboard_warning_for_each(tmp_path, caplog):
    from layerscale_jax.train.metrics import MetricsWriter
    writer = MetricsWriter(tmp_path, total_steps=2)
    with caplog.at_level("WARNING"):
        writer.write(1, {"train_loss": float("nan"), "grad_norm": float("inf")})
    writer.close()
    assert "NaN or Inf" not in caplog.text
    assert read_metrics(str(tmp_path))[0]["step"] == 1


@pytest.mark.slow
def test_a_metric_added_in_the_task_alone_is_logged_shown_and_in_the_results(tmp_path, monkeypatch, capsys):
    """A train statistic and an evaluation metric added to a task (``train/tasks.py``) and nowhere else reach
    metrics.jsonl, the console line and results.json."""
    import jax.numpy as jnp

    from layerscale_jax.train import tasks as tasks_lib

    class WithTop2(tasks_lib.ClassificationTask):
        eval_metrics = (*tasks_lib.ClassificationTask.eval_metrics, "top2")

        def loss(self, model, images, targets, key):
            loss, statistics = super().loss(model, images, targets, key)
            return loss, {**statistics, "top_target": jnp.mean(jnp.max(targets, -1))}

        def eval_values(self, model, batch):
            top2 = jnp.argsort(model(batch["image"]), -1)[:, -2:]
            return {**super().eval_values(model, batch),
                    "top2": jnp.any(top2 == batch["label"][:, None], -1).astype(jnp.float32)}

    monkeypatch.setattr(tasks_lib, "for_model", lambda model, eval_split="test": WithTop2(eval_split))
    workdir = str(tmp_path / "run")
    results = loop_lib.train_and_evaluate(validate_experiment_config(tiny_config("steps=3")), workdir)
    assert results["test_accuracy"] <= results["test_top2"] <= 1.0 and results["test_examples"] == 40
    logged = read_metrics(workdir)
    assert all("train_top_target" in r for r in logged if "train_loss" in r)
    assert logged[-1]["test_top2"] == results["test_top2"]
    assert "test_top2" in capsys.readouterr().err.splitlines()[-1]


# -- multi-process: tests/test_multihost.py ---------------------------------------------------------------------


# -- starting from converted weights ------------------------------------------------------------------------------

def _saved_tiny_model(tmp_path, **overrides):
    from layerscale_jax.convert import save_pretrained
    from layerscale_jax.models import create_model
    from layerscale_jax.train.config import model_overrides
    config = tiny_config()
    model = create_model(config.model.name, rngs=nnx.Rngs(123), **{**model_overrides(config.model), **overrides})
    out = str(tmp_path / "pretrained")
    save_pretrained(model, out, name=config.model.name)
    return out, jax.device_get(nnx.state(model, nnx.Param))


@pytest.mark.slow
def test_init_from_starts_from_the_saved_weights(tmp_path):
    source, saved = _saved_tiny_model(tmp_path)
    config = tiny_config()
    config.train.init_from = source
    trainer = loop_lib.create_trainer(validate_experiment_config(config), shard_lib.make_mesh({"data": -1}))
    state = trainer.init_state()
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), jax.device_get(state["params"]), saved)
    assert all(jax.tree.leaves(same))


@pytest.mark.slow
def test_init_from_with_mismatched_parameters_lists_them(tmp_path):
    source, _ = _saved_tiny_model(tmp_path, depth=3)
    config = tiny_config()
    config.train.init_from = source
    trainer = loop_lib.create_trainer(validate_experiment_config(config), shard_lib.make_mesh({"data": -1}))
    with pytest.raises(ValueError, match=r"blocks\.2"):
        trainer.init_state()


@pytest.mark.slow
def test_a_run_evaluated_on_validation_names_its_metrics_val_not_test(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("digits", os.path.join(ROOT, "configs", "digits_layerscale.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config("depth=1,embed_dim=16,num_heads=2,steps=4")
    config.data.train_split, config.data.eval_split = "train_without_validation", "validation"
    config.optim.warmup_steps = 1
    config.train.log_every, config.train.eval_every, config.train.checkpoint_every = 2, 2, 2
    results = loop_lib.train_and_evaluate(validate_experiment_config(config), str(tmp_path))
    assert results["val_examples"] == 285 and 0 <= results["val_accuracy"] <= 1
    assert not [k for k in results if k.startswith("test_")]
    evaluations = [r for r in read_metrics(tmp_path) if "val_accuracy" in r]
    assert [r["step"] for r in evaluations] == [2, 4]      # the checkpoints of both kept the best by val_accuracy


@pytest.mark.slow
def test_a_damaged_compilation_cache_entry_is_replaced_by_the_next_compile(tmp_path):
    """An entry overwritten with random bytes: JAX warns once and compiles, replacing the entry; the next run loads
    the replaced entry without a warning."""
    import subprocess
    import sys
    cache = tmp_path / "cache"
    program = ("import sys; from layerscale_jax.storage.compile_cache import use_compilation_cache; "
               "use_compilation_cache(sys.argv[1]); import jax, jax.numpy as jnp; "
               "print(jax.jit(lambda x: jnp.sin(x) * 2 + 1)(jnp.arange(3.0)))")

    def run():
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
        env.pop("JAX_COMPILATION_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", program, str(cache)], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr
        return done.stderr

    run()
    entries = sorted(cache.glob("*-cache"))
    assert entries
    for entry in entries:
        entry.write_bytes(np.random.default_rng(0).bytes(entry.stat().st_size))
    assert "Error reading persistent compilation cache entry" in run()
    assert "Error reading persistent compilation cache entry" not in run()
