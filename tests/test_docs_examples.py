"""Every Python example of README.md, docs/*.md and the Python API's docstring runs as written, in the order a reader
meets it, on a fresh clone: each page's blocks in one interpreter (a later block uses what an earlier one made),
started in an empty directory holding only the clone's ``configs/`` (so ``runs/...`` workdirs are new, as on a fresh
clone) with the devices a reader has: one CPU device (a laptop's CPU is one JAX device, not the test session's 8
virtual ones), 8 for multihost.md's example, which runs on a pod host. Slow: the pages train the digits runs they
show (README: depth 4 for 300 steps; python_api.md: depth 4 for 150 steps, then depth 12 for 30 steps three times;
the API's docstring: depth 4 for 150 steps)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


def python_blocks(page: str) -> list[str]:
    if page.endswith(".py"):                 # a module docstring's example: its lines indented by four spaces
        import ast
        doc = ast.get_docstring(ast.parse((ROOT / page).read_text()))
        return ["\n".join(line[4:] for line in doc.splitlines() if line.startswith("    "))]
    return re.findall(r"^```python\n(.*?)^```", (ROOT / page).read_text(), re.S | re.M)


def test_the_pages_with_python_examples_are_the_ones_this_test_runs():
    assert [page for page in PAGES if python_blocks(page)] == ["README.md", "docs/multihost.md",
                                                               "docs/python_api.md"]


@pytest.mark.slow
@pytest.mark.parametrize("page", ["README.md", "docs/multihost.md", "docs/python_api.md", "layerscale_jax/api.py"])
def test_the_python_examples_of_a_page_run_in_sequence_as_written(page, tmp_path):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    program = "\n\n".join(python_blocks(page))
    devices = "8" if page == "docs/multihost.md" else "1"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_NUM_CPU_DEVICES": devices}
    done = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{page}: {done.stderr[-3000:]}"


def test_a_model_echoed_in_a_notebook_is_one_line():
    import layerscale_jax as lsj
    from flax import nnx
    model = nnx.eval_shape(lambda: lsj.create_model("deit3_small_patch16_224"))
    assert repr(model) == ("VisionTransformer(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6, "
                           "num_classes=1000, branch_scaling='layerscale'; 22,059,496 parameters; nnx.display(model) "
                           "shows every layer)")
