"""``gs://`` served from a local folder with Google Cloud Storage's semantics, for tests of cloud workdirs without
credentials or network.

Where this project's files leave the process:

- ``etils.epath`` (the workdir's own files, TensorBoard event files through it, orbax's metadata and commit files,
  JAX's compilation cache): etils' own test double, ``epath.testing.mock_epath``, with every file operation on a
  ``gs://`` path served by ``FakeBucket`` in the folder (``gs://bucket/run`` → ``<root>/bucket/run``), and
  TensorFlow's gfile kept out of the way;
- TensorStore (orbax's arrays): orbax's kvstore spec for a ``gs://`` path becomes a ``file`` kvstore in the folder;
- orbax's bucket look-up through ``google-cloud-storage`` (is the bucket's namespace hierarchical?): no;
- the workdir's probe of the storage endpoint (``layerscale_jax.network.cloud_storage_problem``): reachable.

Orbax still treats the path as ``gs://``: it commits a step with its commit file instead of a rename, as on GCS.

What GCS does, and ``FakeBucket`` with it (a local disk does none of these):

- **Whole objects.** An object written is visible whole when the write ends, or not at all (the old one stays):
  a file opened for writing is buffered and published at ``close``.
- **No append.** Opening an object with ``"a"`` reads it and rewrites the whole object at ``close`` (what gfile
  does on GCS): every append is one more write of the object, and costs its whole size.
- **Write rate per object.** GCS accepts about one write per second to one object name (more in short bursts, then
  it answers 429 and the client backs off). The fake refuses a write to an object that has used up its burst
  (``burst`` writes, refilled at ``writes_per_s``) with ``OSError`` 429 naming the object, so a test fails where a
  real bucket would throttle the writer. ``writes[name]`` counts each object's writes.
- **No rename.** Renaming copies the object, then deletes the original; a directory (a prefix) is renamed object by
  object, in listing order, and so is a directory deleted (``rmtree``). ``kill_after(n)`` raises ``Killed`` (a
  ``BaseException``: no ``except Exception`` catches it) after ``n`` more object operations (a write, a copy, a
  delete), leaving a rename or a delete half done, as a job killed in the middle of one leaves it.
- **Listing by prefix**: listing a directory lists the objects and prefixes under it (the folder's own listing);
  ``mkdir`` makes the empty placeholder gfile makes on GCS.

``python tests/cloud_bucket.py ROOT [--kill_at_save=N] TRAIN_ARGS...`` runs the train CLI inside the fake; with
``--kill_at_save=N`` the process kills itself with SIGKILL when the loop asks for the save of step N, once the
previous save is complete; with ``--pod_cache_keys`` the processes of a CPU job share compilation-cache keys as a
pod's hosts do (``layerscale_jax.bench.cache_keys``).
"""
from __future__ import annotations

import collections
import contextlib
import errno
import io
import os
import shutil
import signal
import sys
import time
from unittest import mock

PREFIX = "gs://"
POD_CACHE_KEYS = "--pod_cache_keys"


class Killed(BaseException):
    """The job died here (``FakeBucket.kill_after``)."""


