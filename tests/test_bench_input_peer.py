"""benchmarks/bench_input_peer.py compares like with like: for each path it covers, ours and the tf.data peer emit
the same batch for the same JPEGs (uint8 by default, both normalised with --emit float32), and the peer does no float
normalisation when ours does none (issue 49 item 8)."""
import importlib.util
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (ours, tf.data): each of ours against the peer that does its work, as in PEERS
PATHS = [("bilinear_threads", "base"), ("base_threads", "bicubic"), ("deit3_threads", "deit3")]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_input_peer",
                                                  os.path.join(ROOT, "benchmarks", "bench_input_peer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_batch(build, variant, emit):
    """The first images of a tiny run of one side: 2 images of 16 px from 4 JPEGs of 24x32."""
    next_images, close = build(variant, 1, 2, (24, 32), 4, size=16, emit=emit)
    try:
        return next_images()
    finally:
        close()


@pytest.mark.slow  # TensorFlow (tf.data's side): about 5 s of CPU to import
@pytest.mark.parametrize("ours_variant,peer_variant", PATHS)
def test_both_sides_emit_the_same_uint8_batch(ours_variant, peer_variant):
    bench = load_bench()
    ours = first_batch(bench.ours, ours_variant, "uint8")
    peer = first_batch(bench.tfdata, peer_variant, "uint8")
    assert (ours.dtype, ours.shape) == (peer.dtype, peer.shape) == (np.uint8, (2, 16, 16, 3))
    # pixel values, not (x / 255 - mean) / std cast back: smooth random images span far more than a few levels
    assert peer.max() - peer.min() > 16 and ours.max() - ours.min() > 16


@pytest.mark.slow
def test_with_emit_float32_both_sides_normalise():
    bench = load_bench()
    ours = first_batch(bench.ours, "bilinear_threads", "float32")
    peer = first_batch(bench.tfdata, "base", "float32")
    assert (ours.dtype, ours.shape) == (peer.dtype, peer.shape) == (np.float32, (2, 16, 16, 3))
    for x in (ours, peer):  # (x / 255 - mean) / std of ImageNet's constants lies in [-2.2, 2.7]
        assert -2.2 <= x.min() < x.max() <= 2.7


def test_a_run_whose_contenders_emit_different_batches_stops():
    bench = load_bench()
    runs = [{"contender": "ours_base", "batch_shape": [2, 16, 16, 3], "dtype": "uint8"},
            {"contender": "tfdata_base", "batch_shape": [2, 16, 16, 3], "dtype": "float32"}]
    with pytest.raises(SystemExit, match="different batches"):
        bench.same_output(runs)
    assert bench.same_output(runs[:1]) == ((2, 16, 16, 3), "uint8")


def test_docs_like_for_like_table_is_the_committed_uint8_record():
    """docs/data.md's "Measured here, uint8 out on both sides" table quotes the committed record: each side's median
    and rounds (images per CPU-second) and their ratio, per path."""
    import json
    import re
    from collections import defaultdict

    with open(os.path.join(ROOT, "benchmarks", "results", "input_peer_cpu2-intel-xeon-processor_2026-12-06.json")) as f:
        record = json.load(f)
    assert {run["dtype"] for run in record["runs"]} == {"uint8"}
    rounds = defaultdict(list)
    for run in record["runs"]:
        rounds[run["contender"]].append(run["images_per_cpu_s"])
    with open(os.path.join(ROOT, "docs", "data.md")) as f:
        text = f.read()
    section = text[text.index("**Measured here, uint8 out on both sides**"):]
    rows = re.findall(r"^\| [^|]+ \| (\d+) \(([\d, ]+)\) \| (\d+) \(([\d, ]+)\) \| \*\*([\d.]+)×\*\*", section,
                      re.M)[:3]
    assert len(rows) == len(PATHS)
    for (ours_variant, peer_variant), (ours, ours_rounds, peer, peer_rounds, ratio) in zip(PATHS, rows):
        mine, theirs = rounds[f"ours_{ours_variant}"], rounds[f"tfdata_{peer_variant}"]
        assert [round(v) for v in mine] == [int(v) for v in ours_rounds.split(", ")]
        assert [round(v) for v in theirs] == [int(v) for v in peer_rounds.split(", ")]
        assert (round(np.median(mine)), round(np.median(theirs))) == (int(ours), int(peer))
        assert f"{np.median(mine) / np.median(theirs):.2f}" == ratio
