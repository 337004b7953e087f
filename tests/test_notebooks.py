"""Every analysis notebook runs top to bottom on its reduced grid (as CI would catch any rot)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_on_a_reduced_grid(path, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERMAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("INFERMAX_NOTEBOOK_OUT", str(tmp_path))
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    tables = [o for o in outputs if "| the paper says |" in o.get("data", {}).get("text/markdown", "")]
    assert figures and tables, "each notebook draws figures and states the findings"
    assert all("| yes |" in t["data"]["text/markdown"] or "| **no** |" in t["data"]["text/markdown"] for t in tables)
