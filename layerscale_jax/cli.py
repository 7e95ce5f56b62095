"""How every command-line entry point reports a user's mistake: ``error: ...`` on one line, exit status 2.

``python -m layerscale_jax.train``, ``.convert``, ``.bench`` and ``.data.prepare`` run their main function through
``run_cli``. A mistake in what the user gave — the config (a bad value, an unknown field), an input file, a dataset
name, the devices, the disk — is printed as one line on stderr, ``error: <what was wrong, naming the field or the
file>``, and the process exits with status 2. Anything else (a bug) keeps its traceback. ``--debug`` anywhere on
the command line, or ``LAYERSCALE_JAX_DEBUG=1`` in the environment, prints the traceback of a user error as well.

What counts as a user error (``is_user_error``): a ``UserError`` (``layerscale_jax.errors``: raised where the input
enters, naming the field or the file and the value; a run that diverged raises one naming the step and the last
complete checkpoint); ``OSError`` (missing, unreadable or wrongly typed files, a full disk, a lost connection:
the environment, not the code); argparse usage errors; a device backend that cannot start, and running out of
device memory. Any other exception — a ``ValueError`` or ``TypeError`` from deep in the code included — is a bug
and keeps its traceback.

On a machine without an accelerator (no TPU chip, NVIDIA or AMD GPU: ``no_accelerator_here``) ``run_cli`` sets
``JAX_PLATFORMS=cpu`` unless it is set: JAX would otherwise start every installed plugin, and libtpu (the ``[tpu]``
extra) prints five lines on a machine without TPUs ("unexpected worker hostname ..."). ``--compile_for`` compiles
for TPUs without one all the same (libtpu's compiler, deviceless). ``JAX_PLATFORMS=tpu`` (or any value) overrides it.
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import glob
import os
import sys
import traceback
from typing import Callable, Sequence

from layerscale_jax.errors import UserError

DEBUG_ENV = "LAYERSCALE_JAX_DEBUG"
DEBUG_FLAG = "--debug"
EXIT_USER_ERROR = 2
MAX_MESSAGE_CHARS = 2000          # a longer message (e.g. hundreds of mismatched keys) is cut; --debug shows it all

# A disk or permission problem is a user error even when a library wraps it in its own exception type.
_ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}


def debug_enabled(argv: Sequence[str] = ()) -> bool:
    return DEBUG_FLAG in argv or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _disk_cause(err: BaseException) -> OSError | None:
    """A disk or permission ``OSError`` anywhere in ``err``'s chain of causes."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _ENVIRONMENT_ERRNOS:
            return err
        err = err.__cause__ or err.__context__
    return None


def _device_error(err: BaseException) -> bool:
    """A backend that cannot start (``JAX_PLATFORMS=cuda`` without a GPU) or an exhausted device memory."""
    text = str(err)
    if isinstance(err, RuntimeError) and text.startswith("Unable to initialize backend"):
        return True
    return type(err).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and "RESOURCE_EXHAUSTED" in text


def is_user_error(err: BaseException) -> bool:
    """Whether ``run_cli`` reports ``err`` as a one-line user error (see the module docstring)."""
    return isinstance(err, (UserError, OSError)) or _device_error(err) or _disk_cause(err) is not None


