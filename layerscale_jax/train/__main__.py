"""The main job: ``python -m layerscale_jax.train --config configs/X.py[:arg] --workdir DIR [--config.a.b=v ...]``.

Multi-host jobs (TPU pods, GPU clusters): pass ``--distributed`` to read the job from the launcher (SLURM,
torchrun-style ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``, Open MPI, Kubernetes, Cloud TPU), or ``--coordinator_address
host:port --num_processes N --process_id I``; ``--local_device_ids`` picks the devices of each process
(``train/launch.py`` resolves all of it). Every process runs the same command. A process of such a job that fails
exits at once, without the distributed runtime's shutdown barrier: its peers' next collective then fails too, instead
of every process waiting for the others until a timeout.

``--compile_for TARGET`` (``v5e-256``, ``v4-32``, ``2xv5e-256``, ``8xh100``, ``v5e:16x16``, ...) compiles the run's
train and eval steps for that target on this machine and prints per-chip memory against what the compiler allows,
FLOPs, collectives and the step-time range instead of training (no ``--workdir``, no data; ``--fit`` ranks the
configs that fit by the step time,
``--json`` adds the report as one JSON line; ``plan.compile_for``, docs/multihost.md "Will it fit?").

A mistake in the command line or the config is reported in one line (``error: ...``, exit status 2) before JAX
starts: an unknown field names the closest valid ones, a bad value names the field and the value. ``--debug`` (or
``LAYERSCALE_JAX_DEBUG=1``) adds the traceback.

A preemption notice (SIGTERM) or Ctrl-C, from the first second on, stops every process of the job before the same
step, with a checkpoint when there is new state (``layerscale_jax.runtime.StopSignals``; docs/multihost.md,
"Preemption"); the rerun resumes from it. Exit status: 0 when the run finished (or ``train.stop_after_steps`` ended
it), 143 when a preemption notice stopped it and 130 when Ctrl-C did (rerun to resume), 2 for a user error. A
second Ctrl-C stops at once, without saving (exit status 130). A watcher thread acts on the signals while the main
thread is inside XLA: a process of its own that has not reached its first step (start-up, restore, compile, all of
``--compile_for``) has nothing new to save and ends at once (``runtime/signals.py``).

A process of a multi-process job says what it waits for as it connects (the coordinator's address, its process id
and the count) and gives up after ``--connect_timeout`` seconds (default 300) with one ``error:`` line (exit status
2); a stop signal while it waits ends it within 20 s.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback

from layerscale_jax.runtime import reexec_with_fast_malloc, stop_signals
from layerscale_jax.runtime.signals import INTERRUPTED_MESSAGE

# Before anything allocates: a malloc that keeps XLA's per-step CPU buffers (see layerscale_jax/runtime/malloc.py).
# Then, before the rest starts, the stop signals' handlers: a preemption notice during start-up is not lost.
if __name__ == "__main__":
    reexec_with_fast_malloc()
    stop_signals.install()
    # A stop signal acts even while the main thread is inside XLA (runtime/signals.py); one that comes before a
    # multi-process job's connect waits for it (main() says for sure once the command is parsed).
    stop_signals.watch(joins_job=any(arg.startswith(("--distributed", "--coordinator_address")) for arg in sys.argv))

from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from layerscale_jax.cli import run_cli  # noqa: E402
from layerscale_jax.errors import UserError  # noqa: E402
from layerscale_jax.paths import as_path  # noqa: E402
from layerscale_jax.train import goodput  # noqa: E402
from layerscale_jax.train.config import (CONFIG_FLAG, Experiment, check_override_paths, load_config,  # noqa: E402
                                         validate_experiment_config)
from layerscale_jax.train.launch import (DEFAULT_CONNECT_TIMEOUT, accelerator_line, describe_connect,  # noqa: E402
                                         missing_accelerator_package, partial_torchrun, resolve_launch)

EXIT_INTERRUPTED = 130                        # 128 + SIGINT, as a shell reports a Ctrl-C
EXIT_PREEMPTED = 143                          # 128 + SIGTERM: stopped by a preemption notice, rerun to resume
_HELP_FLAGS = ("-h", "--help", "--helpshort", "--helpfull", "-?")


def _define_flags(flag_values: flags.FlagValues) -> None:
    """Every flag but --config (read by ``parse_command_line`` itself, then defined with the loaded config)."""
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics, TensorBoard logs and results.json.",
                        flag_values=flag_values)
    flags.DEFINE_bool("restart", False, "Start over in a workdir that holds an earlier run: its files (checkpoints, "
                      "metrics.jsonl, tensorboard/, results.json, config.json) are moved to WORKDIR/previous/<time>/.",
                      flag_values=flag_values)
    flags.DEFINE_bool("distributed", False, "Call jax.distributed.initialize() with the cluster's auto-detection.",
                      flag_values=flag_values)
    flags.DEFINE_string("coordinator_address", None, "host:port of process 0 for jax.distributed.initialize.",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_processes", None, "Number of processes in the job.", flag_values=flag_values)
    flags.DEFINE_integer("process_id", None, "This process's index in the job.", flag_values=flag_values)
    flags.DEFINE_float("connect_timeout", DEFAULT_CONNECT_TIMEOUT, "Seconds a process of a multi-process job waits for "
                       "all of the job's processes to connect to its coordinator before it gives up (exit status 2).",
                       flag_values=flag_values)
    flags.DEFINE_string("local_device_ids", None, "The devices this process uses: 'all' or '0,1,...' (default: one "
                        "GPU per process when several processes share a node's GPUs, else all; "
                        "layerscale_jax/train/launch.py).", flag_values=flag_values)
    flags.DEFINE_string("compile_for", None, "Compile the train and eval steps for a target (v5e-256, v4-32, "
                        "2xv5e-256, 8xh100, v5e:16x16, ...) on this machine and report memory, FLOPs, collectives and "
                        "the step-time range; nothing runs, no --workdir or data needed.", flag_values=flag_values)
    flags.DEFINE_bool("fit", False, "With --compile_for: search the per-chip batch, remat, scan and fsdp for the "
                      "configs that fit, rank them by the step time's lower bound, print the fastest one's "
                      "--config overrides.",
                      flag_values=flag_values)
    flags.DEFINE_bool("json", False, "With --compile_for: the report as one JSON object on the last line of stdout.",
                      flag_values=flag_values)
    flags.DEFINE_bool("debug", False, "Print the traceback of an error as well (or set LAYERSCALE_JAX_DEBUG=1).",
                      flag_values=flag_values)


def _split_config_args(argv: list[str]) -> tuple[str | None, list[str], list[str]]:
    """``(config spec, --config.X overrides, the other arguments)``; ``--config X`` and ``--config=X`` both work."""
    spec, overrides, rest = None, [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.lstrip("-").split("=", 1)[0]
        following = argv[i + 1] if i + 1 < len(argv) else None
        takes_next = "=" not in arg and following is not None and not following.startswith("-")
        if arg.startswith("-") and name == CONFIG_FLAG:
            if "=" not in arg and following is None:
                raise UserError("--config needs a value: --config configs/NAME.py[:arg]")
            spec = arg.split("=", 1)[1] if "=" in arg else following
            i += 1 if "=" in arg else 2
        elif arg.startswith("-") and (name.startswith(CONFIG_FLAG + ".") or name.startswith(f"no{CONFIG_FLAG}.")):
            overrides += [arg, following] if takes_next else [arg]    # '--config.a.b value' or a bool '--config.a.b'
            i += 2 if takes_next else 1
        else:
            rest.append(arg)
            i += 1
    return spec, overrides, rest


def parse_command_line(argv: list[str]) -> flags.FlagValues:
    """Parse ``argv`` (without the program name): the flags, the config file, its overrides, all validated.

    Returns the parsed flags; ``.config`` is the validated, locked experiment config. Raises ``UserError`` or
    ``ConfigError`` naming the flag, the config field or the file.
    """
    return parse_job(argv)[0]


def parse_job(argv: list[str]) -> tuple[flags.FlagValues, Experiment]:
    """``parse_command_line``'s flags, and the config validated into the ``Experiment`` the job runs (no jax)."""
    spec, overrides, rest = _split_config_args(argv)
    flag_values = flags.FlagValues()
    _define_flags(flag_values)
    if spec is None:
        raise UserError("--config is required: --config configs/NAME.py[:arg] --workdir DIR")
    config = load_config(spec)
    check_override_paths(config, overrides)
    argv_for_flags = ["layerscale_jax.train"] + overrides + rest
    config_flags.DEFINE_config_dict(CONFIG_FLAG, config, "The experiment config.", flag_values=flag_values,
                                    lock_config=True, sys_argv=argv_for_flags)
    try:
        unparsed = flag_values(argv_for_flags)
    except flags.Error as err:
        raise UserError(str(err)) from err
    if len(unparsed) > 1:
        raise UserError(f"unexpected argument(s) {unparsed[1:]} (flags are written --name=value)")
    if not flag_values.workdir and flag_values.compile_for is None:
        raise UserError("--workdir is required: the directory for checkpoints, metrics and results")
    if flag_values.compile_for is not None:
        from layerscale_jax.plan.targets import parse_target
        parse_target(flag_values.compile_for)       # an unknown target: one line listing the known ones
    elif flag_values.fit or flag_values.json:
        raise UserError("--fit and --json go with --compile_for TARGET")
    else:
        as_path(flag_values.workdir, "--workdir")  # a local path, file:// or gs:// (layerscale_jax.paths)
    return flag_values, validate_experiment_config(flag_values[CONFIG_FLAG].value)


