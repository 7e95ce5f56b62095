"""The workdir around a run (its lock: ``workdir_lock``): the stored config, the metrics log after a resume,
what a run may not do to an earlier one (shorten it, mix its logs with a fresh start), and ``--restart``.

Every path is an ``etils.epath`` path, so a workdir may be local or ``gs://...``; only process 0 writes.
"""
from __future__ import annotations

import json
import logging
import time

from etils import epath

from layerscale_jax import network
from layerscale_jax.errors import UserError
from layerscale_jax.paths import finish_moves, is_url, move_all, read_json, write_text_atomically

# Config fields that may differ between the run that wrote a workdir and the run that resumes it: they change how
# long the run goes on, what it logs, how it is laid out on devices, not what the checkpoints hold.
RESUMABLE_CHANGES = (
    "train.steps", "train.log_every", "train.eval_every", "train.checkpoint_every", "train.keep_checkpoints",
    "train.stop_after_steps", "train.stop_deadline_seconds",
    "train.nonfinite", "train.eval_batch_size", "train.mesh.", "train.compilation_cache_dir",
    "data.num_workers", "data.prefetch", "model.attention_impl",
    "train.profile_steps", "train.profile_all_processes",
)


# Fields added to the config after runs were stored with it: a stored config without one ran as with this value.
ADDED_FIELDS = {"data.read_block": 0, "data.read_window": 16, "train.profile_steps": [],
                "train.profile_all_processes": False}

PREVIOUS_DIR = "previous"       # --restart moves an earlier run's files to <workdir>/previous/<UTC time>/
RESTART_JOURNAL = "restart.json"  # the moves of a --restart until they are all done (paths.move_all)
CACHE_IN_WORKDIR = "xla_cache"  # a multi-process job's default compilation cache (storage.compile_cache)

log = logging.getLogger(__name__)


class WorkdirError(UserError):
    """The workdir cannot be used as asked (another job holds it, or it belongs to a different experiment)."""


def create(workdir: epath.Path) -> None:
    """Create ``workdir`` (with its parents); ``WorkdirError`` in one line when it cannot hold a run. A ``gs://``
    workdir is first probed with one connection to the storage endpoint (``network.cloud_storage_problem``, at most
    ``network.CONNECT_TIMEOUT_S``): offline, TensorFlow's ``gfile`` retries a failed connection for about 40 s."""
    if is_url(workdir):
        problem = network.cloud_storage_problem()
        if problem is not None:
            raise WorkdirError(f"--workdir {workdir}: {problem}; check the network (or "
                               "HTTPS_PROXY) and the credentials (gcloud auth application-default login), or use a "
                               "local --workdir")
        try:
            workdir.exists()
        except Exception as err:  # noqa: BLE001 - TensorFlow's gfile raises its own errors (no network, no login)
            raise WorkdirError(f"--workdir {workdir} cannot be reached ({type(err).__name__}: "
                               f"{' '.join(str(err).split())}); check the network and the credentials (gcloud auth "
                               "application-default login), or use a local --workdir") from None
    if workdir.exists() and not workdir.is_dir():
        raise WorkdirError(f"--workdir {workdir} is a file, not a directory; give a directory (created if missing)")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WorkdirError(f"--workdir {workdir} cannot be created ({_cause(err)}); give a directory this user can "
                           "create and write") from err


def _cause(err: OSError) -> str:
    return f"{err.strerror}: {err.filename}" if err.strerror and err.filename else (err.strerror or str(err))


