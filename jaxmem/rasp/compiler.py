"""``compile(program, vocab, max_seq_len)``: RASP → an exact average-hard-attention transformer.

The passes, one module each in :mod:`jaxmem.rasp.passes` (named ``source_to_target``, as tracr's
``compiler/`` is), after a ``graph_to_value_sets.ValueSets`` (value sets, computed on demand, which
the first pass already consults): ``rasp_to_normal_form.rewrite`` (the compilable normal form) →
``rasp_to_graph`` (the graph, ``check_types``) → ``graph_to_value_sets.check_none`` (which SOps
may be None) → ``graph_to_schedule.allocate`` (layers) →
``schedule_to_craft.build`` (residual space and weights, from the blocks in
:mod:`jaxmem.rasp.craft`) → ``craft_to_model.assemble`` (a
:class:`~jaxmem.rasp.model.CompiledModel`, a Flax NNX model on :mod:`jaxmem.kernels.ahat`).

Exactness: hard attention computes a selection's mean exactly (no soft-attention leakage to
BOS or to unselected keys, unlike tracr's logit-100 softmax), every attention score is a sum
of 0/1 table entries, and every MLP that reads a number discretises it at midpoints of its
inferred value set with steps that saturate a quarter-gap away. So the compiled model agrees
with :func:`jaxmem.rasp.evaluate` on every input of every length ``n ≤ max_seq_len``:
categorical outputs identical, numerical ones to float32 rounding of the means (≈1e−7
relative). Limits, each a ``ValueError`` at compile time rather than a wrong model: numerical
value sets above :data:`~jaxmem.rasp.passes.values.MAX_VALUE_SET`, values closer than float32 can
separate (relative to the values, and to each SOp's float32 error bound,
:class:`jaxmem.rasp.craft.residual.ModelError`), constants (``ConstantSOp``), models above
``max_params`` (estimated before any weight is built).
"""

from __future__ import annotations

import time
from typing import Any, Optional, Sequence

import numpy as np

from jaxmem.rasp import rasp
from jaxmem.rasp.model import CompiledModel
from jaxmem.rasp.passes import (
  craft_to_model,
  graph_to_schedule,
  graph_to_value_sets,
  rasp_to_graph,
  rasp_to_normal_form,
  schedule_to_craft,
  values,
)
from jaxmem.rasp.passes.values import MAX_PAIRS


def _check_vocab(vocab, compiler_bos):
  try:
    vocab = list(vocab)
  except TypeError as e:
    raise ValueError(f"`vocab` must be a collection of tokens, got {vocab!r}.") from e
  if not vocab:
    raise ValueError("`vocab` must not be empty.")
  for v in vocab:
    if v is None:
      raise ValueError("`vocab` must not contain None (None is RASP's 'no value').")
  if any(v == compiler_bos for v in vocab):
    raise ValueError(f"`compiler_bos` {compiler_bos!r} equals a token in `vocab`; pick another BOS.")
  seen = {}
  for v in vocab:
    try:
      hash(v)
    except TypeError as e:
      raise ValueError(f"`vocab` token {v!r} is unhashable; tokens must be hashable.") from e
    if v in seen and type(seen[v]) is not type(v):
      raise ValueError(f"`vocab` holds {seen[v]!r} and {v!r}, equal in Python but of different "
                       "types; a compiled model reads them as one token. Keep one.")
    seen.setdefault(v, v)
  return values.unique_values(vocab, "vocab")


def compile(program: rasp.SOp, vocab: Sequence[Any], max_seq_len: int,  # noqa: A001
            compiler_bos: Any = "BOS", max_params: Optional[int] = 100_000_000,
            causal: bool = False, max_pairs: int = MAX_PAIRS) -> CompiledModel:
  """Compiles ``program`` for inputs over ``vocab`` of every length ``1..max_seq_len``.

  Returns a :class:`~jaxmem.rasp.model.CompiledModel`; ``.apply(tokens)`` (no BOS) decodes
  the output at each position. ``causal=True``: every head sees only the positions at or
  before its query (BOS always), so the model computes ``rasp.evaluate(program, xs,
  causal=True)`` (the weights are the same; only the mask differs). Raises ``ValueError``
  for programs that cannot be compiled exactly (see the module docstring), for bad
  arguments, and — before allocating any weights — when the model would exceed
  ``max_params`` parameters (None: no limit). ``max_pairs``: a SequenceMap over more input pairs
  (its function is called on each) is refused; the default keeps every refusal under a second,
  a larger one compiles larger tables (``sort`` at ``N = 1024`` needs 1,050,625) more slowly."""
  t0 = time.perf_counter()
  if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, (int, np.integer)) \
      or max_seq_len < 1:
    raise ValueError(f"`max_seq_len` must be a positive integer, got {max_seq_len!r}.")
  max_seq_len = int(max_seq_len)
  if not isinstance(causal, bool):
    raise ValueError(f"`causal` must be a bool, got {causal!r}.")
  vocab = _check_vocab(vocab, compiler_bos)
  if isinstance(max_pairs, bool) or not isinstance(max_pairs, (int, np.integer)) or max_pairs < 1:
    raise ValueError(f"`max_pairs` must be a positive integer, got {max_pairs!r}.")
  vs = graph_to_value_sets.ValueSets(vocab, max_seq_len, int(max_pairs))
  out = rasp_to_normal_form.rewrite(program, vs)
  nodes = rasp_to_graph.walk(out)
  rasp_to_graph.check_types(nodes, out)
  for e in nodes:  # numerical tokens / Full must be numbers
    if isinstance(e, (rasp.TokensType, rasp.Full)) and rasp.is_numerical(e):
      vs[e]
  none_checked = graph_to_value_sets.check_none(nodes, vs, out)
  graph_to_value_sets.check_value_types(nodes, vs)
  schedule = graph_to_schedule.allocate(nodes)
  fused = graph_to_schedule.allocate(nodes, fuse=True)
  if fused.num_layers < schedule.num_layers:   # MLP-only chains in one layer's (deeper) MLP
    schedule = fused
  res, tok, pos, layers = schedule_to_craft.build(nodes, out, vs, schedule, vocab, max_seq_len, max_params)
  model = craft_to_model.assemble(program, out, nodes, vs, none_checked, res, tok, pos, layers, vocab,
                                  compiler_bos, max_seq_len, causal)
  model.compile_seconds = time.perf_counter() - t0  # everything up to a runnable NNX model
  return model
