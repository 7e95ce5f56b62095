"""SHA-256 digests of a checkpoint's files, written when the checkpoint is finalised and checked before it is read
(``train/checkpoint.py`` restores, ``convert`` exports). Paths are ``pathlib.Path`` or ``etils.epath.Path`` (for
``gs://``); only the standard library is imported, so the conversion tools use it without the training stack."""
from __future__ import annotations

import hashlib
import json


def _files(root):
    for child in sorted(root.iterdir()):
        if child.is_dir():
            yield from _files(child)
        else:
            yield child


def file_digests(root) -> dict[str, str]:
    """``{path relative to root: SHA-256 hex digest}`` of every file under ``root``."""
    digests = {}
    for path in _files(root):
        sha = hashlib.sha256()
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                sha.update(chunk)
        digests[str(path.relative_to(root))] = sha.hexdigest()
    return digests


def corruption(directory, checksums_file) -> str | None:
    """Why ``directory`` no longer matches the digests in ``checksums_file``, or None (also None when there is no
    such file: a checkpoint never sealed)."""
    if not checksums_file.exists():
        return None
    expected = json.loads(checksums_file.read_text())
    actual = file_digests(directory)
    missing = sorted(set(expected) - set(actual))
    changed = sorted(f for f in expected if f in actual and actual[f] != expected[f])
    if missing or changed:
        return (f"{len(missing)} file(s) missing, {len(changed)} changed since it was written"
                f" (e.g. {(missing + changed)[0]})")
    return None