def one_line(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` on one line: its lines joined (after a ':' with a space, otherwise with '; '), cut at ``limit``."""
    lines = [" ".join(line.split()) for line in str(message).splitlines()]
    text = ""
    for line in filter(None, lines):
        text = line if not text else text + (" " if text.endswith(":") else "; ") + line
    if len(text) > limit:
        text = (text[:limit].rstrip() + f" ... [{len(text) - limit} more characters: rerun with {DEBUG_FLAG} or "
                f"{DEBUG_ENV}=1 for the whole message]")
    return text


def error_line(err: BaseException) -> str:
    """The one line ``run_cli`` prints for a user error: ``error: <message>``."""
    message = str(err)
    disk = _disk_cause(err)
    if disk is not None and disk is not err and str(disk) not in message:
        message = f"{message}: {disk}" if message else str(disk)
    if not message:
        message = type(err).__name__
    if _device_error(err):
        message = "device: " + message
    return "error: " + one_line(message)


def _raise_usage_error(parser: argparse.ArgumentParser, message: str):
    raise UserError(f"{message} (usage: {parser.prog} --help)")


@contextlib.contextmanager
def _argparse_errors_raise():
    """argparse's usage errors (two lines and exit status 2) raise ``UserError`` instead, so that ``run_cli``
    prints them in one line like every other user error — also for parsers built elsewhere (e.g. the bench's)."""
    original = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _raise_usage_error
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original


# JAX's TPU probe (jax/_src/hardware_utils.py): Google's PCI vendor id and its TPU chips' device ids (other Google
# devices, e.g. the gVNIC network card of every GCE VM, are no TPU); /dev/accel* are TPU device files.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_TPU_PCI_DEVICES = {"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076", "0x0083", "0x007c"}
_GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def no_accelerator_here() -> bool:
    """Whether this machine has no TPU chip, NVIDIA or AMD GPU (JAX's own hardware probes, without importing jax)."""
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        if _read(vendor) == _GOOGLE_PCI_VENDOR and _read(os.path.join(os.path.dirname(vendor), "device")) in \
                _TPU_PCI_DEVICES:
            return False
    return not glob.glob("/dev/accel[0-9]*") and not any(os.path.exists(p) for p in _GPU_DEVICE_FILES)


def use_cpu_without_accelerator(environ=os.environ) -> bool:
    """``JAX_PLATFORMS=cpu`` in ``environ`` when it is unset, jax is not imported yet and ``no_accelerator_here``
    (the module docstring); whether it was set."""
    if environ.get("JAX_PLATFORMS") or "jax" in sys.modules or not no_accelerator_here():
        return False
    environ["JAX_PLATFORMS"] = "cpu"
    return True


# Read by JAX's GPU client as it starts (jaxlib/xla_client.py): a value that is no number was an 11-line plugin
# traceback blaming the plugin, on the first device use.
MEMORY_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


def check_environment(environ=os.environ) -> None:
    """The environment variables JAX reads later, checked as the command starts: ``UserError`` naming the first bad
    one and its value."""
    for name in MEMORY_FRACTION_VARIABLES:
        text = environ.get(name, "")
        try:
            fine = not text or 0 < float(text) <= 1
        except ValueError:
            fine = False
        if not fine:
            raise UserError(f"{name}={text!r} in the environment: the fraction of each GPU's memory JAX takes is a "
                            f"number in (0, 1], e.g. {name}=0.9; fix or unset it")


def run_cli(main: Callable[[list[str]], int | None], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)`` (argv without the program name; default ``sys.argv[1:]``) and return its exit status.

    A user error (``is_user_error``) prints ``error: ...`` on one line to stderr and returns 2; with ``--debug``
    (taken out of ``argv`` before ``main`` sees it) or ``LAYERSCALE_JAX_DEBUG=1`` its traceback is printed first.
    ``SystemExit`` with a message is a user error too; with a number it passes through. Anything else propagates
    with its traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    use_cpu_without_accelerator()
    debug = debug_enabled(argv)
    argv = [a for a in argv if a != DEBUG_FLAG]
    try:
        check_environment()
        with _argparse_errors_raise():
            status = main(argv)
        return 0 if status is None else int(status)
    except SystemExit as exit_:
        if isinstance(exit_.code, str):            # SystemExit("...") or SystemExit("error: ...")
            message = exit_.code[len("error: "):] if exit_.code.startswith("error: ") else exit_.code
            print("error: " + one_line(message), file=sys.stderr, flush=True)
            return EXIT_USER_ERROR
        raise
    except Exception as err:  # noqa: BLE001 - classified below; everything that is not a user error re-raises
        if not is_user_error(err):
            raise
        sys.stdout.flush()
        if debug:
            traceback.print_exc()
        print(error_line(err), file=sys.stderr, flush=True)
        return EXIT_USER_ERROR