def _print_help() -> None:
    flag_values = flags.FlagValues()
    flags.DEFINE_string(CONFIG_FLAG, None, "Experiment config file: configs/NAME.py[:arg]. Any field can then be "
                        "overridden with --config.SECTION.FIELD=VALUE.", flag_values=flag_values)
    _define_flags(flag_values)
    print(__doc__)
    print(flag_values.get_help())


def _check_devices(jax) -> None:
    """Start the device backend now, so that a missing one (``JAX_PLATFORMS=cuda`` on a machine without a GPU or
    without jax's CUDA plugin) is one clear error rather than a traceback from deep inside JAX."""
    try:
        jax.devices()
    except (RuntimeError, AssertionError) as err:          # jax 0.12 asserts when no requested platform starts
        platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "(auto)"
        raise UserError(f"no JAX device backend could start (JAX_PLATFORMS={platforms}): "
                        f"{str(err).splitlines()[0] if str(err) else type(err).__name__}; check the "
                        "accelerator, its jax plugin, or set JAX_PLATFORMS=cpu") from err


def main(argv: list[str]) -> int:
    """The job, from its arguments (without the program name); see the module docstring."""
    if any(arg in _HELP_FLAGS for arg in argv):
        _print_help()
        return 0
    parsed, experiment = parse_job(argv)
    flags.FLAGS.mark_as_parsed()             # absl logging (used by orbax) otherwise warns about unparsed flags
    launch = resolve_launch(distributed=parsed.distributed, coordinator_address=parsed.coordinator_address,
                            num_processes=parsed.num_processes, process_id=parsed.process_id,
                            local_devices=parsed.local_device_ids, environ=os.environ)
    if not 0 < parsed.connect_timeout < float("inf"):       # nan, 0, negative or inf
        raise UserError(f"--connect_timeout={parsed.connect_timeout:g}: give the seconds (> 0) a process waits for "
                        "the job's processes to connect")
    stop_signals.watch(deadline=experiment.train.stop_deadline_seconds, joins_job=launch is not None)
    if parsed.compile_for:
        stop_signals.starting(f"stopped: --compile_for {parsed.compile_for} did not finish; nothing to report")
    import jax

    if parsed.compile_for and not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")    # the target's compiler needs no local accelerator
    missing = missing_accelerator_package()
    if launch is not None:
        if missing:
            raise UserError(missing)
        # Cross-process collectives for CPU-only jobs (tests, debugging); GPUs and TPUs use their own.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        waiting_for, gave_up = describe_connect(launch, parsed.connect_timeout, os.environ)
        try:
            with stop_signals.connecting(waiting_for, parsed.connect_timeout, gave_up):
                print(f"waiting for {waiting_for}, at most {parsed.connect_timeout:g} s (--connect_timeout)",
                      flush=True)
                # JAX's own timeout, which aborts the process with a trace, comes after the watcher's clean one.
                connect_start = time.time()
                jax.distributed.initialize(**launch.initialize_kwargs(),
                                           initialization_timeout=int(parsed.connect_timeout) + 60)
                goodput.connected(time.time() - connect_start)
        except ValueError as err:            # JAX found no launcher to read the job from
            raise UserError(f"--distributed: {err} (no SLURM, torchrun-style, Open MPI, Kubernetes or Cloud TPU "
                            f"environment found{partial_torchrun(os.environ)}); pass --coordinator_address HOST:PORT "
                            "--num_processes N --process_id I") from err
        stop_signals.pass_to_jax()           # a signal during start-up goes to JAX's preemption sync as well
    _check_devices(jax)
    if jax.process_index() == 0 and not parsed.compile_for:
        print(accelerator_line(jax) + (f"; {missing}" if missing else ""), flush=True)
    logging.getLogger("absl").setLevel(logging.WARNING)
    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.WARNING)
    if parsed.compile_for:
        from layerscale_jax.plan.compile_for import compile_command
        # A large model's compile takes minutes with nothing else printed before the report: say it started.
        print(f"compiling {experiment.config.model.name} for {parsed.compile_for} (minutes for a large model; Ctrl-C "
              "stops it at once) ...", file=sys.stderr, flush=True)
        return compile_command(experiment, parsed.compile_for, fit=parsed.fit, as_json=parsed.json)
    from layerscale_jax.train.loop import train_and_evaluate

    # workdir, save and checkpoint problems raise UserErrors
    results = train_and_evaluate(experiment, parsed.workdir, restart=parsed.restart)
    signalled = stop_signals.received is not None or stop_signals.notice_time() is not None
    if "preempted_at_step" in results and (signalled or not experiment.train.stop_after_steps):
        return stop_signals.exit_status       # 143 (a preemption notice) or 130 (Ctrl-C): unfinished, rerun it
    return 0


