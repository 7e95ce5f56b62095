"""The notebooks execute top to bottom (so they cannot rot): nbclient runs each in a fresh kernel, as a reader would
from its folder, through the public Python API only."""
import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "experiments", "notebooks", "quickstart.ipynb")
DEPTH_ABLATION = os.path.join(ROOT, "experiments", "depth_ablation.ipynb")


def execute(path):
    """The executed notebook's code cells' outputs (the committed file is left as it is)."""
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]'")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]'")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    # one CPU device in the kernel (the test session's 8 virtual devices would only shard a tiny model 8 ways)
    client.execute(env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    return outputs


def text(outputs, stream="stdout"):
    return "".join(o.get("text", "") for o in outputs if o.get("name") == stream)


def images(outputs):
    return sum("image/png" in o.get("data", {}) for o in outputs)


@pytest.mark.parametrize("path", [QUICKSTART, DEPTH_ABLATION], ids=["quickstart", "depth_ablation"])
def test_a_notebook_imports_only_the_public_api(path):
    sources = "\n".join("".join(cell["source"]) for cell in json.load(open(path))["cells"]
                        if cell["cell_type"] == "code")
    imports = set(re.findall(r"^\s*(?:from|import) ([\w.]+)", sources, flags=re.M))
    ours = {name for name in imports if name.startswith("layerscale_jax") or name == "depth_ablation"}
    assert ours <= {"layerscale_jax", "layerscale_jax.errors"}, ours


@pytest.mark.slow
@pytest.mark.notebook
def test_quickstart_trains_plots_and_loads_the_run_back():
    outputs = execute(QUICKSTART)
    stdout = text(outputs)
    assert "error: unknown config field config.train.stepz" in stdout
    loaded, trained = re.search(r"test accuracy (\S+) \(the run's: (\S+)\)", stdout).groups()
    assert loaded == trained and float(loaded) > 0.5
    assert "\r[" in text(outputs, "stderr")                         # progress: one line updated in place
    assert images(outputs) == 2                                     # loss and λ; the test digits


@pytest.mark.slow
@pytest.mark.notebook
def test_depth_ablation_notebook_executes_and_shows_the_diagnostics():
    outputs = execute(DEPTH_ABLATION)
    assert "train loss" in text(outputs)
    assert images(outputs) >= 1
