"""Every committed pod recipe fits its stated target as libtpu's compiler compiles it
(``benchmarks/compile_recipes.py``'s ``RECIPES``: the commands of docs/multihost.md and ``configs/imagenet_*.py``),
and a deliberately oversize one is refused in one error line with the numbers. Skipped where libtpu is absent.

Those compiles take one to four minutes each on two cores, so they are made by ``benchmarks/compile_recipes.py`` and
committed as a record (the one README's and docs/multihost.md's tables show), and this file holds that record to
today's code: each recipe's train step, lowered now (seconds, nothing compiled), must be the very program the record
compiled (the same ``program_sha256`` of its StableHLO). A change to the model, optimizer, shardings, a config or jax
that changes a recipe's program fails here until the record is made again. One recipe is compiled here as well and must
give the record's numbers, and the oversize refusal is the command line's own, compiled here too."""
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
from layerscale_jax.train.config import validate_experiment_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                 reason="libtpu is not installed (pip install -e '.[tpu]')"),
              pytest.mark.slow]


def recipes_module():
    spec = importlib.util.spec_from_file_location("compile_recipes", os.path.join(ROOT, "benchmarks",
                                                                                  "compile_recipes.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module                 # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


RECIPES = recipes_module()
RECORD_PATH = RECIPES.newest_record()
with open(RECORD_PATH) as _f:
    RECORD = json.load(_f)
REMAKE = ("remake the record: python benchmarks/compile_recipes.py --jobs 2, then python benchmarks/compile_recipes.py "
          "--docs <the record it writes>")


def committed_row(recipe) -> dict:
    (row,) = [r for r in RECORD["rows"] if r["id"] == recipe.id]
    assert row["command"] == recipe.command, f"{recipe.id}: the record compiled another command; {REMAKE}"
    return row


def test_the_record_was_compiled_by_the_installed_jax_and_libtpu():
    import jax
    assert (RECORD["jax"], RECORD["libtpu"]) == (jax.__version__, metadata.version("libtpu")), REMAKE


COMPILED_HERE = "deit3_b_2xv5e-256_multislice"    # scanned layers: the fastest recipe to compile


@pytest.mark.parametrize("recipe", [r for r in RECIPES.RECIPES if r.id != COMPILED_HERE], ids=lambda r: r.id)
def test_the_committed_compile_is_of_the_recipes_program_today(recipe):
    """(The recipe compiled here and the oversize one are held to the record by their compiles below.)"""
    from layerscale_jax.plan.compile_for import train_step_sha256
    row = committed_row(recipe)
    experiment = validate_experiment_config(RECIPES.load(recipe))
    assert train_step_sha256(experiment, recipe.target) == row["programs"]["train"], (
        f"{recipe.id}: its train step is no longer the program {os.path.basename(RECORD_PATH)} compiled; {REMAKE}")


@pytest.mark.parametrize("recipe", RECIPES.RECIPES, ids=lambda r: r.id)
def test_the_recipe_fits_its_target_and_reduces_its_gradients(recipe):
    row = committed_row(recipe)
    assert row["fits"] and 0 < row["peak_bytes_per_chip"] <= row["hbm_per_chip"], row["text"]
    assert {"all-reduce", "reduce-scatter"} & set(row["collectives"]), row["collectives"]     # gradients reduced
    assert set(recipe.kinds) <= set(row["collectives"]), row["collectives"]
    assert row["num_chips"] == {"v5e-256": 256, "v5e-32": 32, "2xv5e-256": 512, "v4-128": 64,
                                "v5p-128": 64}[recipe.target]


def test_a_recipe_compiled_here_gives_its_committed_numbers():
    """One recipe compiled by libtpu in this process: the same program, memory, FLOPs, collectives and step-time
    terms as the record's compile of it."""
    from layerscale_jax.plan.compile_for import compile_for
    (recipe,) = [r for r in RECIPES.RECIPES if r.id == COMPILED_HERE]
    row = committed_row(recipe)
    report = compile_for(validate_experiment_config(RECIPES.load(recipe)), recipe.target, check_fit=False,
                         eval_step=False)
    assert report.programs["train"] == row["programs"]["train"]
    assert dict(dataclasses.asdict(report.train_memory), total=report.train_memory.total) == row["train_memory"]
    assert report.collectives == row["collectives"] and report.flops_per_step == row["flops_per_step"]
    assert report.step.seconds == row["step"]["seconds"]
    assert report.fits and report.num_chips == 512


def test_the_oversize_recipe_is_one_error_line_with_needed_and_available_hbm():
    recipe = RECIPES.OVERSIZE
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "layerscale_jax.train", "--config", recipe.config,
                             "--compile_for", recipe.target], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=1800)
    assert result.returncode == 2 and result.stdout == "", result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: deit3_huge_patch14_224 (global batch 2048, 128 per chip) does not fit v5e-16: it "
                           "needs "), line
    assert "GiB per chip" in line and "a TPU v5e chip has" in line and "--config.optim.accum_steps=" in line
    assert line == "error: " + committed_row(recipe)["error"]     # the record's refusal word for word: today's
