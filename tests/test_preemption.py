"""Stop signals from the first second, through the CLI: a preemption notice (SIGTERM) to one process of two while the
train step compiles stops both at one step, and one while it waits for the distributed connect stops both at one
point; Ctrl-C or SIGTERM to one process while it compiles ends in one line, a second Ctrl-C at once; and a run
stopped between two logging steps logs the same records as an uninterrupted run.

"During compile" is found without a test-only option: JAX's own ``JAX_LOG_COMPILES=1`` logs "Compiling jit(NAME)"
before each compilation, and the first compilation after the state's ``init_fn`` is the train step's.
"""
import contextlib
import copy
import dataclasses
import gc
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import numpy as np
import pytest

from layerscale_jax.runtime import StopSignals
from layerscale_jax.train import loop as loop_lib
from layerscale_jax.train.config import validate_experiment_config

from test_multihost import experiment, flags, launch, losses
from test_train import cli, read_metrics, subprocess_env, tiny_config

pytestmark = [pytest.mark.slow]

# The CLI's huge-page re-exec (layerscale_jax/runtime/malloc.py) imports the package twice; only the start-up
# test keeps it.
NO_REEXEC = {"LAYERSCALE_JAX_MALLOC": "system"}
STATE_INIT = "init_fn"                   # loop.create_trainer's state initialiser, compiled before the train step
ONE_PROCESS = {"data": 4, "fsdp": 1, "tensor": 1}


