"""Every committed pod recipe compiles for its stated target with libtpu's compiler and fits the chips' HBM
(``benchmarks/compile_recipes.py``'s ``RECIPES``: the commands of docs/multihost.md and ``configs/imagenet_*.py``);
a deliberately oversize one is refused in one error line with the numbers. Skipped where libtpu is absent. The train
step is what must fit, so only it is compiled here (about 40 s per recipe on two idle cores; the eval step adds
10-20%: ``benchmarks/compile_recipes.py`` compiles both for the table)."""
import importlib.util
import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("recipe", RECIPES.RECIPES, ids=lambda r: r.id)
def test_the_recipe_compiles_for_its_target_and_fits(recipe):
    from layerscale_jax.plan.compile_for import compile_for
    report = compile_for(RECIPES.load(recipe), recipe.target, check_fit=False, eval_step=False)
    assert report.fits and 0 < report.peak_bytes <= report.hbm_per_chip, report.format()
    assert {"all-reduce", "reduce-scatter"} & set(report.collectives), report.collectives     # gradients reduced
    assert set(recipe.kinds) <= set(report.collectives), report.collectives
    assert report.num_chips == {"v5e-256": 256, "v5e-32": 32, "2xv5e-256": 512, "v4-128": 64,
                                "v5p-128": 64}[recipe.target]


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
