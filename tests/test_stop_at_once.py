"""Stop signals that do not wait for XLA, and a distributed connect that cannot hang silently.

Python runs signal handlers only between bytecodes of the main thread; the train command's watcher thread
(``runtime.signals``: ``set_wakeup_fd``) acts while the main thread is inside a long C call. The tests block the main
thread in one (``libc.sleep`` through ctypes, which releases the GIL as XLA's compile does) at the point the job is
in: the train step's compile (``jax.stages.Lowered.compile``), a save (``Checkpointer.save``), ``--compile_for``'s
compile, or the distributed connect (a coordinator that never comes). Without the watcher each of them ended only
when the C call returned (10 minutes here; a deep model's compile: 156 s in issue 49). Time bounds are generous and
only guard against that wait: what is checked is the exit status and the last lines.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from layerscale_jax import cli as cli_lib
from layerscale_jax.runtime import signals as signals_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "configs", "tiny_synthetic.py")
BLOCKED = "blocked in a C call"           # what the patched function prints before it blocks
AT_ONCE = 60                              # seconds: "at once" (the C call blocks for 600)

# The train command, with ``target`` (module:attribute path of a function) replaced by one that prints BLOCKED and
# sleeps in C for 10 minutes before calling the original.
PROGRAM = """
import ctypes, importlib, runpy, signal, sys
module_name, qualname = sys.argv[1].split(":")
owner = importlib.import_module(module_name)
*path, name = qualname.split(".")
for part in path:
    owner = getattr(owner, part)
original = getattr(owner, name)
def blocked(*args, **kwargs):
    print("{blocked}", file=sys.stderr, flush=True)
    # As in XLA, the main thread does not come back to Python until the call returns: the signals go to another
    # thread (else sleep() would end early, EINTR, and Python would run the handler).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGINT, signal.SIGTERM}})
    try:
        ctypes.CDLL(None).sleep(600)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return original(*args, **kwargs)
