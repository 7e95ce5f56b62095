"""Smoke tests of the benchmark suite: the step runs at a toy size and reports its numbers; the FLOP counts agree;
the bench modules import one way (no cycle) and without the data or training stack."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from layerscale_jax.bench import cli
from layerscale_jax.bench.step import CompiledStep, StepSpec, measure_train_step

TOY = dict(img_size=16, patch_size=4, depth=2, embed_dim=64, num_heads=2, num_classes=10)
PEAK = {"flop_per_s": 1e11}  # a stand-in matmul peak: the smoke tests do not measure one


def test_train_step_at_a_toy_size_reports_the_json_keys(capsys):
    cli.main(["train_step", "--batch", "4", "--repeats", "1", "--min-repeat-s", "0", "--json",
              *[a for k, v in TOY.items() for a in ("--set", f"{k}={v}")]])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("img_per_s", "step_time_s", "flops_per_step", "mfu", "compile_s", "peak_memory_bytes"):
        assert result[key] is not None and result[key] > 0, key
    assert result["overrides"] == TOY


def test_vs_timm_without_torch_says_so_and_still_reports_ours(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name in ("torch", "timm"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    import importlib.util
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in ("torch", "timm") else real_find_spec(name, *a, **k))
    r = measure_train_step(StepSpec(batch=2, overrides=TOY), vs_timm=True, repeats=1, min_repeat_s=0, peak=PEAK)
    assert r["img_per_s"] > 0
    assert r["timm_img_per_s"] is None and r["ratio_vs_timm"] is None
    assert "not importable" in r["timm_skipped"]


@pytest.mark.parametrize("model", ["deit3_small_patch16_224", "cait_xxs24_224"])
def test_analytic_flops_agree_with_xla_cost_analysis(model):
    f = CompiledStep(StepSpec(model=model, batch=4, overrides=TOY)).flops()
    # XLA also counts the elementwise work (softmax, GELU, LayerNorm, AdamW): a little above the matmul count.
    assert 1.0 <= f["flops_xla_over_analytic"] <= 1.25, f


def test_xla_options_compiles_each_option_set_and_times_them_against_the_default():
    from layerscale_jax.bench.entries import bench_xla_options
    r = bench_xla_options(["ynn_off"], cases=[("toy", StepSpec(batch=2, overrides=TOY))], repeats=1)
    rows = {row["option"]: row for row in r["rows"]}
    assert set(rows) == {"xla_default", "ynn_off"}
    assert rows["xla_default"]["speedup_vs_default"] == 1.0
    assert rows["ynn_off"]["step_time_s"] > 0 and rows["ynn_off"]["error"] is None
    assert rows["ynn_off"]["library_calls"]["ynn_fusion"] == 0


def test_xla_options_rejects_an_unknown_option_set_by_name():
    from layerscale_jax.bench.entries import bench_xla_options
    with pytest.raises(ValueError, match="no_such_option"):
        bench_xla_options(["no_such_option"], cases=[("toy", StepSpec(batch=2, overrides=TOY))])


def test_profile_attributes_time_to_the_compiled_programs_operations(capsys):
    cli.main(["profile", "--batch", "2", "--steps", "1", "--top", "5", "--json",
              *[a for k, v in TOY.items() for a in ("--set", f"{k}={v}")]])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["timed_ops_ms_per_step"] > 0
    assert 0 < len(r["by_op"]) <= 5 and all(row["shape"] and row["ms_per_step"] > 0 for row in r["by_op"])
    assert sum(row["ms_per_step"] for row in r["by_kind"]) <= r["timed_ops_ms_per_step"] + 1e-9


def test_page_faults_runs_the_step_in_fresh_processes_with_and_without_the_tunable():
    from layerscale_jax.bench.entries import bench_page_faults
    r = bench_page_faults(StepSpec(batch=2, overrides=TOY), rounds=1)
    assert [run["glibc_tunables"] for run in r["runs"]["default_4k_pages"]] == [""]
    assert [run["glibc_tunables"] for run in r["runs"]["huge_page_malloc"]] == ["glibc.malloc.hugetlb=1"]
    for name in ("default_4k_pages", "huge_page_malloc"):
        assert r[name]["step_s"] > 0 and r[name]["minor_faults"] >= 0


def test_report_renders_the_measured_ratios_into_the_table():
    from layerscale_jax.bench.report import report
    row = {"img_per_s": 3.0, "timm_img_per_s": 4.0, "ratio_vs_timm": 0.75, "ratio_vs_timm_paired": 0.8,
           "mfu": 0.5, "timm_mfu": 0.6}
    table = report({"entries": {"train_step_deit3_small_b16_float32": row,
                                "layerscale": {"rows": [{"case": "toy", "layerscale_step_s": 1.01, "none_step_s": 1.0,
                                                         "overhead": 0.01, "bytes_accessed_overhead": 0.02}]}},
                    "machine": {"cpu": "test cpu"}})
    assert "| DeiT III-S/16 train step, float32, batch 16 | 3.00 img/s | 4.00 img/s | **0.75×** (paired 0.80×)" in table
    assert "overhead **+1.0%** (XLA bytes accessed +2.0%)" in table and "test cpu" in table


def test_optimizer_entry_times_the_trainer_optimizer_against_plain_adamw_and_reports_the_ratio():
    from layerscale_jax.bench import trainer
    from layerscale_jax.bench.report import report
    r = trainer.bench_optimizer(depths=(2,), layouts=("scan",), layer_decays=(0.75,), repeats=1, min_repeat_s=0.0)
    (row,) = r["rows"]
    assert row["depth"] == 2 and row["layout"] == "scan" and row["leaves"] > 0
    assert row["ours_s"] > 0 and row["plain_s"] > 0 and row["ratio"] == row["ours_s"] / row["plain_s"]
    assert row["state_nodes"] > 2 * row["leaves"] and row["stablehlo_ops"] > 0
    table = report({"entries": {"optimizer": r}, "machine": {"cpu": "test cpu"}})
    assert f"scan, layer decay 0.75, depth 2 | {row['ours_s'] * 1e3:.1f}/{row['plain_s'] * 1e3:.1f} ms" in table


BENCH = Path(__file__).resolve().parents[1] / "layerscale_jax" / "bench"
# Each bench module may import only modules listed before it (at module level or inside a function).
IMPORT_ORDER = ("timing", "flops", "timm_worker", "step", "profile", "trainer", "report", "entries", "cli",
                "__main__")


def bench_imports(path: Path) -> set[str]:
    """The ``layerscale_jax.bench`` modules that ``path`` imports anywhere in its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "layerscale_jax.bench":
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("layerscale_jax.bench."):
            out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[2] for a in node.names if a.name.startswith("layerscale_jax.bench."))
    return out


