"""``--compile_for``: target names, the collectives of TPU programs, and the command on a small config compiled by
libtpu's compiler (``plan.compile_for``; the compiles skip where libtpu is not installed)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import layerscale_jax as lsj
from layerscale_jax.errors import UserError
from layerscale_jax.plan import hlo as hlo_lib
from layerscale_jax.plan.targets import CHIPS, GiB, chip_table, parse_target

from test_train import TINY, tiny_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install -e '.[tpu]')")


@pytest.mark.parametrize("name, chip, shape, slices, chips, hosts_per_slice", [
    ("v5e-256", "v5e", (16, 16), 1, 256, 64),
    ("v5litepod-16", "v5e", (4, 4), 1, 16, 4),
    ("v5e-8", "v5e", (2, 4), 1, 8, 1),
    ("v6e-64", "v6e", (8, 8), 1, 64, 16),
    ("v4-32", "v4", (2, 2, 4), 1, 16, 4),            # v4 and v5p names count TensorCores, two per chip
    ("v4-8", "v4", (2, 2, 1), 1, 4, 1),
    ("v5p-128", "v5p", (4, 4, 4), 1, 64, 16),
    ("2xv5e-256", "v5e", (16, 16), 2, 512, 64),
    ("v5e:16x16", "v5e", (16, 16), 1, 256, 64),
    ("V4:2x2x4", "v4", (2, 2, 4), 1, 16, 4),
])
def test_tpu_names_give_the_slice_shape_chips_and_hosts(name, chip, shape, slices, chips, hosts_per_slice):
    target = parse_target(name)
    assert (target.chip_key, target.shape, target.num_slices) == (chip, shape, slices)
    assert target.num_chips == chips and target.hosts_per_slice == hosts_per_slice


def test_wraparound_only_on_full_pods_and_full_cubes():
    assert parse_target("v5e-256").wrap == (True, True, False) and parse_target("v5e-64").wrap == (False,) * 3
    assert parse_target("v5p-128").wrap == (True,) * 3 and parse_target("v4-32").wrap == (False,) * 3


def test_gpu_names_give_hosts_and_gpus_per_host():
    assert (parse_target("8xh100").num_hosts, parse_target("8xh100").num_chips) == (1, 8)
    two = parse_target("2x8xH200")
    assert (two.chip_key, two.num_hosts, two.num_chips) == ("h200", 2, 16)


@pytest.mark.parametrize("name", ["v5x-4", "v5e-12", "v4-30", "h100", "v5e:4x4x4", "tpu"])
def test_an_unknown_target_is_one_error_listing_the_known_names(name):
    with pytest.raises(UserError, match=r"known names: v5e-256, v4-32, v5p-128, v6e-64, 2xv5e-256, .*8xh100"):
        parse_target(name)


def test_every_chip_names_its_published_source():
    for chip in CHIPS.values():
        assert chip.source.startswith("https://") and chip.hbm_bytes >= 16 * GiB
        assert 1e14 < chip.peak_bf16_flop_per_s < 2e15 and 5e11 < chip.hbm_bytes_per_s < 1e13


TPU_HLO = """\
%windowed_dot_general_body_ag.3 (p: (bf16[4,8], u32[])) -> (bf16[4,8], u32[]) {
  %collective-permute-start.1 = (bf16[4,8]{1,0:T(4,128)(2,1)}, bf16[4,8]{1,0}, u32[]{:S(2)}, u32[]{:S(2)}) \
collective-permute-start(%p), channel_id=7, source_target_pairs={{0,1},{1,0}}
  %collective-permute-done.1 = bf16[4,8]{1,0} collective-permute-done(%collective-permute-start.1)
}

%windowed_dot_general_body_rs.1 (p: f32[16]) -> f32[16] {
  %collective-permute.2 = f32[16]{0} collective-permute(%p), channel_id=8, source_target_pairs={{0,1},{1,0}}
}

%fused_computation.5 (param_0: bf16[2,8]) -> bf16[8,8] {
  %all-gather.41 = bf16[8,8]{1,0} all-gather(%param_0), channel_id=104, replica_groups=[1,4]<=[4], dimensions={0}
}

%fused_computation.6 (param_0: bf16[2,8]) -> bf16[8,8] {
  %all-gather.43 = bf16[8,8]{1,0} all-gather(%param_0), channel_id=104, replica_groups=[1,4]<=[4], dimensions={0}
}