setattr(owner, name, blocked)
sys.argv = ["layerscale_jax.train"] + sys.argv[2:]
runpy.run_module("layerscale_jax.train", run_name="__main__", alter_sys=True)
""".format(blocked=BLOCKED)

pytestmark = [pytest.mark.slow]


def env(**extra):
    base = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1", LAYERSCALE_JAX_MALLOC="system",
                PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return {**base, **extra}


class Job:
    """A process whose stdout and stderr lines are collected by threads as they come, so that every wait has a
    bound (a blocking read would wait as long as the process blocks)."""

    def __init__(self, args, environ):
        self.proc = subprocess.Popen(args, env=environ, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.out, self.err = [], []
        self._readers = [threading.Thread(target=lines.extend, args=(stream,), daemon=True)
                         for lines, stream in ((self.out, self.proc.stdout), (self.err, self.proc.stderr))]
        for reader in self._readers:
            reader.start()

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)

    def wait_for(self, text: str, timeout: float) -> None:
        """Until a line of stdout or stderr contains ``text``, the process still running."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.out + self.err):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError(f"no line with {text!r} within {timeout} s:\n" + self.text())

    def finish(self, timeout: float) -> tuple[int, str, str]:
        """(exit status, stdout, stderr) once the process ended, at most ``timeout`` seconds from now."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running {timeout} s later:\n" + self.text()) from None
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode, "".join(self.out), "".join(self.err)


def start(target, *args, **environ) -> Job:
    job = Job([sys.executable, "-c", PROGRAM, target, *args], env(**environ))
    job.wait_for(BLOCKED, timeout=600)
    return job


def signal_and_finish(job: Job, *signums, seen=None) -> tuple[int, float, str, str]:
    """Send the signals (each after the line ``seen`` that says the previous one was handled, within ``AT_ONCE``),
    wait: (status, seconds from the last signal to the exit, stdout, stderr)."""
    for i, signum in enumerate(signums):
        if i:
            job.wait_for(seen, timeout=AT_ONCE)
        sent = time.monotonic()
        job.proc.send_signal(signum)
    status, out, err = job.finish(timeout=AT_ONCE)
    return status, time.monotonic() - sent, out, err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_a_stop_signal_during_the_train_steps_compile_ends_the_process_at_once(tmp_path, signum):
    workdir = str(tmp_path / "run")
    job = start("jax.stages:Lowered.compile", f"--config={TINY}:steps=24", f"--workdir={workdir}")
    status, seconds, out, err = signal_and_finish(job, signum)
    lines = (out + err).strip().splitlines()
    assert status == 128 + signum, out + err
    assert lines[-1] == "stopped before step 1: nothing new to save", lines
    assert lines[-2].startswith(f"received {signal.Signals(signum).name} while the job was starting"), lines
    assert "Traceback" not in err
    assert not os.path.exists(os.path.join(workdir, "lock.json"))      # released on the way out
    assert not os.listdir(os.path.join(workdir, "checkpoints"))


def test_a_second_ctrl_c_during_a_save_stops_at_once(tmp_path):
    """The first Ctrl-C waits for the save in progress (new state: the stop is the loop's); the second ends the
    process at once, releasing the workdir."""
    workdir = str(tmp_path / "run")
    job = start("layerscale_jax.storage.checkpoint:Checkpointer.save", f"--config={TINY}:steps=24",
                f"--workdir={workdir}", "--config.train.checkpoint_every=4")
    status, seconds, out, err = signal_and_finish(job, signal.SIGINT, signal.SIGINT, seen="received SIGINT")
    assert status == 130, out + err
    assert err.strip().splitlines()[-1] == signals_lib.INTERRUPTED_MESSAGE, err
    assert "Traceback" not in err
    assert not os.path.exists(os.path.join(workdir, "lock.json"))


# The train command with the stop's save held in flight (a save that starts after a stop signal never finalises)
# and, as the main thread waits for it, the wakeup fd taken by another library (an asyncio event loop that handles
# a signal): a Ctrl-C from then on reaches the main thread's handler, not the watcher. WAITING is printed once the
# main thread is inside orbax's wait for that save.
WAITING = "waiting for the stop's save"
HELD_SAVE_PROGRAM = """
import asyncio, runpy, signal, sys, threading, time, traceback
from layerscale_jax.runtime import stop_signals
from layerscale_jax.storage.checkpoint import Checkpointer
save, finalized, close = Checkpointer.save, Checkpointer._finalized, Checkpointer.close
def held_save(self, *args, **kwargs):
    self.wait()
    self.held = stop_signals.received is not None
    return save(self, *args, **kwargs)
def held_finalized(self):
    while getattr(self, "held", False):
        time.sleep(600)
    return finalized(self)
def announce_the_wait():
    main = threading.main_thread().ident
    while all(frame.name != "wait_until_finished" for frame in traceback.extract_stack(sys._current_frames()[main])):
        time.sleep(0.01)
    print("{waiting}", file=sys.stderr, flush=True)
loops = []
def close_after_the_fd_is_taken(self):
    if stop_signals.received is not None:
        loops.append(asyncio.new_event_loop())
        loops[-1].add_signal_handler(signal.SIGUSR1, lambda: None)                 # takes the wakeup fd
        threading.Thread(target=announce_the_wait, daemon=True).start()
    return close(self)
Checkpointer.save, Checkpointer._finalized, Checkpointer.close = held_save, held_finalized, close_after_the_fd_is_taken
sys.argv = ["layerscale_jax.train"] + sys.argv[1:]
runpy.run_module("layerscale_jax.train", run_name="__main__", alter_sys=True)
""".format(waiting=WAITING)


def test_two_ctrl_cs_while_the_stops_save_is_in_flight_print_no_orbax_error_and_the_rerun_resumes(tmp_path):
    """Issue 49 item 5: two Ctrl-Cs 0.2 s apart printed ``ERROR:absl:[process=0][thread=MainThread][step=N]
    [wait_until_finished] Save Finalize thread (save_finalize) failed.`` before the stop's line: orbax logs any
    exception that interrupts its wait for a save, and the second Ctrl-C was a ``KeyboardInterrupt`` raised there
    (the main thread's handler, before the watcher; it still was when the watcher does not get the signal). Here the
    second Ctrl-C reaches that handler (the wakeup fd taken), which ends a command-line job as the watcher does. The
    last complete checkpoint stays, the cut-off save's temporary directory goes at the rerun, which resumes from that
    checkpoint."""
    workdir = str(tmp_path / "run")
    checkpoints = os.path.join(workdir, "checkpoints")
    config = [f"--config={TINY}:steps=24", f"--workdir={workdir}", "--config.train.checkpoint_every=2"]
    job = Job([sys.executable, "-c", HELD_SAVE_PROGRAM, *config], env())
    deadline = time.monotonic() + 600
    while not os.path.isdir(os.path.join(checkpoints, "2")):          # a complete checkpoint to come back to
        assert job.proc.poll() is None and time.monotonic() < deadline, job.text()
        time.sleep(0.05)
    job.proc.send_signal(signal.SIGINT)
    job.wait_for(WAITING, timeout=AT_ONCE)
    job.proc.send_signal(signal.SIGINT)
    status, out, err = job.finish(timeout=AT_ONCE)
    assert status == 130, out + err
    assert err.strip().splitlines()[-1] == signals_lib.INTERRUPTED_MESSAGE, err
    # (orbax's warning that a run's save waited over 1 s for the previous one, on a loaded machine, is not the stop's)
    assert not [line for line in err.splitlines() if "absl" in line and "Waiting for previous save" not in line
                or "Finalize" in line or "Traceback" in line], err
    assert not os.path.exists(os.path.join(workdir, "lock.json"))
    complete = max(int(name) for name in os.listdir(checkpoints) if name.isdigit())
    assert any(".orbax-checkpoint-tmp" in name for name in os.listdir(checkpoints))    # the stop's save, cut off

    rerun = Job([sys.executable, "-m", "layerscale_jax.train", *config, "--config.train.stop_after_steps=2"], env())
    status, out, err = rerun.finish(timeout=600)
    assert status == 0, out + err
    assert f"resumed from step {complete} in {checkpoints}" in out, out + err
    assert not [name for name in os.listdir(checkpoints) if ".orbax-checkpoint-tmp" in name]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records if "train_loss" in r] == list(range(1, complete + 3))


def test_a_stop_that_cannot_end_within_the_stop_deadline_ends_the_process_then(tmp_path):
    workdir = str(tmp_path / "run")
    job = start("layerscale_jax.storage.checkpoint:Checkpointer.save", f"--config={TINY}:steps=24",
                f"--workdir={workdir}", "--config.train.checkpoint_every=4", "--config.train.stop_deadline_seconds=3")
    status, seconds, out, err = signal_and_finish(job, signal.SIGTERM)
    assert status == 143, out + err
    assert err.strip().splitlines()[-1].startswith(
        "stopped without saving: the stop did not end within train.stop_deadline_seconds=3 of the SIGTERM"), err
    assert seconds >= 3
    assert not os.path.exists(os.path.join(workdir, "lock.json"))


def test_a_ctrl_c_during_compile_for_ends_it_at_once_and_not_with_status_0(tmp_path):
    """Issue 49: it printed "received SIGINT ... with a checkpoint if there is new state", compiled on, exited 0."""
    job = start("jax.stages:Lowered.compile", f"--config={TINY}", "--compile_for", "v5e-4")
    status, seconds, out, err = signal_and_finish(job, signal.SIGINT)
    assert status == 130, out + err
    assert err.strip().splitlines()[-1] == "stopped: --compile_for v5e-4 did not finish; nothing to report", err


def test_the_watcher_ends_a_process_blocked_in_c_and_runs_its_cleanups(tmp_path):
    """The mechanism alone: a process whose main thread sleeps in C gets SIGTERM."""
    marker = tmp_path / "cleaned"
    program = ("import ctypes, pathlib, signal, sys\n"
               "from layerscale_jax.runtime import stop_signals\n"
               "stop_signals.install(); stop_signals.watch()\n"
               "stop_signals.starting('stopped before step 7: nothing new to save')\n"
               f"stop_signals.before_exit(lambda: pathlib.Path({str(marker)!r}).write_text('yes'))\n"
               f"print({BLOCKED!r}, file=sys.stderr, flush=True)\n"
               "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
               "ctypes.CDLL(None).sleep(600)\n")
    job = Job([sys.executable, "-c", program], env())
    job.wait_for(BLOCKED, timeout=600)
    status, seconds, out, err = signal_and_finish(job, signal.SIGTERM)
    assert status == 143 and err.strip().splitlines()[-1] == "stopped before step 7: nothing new to save", err
    assert marker.read_text() == "yes"


# -- the distributed connect -----------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def lone_slurm_task(tmp_path, *args):
    """Process 1 of a 2-task SLURM job started alone: its coordinator (process 0) never comes."""
    slurm = {"SLURM_JOB_ID": "79", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "0", "JAX_COORDINATOR_PORT": str(free_port())}
    return Job([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}", f"--workdir={tmp_path / 'run'}",
                "--distributed", *args], env(**slurm)), slurm["JAX_COORDINATOR_PORT"]


def test_a_process_whose_coordinator_never_comes_says_so_and_gives_up_in_one_line(tmp_path):
    """Issue 49: it printed nothing and aborted after 286 s with a 17-line absl trace (rc 134)."""
    job, port = lone_slurm_task(tmp_path, "--connect_timeout=5")
    status, out, err = job.finish(timeout=600)
    assert out.splitlines()[0].startswith(f"waiting for the coordinator at localhost:{port} as process 1 of 2"), out
    assert status == 2, err
    assert err.strip().splitlines() == [
        f"error: --distributed: process 1 of 2 could not join the job: the coordinator at localhost:{port} did not "
        "see all 2 processes connect within 5 s (--connect_timeout); start every process of the job (process 0 "
        "runs the coordinator), check the address, or raise --connect_timeout"], err


def test_a_stop_signal_while_waiting_for_the_coordinator_ends_the_process(tmp_path):
    """Issue 49: SIGTERM was ignored until JAX's own timeout (286 s). The process gives the connect
    ``CONNECT_GRACE_SECONDS`` to complete (then every process of the job stops at one point), then stops."""
    job, port = lone_slurm_task(tmp_path)
    job.wait_for("waiting for the coordinator", timeout=600)
    job.proc.send_signal(signal.SIGTERM)
    status, out, err = job.finish(timeout=signals_lib.CONNECT_GRACE_SECONDS + AT_ONCE)
    assert status == 143, err
    assert err.strip().splitlines()[-1] == (f"stopped while waiting for the coordinator at localhost:{port} as "
                                            "process 1 of 2 (SLURM; process 0 runs the coordinator): nothing new "
                                            "to save"), err


@pytest.mark.multiprocess
@pytest.mark.parametrize("process, signum", [(1, signal.SIGTERM), (0, signal.SIGINT)],
                         ids=["sigterm_to_process_1", "ctrl_c_to_process_0"])
def test_a_stop_signal_to_one_process_while_a_two_process_job_compiles_ends_both_at_once(tmp_path, process, signum):
    """After the connect JAX's preemption notifier owns SIGTERM, and the loop asked for the notice only at its first
    sync point, after the compile (issue 49: minutes). The watchers ask the coordination service while the job starts:
    every process ends, the one that got the signal with its status, the other with 143 (a preemption notice)."""
    port, workdir = str(free_port()), str(tmp_path / "run")
    jobs = []
    for rank in (0, 1):
        slurm = {"SLURM_JOB_ID": "80", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "2",
                 "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "JAX_COORDINATOR_PORT": port}
        jobs.append(Job([sys.executable, "-c", PROGRAM, "jax.stages:Lowered.compile", f"--config={TINY}:steps=24",
                         f"--workdir={workdir}", "--distributed"], env(**slurm)))
    try:
        for job in jobs:
            job.wait_for(BLOCKED, timeout=600)
        jobs[process].proc.send_signal(signum)
        ended = [job.finish(timeout=AT_ONCE) for job in jobs]
    finally:
        for job in jobs:
            if job.proc.poll() is None:
                job.proc.kill()
    statuses = [status for status, _, _ in ended]
    assert statuses == [128 + signum if rank == process else 143 for rank in (0, 1)], ended
    for status, out, err in ended:
        lines = (out + err).strip().splitlines()
        assert lines[-2:] == ["a stop notice reached the job while its train step compiled: every process stops "
                              "at once", "stopped before step 1: nothing new to save"], lines
        assert "Traceback" not in err
    assert not os.path.exists(os.path.join(workdir, "lock.json"))      # released on the way out
    assert not os.listdir(os.path.join(workdir, "checkpoints"))


@pytest.mark.parametrize("value", ["0", "-3", "nan", "inf"])
def test_a_bad_connect_timeout_is_one_error_line_naming_the_flag(tmp_path, value):
    from layerscale_jax.train.__main__ import main
    import io
    import contextlib
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = cli_lib.run_cli(main, [f"--config={TINY}", f"--workdir={tmp_path}", f"--connect_timeout={value}"])
    assert status == 2 and stderr.getvalue().startswith(f"error: --connect_timeout={value}"), stderr.getvalue()
