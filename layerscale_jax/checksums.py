"""SHA-256 digests of a checkpoint's files: its seal, written as part of finishing the checkpoint and checked before it
is read (``storage/checkpoint.py`` restores, ``convert`` exports). A checkpoint without a seal is never trusted.

Digests are computed on several threads (``hashlib`` releases the GIL while it hashes, file reads release it while
they wait), and each process of a job hashes, and later checks, only its share of the files. Paths are
``pathlib.Path`` or ``etils.epath.Path`` (``gs://``); only the standard library is imported, so the conversion tools
use this module without the training stack.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json

THREADS = 16          # enough to keep a cloud bucket's reads in flight; local disks are saturated by fewer
_CHUNK = 1 << 24


def list_files(root) -> list[str]:
    """The paths, relative to ``root`` and sorted, of every file under ``root``."""
    names = []

    def walk(directory, prefix):
        for child in directory.iterdir():
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            else:
                names.append(prefix + child.name)

    walk(root, "")
    return sorted(names)


def _digest(path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            sha.update(chunk)
    return sha.hexdigest()


def file_digests(root, names: list[str] | None = None, threads: int = THREADS) -> dict[str, str]:
    """``{path relative to root: SHA-256 hex digest}`` of ``names`` (default: every file under ``root``), hashed on
    ``threads`` threads."""
    names = list_files(root) if names is None else sorted(names)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda name: _digest(root / name), names)))


def corruption(directory, checksums_file, share: tuple[int, int] = (0, 1)) -> str | None:
    """Why ``directory`` cannot be trusted, or None when its files match the digests in ``checksums_file``.

    ``share=(index, count)``: check only every ``count``-th recorded file from the ``index``-th (each of ``count``
    processes checks its own share; together they check every file once). A directory without ``checksums_file``
    was never sealed (the job stopped while writing it) and is not trusted either.
    """
    if not checksums_file.exists():
        return f"never sealed: {checksums_file} is missing, the job stopped while writing it"
    try:
        expected = json.loads(checksums_file.read_text())
        if not isinstance(expected, dict):
            raise ValueError("not an object")
    except ValueError as err:
        return f"its seal {checksums_file} cannot be read ({err})"
    index, count = share
    names = sorted(expected)[index::count]
    present = set(list_files(directory))
    missing = [name for name in names if name not in present]
    actual = file_digests(directory, [name for name in names if name in present])
    changed = [name for name in actual if actual[name] != expected[name]]
    if missing or changed:
        return (f"{len(missing)} file(s) missing, {len(changed)} changed since it was written"
                f" (e.g. {(missing + changed)[0]})")
    return None
