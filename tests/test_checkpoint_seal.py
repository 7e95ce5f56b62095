"""The seal of a checkpoint written by several processes: each process hashes the files it wrote itself (before
orbax's write barrier), process 0 the shared ones, and the merged seal covers every file the step keeps."""
import json
import os
import socket
import subprocess
import sys

from etils import epath

from layerscale_jax.checksums import file_digests
from layerscale_jax.train.checkpoint import REWRITTEN_AT_COMMIT, Checkpointer, writer_process

from test_train import TINY, subprocess_env


def test_each_process_hashes_the_files_it_wrote_and_the_seal_covers_the_whole_step(tmp_path):
    workdir = tmp_path / "two"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=3",
                               f"--workdir={workdir}", f"--coordinator_address=localhost:{port}",
                               "--num_processes=2", f"--process_id={i}"],
                              env=subprocess_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n\n".join(outputs)

    step_dir = epath.Path(workdir) / "checkpoints" / "2"
    meta = epath.Path(workdir) / "checkpoints" / "meta" / "2"
    on_disk = file_digests(step_dir)
    by_process_1 = json.loads((meta / "digests_process_1.json").read_text())
    assert by_process_1 and {writer_process(name) for name in by_process_1} == {1}
    assert sorted(by_process_1) == sorted(name for name in on_disk if writer_process(name) == 1)
    seal = json.loads((meta / "checksums.json").read_text())
    assert seal == {name: digest for name, digest in on_disk.items() if name not in REWRITTEN_AT_COMMIT}

    (step_dir / sorted(by_process_1)[-1]).write_bytes(b"damaged")      # one of process 1's files
    assert "1 changed" in Checkpointer(os.fspath(workdir / "checkpoints"), keep=2)._verify(2)
