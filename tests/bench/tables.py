"""Shared by the bench tests: the Markdown tables of a bench's printed section."""


def markdown_tables(section: str) -> list:
  """The Markdown tables of ``section``, each a list of rows (lists of cell strings)."""
  tables, current = [], None
  for line in section.splitlines():
    if line.startswith("|"):
      cells = [c.strip() for c in line.strip().strip("|").split("|")]
      if current is None:
        current = []
        tables.append(current)
      current.append(cells)
    else:
      current = None
  return tables
