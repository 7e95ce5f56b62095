"""Smoke tests of the benchmark suite at toy sizes: the step, the timm and big_vision sides, the FLOP counts, the
fresh-process probe, the printer and docs/performance.md's table; the bench modules import one way and need no
data stack."""
import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from layerscale_jax.bench import cli, flops, peer, timing
from layerscale_jax.bench.step import CompiledStep, StepSpec, measure_train_step
from layerscale_jax.models import model_config

TOY = dict(img_size=16, patch_size=4, depth=2, embed_dim=64, num_heads=2, num_classes=10)
TOY_FLAGS = [a for k, v in TOY.items() for a in ("--set", f"{k}={v}")]
PEAK = {"flop_per_s": 1e11}  # a stand-in matmul peak: the smoke tests do not measure one
REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "layerscale_jax" / "bench"


@pytest.fixture
def step_seconds(monkeypatch):
    """Timing on a clock that only the timed calls move: ``step_seconds[name] = s`` makes each of contender
    ``name``'s steps last exactly ``s`` seconds (the calls still run), so what a benchmark reports follows exactly."""
    seconds, clock = {}, [0.0]
    real_measure = timing.measure

    def advancing(name, call):
        def run(k):
            call(k)
            clock[0] += k * seconds[name]
        return run

    monkeypatch.setattr(timing, "measure",
                        lambda calls, **kw: real_measure({n: advancing(n, c) for n, c in calls.items()}, **kw))
    monkeypatch.setattr(timing, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    return seconds


def no_torch(monkeypatch):
    import importlib.util
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name in ("torch", "timm") else real_find_spec(name, *a, **k))


@pytest.mark.slow
def test_train_step_at_a_toy_size_reports_speed_flops_and_mfu_from_the_step_time(capsys, step_seconds):
    step_seconds.update(ours=0.25, mm=2 * 2048 ** 3 / 1e11)             # a step: 250 ms; the matmul peak: 100 GFLOP/s
    cli.main(["train_step", "--batch", "4", "--repeats", "1", "--min-repeat-s", "0", "--json", *TOY_FLAGS])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    analytic = flops.train_step_flops(model_config("deit3_small_patch16_224", **TOY), 4)
    assert result["step_time_s"] == 0.25 and result["img_per_s"] == 4 / 0.25
    assert result["model_flops_per_step"] == analytic and result["matmul_peak_flop_per_s"] == pytest.approx(1e11)
    assert result["mfu"] == pytest.approx(analytic / 0.25 / 1e11)
    assert result["compile_s"] > 0 and result["peak_memory_bytes"] > 0
    assert result["overrides"] == TOY


@pytest.mark.slow
def test_vs_timm_without_torch_says_so_and_still_reports_ours(monkeypatch, step_seconds):
    no_torch(monkeypatch)
    step_seconds.update(ours=0.5)
    r = measure_train_step(StepSpec(batch=2, overrides=TOY), vs_timm=True, repeats=1, min_repeat_s=0, peak=PEAK)
    assert r["img_per_s"] == 2 / 0.5
    assert r["timm_img_per_s"] is None and r["ratio_vs_timm"] is None
    assert "not importable" in r["timm_skipped"] and "--timm-python" in r["timm_skipped"]


@pytest.mark.slow
def test_timm_python_runs_the_worker_with_that_interpreter_and_reports_what_it_lacks():
    # This interpreter has no torch: the worker starts under it (the repository on PYTHONPATH), says so and exits.
    import importlib.util
    if importlib.util.find_spec("torch"):
        pytest.skip("torch is importable here; the worker would time timm")
    r = measure_train_step(StepSpec(batch=2, overrides=TOY), vs_timm=True, timm_python=sys.executable, repeats=1,
                           min_repeat_s=0, peak=PEAK)
    assert f"not importable by {sys.executable}" in r["timm_skipped"] and r["ratio_vs_timm"] is None


