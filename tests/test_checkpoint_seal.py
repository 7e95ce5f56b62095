"""The seal of a checkpoint written by several processes: each process hashes the files it wrote itself (before
orbax's write barrier), process 0 the shared ones, and the merged seal covers every file the step keeps."""
import json
import os
import re
import socket
import subprocess
import sys

from etils import epath
import pytest

from layerscale_jax.checksums import file_digests
from layerscale_jax.storage.checkpoint import REWRITTEN_AT_COMMIT, Checkpointer

from test_train import TINY, subprocess_env

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

WRITER = re.compile(r"(?:^|/)(?:ocdbt\.)?process_(\d+)(?:/|$)")


def writer_process(name: str) -> int:
    """Who wrote a file of a step, by orbax's layout: ``*/ocdbt.process_<i>/...`` and ``*/array_metadatas/process_<i>``
    are process i's, the rest process 0's (the merged index, the metadata)."""
    match = WRITER.search(name)
    return int(match.group(1)) if match else 0


def test_each_process_hashes_the_files_it_wrote_and_the_seal_covers_the_whole_step(tmp_path):
    workdir = tmp_path / "two"
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    # the step-2 checkpoint of a 3-step run, then a stop: no third step, no final save or evaluation to wait for
    procs = [subprocess.Popen([sys.executable, "-m", "layerscale_jax.train", f"--config={TINY}:steps=3",
                               "--config.train.stop_after_steps=2", f"--workdir={workdir}",
                               f"--coordinator_address=localhost:{port}", "--num_processes=2", f"--process_id={i}"],
                              env=subprocess_env(2), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n\n".join(outputs)

    step_dir = epath.Path(workdir) / "checkpoints" / "2"
    meta = epath.Path(workdir) / "checkpoints" / "meta" / "2"
    on_disk = file_digests(step_dir)
    for process in (0, 1):            # before orbax's write barrier, each process hashed exactly its own files
        hashed = json.loads((meta / f"digests_process_{process}.json").read_text())
        assert sorted(hashed) == sorted(name for name in on_disk if writer_process(name) == process
                                        and "process_" in name)
        assert hashed and all(on_disk[name] == digest for name, digest in hashed.items())
    by_process_1 = json.loads((meta / "digests_process_1.json").read_text())
    seal = json.loads((meta / "checksums.json").read_text())
    assert seal == {name: digest for name, digest in on_disk.items() if name not in REWRITTEN_AT_COMMIT}

    (step_dir / sorted(by_process_1)[-1]).write_bytes(b"damaged")      # one of process 1's files
    assert "1 changed" in Checkpointer(os.fspath(workdir / "checkpoints"), keep=2)._verify(2)


@pytest.mark.slow
def test_the_seal_benchmark_of_storage_md_runs(tmp_path):
    """docs/storage.md's ``python benchmarks/bench_seal.py --rounds 5`` ended in ``TypeError: Checkpointer.save()
    got an unexpected keyword argument 'force'``: the same script, at depth 1 and one round."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench_seal.py")
    spec = importlib.util.spec_from_file_location("bench_seal", path)
    bench_seal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_seal)
    result = bench_seal.main(["--depth", "1", "--rounds", "1", "--json", str(tmp_path / "seal.json")])
    assert len(result["save_s"]["with_seal"]) == len(result["save_s"]["without_seal"]) == 1
    assert json.loads((tmp_path / "seal.json").read_text())["added_per_save_s"] == result["added_per_save_s"]
