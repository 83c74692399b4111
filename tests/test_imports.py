"""The import graph of ``jaxmem/``: dependencies point down the layers below (the project's intended shape),
and no module imports another package's ``_private`` name or module. Read from the source with ``ast`` (every
import, also the ones inside functions), so nothing is imported or compiled."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "jaxmem"

# Each unit (a subpackage of jaxmem, or a top-level module) may import units of lower layers and its own
# package; units of one layer are siblings and never import each other.
LAYERS = (
    ("checks", "arrays", "sharding", "distributed", "results"),   # shared helpers
    ("kernels", "data"),                                          # pure arithmetic; byte corpora
    ("models", "ops", "machine"),                                 # modules; fla's op surface; AHAT programs
    ("config_files",),                                            # config files (they name model configs)
    ("train", "tasks", "rasp", "simulator", "decode"),    # loop; generators; compiler; simulator; sampling
    ("experiments", "bench"),                                     # glue: results and benchmarks
    ("cli",),                                                     # the command line
    ("__main__", "__init__"),                                     # entry points
)
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}


def _unit(module: str) -> str:
  """``jaxmem.models.mixers.qkv`` -> ``models``; ``jaxmem.sharding`` -> ``sharding``; ``jaxmem`` -> the
  package's ``__init__``."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "__init__"


def _module_of(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path, root: pathlib.Path):
  """``(target module, imported name or None)`` for every jaxmem import in ``path``."""
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "jaxmem":
          yield a.name, None
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
        node.module.split(".")[0] == "jaxmem":
      for a in node.names:
        # `from jaxmem import sharding` / `from jaxmem.models import mixers` import a module
        sub = f"{node.module}.{a.name}"
        is_module = (root.parent / (sub.replace(".", "/") + ".py")).exists() or \
            (root.parent / sub.replace(".", "/")).is_dir()
        yield (sub, None) if is_module else (node.module, a.name)


def violations(root: pathlib.Path = ROOT) -> list:
  out = []
  for path in sorted(root.rglob("*.py")):
    src = _unit(_module_of(path, root))
    for target, name in _imports(path, root):
      dst = _unit(target)
      where = f"{path.relative_to(root.parent)}: {target}" + (f".{name}" if name else "")
      if src not in RANK or dst not in RANK:
        out.append(f"{where}: {src if src not in RANK else dst!r} is in no layer of tests/test_imports.py")
      elif dst != src and RANK[dst] >= RANK[src]:
        out.append(f"{where}: {src} (layer {RANK[src]}) imports {dst} (layer {RANK[dst]})")
      if dst != src:
        private = [p for p in target.split(".")[1:] if p.startswith("_") and not p.startswith("__")]
        if private or (name and name.startswith("_") and not name.startswith("__")):
          out.append(f"{where}: a private name of another package")
  return out


def test_dependencies_point_down_and_no_private_name_crosses_a_package():
  found = violations()
  assert not found, "\n".join(found)


def test_the_check_sees_an_upward_import_and_a_private_name(tmp_path):
  pkg = tmp_path / "jaxmem"
  for rel, text in {"kernels/a.py": "from jaxmem.models import transformer\n",
                    "models/b.py": "def f():\n  from jaxmem.train.loop import _helper\n",
                    "tasks/c.py": "import jaxmem.rasp.lib\n",
                    "models/d.py": "from jaxmem.kernels import attention\n"}.items():
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(text)
  found = violations(pkg)
  assert any("kernels/a.py" in v and "kernels (layer 1) imports models (layer 2)" in v for v in found), found
  assert any("models/b.py" in v and "imports train" in v for v in found), found
  assert any("models/b.py" in v and "private" in v for v in found), found
  assert any("tasks/c.py" in v and "tasks (layer 4) imports rasp (layer 4)" in v for v in found), found
  assert not any("models/d.py" in v for v in found), found


UNITS = sorted({p.stem if p.is_file() else p.name for p in ROOT.iterdir()
                if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())})


@pytest.mark.parametrize("unit", UNITS)
def test_every_package_is_in_a_layer(unit):
  assert unit in RANK, f"jaxmem/{unit}: add it to a layer of tests/test_imports.py"
