"""Notebooks execute end to end at tiny size (JAXMEM_NOTEBOOK_TINY=1)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# what each notebook must print besides NOTEBOOK OK (its claim, checked in the notebook)
EXPECTED = {"quickstart.ipynb": "validation bpb", "sdnc.ipynb": "memory == writes: True",
            "simulator.ipynb": "compiled == interpreted: True", "unimatrix.ipynb": "all variants causal: True"}


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, synthetic_data_dir, monkeypatch):
  monkeypatch.setenv("JAXMEM_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  nb = nbformat.read(path, as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  assert "NOTEBOOK OK" in outputs
  assert EXPECTED.get(path.name, "") in outputs


def test_there_is_a_quickstart_and_a_notebook_per_paper_so_far():
  assert {"quickstart.ipynb", "sdnc.ipynb", "simulator.ipynb"} <= {p.name for p in NOTEBOOKS}