def run_job(argv: list[str] | None = None) -> int:
    """``run_cli(main)``, with the stop signals handled; a failed process of a multi-process job leaves with
    ``os._exit`` (see the docstring)."""
    abrupt = False
    try:
        with stop_signals:
            status = run_cli(main, argv)
    except KeyboardInterrupt:                 # a second Ctrl-C: the workdir's lock is released on the way out
        print(INTERRUPTED_MESSAGE, file=sys.stderr, flush=True)
        status, abrupt = EXIT_INTERRUPTED, True
    except BaseException:
        if not _is_multiprocess():
            raise
        traceback.print_exc()
        status, abrupt = 1, True
    # A stop every process agreed on (143, 130) leaves through the distributed runtime's shutdown like a finished
    # run: process 0 runs the coordination service its peers still talk to until they are done.
    global _stopped_cleanly
    _stopped_cleanly = not abrupt and status in (EXIT_PREEMPTED, EXIT_INTERRUPTED)
    if (abrupt or status not in (0, EXIT_PREEMPTED, EXIT_INTERRUPTED)) and _is_multiprocess():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


_stopped_cleanly = False       # run_job: the job stopped where every process agreed (143, or 130 after one Ctrl-C)


def exit_process(status: int) -> None:
    """Leave the process with ``status``. After a second Ctrl-C (130 without a clean stop), at once: orbax's save
    threads, cut off mid-write, printed their failures while the interpreter shut down ("Event loop is closed", up
    to ~1,150 lines) or kept it waiting. Otherwise the normal exit, during which (JAX and orbax finishing their
    work) a Ctrl-C stops at once with the one line too, instead of a traceback or a silent exit by the signal."""
    def at_once(signum, frame):
        print(INTERRUPTED_MESSAGE, file=sys.stderr, flush=True)
        os._exit(EXIT_INTERRUPTED)

    signal.signal(signal.SIGINT, at_once)
    if status == EXIT_INTERRUPTED and not _stopped_cleanly:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _is_multiprocess() -> bool:
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1


if __name__ == "__main__":
    exit_process(run_job())