ENTRY %main.1 (a: f32[64]) -> f32[16] {
  %all-gather-start.2 = (f32[16]{0}, f32[64]{0}) all-gather-start(%x), channel_id=9, dimensions={0}
  %all-gather-done.2 = f32[64]{0} all-gather-done(%all-gather-start.2)
  %all-reduce-start.3 = f32[64]{0} all-reduce-start(%a), channel_id=10, to_apply=%add
  %all-reduce-scatter-fusion.4 = f32[16]{0} fusion(%a), kind=kOutput, calls=%reduce_scatter_computation
  ROOT %collective-permute.5 = f32[16]{0} collective-permute(%b), channel_id=11, source_target_pairs={{0,1}}
}
"""


def test_tpu_collective_forms_are_read_as_what_they_do():
    found = hlo_lib.collectives(TPU_HLO)
    kinds = [(c.op, c.kind, c.form, c.bytes) for c in found]
    assert kinds == [
        ("collective-permute", "all-gather", "collective matmul", 4 * 8 * 2),      # the result of the async pair
        ("collective-permute", "reduce-scatter", "collective matmul", 16 * 4),
        ("all-gather", "all-gather", "", 8 * 8 * 2),                               # cloned into two fusions: once
        ("all-gather", "all-gather", "async", 64 * 4),                            # the gathered result only
        ("all-reduce", "all-reduce", "async", 64 * 4),
        ("reduce-scatter", "reduce-scatter", "all-reduce-scatter fusion", 16 * 4),
        ("collective-permute", "collective-permute", "", 16 * 4),
    ]
    table = hlo_lib.collectives_by_kind(found)
    assert table["all-gather"] == {"instructions": 3, "count": 3, "bytes": 64 + 128 + 256}
    assert list(table) == sorted(table)


def command(*args, timeout=900):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "layerscale_jax.train", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.slow
def test_an_unknown_target_on_the_command_line_is_one_error_line_before_jax_starts():
    result = command("--config", TINY, "--compile_for", "v5e-257")
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --compile_for 'v5e-257': v5e slices have 1, 4, 8, 16") and "known names" in line


@pytest.mark.slow
def test_fit_and_json_need_compile_for():
    result = command("--config", TINY, "--workdir", "/tmp/never_created_by_this_test", "--json")
    assert result.returncode == 2 and result.stderr.strip() == "error: --fit and --json go with --compile_for TARGET"


SMALL = ("--config.data.mixup_alpha=0", "--config.data.cutmix_alpha=0",       # Mixup's Beta sampler: a larger HLO
         "--config.train.mesh.data=1", "--config.train.mesh.fsdp=-1")


@pytest.mark.slow
@needs_libtpu
def test_compile_for_prints_one_screen_and_the_report_as_the_last_json_line():
    result = command("--config", f"{TINY}:scan_layers=True", "--compile_for", "v5e-4", "--json", *SMALL)
    assert result.returncode == 0, result.stderr[-3000:]
    # libtpu's five lines about this host's place in a slice (issue 49): none on a machine without TPUs
    assert not [line for line in result.stderr.splitlines() if "TPU" in line or "libtpu" in line], result.stderr
    lines = result.stdout.strip().splitlines()
    report = json.loads(lines[-1])
    text = "\n".join(lines[:-1])
    assert len(lines) - 1 <= 24 and "target      v5e-4: TPU v5e 2×2 (4 chips, 1 host)" in text
    assert report["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1} and report["per_chip_batch"] == 4
    assert report["fits"] and report["hbm_per_chip"] == 15.75 * GiB         # what libtpu allows of v5e's 16 GiB
    memory = report["train_memory"]
    assert memory["total"] == (memory["arguments"] + memory["outputs"] - memory["aliased"] + memory["temporaries"]
                               + memory["code"])
    assert report["headroom_bytes"] == 15.75 * GiB - max(memory["total"], report["eval_memory"]["total"])
    # FSDP: the parameters are gathered and the gradients reduced, however the TPU compiler spells it
    assert "all-gather" in report["collectives"] and {"reduce-scatter", "all-reduce"} & set(report["collectives"])
    # the matmul FLOPs counted in libtpu's program, its scanned layers by their trip count, are the model's
    # (float32, no remat: nothing recomputed), a quarter of them on each of the 4 chips
    step = report["step"]
    assert step["flops_per_chip"] == pytest.approx(report["flops_per_step"] / 4, rel=1e-6)
    # the terms at v5e's data sheet (197 TFLOP/s bf16, 819 GB/s of HBM, 200 GB/s of ICI a chip)
    assert step["seconds"]["compute"] == pytest.approx(step["flops_per_chip"] / 197e12)
    assert step["seconds"]["memory"] == pytest.approx(step["hbm_bytes_per_chip"] / 819e9)
    assert step["seconds"]["ICI"] == pytest.approx(step["link_bytes_per_chip"]["ICI"] / 200e9)
    assert report["step_time_lower_bound_s"] == max(step["seconds"].values())
    assert report["step_time_upper_bound_s"] == pytest.approx(sum(step["seconds"].values()))
    assert report["mfu_ceiling"] == pytest.approx(report["flops_per_step"] / (4 * 197e12) /
                                                  report["step_time_lower_bound_s"])


@pytest.mark.slow
@needs_libtpu
@pytest.mark.slow
def test_the_python_api_returns_the_report_without_opening_the_dataset():
    config = tiny_config("scan_layers=True")
    config.data.name = "imagenet2012"          # not prepared here: compile_for takes the shapes from the config
    config.data.data_dir = "/nonexistent/tfds"
    config.data.mixup_alpha = config.data.cutmix_alpha = 0.0
    report = lsj.compile_for(config, "v5e-4")
    assert report.fits and report.num_chips == 4 and report.train_memory.temporaries > 0
    assert report.compile_seconds["train"] > 0 and "eval" in report.compile_seconds


def fake_compiles(monkeypatch, fits, bound=lambda config: 1.0):
    """``compile_for`` replaced by a function of the candidate config (``fits(config) -> bool``, the step time's
    lower bound ``bound(config)`` in seconds), recording the candidates tried; the mesh's batch devices fixed at
    16."""
    from types import SimpleNamespace

    from layerscale_jax.plan import compile_for as module
    tried = []

    def fake(config, target, check_fit=True, eval_step=True):
        tried.append((config.optim.accum_steps, config.model.remat, config.train.mesh.data, config.model.scan_layers))
        ok = fits(config)
        if not ok and check_fit:
            raise module.DoesNotFit(f"{config.model.name} does not fit: it needs 20.00 GiB per chip; more")
        return SimpleNamespace(fits=ok, peak_bytes=(10 if ok else 20) * GiB, hbm_per_chip=16 * GiB,
                               bound_seconds=bound(config), upper_seconds=2 * bound(config),
                               mfu=lambda seconds: 0.5, mfu_ceiling=0.5)

    monkeypatch.setattr(module, "compile_for", fake)
    monkeypatch.setattr(module, "_batch_devices", lambda config, target: 16)
    return module, tried


def recipe_config(*overrides):
    from layerscale_jax.train.__main__ import parse_command_line
    return parse_command_line(["--config", "configs/imagenet_deit3.py:variant=B", *overrides,
                               "--compile_for", "v5e-16"])["config"].value


@pytest.mark.slow
def test_fit_finds_the_largest_per_chip_micro_batch_that_fits(monkeypatch):
    module, tried = fake_compiles(monkeypatch, lambda c: c.optim.accum_steps >= 4 and c.model.remat == "none")
    found = module.fit_search(recipe_config(), "v5e-16", log=lambda line: None)
    assert found.overrides == {"optim.accum_steps": 4} and found.report.fits
    assert tried[0] == (1, "none", 1, False)                 # the recipe as given first (unrolled layers)
    assert {(1, "none", 1, False), (2, "none", 1, False), (4, "none", 1, False)} <= set(tried)
    assert (8, "none", 1, False) not in tried                # bisection: 4 fits, 2 does not
    assert module.command_line_overrides(found.overrides) == "--config.optim.accum_steps=4"


@pytest.mark.slow
def test_fit_ranks_what_fits_by_the_step_time_s_lower_bound(monkeypatch):
    module, tried = fake_compiles(monkeypatch, lambda c: True, bound=lambda c: 0.7 if c.model.scan_layers else 1.0)
    found = module.fit_search(recipe_config(), "v5e-16", log=lambda line: None)
    assert found.overrides == {"model.scan_layers": True}                  # scanned: faster here
    assert [o for o, _ in found.candidates] == [{"model.scan_layers": True}, {}]
    assert len(tried) == 2 + 1          # both fit at the recipe's batch: no remat, no more fsdp; then the winner
    assert "model.scan_layers=True" in found.table().splitlines()[1]


@pytest.mark.slow
def test_fit_tries_remat_when_no_micro_batch_fits_then_more_fsdp(monkeypatch):
    module, tried = fake_compiles(monkeypatch, lambda c: c.model.remat == "full")
    found = module.fit_search(recipe_config(), "v5e-16", log=lambda line: None)
    assert found.overrides == {"model.remat": "full"}
    assert [r for _, r, _, _ in tried].index("full") > [r for _, r, _, _ in tried].index("dots_saveable")
    module, tried = fake_compiles(monkeypatch, lambda c: c.train.mesh.data == 1)
    found = module.fit_search(recipe_config("--config.train.mesh.data=4", "--config.train.mesh.fsdp=4"),
                              "v5e-16", log=lambda line: None)
    assert found.overrides == {"train.mesh.data": 1, "train.mesh.fsdp": -1}


@pytest.mark.slow
def test_fit_says_so_in_one_error_when_nothing_fits(monkeypatch):
    module, _ = fake_compiles(monkeypatch, lambda c: False)
    with pytest.raises(module.DoesNotFit, match=r"does not fit v5e-16 with any per-chip batch, remat policy or fsdp"):
        module.fit_search(recipe_config(), "v5e-16", log=lambda line: None)


@needs_libtpu
@pytest.mark.slow
def test_fit_compiles_scanned_and_unrolled_and_ranks_them_by_the_lower_bound():
    """One real search: the tiny config on v5e-4 fits as given; both layer layouts are compiled by libtpu, and the
    answer is the one with the smaller lower bound."""
    from layerscale_jax.plan import compile_for as module
    config = tiny_config("scan_layers=True")
    config.data.mixup_alpha = config.data.cutmix_alpha = 0.0
    lines = []
    found = module.fit_search(config, "v5e-4", log=lines.append)
    assert sorted(map(str, (o for o, _ in found.candidates))) == ["{'model.scan_layers': False}", "{}"]
    bounds = [r.bound_seconds for _, r in found.candidates]
    assert bounds == sorted(bounds) and found.overrides == found.candidates[0][0]
    assert found.report.bound_seconds == pytest.approx(bounds[0], rel=1e-6) and found.report.fits
    assert len(lines) == 1 + 2 and all("GiB of 15.75 GiB per chip" in line for line in lines[1:])


@pytest.mark.slow
def test_the_does_not_fit_line_names_the_numbers_and_the_accumulation_that_would_fit():
    from layerscale_jax.plan.compile_for import does_not_fit
    config = recipe_config()                                       # DeiT III-B, global batch 2048
    line = does_not_fit(config, parse_target("v5e-16"), 16.96 * GiB, 15.75 * GiB, "of temporaries", 128,
                        16.96 * GiB, 15.75 * GiB)
    assert line.startswith("deit3_base_patch16_224 (global batch 2048, 128 per chip) does not fit v5e-16: it needs "
                           "16.96 GiB per chip (of temporaries) but a TPU v5e chip has 15.75 GiB (what libtpu allows "
                           "of the chip's 16 GiB); about 118 images "
                           "per chip would fit"), line                # 128 × 15.75 / 16.96
    assert "--config.optim.accum_steps=2 keeps the global batch" in line
    hopeless = does_not_fit(config, parse_target("v5e-16"), 40 * GiB, 16 * GiB, "in all", 128, 30 * GiB, -1 * GiB)
    assert "not even one image per chip would fit as it is" in hopeless and "accum_steps" not in hopeless


def test_the_docs_chip_table_is_the_code_s():
    with open(os.path.join(ROOT, "docs", "multihost.md")) as f:
        assert chip_table() in f.read()
    assert "| TPU v5e (`v5e`) | 16 GiB | 197 TFLOP/s | 819 GB/s | ICI 200 GB/s | DCN 3.12 GB/s |" in chip_table()


def recipes_module():
    import importlib.util as util
    spec = util.spec_from_file_location("compile_recipes", os.path.join(ROOT, "benchmarks", "compile_recipes.py"))
    module = util.module_from_spec(spec)
    sys.modules[spec.name] = module                 # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_docs_recipe_table_is_the_one_the_committed_compiles_give():
    recipes = recipes_module()
    newest = os.path.basename(recipes.newest_record())
    with open(recipes.newest_record()) as f:
        record = json.load(f)
    assert {r["id"] for r in record["rows"]} == {r.id for r in recipes.RECIPES + (recipes.OVERSIZE,)}
    table = recipes.markdown([r for r in record["rows"] if r["fits"]])
    for page in ("README.md", "docs/multihost.md"):
        with open(os.path.join(ROOT, page)) as f:
            text = f.read()
        assert table in text, page
        assert newest in text and record["cpu"] in text, page
    oversize = next(r for r in record["rows"] if r["id"] == recipes.OVERSIZE.id)
    assert not oversize["fits"] and "does not fit v5e-16" in oversize["error"]
    with open(os.path.join(ROOT, "docs", "multihost.md")) as f:
        multihost = f.read()
    assert "\n" + oversize["error"].removeprefix("error: ") in multihost.replace("\nerror: ", "\n")   # "Won't fit"
    for recipe in recipes.RECIPES + (recipes.OVERSIZE,):
        assert f"`{recipe.command}`" in multihost, recipe.id                           # the recipe table's commands


def test_fit_tries_more_fsdp_only_where_it_is_another_mesh_on_the_target():
    """``data=-1`` on one chip is the ``fsdp=-1`` mesh already: --fit compiled that mesh a second time (half of a
    460 s search)."""
    from layerscale_jax.plan import compile_for as module
    config = tiny_config()                                           # mesh data=-1
    assert module._layouts(config, "v5e-1") == []
    assert module._layouts(config, "v5e-4") == [{"train.mesh.data": 1, "train.mesh.fsdp": -1}]


def test_compile_for_says_it_is_compiling_before_the_compile(monkeypatch, capsys):
    """A 244 s compile printed nothing until the report."""
    from layerscale_jax.plan import compile_for as module
    from layerscale_jax.runtime import stop_signals
    from layerscale_jax.train.__main__ import main
    for name in ("phase", "_stop_line", "_deadline", "joins_job"):       # main sets them: restored after the test
        monkeypatch.setattr(stop_signals, name, getattr(stop_signals, name))
    monkeypatch.setattr(module, "compile_command", lambda *args, **kwargs: 0)
    assert main(["--config", TINY, "--compile_for", "v5e-4"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == (
        "compiling deit3_small_patch16_224 for v5e-4 (minutes for a large model; Ctrl-C stops it at once) ...")


def test_a_model_whose_state_and_gradients_exceed_the_chip_is_said_to_fit_nowhere():
    """A model that fits at no per-chip batch got "about 1 images per chip would fit: --config.optim.accum_steps=64
    keeps the global batch" (with --fit, accumulation 4 still needed 960 GiB)."""
    from types import SimpleNamespace

    import jax
    import numpy as np
    from layerscale_jax.plan.compile_for import does_not_fit, state_floor
    config = tiny_config()
    line = does_not_fit(config, parse_target("v5e-16"), 980 * GiB, 15.75 * GiB, "in all", 64, 900 * GiB,
                        15.75 * GiB - 20 * GiB, floor=40 * GiB)
    assert line.endswith("the train state and its gradients alone take 40.00 GiB per chip, so no per-chip batch, "
                         "accumulation or remat fits: shard them over more chips (more fsdp, a larger target) or "
                         "train a smaller model"), line
    assert "accum_steps" not in line and "would fit" not in line

    def leaf(shape, shard):                      # a ShapeDtypeStruct's shape, dtype and per-chip shard shape
        return SimpleNamespace(shape=shape, dtype=np.dtype(np.float32),
                               sharding=SimpleNamespace(shard_shape=lambda _: shard))
    state = {"params": {"w": leaf((8, 4), (2, 4))}, "opt_state": [leaf((8, 4), (2, 4))] * 2, "step": leaf((), ())}
    assert state_floor(jax.tree.map(lambda x: x, state, is_leaf=lambda x: isinstance(x, SimpleNamespace))) == \
        4 * (8 * 3 + 1 + 8)                      # params, two moments, the step; one gradient per parameter
