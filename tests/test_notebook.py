"""The experiments notebook executes top to bottom (so it cannot rot): nbclient runs it in a fresh kernel."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "experiments", "depth_ablation.ipynb")


def test_depth_ablation_notebook_executes_and_shows_the_diagnostics():
    nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]'")
    nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]'")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.join(ROOT, "experiments")}})
    # one CPU device in the kernel (the test session's 8 virtual devices would only shard a tiny model 8 ways)
    client.execute(env={**os.environ, "JAX_NUM_CPU_DEVICES": "1"})
    outputs = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                      for o in cell.get("outputs", []))
    assert "train loss" in outputs
    assert not any(o.get("output_type") == "error" for cell in notebook.cells for o in cell.get("outputs", []))
    images = sum("image/png" in o.get("data", {}) for cell in notebook.cells for o in cell.get("outputs", []))
    assert images >= 1
