"""``gs://`` served from a local folder, for tests of cloud workdirs without credentials or network.

- ``etils.epath`` (the workdir's own files, TensorBoard event files through it, orbax's metadata and commit files):
  etils' own test double, ``epath.testing.mock_epath``, with every file operation redirected into the folder
  (``gs://bucket/run`` → ``<root>/bucket/run``), and TensorFlow's gfile kept out of the way;
- TensorStore (orbax's arrays): orbax's kvstore spec for a ``gs://`` path becomes a ``file`` kvstore in the folder;
- orbax's bucket look-up through ``google-cloud-storage`` (is the bucket's namespace hierarchical?): no.

Orbax still treats the path as ``gs://``: it commits a step with its commit file instead of a rename, as on GCS.

``python tests/cloud_bucket.py ROOT [--kill_at_save=N] TRAIN_ARGS...`` runs the train CLI inside the mock; with
``--kill_at_save=N`` the process kills itself with SIGKILL when the loop asks for the save of step N, once the
previous save is complete.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from unittest import mock

PREFIX = "gs://"


@contextlib.contextmanager
def cloud_bucket(root):
    """Inside the block, ``gs://BUCKET/PATH`` is ``<root>/BUCKET/PATH``."""
    from etils.epath import gpath
    from etils.epath import testing as epath_testing
    from orbax.checkpoint._src.path import gcs_utils

    root = os.fspath(root)

    def local(path):
        text = os.fspath(path)
        return os.path.join(root, text[len(PREFIX):]) if text.startswith(PREFIX) else text

    def remote(path):
        text = os.fspath(path)
        return PREFIX + os.path.relpath(text, root) if text.startswith(root + os.sep) else text

    def redirect(original, path, *args, **kwargs):
        args = tuple(local(a) if isinstance(a, (str, os.PathLike)) else a for a in args)
        return original(local(path), *args, **kwargs)

    def glob(original, pattern):
        return [remote(p) for p in original(local(pattern))]

    def walk(original, top, **kwargs):
        for directory, dirs, files in original(local(top), **kwargs):
            yield remote(directory), dirs, files

    fns = ("copy", "exists", "isdir", "listdir", "makedirs", "mkdir", "open", "remove", "rename", "replace",
           "rmtree", "stat")
    with contextlib.ExitStack() as stack:
        stack.enter_context(epath_testing.mock_epath(glob=glob, walk=walk, **{name: redirect for name in fns}))
        stack.enter_context(mock.patch.object(gpath, "_is_tf_installed", lambda: False))
        stack.enter_context(mock.patch.object(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False))
        stack.enter_context(mock.patch.object(
            gcs_utils, "get_kvstore_for_gcs", lambda path: {"driver": "file", "path": local(path)}))
        yield


def _kill_at_save(step: int):
    from layerscale_jax.train.checkpoint import Checkpointer
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
    from layerscale_jax.train.__main__ import run_job
    with cloud_bucket(bucket_root):
        sys.exit(run_job([a for a in args if a not in kill]))
