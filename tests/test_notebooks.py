"""Notebooks: stripped in git, Colab-ready (a badge, one shared install cell, a TINY switch that the
markdown describes), valid Python whose every use of jaxmem's API resolves, and executed end to end at tiny
size (JAXMEM_NOTEBOOK_TINY=1): the quickstart in every run of the suite, all of them with
``make notebooks`` (``JAXMEM_TEST_NOTEBOOKS=all``), which CI runs after the suite."""

import ast
import importlib
import inspect
import os
import site
import subprocess
import sys
import types

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
# what each notebook must print besides NOTEBOOK OK (its claim, checked in the notebook)
EXPECTED = {"quickstart.ipynb": "validation bpb", "sdnc.ipynb": "memory == writes: True",
            "simulator.ipynb": "compiled == interpreted: True", "unimatrix.ipynb": "all variants causal: True",
            "pavlovian.ipynb": "every form == numpy loop: True"}
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/jaxmem/jaxmem/blob/main/notebooks/{name})")
TINY_LINE = "TINY = os.environ.get('JAXMEM_NOTEBOOK_TINY', '0') == '1'"
PIP_CALL = ("[sys.executable, '-m', 'pip', 'install', '-q', "
            "'jaxmem[data] @ git+https://github.com/jaxmem/jaxmem']")
STRIP_HINT = "clear all outputs before committing (Jupyter: Edit > Clear All Outputs)"


def read(path):
  return nbformat.read(path, as_version=4)


def code_cells(nb):
  return [c for c in nb.cells if c.cell_type == "code"]


def install_cell() -> str:
  return code_cells(read(REPO / "notebooks" / "quickstart.ipynb"))[0].source


# executed by every run of the suite; the others by `make notebooks` (JAXMEM_TEST_NOTEBOOKS=all)
EXECUTED_BY_DEFAULT = ("quickstart.ipynb",)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path, synthetic_data_dir, monkeypatch):
  if path.name not in EXECUTED_BY_DEFAULT and os.environ.get("JAXMEM_TEST_NOTEBOOKS") != "all":
    pytest.skip("run by `make notebooks` (JAXMEM_TEST_NOTEBOOKS=all), as CI does")
  monkeypatch.setenv("JAXMEM_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
  nb = nbformat.read(path, as_version=4)
  NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}).execute()
  outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
  assert "NOTEBOOK OK" in outputs
  assert EXPECTED.get(path.name, "") in outputs


def jaxmem_api_errors(source: str) -> list:
  """What in ``source`` (a code cell) does not resolve against the installed jaxmem: ``from jaxmem... import
  name`` / ``import jaxmem...`` targets, attribute chains on imported jaxmem modules (``dnc.init``), and
  keyword arguments of calls to jaxmem functions and classes (``train_lm(cfg, progress=False)``) that their
  signatures do not take. Names bound by the notebook itself are not followed."""
  tree, env, errors = ast.parse(source), {}, []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "jaxmem":
      module = importlib.import_module(node.module)
      for alias in node.names:
        try:
          env[alias.asname or alias.name] = getattr(module, alias.name)
        except AttributeError:
          try:   # a submodule not imported by its package
            env[alias.asname or alias.name] = importlib.import_module(f"{node.module}.{alias.name}")
          except ImportError:
            errors.append(f"from {node.module} import {alias.name}")
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] == "jaxmem":   # `import jaxmem.a.b as m` binds m; `import jaxmem.a`, jaxmem
          module = importlib.import_module(alias.name)
          env[alias.asname or "jaxmem"] = module if alias.asname else importlib.import_module("jaxmem")

  def resolve(expr):
    """The jaxmem object ``expr`` names (a Name or an attribute chain on a module), else None."""
    if isinstance(expr, ast.Name):
      return env.get(expr.id)
    if isinstance(expr, ast.Attribute):
      base = resolve(expr.value)
      if isinstance(base, types.ModuleType):
        if not hasattr(base, expr.attr):
          try:
            return importlib.import_module(f"{base.__name__}.{expr.attr}")
          except ImportError:
            errors.append(f"{ast.unparse(expr)}: {base.__name__} has no attribute {expr.attr!r}")
            return None
        return getattr(base, expr.attr)
    return None

  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      resolve(node)
    if isinstance(node, ast.Call):
      fn = resolve(node.func)
      if fn is None or not callable(fn) or not getattr(fn, "__module__", "").startswith("jaxmem"):
        continue
      try:
        params = inspect.signature(fn).parameters
      except (TypeError, ValueError):
        continue
      if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        continue
      errors += [f"{ast.unparse(node.func)}(..., {k.arg}=...): no such argument"
                 for k in node.keywords if k.arg is not None and k.arg not in params]
  return list(dict.fromkeys(errors))   # a chain inside a call is seen twice


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_cells_are_python_and_their_jaxmem_api_resolves(path):
  """Without executing anything: every code cell compiles, and every jaxmem import, module attribute and
  keyword argument it uses exists (what a rename in the library breaks first)."""
  errors = []
  for i, cell in enumerate(code_cells(read(path))):
    compile(cell.source, f"{path.name} cell {i}", "exec")
    errors += [f"cell {i}: {e}" for e in jaxmem_api_errors(cell.source)]
  assert not errors, f"{path.name}: " + "; ".join(errors)


