"""benchmarks/gpu_mfu.py: the H200 rows of docs/performance.md state MFU on both bases, the bf16 matmul peak measured
in the same run and NVIDIA's datasheet figure, computed from the committed results (issue 49 item 8)."""
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "benchmarks", "results", "gpu_h200_2026-12-04")


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_mfu", os.path.join(ROOT, "benchmarks", "gpu_mfu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(*path):
    with open(os.path.join(*path)) as f:
        return json.load(f)


def test_both_bases_equal_a_hand_computation_from_the_committed_results():
    rows = load_script().rows(RUN, RUN + "_compile")
    xla = read(RUN, "b16_bf16.json")
    cudnn = read(RUN + "_compile", "attention.json")["impls"]["cudnn"]
    by = {(r["label"], r["attention"]): r for r in rows}
    # B/16 with XLA's attention: FLOPs / step time / the run's own matmul peak, and / NVIDIA's 989 TFLOP/s dense bf16
    flops, step = xla["model_flops_per_step"], xla["step_time_s"]
    assert by["B/16", "XLA"]["mfu_measured_peak"] == pytest.approx(flops / step / xla["matmul_peak_flop_per_s"])
    assert by["B/16", "XLA"]["mfu_measured_peak"] == pytest.approx(xla["mfu"])      # what the bench stored
    assert by["B/16", "XLA"]["mfu_datasheet"] == pytest.approx(flops / step / 989e12)
    # B/16 with cuDNN's attention (second run): the same step's FLOPs, the first run's peak
    row = by["B/16", "cuDNN (second run)"]
    assert row["mfu_measured_peak"] == pytest.approx(flops / cudnn["step_time_s"] / xla["matmul_peak_flop_per_s"])
    assert row["mfu_datasheet"] == pytest.approx(flops / cudnn["step_time_s"] / 989e12)
    for name, label in (("s16_bf16", "S/16"), ("b16_scan", "B/16, scanned layers")):
        r = read(RUN, f"{name}.json")
        assert by[label, "XLA"]["mfu_measured_peak"] == pytest.approx(r["mfu"])
        assert by[label, "XLA"]["mfu_datasheet"] == pytest.approx(r["model_flops_per_step"] / r["step_time_s"] / 989e12)
    assert len(rows) == 4


def test_the_docs_rows_are_the_script_s_output():
    script = load_script()
    rows = script.rows(RUN, RUN + "_compile")
    with open(os.path.join(ROOT, "docs", "performance.md")) as f:
        doc = f.read()
    assert script.table(rows) in doc and script.summary(rows) in doc
    assert "MFU, datasheet (989 TFLOP/s)" in script.table(rows)


def test_a_gpu_without_a_datasheet_figure_is_one_error(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"device_kind": "NVIDIA H200 NVL"}))
    with pytest.raises(SystemExit, match="no datasheet figure for the device 'NVIDIA H200 NVL'"):
        load_script().rows(str(tmp_path), None)