def test_bench_modules_import_only_modules_before_them_so_there_is_no_cycle():
    modules = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    assert modules == set(IMPORT_ORDER), "add the new bench module to IMPORT_ORDER"
    assert bench_imports(BENCH / "__init__.py") == set()
    for i, name in enumerate(IMPORT_ORDER):
        later = bench_imports(BENCH / f"{name}.py") - set(IMPORT_ORDER[:i])
        assert not later, f"bench/{name}.py imports {sorted(later)}, which come after it in IMPORT_ORDER"


def test_the_bench_command_line_imports_nothing_heavier_than_the_models_do():
    # The GPU machine has jax, flax and optax but no TensorFlow, grain or torch: the bench needs only the models.
    heavy = "('tensorflow', 'tensorflow_datasets', 'grain', 'ml_collections', 'torch', 'timm')"
    code = (f"import sys; loaded = lambda: {{m for m in {heavy} if m in sys.modules}}; "
            "import layerscale_jax.models; base = loaded(); import layerscale_jax.bench.cli; "
            "print(sorted(loaded() - base))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_entry_prints_its_results_from_a_committed_results_file(capsys):
    from layerscale_jax.bench.entries import ENTRIES, display
    results = json.loads((BENCH.parents[1] / "benchmarks/results/cpu2_2026-11-29.json").read_text())
    for name, result in results["entries"].items():
        display(name.split("_deit3")[0] if name != "matmul" else "all", result)
    assert "ratio_vs_timm" in capsys.readouterr().out and {"train_step", "optimizer", "all"} <= set(ENTRIES)
