"""The goodput account (train/goodput.py): every attempt's wall time by cause in goodput.jsonl, the steps a resume
trained again counted exactly, the causes summing to the wall time, an attempt killed with kill -9 counted up to
its last record; results.json, load_run, TensorBoard and the command show it."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from layerscale_jax.train import goodput as goodput_lib
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train import saving as saving_lib
from layerscale_jax.train.config import validate_experiment_config

from test_train import ROOT, TINY, subprocess_env, tiny_config

STEPS = 24
TOLERANCE_S = 0.5     # an attempt's wall time vs the time its call took: what lies before the account and after


def _config(steps=STEPS, **train):
    config = tiny_config(f"steps={steps}")
    config.train.checkpoint_every = 4
    config.train.log_every = 1
    for key, value in train.items():
        config.train[key] = value
    return config


def _preempted_without_a_save(patch):
    """A stop (``train.stop_after_steps``) whose save is skipped, as when ``train.stop_deadline_seconds`` leaves no
    time for one: the steps after the last checkpoint are lost, and the resume trains them again."""
    patch.setattr(saving_lib, "_no_time_to_save", lambda deadline, checkpointer: "the test's preemption")


def _sums_to_wall(attempt):
    assert sum(attempt["seconds"].values()) == pytest.approx(attempt["wall_seconds"], rel=1e-9, abs=1e-6)


@pytest.mark.slow
def test_a_run_preempted_twice_counts_exactly_the_steps_it_redid(tmp_path, capsys):
    """Preempted after 11 steps of each start without a save (checkpoints every 4 steps): the resumes from 8 and 16
    train 9-11 and 17-19 again, 3 + 3 steps; every attempt's causes sum to its wall time, which is the time its
    call took within ``TOLERANCE_S``."""
    workdir = str(tmp_path)
    took = []
    for stop_after in (11, 11, 0):
        with pytest.MonkeyPatch.context() as patch:
            _preempted_without_a_save(patch)
            started = time.time()
            experiment = validate_experiment_config(_config(stop_after_steps=stop_after))
            results = loop_lib.train_and_evaluate(experiment, workdir)
            took.append(time.time() - started)
        if stop_after:
            assert results == {"preempted_at_step": 11 if len(took) == 1 else 19}
    attempts = goodput_lib.read_attempts(os.path.join(workdir, "goodput.jsonl"))
    assert [(a["attempt"], a["start_step"], a["step"], a["reached_before"], a["redone_steps"], a["final"])
            for a in attempts] == [(1, 0, 11, 0, 0, True), (2, 8, 19, 11, 3, True), (3, 16, 24, 19, 3, True)]
    for attempt, seconds in zip(attempts, took):
        _sums_to_wall(attempt)
        assert seconds - TOLERANCE_S <= attempt["wall_seconds"] <= seconds
        assert attempt["seconds"]["startup"] == 0.0          # a library call: the attempt starts at the call
    assert attempts[0]["seconds"]["redone"] == 0.0 and attempts[0]["seconds"]["restore"] == 0.0
    for attempt in attempts[1:]:
        assert attempt["seconds"]["redone"] > 0 and attempt["seconds"]["restore"] > 0
    account = goodput_lib.read(workdir)
    assert account["attempts"] == 3 and account["redone_steps"] == 6 and account["unfinished_attempts"] == 0
    assert account["wall_seconds"] == pytest.approx(sum(a["wall_seconds"] for a in attempts))
    assert account["goodput"] + sum(account["badput"].values()) == pytest.approx(1.0)
    # results.json: the same account, the last attempt up to its results
    stored = json.load(open(os.path.join(workdir, "results.json")))["goodput"]
    assert stored == results["goodput"]
    assert stored["attempts"] == 3 and stored["redone_steps"] == 6
    assert stored["wall_seconds"] <= account["wall_seconds"]
    # lsj.load_run: the account as goodput.jsonl holds it
    import layerscale_jax as lsj
    assert lsj.load_run(workdir).goodput == account
    # TensorBoard: goodput and every badput cause, at each attempt's last step
    events = glob.glob(os.path.join(workdir, "tensorboard", "goodput", "events*"))
    assert len(events) == 3
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set()
    for path in events:
        accumulator = EventAccumulator(path)
        accumulator.Reload()
        tags |= set(accumulator.Tags()["scalars"])
    assert tags == {"goodput"} | {f"badput/{cause}" for cause in goodput_lib.BADPUT}
    # the command
    capsys.readouterr()
    assert goodput_lib.main([workdir]) == 0
    table = capsys.readouterr().out
    assert f"goodput {account['goodput']:.1%} of {account['wall_seconds']:.1f} s over 3 attempt(s)" in table


@pytest.mark.slow
def test_an_attempt_killed_with_kill_9_counts_up_to_its_last_record(tmp_path):
    """The train command killed with SIGKILL mid-run: its attempt is in goodput.jsonl without its end, up to its
    last record (its startup measured from the process's start); the resume counts it and redoes exactly the steps
    past its checkpoint."""
    workdir = str(tmp_path)
    path = os.path.join(workdir, "goodput.jsonl")
    command = [sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=4000", f"--workdir={workdir}",
               "--config.train.checkpoint_every=4", "--config.train.log_every=1"]
    process = subprocess.Popen(command, env=subprocess_env(1), cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            attempts = goodput_lib.read_attempts(path)
            if attempts and attempts[0]["step"] >= 15:
                break
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    (killed,) = goodput_lib.read_attempts(path)
    assert not killed["final"] and killed["step"] >= 15
    assert killed["seconds"]["startup"] > 0.5              # the interpreter and jax's import, before the entry
    _sums_to_wall(killed)
    loop_lib.train_and_evaluate(validate_experiment_config(_config(4000, stop_after_steps=killed["step"] + 2)), workdir)
    killed_again, resumed = goodput_lib.read_attempts(path)
    assert killed_again == killed
    checkpoint = resumed["start_step"]                     # the newest complete checkpoint when it was killed
    assert checkpoint % 4 == 0 and checkpoint < killed["step"]
    redo = killed["step"] - checkpoint
    assert (resumed["reached_before"], resumed["redone_steps"], resumed["step"]) == (
        killed["step"], redo, checkpoint + killed["step"] + 2)
    account = goodput_lib.read(workdir)
    assert account["unfinished_attempts"] == 1 and account["redone_steps"] == redo


def test_the_account_by_cause_with_a_clock(monkeypatch):
    """Each interval goes to one cause; a step at or below an earlier attempt's highest step is redone; the input
    wait comes out of the step it delayed."""
    clock = iter(range(100, 1000))
    monkeypatch.setattr(goodput_lib.time, "time", lambda: float(next(clock)))
    monkeypatch.setattr(goodput_lib, "process_start_time", lambda: None)
    account = goodput_lib.Goodput(True)                      # t = 100: the entry
    account.path, account.attempt, account.reached = None, 2, 6
    account.spent("setup")                                   # 101
    account.spent("restore")                                 # 102
    account.started_at(4, waited=0.0)
    account.trained(5, waited=0.25)                          # 103: step 5 (redone), 0.25 s of it waiting for input
    account.trained(6, waited=0.25)                          # 104: step 6 (redone)
    account.trained(7, waited=0.25)                          # 105: step 7, new
    account.trained(7, waited=0.25)                          # 106: waiting for step 7's device work
    account.spent("evaluation")                              # 107
    record = account.account()
    assert record["seconds"] == {**dict.fromkeys(goodput_lib.CAUSES, 0.0), "setup": 1.0, "restore": 1.0,
                                 "input_wait": 0.25, "redone": 1.75, "productive": 2.0, "evaluation": 1.0}
    assert record["redone_steps"] == 2 and record["wall_seconds"] == 7.0
    summary = goodput_lib.summarize([record])
    assert summary["goodput"] == pytest.approx(2 / 7) and summary["badput"]["redone"] == pytest.approx(1.75 / 7)


def test_the_distributed_connect_is_charged_apart_from_the_start_up(monkeypatch):
    """The train command's connect (``connected``) comes out of the interval from the process's start to the entry;
    a call from Python (no process start) charges neither."""
    monkeypatch.setattr(goodput_lib.time, "time", lambda: 100.0)
    monkeypatch.setattr(goodput_lib, "_connect_seconds", 0.0)
    goodput_lib.connected(4.0)
    monkeypatch.setattr(goodput_lib, "process_start_time", lambda: 90.0)
    seconds = goodput_lib.Goodput(True).seconds
    assert (seconds["startup"], seconds["connect"]) == (6.0, 4.0)
    monkeypatch.setattr(goodput_lib, "process_start_time", lambda: None)
    seconds = goodput_lib.Goodput(True).seconds
    assert (seconds["startup"], seconds["connect"]) == (0.0, 0.0)


def test_a_torn_last_line_is_skipped_and_each_attempt_counts_by_its_last_record(tmp_path):
    def record(attempt, step, final):
        return json.dumps({"attempt": attempt, "step": step, "start_step": 0, "final": final, "redone_steps": 0,
                           "wall_seconds": float(step), "seconds": {"productive": float(step)}})
    path = tmp_path / "goodput.jsonl"
    path.write_text("\n".join([record(1, 3, False), record(1, 5, False), record(2, 4, True), '{"attempt": 2, "st'])
                    + "\n")
    attempts = goodput_lib.read_attempts(path)
    assert [(a["attempt"], a["step"]) for a in attempts] == [(1, 5), (2, 4)]
    summary = goodput_lib.summarize(attempts)
    assert summary["wall_seconds"] == 9.0 and summary["goodput"] == 1.0 and summary["unfinished_attempts"] == 1


def test_the_command_without_an_account(tmp_path, capsys):
    assert goodput_lib.main([str(tmp_path)]) == 0
    assert "no goodput account" in capsys.readouterr().out
    assert goodput_lib.main([]) == 2
