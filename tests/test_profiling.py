"""Profiles on demand (``train.profile_steps``, train/profiling.py): the trace of the asked steps where TensorBoard's
profile plugin reads it, each step named; the same metrics as without; no profiler call when off; bad values refused
at validation."""
import glob
import gzip
import json
import os
import re
import subprocess
import sys

import jax
import pytest

from layerscale_jax.errors import ConfigError
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config, validate_train_config
from layerscale_jax.train.profiling import STEP_NAME, StepProfile

from test_train import ROOT, TINY, read_metrics, subprocess_env, tiny_config

STEPS = 6


def _config(**train):
    config = tiny_config(f"steps={STEPS}")
    for key, value in train.items():
        config.train[key] = value
    return config


def _experiment(**train):
    return validate_experiment_config(_config(**train))


def _no_timing(workdir):
    return [{k: v for k, v in r.items() if k != "img_per_s"} for r in read_metrics(workdir)]


def _sessions(workdir):
    return sorted(glob.glob(os.path.join(workdir, "tensorboard", "plugins", "profile", "*")))


def _traced_steps(session):
    """The step numbers of the ``train_step`` annotations in a session's trace (its Chrome-trace JSON)."""
    (path,) = glob.glob(os.path.join(session, "*.trace.json.gz"))
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == STEP_NAME and "args" in e)


@pytest.fixture(scope="module")
def unprofiled(tmp_path_factory):
    """A run with ``train.profile_steps = ()`` while the profile's code and jax.profiler's sessions and step
    annotations raise: none is called. (``TraceAnnotation`` is left alone: grain annotates its own reads with it, a
    no-op without a running trace.)"""
    def refuse(*args, **kwargs):
        raise AssertionError("profiler called with train.profile_steps = ()")

    workdir = str(tmp_path_factory.mktemp("unprofiled"))
    with pytest.MonkeyPatch.context() as patch:
        for name in ("start_trace", "stop_trace", "trace", "ProfileSession", "ProfileOptions", "StepTraceAnnotation",
                     "start_server"):
            patch.setattr(jax.profiler, name, refuse)
        for name in ("step", "close", "_start"):
            patch.setattr(StepProfile, name, refuse)
        loop_lib.train_and_evaluate(_experiment(), workdir)
    assert not os.path.exists(os.path.join(workdir, "tensorboard", "plugins"))
    return workdir


@pytest.mark.slow
def test_off_calls_no_profiler(unprofiled):
    assert len(read_metrics(unprofiled)) >= STEPS


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The same run with ``train.profile_steps = (3, 5)``: its workdir and what it printed."""
    workdir = str(tmp_path_factory.mktemp("profiled"))
    with pytest.MonkeyPatch.context() as patch:
        printed = []
        patch.setattr("builtins.print", lambda *args, **kwargs: printed.append(" ".join(map(str, args))))
        loop_lib.train_and_evaluate(_experiment(profile_steps=(3, 5)), workdir)
    return workdir, printed


@pytest.mark.slow
def test_profile_traces_the_asked_steps_with_the_same_metrics(unprofiled, profiled):
    workdir, printed = profiled
    (session,) = _sessions(workdir)
    assert os.path.basename(session).startswith("steps_3-5_")
    assert glob.glob(os.path.join(session, "*.xplane.pb"))           # what TensorBoard's profile plugin / XProf read
    assert _traced_steps(session) == [3, 4, 5]
    assert any(line.startswith(f"profile of steps 3-5: {session} ") for line in printed)
    assert _no_timing(workdir) == _no_timing(unprofiled)            # every metric of every step, bit for bit


@pytest.mark.slow
def test_xprof_reads_the_trace(profiled):
    """XProf (``pip install -e ".[profile]"``; skipped without it) shows the traced steps by name."""
    raw_to_tool_data = pytest.importorskip("xprof.convert.raw_to_tool_data")
    (session,) = _sessions(profiled[0])
    data, _ = raw_to_tool_data.xspace_to_tool_data(glob.glob(os.path.join(session, "*.xplane.pb")), "trace_viewer",
                                                   {})
    text = data.decode() if isinstance(data, bytes) else data
    assert sorted(set(re.findall(rf"{STEP_NAME} \d+", text))) == [f"{STEP_NAME} {n}" for n in (3, 4, 5)]


@pytest.mark.slow
def test_a_resume_inside_the_range_traces_the_rest(tmp_path):
    """A first attempt stopped after step 4 traces steps 3-4; the resume traces 5-6; a later start traces nothing."""
    workdir = str(tmp_path)
    config = _config(profile_steps=(3, 6), stop_after_steps=4, profile_all_processes=True)
    assert loop_lib.train_and_evaluate(validate_experiment_config(config), workdir) == {"preempted_at_step": 4}
    (first,) = _sessions(workdir)
    assert _traced_steps(first) == [3, 4] and first.endswith("_process0")
    loop_lib.train_and_evaluate(_experiment(profile_steps=(3, 6), profile_all_processes=True), workdir)
    second = [s for s in _sessions(workdir) if s != first]
    assert len(second) == 1 and os.path.basename(second[0]).startswith("steps_5-6_")
    assert _traced_steps(second[0]) == [5, 6]


@pytest.mark.parametrize("value", [(0, 2), (4, 3), (1, STEPS + 1), (2,), "2,3", (1.0, 2), (True, 2)])
def test_bad_ranges_are_one_error_naming_the_field(value):
    expected = (rf"^train\.profile_steps={re.escape(repr(value))} must be \(\) \(no profile\) or \(first, last\), "
                rf"the train steps to trace, integers with 1 ≤ first ≤ last ≤ train\.steps={STEPS}$")
    with pytest.raises(ConfigError, match=expected):
        validate_train_config({"steps": STEPS, "profile_steps": value})
    if not isinstance(value, str):                  # a ConfigDict refuses a str for a tuple field itself
        with pytest.raises(ConfigError, match=expected.replace(re.escape(repr(value)), ".*")):
            _experiment(profile_steps=value)


def test_profile_all_processes_is_a_bool():
    with pytest.raises(ConfigError, match=r"^train\.profile_all_processes=1 must be a bool$"):
        validate_train_config({"profile_all_processes": 1})


@pytest.mark.slow
def test_the_command_line_refuses_a_bad_range_before_training(tmp_path):
    result = subprocess.run([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps={STEPS}",
                             f"--workdir={tmp_path}", "--config.train.profile_steps=(5,9)"],
                            capture_output=True, text=True, env=subprocess_env(1), cwd=ROOT, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: train.profile_steps=(5, 9) must be () (no profile) or (first, last), the train steps to trace, "
        f"integers with 1 ≤ first ≤ last ≤ train.steps={STEPS}")
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


def test_a_run_stored_before_the_fields_existed_resumes_and_the_fields_may_change():
    from layerscale_jax.storage.workdir import config_changes
    stored = {"train": {"steps": 6}}
    assert config_changes(stored, {"train": {"steps": 6, "profile_steps": [], "profile_all_processes": False}}) == (
        [], [])
    assert config_changes(stored, {"train": {"steps": 6, "profile_steps": [2, 3], "profile_all_processes": True}}) == (
        [], ["train.profile_all_processes: False → True", "train.profile_steps: [] → [2, 3]"])