class Output:
    """A process's output (stdout and stderr), collected by a thread as it is written: no pipe fills up while the
    test waits for one line."""

    def __init__(self, proc):
        self.proc, self.lines = proc, []
        self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._thread.start()

    def wait_for(self, seen, what: str, timeout=240) -> None:
        """Until ``seen(lines so far)`` holds; fails if the process ends first or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if seen(list(self.lines)):
                return
            assert self.proc.poll() is None, self.text()
            time.sleep(0.01)
        raise AssertionError(f"{what} did not happen in time:\n" + self.text())

    def wait_for_train_step_compile(self, timeout=240) -> None:
        def compiled(lines):
            names = [m.group(1) for line in lines if (m := re.search(r"Compiling jit\((.*?)\)", line))]
            return STATE_INIT in names[:-1]
        self.wait_for(compiled, "the train step's compilation", timeout)

    def finish(self, timeout=240) -> str:
        self.proc.wait(timeout=timeout)
        self._thread.join(timeout=10)
        return self.text()

    def text(self) -> str:
        return "".join(line for line in self.lines if "Compiling" not in line and "compilation" not in line)


@contextlib.contextmanager
def running(procs):
    """The processes' ``Output``s; those still running when the test ends (it failed) are killed."""
    try:
        yield [Output(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def stopped_steps(text: str) -> list[int]:
    return [int(step) for step in re.findall(r"stopped at step (\d+);", text)]


@pytest.mark.multiprocess
def test_sigterm_to_one_process_during_compile_stops_both_at_one_step_and_the_rerun_resumes(tmp_path, monkeypatch):
    for name, value in {"JAX_LOG_COMPILES": "1", **NO_REEXEC}.items():
        monkeypatch.setenv(name, value)
    workdir = str(tmp_path / "sigterm")
    train = {"steps": 10_000, "checkpoint_every": 0}
    with running(launch(workdir, *flags({"data": 4}, **train))) as outputs:
        outputs[1].wait_for_train_step_compile()
        outputs[1].proc.send_signal(signal.SIGTERM)       # the non-primary process only, before its first step
        texts = [out.finish() for out in outputs]
    # Both ended by the stop, at one point: exit 143 (a process that waited for a lost peer would fail when the
    # runtime's wait timed out) and one stop line each at the same point (one that trained on would stop later).
    assert [out.proc.returncode for out in outputs] == [143, 143], "\n\n".join(texts)
    assert len({text.splitlines()[-1] for text in texts}) == 1, texts    # both at the same point
    if texts[0].splitlines()[-1] == "stopped before step 1: nothing new to save":
        assert saved_steps(workdir) == []                 # the notice reached both while the step compiled
        return
    (stop,), (other,) = stopped_steps(texts[0]), stopped_steps(texts[1])
    assert stop == other >= 1, texts
    assert saved_steps(workdir) == [stop]
    assert not os.path.exists(os.path.join(workdir, "lock.json"))
    # The rerun (one process holding the 4 devices) against an uninterrupted run of the same config.
    loop_lib.train_and_evaluate(experiment(mesh=ONE_PROCESS, **train, stop_after_steps=2), workdir,
                                devices=jax.devices()[:4])
    fresh = str(tmp_path / "fresh")
    loop_lib.train_and_evaluate(experiment(mesh=ONE_PROCESS, **train, stop_after_steps=stop + 2), fresh,
                                devices=jax.devices()[:4])
    got, want = losses(workdir), losses(fresh)
    assert sorted(got) == sorted(want) == list(range(1, stop + 3))
    # 2 processes and 1 process sum the gradients in different orders: equal to float32 rounding.
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)], atol=1e-5)


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (Linux: the SigCgt mask of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.multiprocess
def test_sigterm_before_the_distributed_connect_stops_both_processes_at_one_point(tmp_path):
    """Process 1 gets the signal while process 0 has not started the coordination service yet; both resume a
    checkpoint of step 2, so they stop before step 3 (the usual case: the notice has reached JAX's sync protocol
    before their first step) or, on a fast machine, at a later step, with its checkpoint."""
    workdir = str(tmp_path / "early")
    train = {"steps": 10_000, "checkpoint_every": 0}
    loop_lib.train_and_evaluate(experiment(mesh=ONE_PROCESS, **train, stop_after_steps=2), workdir,
                                devices=jax.devices()[:4])
    procs = launch(workdir, *flags({"data": 4}, **train))
    procs[0].send_signal(signal.SIGSTOP)                  # process 1 cannot connect while process 0 is stopped
    with running(procs) as outputs:
        try:
            deadline = time.monotonic() + 240
            while not catches(procs[1].pid, signal.SIGTERM):   # its handler is installed: it is starting up
                assert time.monotonic() < deadline and procs[1].poll() is None, outputs[1].text()
                time.sleep(0.01)
            procs[1].send_signal(signal.SIGTERM)
        finally:
            procs[0].send_signal(signal.SIGCONT)
        texts = [out.finish() for out in outputs]
    # Both ended by the stop, not by jax.distributed's connect timeout (which fails the process): exit 143, the
    # stop's line last.
    assert [p.returncode for p in procs] == [143, 143], "\n\n".join(texts)
    last_lines = {text.splitlines()[-1] for text in texts}
    assert all(re.fullmatch(r"stopped (before step 3: nothing new to save|at step \d+; checkpoint saved in .*)", line)
               for line in last_lines), texts
    assert len(last_lines) == 1, texts                    # both at the same point
    saved = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    if last_lines == {"stopped before step 3: nothing new to save"}:
        assert saved == [2]
    else:
        assert saved == [2, stopped_steps(texts[0])[0]], texts


def _signal_during_compile(workdir, *signals):
    env = dict(subprocess_env(), JAX_LOG_COMPILES="1", **NO_REEXEC)
    proc = subprocess.Popen(cli(workdir, "--config.train.steps=10000"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    with running([proc]) as (out,):
        out.wait_for_train_step_compile()
        for handled, signum in enumerate(signals):
            proc.send_signal(signum)
            if handled + 1 < len(signals):       # the next one only after the handler has seen this one
                out.wait_for(lambda lines: sum(line.startswith("received ") for line in lines) > handled,
                             f"the handling of signal {handled + 1}")
        return out.finish(), proc.returncode


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_a_stop_signal_during_compile_stops_in_one_line_with_the_exit_status_of_the_signal(tmp_path, signum):
    """Before step 1 when the signal came during the compile (nothing to save), or at the step it came during (the
    compile was loaded from the cache before the signal arrived), with a checkpoint of that step; exit 130 for
    Ctrl-C, 143 for SIGTERM: "preempted, rerun to resume"."""
    workdir = str(tmp_path / "stopped")
    text, status = _signal_during_compile(workdir, signum)
    assert status == 128 + signum, text
    assert "Traceback" not in text
    last = text.splitlines()[-1]
    assert (last == "stopped before step 1: nothing new to save"
            or re.fullmatch(rf"stopped at step \d+; checkpoint saved in {workdir}/checkpoints", last)), text
    assert not os.path.exists(os.path.join(workdir, "lock.json"))


def test_second_ctrl_c_stops_at_once_in_one_line_and_releases_the_workdir(tmp_path):
    """Two Ctrl-Cs 0.2 s apart while the train step compiles: the first already ends the process at once (nothing
    new to save; issue 49: the pair used to wait 90 s for the compile), or the second does; one stop line last, 130.
    A second Ctrl-C while the first waits for a save: tests/test_stop_at_once.py."""
    workdir = str(tmp_path / "ctrl_c_twice")
    env = dict(subprocess_env(), JAX_LOG_COMPILES="1", **NO_REEXEC)
    proc = subprocess.Popen(cli(workdir, "--config.train.steps=10000"), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    with running([proc]) as (out,):
        out.wait_for_train_step_compile()
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        text, status = out.finish(), proc.returncode
    assert status == 130, text
    assert "Traceback" not in text
    assert (text.splitlines()[-1].startswith("interrupted by a second Ctrl-C: stopped at once, without saving")
            or text.splitlines()[-1] == "stopped before step 1: nothing new to save"), text
    assert not os.path.exists(os.path.join(workdir, "lock.json"))


def test_a_run_stopped_inside_a_logging_window_logs_the_records_of_an_uninterrupted_run(tmp_path):
    """The stop at step 6 carries steps 5-6 into the checkpoint; the resumed run's mean over steps 5-8 is the same
    number as the uninterrupted run's (every logged quantity but the throughput)."""
    def run(workdir, **train):
        cfg = tiny_config("steps=8")
        cfg.train.log_every, cfg.train.checkpoint_every = 4, 0
        cfg.train.update(train)
        return loop_lib.train_and_evaluate(validate_experiment_config(cfg), workdir)

    uninterrupted, resumed = str(tmp_path / "uninterrupted"), str(tmp_path / "resumed")
    run(uninterrupted)
    assert run(resumed, stop_after_steps=6) == {"preempted_at_step": 6}
    run(resumed)
    drop_timing = [{k: v for k, v in r.items() if k != "img_per_s"} for r in read_metrics(uninterrupted)]
    assert [{k: v for k, v in r.items() if k != "img_per_s"} for r in read_metrics(resumed)] == drop_timing
    assert [r["step"] for r in read_metrics(resumed) if "train_loss" in r] == [4, 8]


def test_one_process_stops_at_its_next_sync_point_after_a_signal_and_a_second_ctrl_c_interrupts():
    stop_signals = StopSignals()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with stop_signals:
        assert not stop_signals.reached_sync_point(1)
        signal.raise_signal(signal.SIGTERM)
        assert stop_signals.received == "SIGTERM"
        assert stop_signals.stopped_before(1) and stop_signals.reached_sync_point(2)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")   # the dropped one, as intended
def test_a_second_ctrl_c_that_python_dropped_in_a_gc_callback_interrupts_at_the_next_sync_point():
    """The CI failure of 2026-12-03: the second Ctrl-C's KeyboardInterrupt was raised inside JAX's
    ``_xla_gc_callback``, where Python prints "Exception ignored" and goes on; the run then finished its step and
    saved instead of stopping at once."""
    stop_signals = StopSignals()

    def ctrl_c_during_collection(phase, info):
        if phase == "start":
            signal.raise_signal(signal.SIGINT)

    with stop_signals:
        signal.raise_signal(signal.SIGINT)
        assert stop_signals.received == "SIGINT"
        gc.callbacks.append(ctrl_c_during_collection)
        try:
            gc.collect()                                 # the KeyboardInterrupt is dropped here, not raised
        finally:
            gc.callbacks.remove(ctrl_c_during_collection)
        with pytest.raises(KeyboardInterrupt):
            stop_signals.reached_sync_point(2)
    with stop_signals:                                   # a new run starts without the old interrupt
        assert not stop_signals.reached_sync_point(1)


@pytest.mark.parametrize("when", ["after a second Ctrl-C", "a Ctrl-C during the exit"])
def test_the_process_leaves_at_once_without_the_noise_of_cut_off_save_threads(when):
    """A thread still working at exit (as orbax's save threads after a second Ctrl-C) neither holds the process nor
    prints; a Ctrl-C while the exit waits for such threads (status 0) stops at once with the one line."""
    import subprocess
    import sys
    program = ("import os, signal, sys, threading, time\n"
               "from layerscale_jax.train.__main__ import exit_process\n"
               "def save_thread():\n"
               "    time.sleep(600)\n"
               "    print('Event loop is closed', file=sys.stderr)\n"
               "threading.Thread(target=save_thread).start()\n"
               f"status = {130 if when == 'after a second Ctrl-C' else 0}\n"
               "if status == 0:\n"
               "    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
               "exit_process(status)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ([] if when == "after a second Ctrl-C" else [
        "interrupted by a second Ctrl-C: stopped at once, without saving; rerun the command to resume from the last "
        "checkpoint"])


# -- within a grace period: no step after a compile or an evaluation, no save that cannot end in time --------------

class SignalDuring:
    """A jitted train step that raises SIGTERM in this process while it is compiled (``lower``: the loop compiles
    the step before its first run), or while running the step numbered ``at_call``."""

    def __init__(self, jitted, at_call=None):
        self.jitted, self.at_call, self.calls = jitted, at_call, 0

    def lower(self, *args):
        lowered = self.jitted.lower(*args)
        if self.at_call is None:
            signal.raise_signal(signal.SIGTERM)
        return lowered

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.at_call:
            signal.raise_signal(signal.SIGTERM)
        return self.jitted(*args)


def signal_in_train_step(monkeypatch, at_call=None):
    real = loop_lib.create_trainer
    monkeypatch.setattr(loop_lib, "create_trainer", lambda config, mesh: dataclasses.replace(
        real(config, mesh), train_step=SignalDuring(real(config, mesh).train_step, at_call)))


def saved_steps(workdir):
    return sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())


def test_a_notice_during_the_first_compile_stops_before_the_first_step_without_saving(tmp_path, monkeypatch, capsys):
    workdir = str(tmp_path / "fresh")
    signal_in_train_step(monkeypatch)
    validated = validate_experiment_config(tiny_config("steps=6"))
    assert loop_lib.train_and_evaluate(validated, workdir) == {"preempted_at_step": 0}
    assert capsys.readouterr().out.splitlines()[-1] == "stopped before step 1: nothing new to save"
    assert saved_steps(workdir) == [] and not os.path.exists(os.path.join(workdir, "metrics.jsonl"))


def test_a_notice_during_the_first_compile_after_a_resume_exits_without_a_new_checkpoint(tmp_path, monkeypatch):
    """Issue 36: it used to train one more step and save a checkpoint for one step of progress."""
    workdir = str(tmp_path / "resumed")
    cfg = tiny_config("steps=6")
    loop_lib.train_and_evaluate(validate_experiment_config(override(cfg, stop_after_steps=2)), workdir)
    logged = read_metrics(workdir)
    signal_in_train_step(monkeypatch)
    assert loop_lib.train_and_evaluate(validate_experiment_config(cfg), workdir) == {"preempted_at_step": 2}
    assert saved_steps(workdir) == [2] and read_metrics(workdir) == logged


def test_a_notice_during_an_evaluation_stops_right_after_it_in_every_process(tmp_path):
    """The check after an evaluation asks every process, through the coordination service, whether any got a
    notice (JAX's notifier records it there): here one process of a distributed job, the notice raised by
    SIGTERM to JAX's own handler, as a scheduler sends it."""
    script = textwrap.dedent("""
        import signal, socket, sys, time
        import jax
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        jax.distributed.initialize(f"localhost:{port}", 1, 0)
        from layerscale_jax.runtime import StopSignals
        stops = StopSignals()
        with stops:
            assert not stops.requested_anywhere() and stops.notice_time() is None
            sent = time.time()
            signal.raise_signal(signal.SIGTERM)              # JAX's preemption notifier owns SIGTERM here
            while not stops.requested_anywhere():            # its notifier polls about once a second
                time.sleep(0.05)
            print("agreed", sent, stops.notice_time(), time.time(), stops.exit_status)
    """)
    proc = subprocess.run([sys.executable, "-c", script], env=subprocess_env(2), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, sent, notice, agreed, status = proc.stdout.split()
    assert float(sent) <= float(notice) <= float(agreed) and status == "143"     # the notice's own time: when it came


@pytest.mark.parametrize("deadline, saved", [(1e-6, [2]), (0.0, [2, 3])], ids=["deadline_too_short", "no_deadline"])
def test_a_save_that_cannot_end_before_the_deadline_is_skipped_keeping_the_last_checkpoint(
        tmp_path, monkeypatch, capsys, deadline, saved):
    """train.stop_deadline_seconds against the save measured at step 2: a notice during step 3 with no time left
    stops without saving step 3 (the sealed step 2 stays); with no deadline step 3 is saved."""
    workdir = str(tmp_path / "deadline")
    signal_in_train_step(monkeypatch, at_call=3)
    cfg = override(tiny_config("steps=6"), stop_deadline_seconds=deadline, checkpoint_every=2)
    assert loop_lib.train_and_evaluate(validate_experiment_config(cfg), workdir) == {"preempted_at_step": 3}
    assert saved_steps(workdir) == saved
    last = capsys.readouterr().out.splitlines()[-1]
    if deadline:
        assert re.fullmatch(r"stopped at step 3 without saving it \(a save takes about \d+\.\d s and 0\.0 s of "
                            rf"train.stop_deadline_seconds=1e-06 are left\); the last checkpoint is step 2 in "
                            rf"{workdir}/checkpoints", last), last
    # the rerun resumes from what stayed
    monkeypatch.undo()
    resumed = loop_lib.train_and_evaluate(validate_experiment_config(override(cfg, stop_after_steps=1)), workdir)
    assert resumed == {"preempted_at_step": saved[-1] + 1}


def test_a_save_is_made_when_no_save_was_measured_yet(tmp_path, monkeypatch):
    workdir = str(tmp_path / "unmeasured")
    signal_in_train_step(monkeypatch, at_call=3)
    cfg = override(tiny_config("steps=6"), stop_deadline_seconds=1e-6, checkpoint_every=0)
    assert loop_lib.train_and_evaluate(validate_experiment_config(cfg), workdir) == {"preempted_at_step": 3}
    assert saved_steps(workdir) == [3]


@pytest.mark.parametrize("value", [-1.0, float("inf"), float("nan"), "30"])
def test_a_bad_stop_deadline_is_refused_naming_the_field(value):
    from layerscale_jax.train.config import validate_train_config
    cfg = tiny_config()
    with cfg.train.ignore_type():
        cfg.train.stop_deadline_seconds = value
    with pytest.raises(ValueError, match="train.stop_deadline_seconds="):
        validate_train_config(cfg.train)


def override(cfg, **train):
    cfg = copy.deepcopy(cfg)
    cfg.train.update(train)
    return cfg


def test_orbax_never_asks_the_preemption_sync_point(tmp_path, monkeypatch):
    """The loop is the sync point's only caller (runtime.StopSignals): orbax's checkpoint manager would ask about
    each step it saves, from its own threads too (storage.checkpoint turns that off)."""
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    from layerscale_jax.storage.checkpoint import Checkpointer
    asked = []
    monkeypatch.setattr(multihost_utils, "reached_preemption_sync_point", lambda step: asked.append(step) or False)
    checkpointer = Checkpointer(tmp_path / "checkpoints", keep=2)
    for step in (1, 2):
        checkpointer.save(step, {"params": {"w": jnp.full(3, step, jnp.float32)}}, {"position": step}, {"a": 1})
    checkpointer.close()
    assert asked == [] and checkpointer.latest_step() == 2