class FakeBucket:
    """The GCS semantics of the module docstring over the local folder ``root``."""

    def __init__(self, root, *, burst: int = 5, writes_per_s: float = 1.0):
        self.root = os.fspath(root)
        self.burst, self.writes_per_s = burst, writes_per_s
        self.writes: collections.Counter = collections.Counter()       # object name -> writes so far
        self._tokens: dict[str, tuple[float, float]] = {}              # object name -> (tokens, at time)
        self._operations_left: int | None = None

    # -- names ----------------------------------------------------------------------------------------------------
    def local(self, path) -> str:
        text = os.fspath(path)
        return os.path.join(self.root, text[len(PREFIX):]) if text.startswith(PREFIX) else text

    def remote(self, path) -> str:
        text = os.fspath(path)
        return PREFIX + os.path.relpath(text, self.root) if text.startswith(self.root + os.sep) else text

    def in_bucket(self, path) -> bool:
        return os.fspath(path).startswith(PREFIX)

    # -- faults ---------------------------------------------------------------------------------------------------
    def kill_after(self, operations: int | None) -> None:
        """Raise ``Killed`` once ``operations`` more object operations are done (None: never)."""
        self._operations_left = operations

    def _operation(self) -> None:
        if self._operations_left is None:
            return
        if self._operations_left <= 0:
            self._operations_left = None
            raise Killed("killed in the middle of an object-store operation (FakeBucket.kill_after)")
        self._operations_left -= 1

    def _take_write_token(self, name: str) -> None:
        now = time.monotonic()
        tokens, then = self._tokens.get(name, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.writes_per_s)
        if tokens < 1:
            raise OSError(429, f"429 Too Many Requests: the object {name} is written more often than GCS allows "
                               f"(about {self.writes_per_s:g} write/s per object, {self.burst} in a burst)")
        self._tokens[name] = (tokens - 1, now)
        self.writes[name] += 1

    # -- object operations ----------------------------------------------------------------------------------------
    def put(self, name: str, data: bytes) -> None:
        """Write the object ``name`` (``gs://...``) whole."""
        self._operation()
        self._take_write_token(name)
        target = self.local(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        staged = os.path.join(os.path.dirname(target), f".fake-bucket-upload-{os.getpid()}-{id(data)}")
        with open(staged, "wb") as f:
            f.write(data)
        os.replace(staged, target)

    def delete(self, name: str) -> None:
        self._operation()
        os.remove(self.local(name))

    def objects(self, name: str) -> list[str]:
        """The objects under the prefix ``name`` (itself, if it is an object), in listing order."""
        top = self.local(name)
        if os.path.isfile(top):
            return [name]
        found = []
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            found += [self.remote(os.path.join(directory, f)) for f in sorted(files)]
        return found

    def rename(self, src: str, dst: str) -> None:
        """Copy then delete, object by object."""
        if not os.path.exists(self.local(src)):
            raise FileNotFoundError(errno.ENOENT, "No such object", src)
        for name in self.objects(src):
            with open(self.local(name), "rb") as f:
                data = f.read()
            self.put(dst + name[len(src):], data)
            self.delete(name)
        _remove_empty_dirs(self.local(src))

    def rmtree(self, name: str) -> None:
        for obj in self.objects(name):
            self.delete(obj)
        _remove_empty_dirs(self.local(name))

    def open(self, name: str, mode: str):
        if "r" in mode:
            return open(self.local(name), mode)
        return _Upload(self, name, mode)


def _remove_empty_dirs(top: str) -> None:
    """A prefix without objects is not listed any more."""
    if os.path.isdir(top) and not any(files for _, _, files in os.walk(top)):
        shutil.rmtree(top)


class _Upload(io.BytesIO):
    """An object being written: buffered, published whole at ``close`` (``"a"``: the old content first)."""

    def __init__(self, bucket: FakeBucket, name: str, mode: str):
        super().__init__()
        self.bucket, self.name, self.text = bucket, name, "b" not in mode
        if "a" in mode and os.path.isfile(bucket.local(name)):
            with open(bucket.local(name), "rb") as f:
                super().write(f.read())

    def write(self, data):
        super().write(data.encode() if self.text else data)
        return len(data)

    def __exit__(self, kind, *rest):
        if kind is not None:           # the writer failed: an upload that does not finish publishes nothing
            super().close()
        return super().__exit__(kind, *rest)

    def close(self):
        if not self.closed:
            data = self.getvalue()
            super().close()
            self.bucket.put(self.name, data)


@contextlib.contextmanager
def cloud_bucket(root, **semantics):
    """Inside the block, ``gs://BUCKET/PATH`` is the object ``<root>/BUCKET/PATH`` of a ``FakeBucket`` (yielded;
    ``semantics``: its keyword arguments)."""
    from etils.epath import gpath
    from etils.epath import testing as epath_testing
    from layerscale_jax import network
    from orbax.checkpoint._src.path import gcs_utils

    bucket = FakeBucket(root, **semantics)

    def redirect(original, path, *args, **kwargs):
        args = tuple(bucket.local(a) if isinstance(a, (str, os.PathLike)) else a for a in args)
        return original(bucket.local(path), *args, **kwargs)

    def glob(original, pattern):
        return [bucket.remote(p) for p in original(bucket.local(pattern))]

    def walk(original, top, **kwargs):
        for directory, dirs, files in original(bucket.local(top), **kwargs):
            yield bucket.remote(directory), dirs, [f for f in files if not f.startswith(".fake-bucket-upload-")]

    def listdir(original, path):
        return [f for f in original(bucket.local(path)) if not f.startswith(".fake-bucket-upload-")]

    def open_(original, path, mode):
        return bucket.open(os.fspath(path), mode) if bucket.in_bucket(path) else original(path, mode)

    def rename(original, src, dst, *args, **kwargs):
        if bucket.in_bucket(src) or bucket.in_bucket(dst):
            if os.path.isfile(bucket.local(dst)) and kwargs.get("overwrite") is False:
                raise FileExistsError(errno.EEXIST, "Object exists", dst)
            return bucket.rename(os.fspath(src), os.fspath(dst))
        return original(src, dst, *args, **kwargs)

    def copy(original, src, dst, *, overwrite):
        if not bucket.in_bucket(dst):
            return original(bucket.local(src), dst, overwrite=overwrite)
        if os.path.exists(bucket.local(dst)) and not overwrite:
            raise FileExistsError(errno.EEXIST, "Object exists", dst)
        with open(bucket.local(src), "rb") as f:
            bucket.put(os.fspath(dst), f.read())

    def remove(original, path):
        return bucket.delete(os.fspath(path)) if bucket.in_bucket(path) else original(path)

    def rmtree(original, path):
        return bucket.rmtree(os.fspath(path)) if bucket.in_bucket(path) else original(path)

    fns = ("exists", "isdir", "makedirs", "mkdir", "stat")
    with contextlib.ExitStack() as stack:
        stack.enter_context(epath_testing.mock_epath(
            glob=glob, walk=walk, listdir=listdir, open=open_, rename=rename, replace=rename, copy=copy,
            remove=remove, rmtree=rmtree, **{name: redirect for name in fns}))
        stack.enter_context(mock.patch.object(gpath, "_is_tf_installed", lambda: False))
        stack.enter_context(mock.patch.object(network, "cloud_storage_problem", lambda: None))    # no network needed
        stack.enter_context(mock.patch.object(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False))
        stack.enter_context(mock.patch.object(
            gcs_utils, "get_kvstore_for_gcs", lambda path: {"driver": "file", "path": bucket.local(path)}))
        yield bucket


def _kill_at_save(step: int):
    from layerscale_jax.storage.checkpoint import Checkpointer
    original = Checkpointer.save

    def save(self, at_step, *args, **kwargs):
        if at_step == step:
            self.manager.wait_until_finished()
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, at_step, *args, **kwargs)

    Checkpointer.save = save


if __name__ == "__main__":
    bucket_root, args = sys.argv[1], sys.argv[2:]
    kill = [a for a in args if a.startswith("--kill_at_save=")]
    if kill:
        _kill_at_save(int(kill[0].split("=", 1)[1]))
    if POD_CACHE_KEYS in args:
        from layerscale_jax.bench.cache_keys import use_process_invariant_cpu_cache_keys
        use_process_invariant_cpu_cache_keys()
    from layerscale_jax.train.__main__ import run_job
    with cloud_bucket(bucket_root):
        sys.exit(run_job([a for a in args if a not in kill and a != POD_CACHE_KEYS]))