@pytest.mark.slow
def test_timm_python_that_does_not_exist_is_a_clear_error_naming_the_flag_and_the_path():
    with pytest.raises(ValueError, match=r"--timm-python '/no/such/python'"):
        measure_train_step(StepSpec(batch=2, overrides=TOY), vs_timm=True, timm_python="/no/such/python")
    out = subprocess.run([sys.executable, "-m", "layerscale_jax.bench", "all", "--timm-python", "/no/such/python"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "--timm-python '/no/such/python'" in out.stderr, out.stderr


def test_the_timm_worker_imports_nothing_newer_than_python_3_11():
    code = ("import sys, layerscale_jax.bench.timm_worker; print('\\n'.join(m.__file__ for n, m in sys.modules.items()"
            " if n.startswith('layerscale_jax')))")
    files = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert any(f.endswith("timm_worker.py") for f in files) and not any(f.endswith("step.py") for f in files)
    for f in files:
        ast.parse(Path(f).read_text(), f, feature_version=(3, 11))


@pytest.mark.slow
def test_the_peer_is_big_vision_vit_with_a_hand_counted_parameter_count():
    d, m, p, n, classes, depth = 64, 256, 4, (16 // 4) ** 2, 10, 2
    block = 2 * 2 * d + 4 * (d * d + d) + (d * m + m) + (m * d + d)   # two LayerNorms, q k v o, the MLP
    expected = (p * p * 3 * d + d) + n * d + depth * block + 2 * d + (d * classes + classes)
    cfg = model_config("deit3_small_patch16_224", **TOY)
    import jax.numpy as jnp
    from layerscale_jax.bench.step import make_optimizer
    images, labels = jnp.zeros((2, 16, 16, 3)), jnp.zeros((2,), jnp.int32)
    loop, num_params = peer.compile_step(cfg, images, labels, make_optimizer())
    assert num_params == expected
    loop.run(2)
    assert float(loop.out) > 0


@pytest.mark.slow
def test_vs_peer_times_the_peer_alternately_and_reports_ratio_and_flops(step_seconds):
    step_seconds.update(ours=0.25, peer=0.5)                   # the peer twice as slow: ours is 2× faster
    r = measure_train_step(StepSpec(batch=2, overrides=TOY), vs_peer=True, repeats=3, min_repeat_s=0, peak=PEAK)
    assert r["peer"] == peer.LABEL and r["peer_step_s"] == 0.5 and r["peer_img_per_s"] == 4.0
    assert r["ours_over_peer"] == 2.0 and r["ours_over_peer_paired"] == 2.0
    # The only FLOP difference is our class token: 17 tokens against the peer's 16 at this toy size.
    cfg = model_config("deit3_small_patch16_224", **TOY)
    assert r["peer_flops_analytic"] == flops.train_step_flops(cfg, 2, class_token=False) < r["flops_analytic"]
    assert r["num_params"] - r["peer_num_params"] == 64 + 2 * 2 * 64       # class token + LayerScale's γ


def test_at_vit_s16_the_peer_and_our_model_count_flops_within_a_percent():
    cfg = model_config("deit3_small_patch16_224")
    ours, peer_flops = flops.train_step_flops(cfg, 16), flops.train_step_flops(cfg, 16, class_token=False)
    assert 1 < ours / peer_flops < 1.01                                          # 197 tokens against 196


def test_vs_peer_refuses_cait_naming_the_flag_and_the_model():
    with pytest.raises(ValueError, match=r"--vs-peer: model 'cait_xxs24_224' is a CaiT"):
        cli.main(["train_step", "--model", "cait_xxs24_224", "--vs-peer", *TOY_FLAGS])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["deit3_small_patch16_224", "cait_xxs24_224"])
def test_analytic_flops_agree_with_xla_cost_analysis(model):
    f = CompiledStep(StepSpec(model=model, batch=4, overrides=TOY)).flops()
    # XLA also counts the elementwise work (softmax, GELU, LayerNorm, AdamW): a little above the matmul count.
    assert 1.0 <= f["flops_xla_over_analytic"] <= 1.25, f


@pytest.mark.slow
def test_xla_options_compiles_each_option_set_and_times_them_against_the_default(step_seconds):
    from layerscale_jax.bench.entries import bench_xla_options
    step_seconds.update(xla_default=0.3, ynn_off=0.2)
    r = bench_xla_options(("ynn_off",), cases=[("toy", StepSpec(batch=2, overrides=TOY))], repeats=1)
    rows = {row["option"]: row for row in r["rows"]}
    assert set(rows) == {"xla_default", "ynn_off"}
    assert rows["ynn_off"]["error"] is None and rows["ynn_off"]["step_time_s"] == pytest.approx(0.2)
    assert [rows[n]["speedup_vs_default"] for n in ("xla_default", "ynn_off")] == pytest.approx([1.0, 1.5])
    assert rows["ynn_off"]["library_calls"]["ynn_fusion"] == 0
    with pytest.raises(ValueError, match="--options: unknown XLA option set.*no_such_option"):
        bench_xla_options(("no_such_option",))


@pytest.mark.slow
def test_profile_attributes_time_to_the_compiled_programs_operations(capsys):
    cli.main(["profile", "--batch", "2", "--steps", "1", "--top", "5", "--json", *TOY_FLAGS])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["timed_ops_ms_per_step"] > 0
    assert 0 < len(r["by_op"]) <= 5 and all(row["shape"] and row["ms_per_step"] > 0 for row in r["by_op"])
    assert sum(row["ms_per_step"] for row in r["by_kind"]) <= r["timed_ops_ms_per_step"] + 1e-9


@pytest.mark.slow
def test_page_faults_runs_the_probe_in_fresh_processes_with_each_malloc():
    from layerscale_jax.bench.entries import bench_page_faults
    from layerscale_jax.runtime.malloc import tcmalloc_library
    r = bench_page_faults(StepSpec(batch=2, overrides=TOY), rounds=1)
    names = ["default_4k_pages", "huge_page_malloc"] + ["tcmalloc"] * (tcmalloc_library() is not None)
    assert [name for name in r["runs"]] == names and r["tcmalloc_library"] == tcmalloc_library()
    assert [(run["glibc_tunables"], run["ld_preload"]) for run in r["runs"]["default_4k_pages"]] == [("", "")]
    assert [run["glibc_tunables"] for run in r["runs"]["huge_page_malloc"]] == ["glibc.malloc.hugetlb=1"]
    if "tcmalloc" in names:
        assert [run["ld_preload"] for run in r["runs"]["tcmalloc"]] == [tcmalloc_library()]
    for name in names:
        assert r[name]["step_s"] > 0 and r[name]["minor_faults"] >= 0
        (run,) = r["runs"][name]             # the same probe measures memory for the `memory` entry
        assert 0 < run["xla_peak_bytes"] and 0 < run["rss_step_increase_bytes"] < run["rss_peak_during_steps_bytes"]


def test_report_renders_the_measured_ratios_and_each_rows_cpu_into_the_table():
    from layerscale_jax.bench.report import report
    row = {"img_per_s": 3.0, "timm_img_per_s": 4.0, "ratio_vs_timm": 0.75, "ratio_vs_timm_paired": 0.8,
           "mfu": 0.5, "timm_mfu": 0.6, "ours_over_peer": 0.9, "ours_over_peer_paired": 0.95, "peer": peer.LABEL,
           "machine": {"cpu": "row cpu"}}
    table = report({"entries": {"train_step_deit3_small_b16_float32": row,
                                "layerscale": {"rows": [{"case": "toy", "layerscale_step_s": 1.01, "none_step_s": 1.0,
                                                         "overhead": 0.01, "bytes_accessed_overhead": 0.02}]}},
                    "machine": {"cpu": "file cpu"}})
    assert ("| DeiT III-S/16 train step, float32, batch 16 | 3.00 img/s | 4.00 img/s | **0.75×** (paired 0.80×) | "
            "**0.90×** (paired 0.95×) | 50.0% / 60.0% | ≥ 1.0× | row cpu |") in table
    assert "overhead **+1.0%** (XLA bytes accessed +2.0%)" in table and table.count("| file cpu |") == 1
    assert f"ours / peer: {peer.LABEL}." in table


def test_report_has_a_malloc_row_per_measured_step_naming_its_size():
    from layerscale_jax.bench.report import report
    spec = StepSpec(batch=64, scan=True, overrides=dict(img_size=8, embed_dim=32, depth=48, num_heads=2)).describe()
    pf = {"spec": spec, "speedup": 1.3, "fault_ratio": 101.0, "tcmalloc_speedup": 1.38, "tcmalloc_fault_ratio": 39295.0,
          "tcmalloc": {"step_s": 0.07, "minor_faults": 0.0}}
    table = report({"entries": {"page_faults": dict(pf, spec=StepSpec().describe(), tcmalloc={"minor_faults": 2.0}),
                                "page_faults_ablation_depth48": pf}, "machine": {"cpu": "test cpu"}})
    assert ("| malloc vs glibc's 4 KiB pages, deit3_small_patch16_224 (img_size=8, embed_dim=32, depth=48), batch 64, "
            "scanned step | huge pages 1.30× faster, 101× fewer page faults; TCMalloc 1.38×, no page faults |") in table
    assert "batch 16 step | huge pages 1.30× faster, 101× fewer page faults; TCMalloc 1.38×, 39295× fewer |" in table


@pytest.mark.parametrize("name, cpu", [("cpu2_2026-11-29", "Intel(R) Xeon(R) Processor"),
                                       ("cpu2_2026-11-30", "AMD EPYC")])
def test_report_reads_the_committed_results_and_names_the_cpu_on_every_row(name, cpu, capsys):
    cli.main(["report", str(REPO / f"benchmarks/results/{name}.json")])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 5 and rows[0].endswith("| target | CPU |")
    assert all(r.endswith(f"| {cpu} |") for r in rows[1:]), rows


def test_report_of_two_machines_puts_each_benchmarks_rows_side_by_side(capsys):
    cli.main(["report", *(str(REPO / f"benchmarks/results/{n}.json") for n in ("cpu2_2026-11-30", "cpu2_2026-11-29"))])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    fp32 = [i for i, r in enumerate(rows) if r.startswith("| DeiT III-S/16 train step, float32, batch 16 |")]
    assert len(fp32) == 2 and fp32[1] == fp32[0] + 1
    assert rows[fp32[0]].endswith("| AMD EPYC |") and rows[fp32[1]].endswith("| Intel(R) Xeon(R) Processor |")


@pytest.mark.slow
def test_optimizer_entry_times_the_trainer_optimizer_against_plain_adamw_and_reports_the_ratio(step_seconds):
    from layerscale_jax.bench import trainer
    from layerscale_jax.bench.report import report
    step_seconds.update(ours=0.003, plain=0.002)
    r = trainer.bench_optimizer(depths=(2,), layouts=("scan",), layer_decays=(0.75,), repeats=1, min_repeat_s=0.0)
    (row,) = r["rows"]
    assert row["depth"] == 2 and row["layout"] == "scan" and row["leaves"] > 0
    assert (row["ours_s"], row["plain_s"]) == pytest.approx((0.003, 0.002)) and row["ratio"] == pytest.approx(1.5)
    assert row["state_nodes"] > 2 * row["leaves"] and row["stablehlo_ops"] > 0
    table = report({"entries": {"optimizer": r}, "machine": {"cpu": "test cpu"}})
    assert f"scan, layer decay 0.75, depth 2 | {row['ours_s'] * 1e3:.1f}/{row['plain_s'] * 1e3:.1f} ms" in table


# Each bench module may import only modules listed before it (at module level or inside a function).
IMPORT_ORDER = ("cache_keys", "timing", "flops", "timm_worker", "peer", "step", "op_profile", "trainer", "report",
                "entries", "cli", "__main__")


def bench_imports(path: Path) -> set[str]:
    """The ``layerscale_jax.bench`` modules that ``path`` imports anywhere in its code (the package-wide reader of
    ``test_import_structure``, which also keeps the whole package free of cycles)."""
    from test_import_structure import imported_modules, package_modules
    prefix = "layerscale_jax.bench."
    return {m[len(prefix):] for m in imported_modules(path, set(package_modules())) if m.startswith(prefix)}


def test_bench_modules_import_only_modules_before_them_so_there_is_no_cycle():
    modules = {p.stem for p in BENCH.glob("*.py")} - {"__init__"}
    assert modules == set(IMPORT_ORDER), "add the new bench module to IMPORT_ORDER"
    assert bench_imports(BENCH / "__init__.py") == set()
    for i, name in enumerate(IMPORT_ORDER):
        later = bench_imports(BENCH / f"{name}.py") - set(IMPORT_ORDER[:i])
        assert not later, f"bench/{name}.py imports {sorted(later)}, which come after it in IMPORT_ORDER"


@pytest.mark.slow
def test_the_bench_command_line_imports_nothing_heavier_than_the_models_do():
    # The GPU machine has jax, flax and optax but no TensorFlow, grain or torch: the bench needs only the models.
    heavy = "('tensorflow', 'tensorflow_datasets', 'grain', 'ml_collections', 'torch', 'timm')"
    code = (f"import sys; loaded = lambda: {{m for m in {heavy} if m in sys.modules}}; "
            "import layerscale_jax.models; base = loaded(); import layerscale_jax.bench.cli; "
            "print(sorted(loaded() - base))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_entry_prints_a_line_per_row_and_per_scalar_of_a_committed_results_file(capsys):
    from layerscale_jax.bench.entries import ENTRIES, display
    from layerscale_jax.bench.report import REASONS, fmt, get
    results = json.loads((REPO / "benchmarks/results/cpu2_2026-11-29.json").read_text())
    assert {"train_step", "optimizer", "all"} <= set(ENTRIES) and len(results["entries"]) > 8
    for name, result in results["entries"].items():
        name = name.split("_deit3")[0]
        display(name, result)
        lines = capsys.readouterr().out.splitlines()
        for key in [k for k, v in result.items() if isinstance(v, (str, int, float)) and k not in REASONS]:
            assert sum(line.split()[:1] == [key] for line in lines) == 1, (name, key)      # one line: key, value
        assert not [line for line in lines if line.split()[:1] in (["machine"], ["times_s"])], name
        columns = ENTRIES[result.get("benchmark", name)][1]
        for rows in [v for v in result.values() if isinstance(v, list) and v and isinstance(v[0], dict)]:
            first = next(c for c in columns if any(get(r, c) is not None for r in rows))   # header, then its rows
            header = next(i for i, line in enumerate(lines) if line.strip().startswith(first))
            assert [line.strip().split("  ")[0] for line in lines[header + 1:header + 1 + len(rows)]] == \
                [fmt(first, get(r, first)) for r in rows], name
    display("train_step", results["entries"]["train_step_deit3_small_b16_float32"])
    out = capsys.readouterr().out.splitlines()
    assert "  ratio_vs_timm                    0.732" in out and "  mfu                              45.7%" in out


@pytest.mark.slow
def test_layerscale_times_both_branch_scalings_alternately_and_reports_the_overhead(step_seconds):
    from layerscale_jax.bench.entries import bench_layerscale
    step_seconds.update(layerscale=0.102, none=0.1)                      # the overhead itself: benchmarks/results
    (row,) = bench_layerscale(repeats=3, cases=[("toy", 2, dict(TOY, init_values="auto"))])["rows"]
    assert (row["layerscale_step_s"], row["none_step_s"], row["overhead"]) == pytest.approx((0.102, 0.1, 0.02))
    assert row["variants"]["layerscale"]["bytes_accessed"] > row["variants"]["none"]["bytes_accessed"] > 0


def test_results_files_of_two_cpu_kinds_never_share_a_name():
    from layerscale_jax.bench.entries import results_name
    amd = {"backend": "cpu", "cpu": "AMD EPYC", "cpu_threads": 2, "device": "cpu"}
    intel = {**amd, "cpu": "Intel(R) Xeon(R) Processor"}
    h200 = {"backend": "gpu", "cpu": "AMD EPYC", "cpu_threads": 16, "device": "NVIDIA H200"}
    assert [results_name(m) for m in (amd, intel, h200)] == ["cpu2-amd-epyc", "cpu2-intel-xeon-processor",
                                                             "gpu-nvidia-h200"]


def test_machine_info_names_the_cpu_generation_and_the_malloc():
    import re

    from layerscale_jax.bench.timing import machine_info
    m = machine_info()
    assert m["malloc"] in ("tcmalloc", "glibc huge pages", "glibc")
    with open("/proc/cpuinfo") as f:
        has_family = "cpu family" in f.read()
    assert (re.fullmatch(r"family \d+ model \d+", m["cpu_family_model"]) is not None) if has_family else \
        m["cpu_family_model"] is None