def _flatten(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(stored: dict, current: dict) -> tuple[list[str], list[str]]:
    """``(refused, accepted)``: the dotted fields whose values differ, as ``field: old → new`` lines."""
    new = _flatten(current)
    old = {**{k: v for k, v in ADDED_FIELDS.items() if k in new}, **_flatten(stored)}    # a field both lack: equal
    refused, accepted = [], []
    for field in sorted(set(old) | set(new)):
        if old.get(field, "<absent>") == new.get(field, "<absent>"):
            continue
        line = f"{field}: {old.get(field, '<absent>')!r} → {new.get(field, '<absent>')!r}"
        harmless = any(field == f or (f.endswith(".") and field.startswith(f)) for f in RESUMABLE_CHANGES)
        (accepted if harmless else refused).append(line)
    return refused, accepted


def check_stored_config(workdir: epath.Path, config_json: dict, has_checkpoints: bool,
                        write: bool = True) -> list[str]:
    """Compare ``config_json`` with the config stored in ``workdir`` (writing it on the first run; ``write=False``:
    only compare).

    Raises ``WorkdirError`` listing the fields that make the checkpoints unusable; returns the accepted changes.
    """
    path = workdir / "config.json"
    if path.exists() and has_checkpoints:
        stored = read_json(path, "it is a copy of the config stored with each checkpoint: copy "
                                 "checkpoints/<newest step>/config/metadata over it, then rerun")
        refused, accepted = config_changes(stored, config_json)
        if refused:
            raise WorkdirError(
                f"workdir {workdir} holds a run of a different config ({'; '.join(refused)}); resume it with the "
                f"stored config ({path}) or use a new --workdir")
    else:
        accepted = []
    if write:
        write_text_atomically(path, json.dumps(config_json, indent=2))
    return accepted


def metrics_lines(path: epath.Path, text: str | None = None) -> list[tuple[str, dict]]:
    """``(line, record)`` for every record of the metrics log ``path`` (``metrics.jsonl``; ``text``: its content,
    when the caller has read it already).

    The log is append-only, so only its last line can be torn (the disk filled, or the job died, while it was being
    written): such a line is dropped with one warning. A damaged line anywhere else is an error naming the file and
    the line.
    """
    records, torn = _parse_metrics(path, read_log(path) if text is None else text)
    if torn:
        log.warning("%s", torn)
    return records


def read_log(path: epath.Path) -> str:
    """The text of the metrics log ``path`` ('' when there is none); ``WorkdirError`` naming the file when it is not
    text (overwritten with random bytes: a 31-line ``UnicodeDecodeError``)."""
    if not path.exists():
        return ""
    try:
        return path.read_text()
    except UnicodeDecodeError as err:
        raise WorkdirError(f"{path} is not a metrics log (byte {err.start} is not UTF-8 text); move it aside or delete "
                           "it: a resume rebuilds the records its checkpoint holds and names the ones lost") from None


def _parse_metrics(path: epath.Path, text: str) -> tuple[list[tuple[str, dict]], str | None]:
    """``metrics_lines``' records, and what was wrong with a torn last line (None: nothing)."""
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not an object with an integer 'step'")
        except ValueError as err:
            if number == len(lines):
                return out, (f"{path} line {number} is incomplete ({err}): dropped, the run writing it stopped in "
                             "the middle of the line (e.g. the disk was full)")
            raise WorkdirError(f"{path} line {number} is not a metrics record ({err}): {line[:60]!r}; repair or "
                               "delete that line") from err
        out.append((line, record))
    return out, None


def truncate_metrics(path: epath.Path, last_step: int, saved: epath.Path | None = None) -> tuple[int, int]:
    """Drop the records after ``last_step`` (logged by a run that was killed before its next checkpoint) and a torn
    last line, so the resumed run appends exactly what an uninterrupted run would have written.

    ``saved``: the checkpoint's ``log.json`` (``MetricsWriter.since_checkpoint``): the number of records up to
    ``last_step`` and those since the previous checkpoint. A log that holds fewer (a torn line at the checkpoint's
    step, the file deleted or damaged during the run) gets those records back — one line says so — and what cannot
    be rebuilt is named in one warning and counted in results.json (``metrics_records_lost``). Returns ``(records
    in the log, records lost so far)``."""
    try:
        kept_at_save = json.loads(saved.read_text()) if saved is not None and saved.exists() else None
    except ValueError:
        kept_at_save = None                           # a damaged log.json: the log is taken as it is
    text = read_log(path)
    records, torn = _parse_metrics(path, text)
    kept = [line for line, record in records if record["step"] <= last_step]
    lost = kept_at_save.get("lost", 0) if kept_at_save else 0
    if kept_at_save is None or len(kept) >= kept_at_save["records"]:
        if torn:
            log.warning("%s", torn)
    else:
        what = ("its last line was torn" if torn else "it was missing" if not text.strip() else
                f"it held {len(kept)} of the {kept_at_save['records']} records up to step {last_step}")
        recent = kept_at_save["recent"]
        kept = [line for line in kept if line not in set(recent)] + recent
        missing = kept_at_save["records"] - len(kept)
        if missing <= 0:
            print(f"{path}: {what}; the records up to step {last_step} are rebuilt from its checkpoint (the log "
                  "equals an uninterrupted run's)", flush=True)
        else:
            lost += missing
            log.warning("%s: %s; %d of the %d records up to step %d are lost (deleted or damaged during the run; "
                        "TensorBoard's event files may hold them), the %d of step %d's checkpoint are rebuilt; "
                        "results.json counts them (metrics_records_lost)", path, what, missing,
                        kept_at_save["records"], last_step, len(recent), last_step)
    rebuilt = "".join(line + "\n" for line in kept)
    if rebuilt != text:
        write_text_atomically(path, rebuilt)
    return len(kept), lost


def check_resumable(workdir: epath.Path, checkpoints: epath.Path, latest_step: int | None, steps: int) -> None:
    """Refuse, before anything in ``workdir`` is written, what would corrupt the run it holds: training past
    ``train.steps`` already (shortening it would rewrite its results and config), or starting from step 0 beside
    the logs of an earlier run that left no usable checkpoint (the two runs' records would mix)."""
    if latest_step is not None and latest_step > steps:
        raise WorkdirError(
            f"workdir {workdir} holds a run trained to step {latest_step}, past train.steps={steps}: a run is not "
            f"shortened (its results.json and config.json are left as they are); continue it with train.steps >= "
            f"{latest_step}, export an earlier checkpoint with `python -m layerscale_jax.convert --source {workdir} "
            f"--step N`, or use a new --workdir")
    if latest_step is None:
        earlier = earlier_run(workdir, checkpoints)
        if earlier:
            raise WorkdirError(
                f"workdir {workdir} holds an earlier run ({', '.join(earlier)}) but no checkpoint to resume it "
                f"from; rerun with --restart to start over here (its files are moved to {workdir / PREVIOUS_DIR}/"
                "<time>/, nothing is deleted), or use a new --workdir")


def earlier_run(workdir: epath.Path, checkpoints: epath.Path) -> list[str]:
    """What a run that cannot be resumed left in ``workdir``: records in metrics.jsonl, results.json, quarantined
    checkpoints (a run starting from step 0 would mix its logs with them)."""
    found = []
    metrics = workdir / "metrics.jsonl"
    text = read_log(metrics)
    if text.strip():
        found.append(f"{metrics.name} with {len(text.splitlines())} line(s)")
    if (workdir / "results.json").exists():
        found.append("results.json")
    quarantine = checkpoints / "quarantine"
    quarantined = list(quarantine.iterdir()) if quarantine.exists() else []
    if quarantined:
        found.append(f"{len(quarantined)} quarantined checkpoint(s) in {quarantine}")
    return found


def move_aside(workdir: epath.Path) -> epath.Path | None:
    """``--restart``: every file of the earlier run (checkpoints, metrics.jsonl, tensorboard/, results.json,
    config.json, ...) moves to ``<workdir>/previous/<UTC time>/`` (the compilation cache stays); returns that
    directory (None: nothing to move).

    The moves are journalled (``paths.move_all``): a job killed in the middle of them (on a bucket a directory moves
    object by object) leaves ``restart.json``, and the next start finishes them (``finish_restart``) before it
    looks at the workdir."""
    names = sorted(p.name for p in workdir.iterdir()
                   if p.name not in ("lock.json", PREVIOUS_DIR, RESTART_JOURNAL, CACHE_IN_WORKDIR))
    if not names:
        return None
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime())
    target, n = workdir / PREVIOUS_DIR / stamp, 1
    while target.exists():
        n += 1
        target = workdir / PREVIOUS_DIR / f"{stamp}_{n}"
    move_all(workdir / RESTART_JOURNAL, [(workdir / name, target / name) for name in names])
    return target


def finish_restart(workdir: epath.Path) -> epath.Path | None:
    """The moves of a ``--restart`` killed midway, completed (``move_aside``); their target (None: there were
    none)."""
    moves = finish_moves(workdir / RESTART_JOURNAL)
    return epath.Path(moves[0][1]).parent if moves else None


def checkpoint_train_steps(checkpoints: epath.Path, step: int) -> int | None:
    """``train.steps`` of the config saved with the checkpoint of ``step`` (what its schedule was laid over), or
    None if it cannot be read."""
    try:
        return int(json.loads((checkpoints / str(step) / "config" / "metadata").read_text())["train"]["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
