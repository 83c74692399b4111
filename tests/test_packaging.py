"""The wheel ships every package: pyproject.toml lists packages explicitly, so a new sub-package
(a kernel split into forms, a mixer folder, a paper's experiments) must be added there."""

import pathlib

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_package_under_jaxmem_is_listed_in_pyproject():
  listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
  found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "jaxmem").rglob("__init__.py")}
  assert found - listed == set(), f"packages missing from pyproject.toml: {sorted(found - listed)}"
