"""Pass 2, the normal-form program → its graph: every node once, children before parents (:func:`walk`), how
many ops read each (:func:`consumers`), what kind of layer computes each (:func:`kind`), the SOps an
op reads (:func:`sop_inputs`), and the encodings the compiler cannot honour exactly
(:func:`check_types`, a ``ValueError`` naming the node).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from jaxmem.rasp import rasp
from jaxmem.rasp.passes.values import is_number


def walk(expr: rasp.RASPExpr) -> List[rasp.RASPExpr]:
  """Every node reachable from ``expr``, children before parents (iterative DFS)."""
  order, seen, stack = [], set(), [(expr, False)]
  while stack:
    node, done = stack.pop()
    if done:
      order.append(node)
      continue
    if node.unique_id in seen:
      continue
    seen.add(node.unique_id)
    stack.append((node, True))
    for c in reversed(node.children):
      if c.unique_id not in seen:
        stack.append((c, False))
  return order


def consumers(nodes: Sequence[rasp.RASPExpr]) -> Dict[int, int]:
  count: Dict[int, int] = {}
  for n in nodes:
    for c in n.children:
      count[c.unique_id] = count.get(c.unique_id, 0) + 1
  return count


def flatten_and(sel: rasp.Selector) -> Optional[List[rasp.Select]]:
  """The Selects of a pure conjunction, or None."""
  if isinstance(sel, rasp.Select):
    return [sel]
  if isinstance(sel, rasp.SelectorAnd):
    a, b = flatten_and(sel.fst), flatten_and(sel.snd)
    return None if a is None or b is None else a + b
  return None


def selects_of(sel: rasp.Selector) -> List[rasp.Select]:
  conj = flatten_and(sel)
  if conj is None:  # rewrite() guarantees conjunctions
    raise ValueError(f"selector '{sel.label}' is not a conjunction of Selects after rewriting.")
  return conj


def selector_key(sel: rasp.Selector) -> Optional[tuple]:
  """What a conjunction of Selects compares (keys, queries, predicate of each); None otherwise."""
  conj = flatten_and(sel)
  if conj is None:
    return None
  return tuple((s.keys.unique_id, s.queries.unique_id, s.predicate) for s in conj)


def kind(e: rasp.RASPExpr) -> str:
  """'input' (embedded), 'mlp', 'attn' (Aggregate), 'width' (SelectorWidth), 'selector'."""
  if isinstance(e, (rasp.TokensType, rasp.IndicesType, rasp.Full)):
    return "input"
  if isinstance(e, (rasp.Map, rasp.SequenceMap)):
    return "mlp"
  if isinstance(e, rasp.Aggregate):
    return "attn"
  if isinstance(e, rasp.SelectorWidth):
    return "width"
  if isinstance(e, rasp.Selector):
    return "selector"
  raise ValueError(f"cannot compile {type(e).__name__} '{e.label}'.")


def sop_inputs(e: rasp.RASPExpr) -> List[rasp.SOp]:
  """The SOps an op reads (through its selector for attention ops)."""
  if isinstance(e, (rasp.Aggregate, rasp.SelectorWidth)):
    out = []
    for s in selects_of(e.selector):
      out += [s.keys, s.queries]
    if isinstance(e, rasp.Aggregate):
      out.append(e.sop)
    return out
  return list(e.children)


def check_types(nodes: Sequence[rasp.RASPExpr], output: Optional[rasp.SOp] = None) -> None:
  """Encodings the compiler cannot honour exactly → ``ValueError`` naming the node."""
  for e in nodes:
    if isinstance(e, rasp.Aggregate):
      if rasp.is_categorical(e) and rasp.is_numerical(e.sop):
        raise ValueError(
            f"categorical Aggregate '{e.label}' averages the numerical SOp '{e.sop.label}': "
            "numerical where categorical is needed. Make the aggregate numerical "
            "(rasp.numerical) or the value categorical.")
      if rasp.is_numerical(e) and e.default is not None and not is_number(e.default):
        raise ValueError(f"numerical Aggregate '{e.label}' has the non-numerical default "
                         f"{e.default!r}.")
    if isinstance(e, rasp.Full) and rasp.is_numerical(e) and not is_number(e.fill):
      raise ValueError(f"numerical Full '{e.label}' has a non-numerical fill {e.fill!r}.")


__all__ = ["check_types", "consumers", "flatten_and", "kind", "selector_key", "selects_of", "sop_inputs",
           "walk"]
