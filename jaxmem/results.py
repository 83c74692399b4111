"""Results as tables and figures: the one home of formatting shared by ``jaxmem bench`` and
``jaxmem reproduce`` (neither imports the other)."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence


@dataclasses.dataclass
class Table:
  title: str
  headers: list
  rows: list

  def markdown(self) -> str:
    return markdown_table(self.headers, self.rows)


def markdown_table(headers: Sequence, rows: Sequence) -> str:
  """A GitHub-flavoured markdown table; cells are ``str()``-ed."""
  lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
  lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
  return "\n".join(lines)


def save_figure(fig, path: str | pathlib.Path, dpi: int = 110) -> pathlib.Path:
  """Lays out, saves (creating the folder) and closes a matplotlib figure; returns its path.
  In a multi-process run only process 0 writes."""
  import jax
  import matplotlib.pyplot as plt
  path = pathlib.Path(path)
  if jax.process_index() == 0:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
  plt.close(fig)
  return path


def pyplot():
  """``matplotlib.pyplot`` on the non-interactive Agg backend (figures are files, not windows)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


__all__ = ["Table", "markdown_table", "pyplot", "save_figure"]
