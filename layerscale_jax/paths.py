"""Paths as users write them (``--workdir``, ``data.data_dir``, ``train.compilation_cache_dir``), as ``etils.epath``
paths: a local path (``~`` expanded, made absolute), ``file://PATH`` (the same local path), or ``gs://BUCKET/PATH``
(Google Cloud Storage, kept as it is).

``gs://`` is the one cloud scheme every writer of a run supports: orbax (TensorStore's ``gcs`` driver for the
arrays, ``etils.epath`` for the rest, ``google-cloud-storage`` to list steps: ``pip install -e ".[gcs]"``), the
side files, logs and TensorBoard event files (``etils.epath``), TFDS and JAX's compilation cache. Any other scheme
(``s3://``, ``memory://``, ...) is refused where it enters, naming the field and the value.
"""
from __future__ import annotations

import json
import os
import re

from etils import epath

from layerscale_jax.errors import UserError

CLOUD_SCHEMES = ("gs",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def is_url(path) -> bool:
    """Whether ``path`` (already through ``as_path``) is on cloud storage rather than on a local filesystem."""
    return _SCHEME.match(os.fspath(path)) is not None


def write_text_atomically(path: epath.Path, text: str) -> None:
    """Replace the file ``path`` by ``text`` whole: a job killed while writing leaves the old file or the new one,
    never a torn one (a local file is written beside it, then renamed over it; an object store replaces an object
    whole anyway)."""
    if is_url(path):
        path.write_text(text)
        return
    tmp = path.parent / (path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def read_json(path: epath.Path, remedy: str) -> dict:
    """The JSON object in the file ``path``. A damaged file (torn, edited, overwritten, another JSON value than an
    object) is a ``UserError`` naming the file, the damage and ``remedy`` (what to do), not a bare "Expecting
    property name ..." on every rerun."""
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        problem = err
    else:
        if isinstance(value, dict):
            return value
        problem = f"not a JSON object: {json.dumps(value)[:40]}"
    raise UserError(f"{path} is damaged ({problem}); {remedy}")


def as_path(path, field: str = "path") -> epath.Path:
    """The ``epath.Path`` of ``path`` as a user wrote it (see the module docstring); ``field`` names it in the
    one-line error for an empty path or an unsupported scheme ('' is no path: it would name the current
    directory)."""
    text = os.fspath(path)
    if not text.strip():
        raise UserError(f"{field}={text!r} is empty: give a path (a local one, ~/..., file://PATH or "
                        "gs://BUCKET/PATH)")
    match = _SCHEME.match(text)
    if match is None:
        return epath.Path(os.path.abspath(os.path.expanduser(text)))
    scheme, rest = match.groups()
    if scheme == "file":
        return epath.Path(os.path.abspath(os.path.expanduser(rest)))
    if scheme in CLOUD_SCHEMES:
        return epath.Path(text)
    raise UserError(f"{field}={text!r}: the scheme '{scheme}://' is not supported; use a local path, file://PATH or "
                    f"gs://BUCKET/PATH")


def move_all(journal: epath.Path, moves: list[tuple[epath.Path, epath.Path]]) -> None:
    """Move each ``(source, target)`` of ``moves`` (files or directories) so that a job killed midway leaves no
    half-done state behind for good: the list is written to ``journal`` first, and ``finish_moves(journal)``, which
    the next start calls, completes it.

    On a local disk each move is a rename (atomic). On an object store there is no rename: a directory moves object
    by object, each copied then deleted, so a kill can leave some objects in both places or only in the source;
    finishing moves what is still in the source (copying again what was copied but not deleted), then removes the
    journal. The journal is written whole, so it is there with every move or not at all.
    """
    write_text_atomically(journal, json.dumps([[os.fspath(src), os.fspath(dst)] for src, dst in moves]))
    finish_moves(journal)


def finish_moves(journal: epath.Path) -> list[tuple[str, str]]:
    """Complete the moves ``journal`` lists (``move_all``), then remove it; the moves (none: no journal)."""
    if not journal.exists():
        return []
    moves = [(src, dst) for src, dst in json.loads(journal.read_text())]
    for src, dst in moves:
        _move(epath.Path(src), epath.Path(dst))
    journal.unlink()
    return moves


def _move(src: epath.Path, dst: epath.Path) -> None:
    """Move what is left of ``src`` to ``dst`` (nothing left: moved already)."""
    if not src.exists():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not is_url(src) and not dst.exists():
        src.rename(dst)
        return
    if not src.is_dir():
        src.replace(dst)
        return
    for directory, _, files in src.walk():
        for name in sorted(files):
            source = epath.Path(directory) / name
            target = dst / source.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            source.replace(target)              # an object store: copy, then delete
    src.rmtree()                                # the prefixes left empty