def test_the_api_check_sees_a_renamed_function_a_missing_import_and_a_wrong_keyword():
  assert jaxmem_api_errors("from jaxmem.train import train_lm\ntrain_lm(1, 2, progress=False)") == []
  assert jaxmem_api_errors("from jaxmem.train import train_language_model") == [
      "from jaxmem.train import train_language_model"]
  assert jaxmem_api_errors("from jaxmem.kernels import dnc\ndnc.start(1)") == [
      "dnc.start: jaxmem.kernels.dnc has no attribute 'start'"]
  assert jaxmem_api_errors("from jaxmem.train import train_lm\ntrain_lm(1, 2, show_progress=False)") == [
      "train_lm(..., show_progress=...): no such argument"]


def test_there_is_a_quickstart_and_a_notebook_per_paper_so_far():
  names = {p.name for p in NOTEBOOKS}
  papers = {p.stem for p in (REPO / "docs" / "papers").glob("*.md") if p.stem != "README"}
  assert {"quickstart.ipynb", "sdnc.ipynb", "simulator.ipynb", "unimatrix.ipynb", "pavlovian.ipynb"} <= names
  assert {f"{p}.ipynb" for p in papers} <= names, "every docs/papers/<name>.md has notebooks/<name>.ipynb"
  assert set(EXPECTED) == names, "every notebook has its claim in EXPECTED"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stripped(path):
  """Committed notebooks carry no outputs and no execution counts."""
  dirty = [i for i, c in enumerate(read(path).cells)
           if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
  assert not dirty, f"{path.name}: cells {dirty} have outputs or an execution count; {STRIP_HINT}."


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_colab_ready(path):
  """A badge opening this very file, the shared install cell first, and a TINY switch that the first
  markdown cell describes as it is: the environment variable the tests set, or an edit of the line."""
  nb = read(path)
  intro, codes = nb.cells[0], code_cells(nb)
  assert intro.cell_type == "markdown"
  assert BADGE.format(name=path.name) in intro.source, f"{path.name}: no Colab badge that opens this notebook"
  assert codes[0].source == install_cell(), f"{path.name}: the first code cell is not the shared install cell"
  assert any(line.startswith(TINY_LINE) for line in codes[1].source.splitlines()), \
      f"{path.name}: the cell after the install cell does not set TINY from JAXMEM_NOTEBOOK_TINY"
  assert sum(TINY_LINE in c.source for c in codes) == 1, f"{path.name}: TINY is set in more than one place"
  assert "JAXMEM_NOTEBOOK_TINY=1" in intro.source and "TINY = ..." in intro.source, \
      f"{path.name}: the first markdown cell does not say how TINY is chosen"


def test_install_cell_is_python_that_pip_installs_on_colab_only():
  cell = install_cell()
  assert "'google.colab' in sys.modules" in cell and " ".join(PIP_CALL.split()) in " ".join(cell.split())
  assert "!pip" not in cell and "<org>" not in cell and "jax.devices()" in cell
  compile(cell, "install cell", "exec")


def test_install_cell_is_a_no_op_where_jaxmem_imports(monkeypatch, capsys):
  def no_pip(*args, **kwargs):
    raise AssertionError(f"the install cell ran {args}")
  monkeypatch.setattr(subprocess, "check_call", no_pip)
  path_before = list(sys.path)
  exec(install_cell(), {})
  assert sys.path == path_before
  assert "devices:" in capsys.readouterr().out


def _run_without_site_packages(code: str, cwd) -> subprocess.CompletedProcess:
  """``python -S``: no site-packages, so neither jaxmem nor its dependencies import."""
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
  return subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                        timeout=120)


def test_install_cell_in_a_checkout_without_an_install_says_what_to_run():
  no_pip = ("import subprocess\n"
            "def check_call(cmd):\n"
            "    raise SystemExit(f'the install cell ran {cmd}')\n"
            "subprocess.check_call = check_call\n")
  res = _run_without_site_packages(no_pip + install_cell(), REPO / "notebooks")
  assert res.returncode != 0
  assert f"-m pip install -e '{REPO}[data]'" in res.stdout, res.stdout + res.stderr


def test_install_cell_on_colab_pip_installs_from_github(tmp_path):
  """Colab simulated: a ``google.colab`` module, and a ``check_call`` that records the command and then
  'installs' by adding this environment's site-packages."""
  dirs = [p for p in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(p)]
  fake = (f"import site, subprocess, sys, types\n"
          f"sys.modules['google'] = types.ModuleType('google')\n"
          f"for name in ('google.colab', 'google.colab.output'):   # jax imports google.colab.output there\n"
          f"    sys.modules[name] = types.ModuleType(name)\n"
          f"sys.modules['google.colab'].output = sys.modules['google.colab.output']\n"
          f"calls = []\n"
          f"def check_call(cmd):\n"
          f"    calls.append(cmd)\n"
          f"    for d in {dirs!r}:\n"
          f"        site.addsitedir(d)\n"
          f"subprocess.check_call = check_call\n")
  check = (f"\nassert calls == [{PIP_CALL}], calls\n"
           f"print('COLAB INSTALL OK')\n")
  res = _run_without_site_packages(fake + install_cell() + check, tmp_path)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "COLAB INSTALL OK" in res.stdout and "devices:" in res.stdout
