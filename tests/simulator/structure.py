"""The structure check shared by the simulator's tests: a program is built only from AHAT layers with fixed
weights and the restricted position-wise kinds, and no layer but an AHAT aggregation sums anything."""

import numpy as np

from jaxmem.machine import UNARY_OPS, AHATLayer, LinearLayer, ProductLayer, UnaryLayer

RESTRICTED = (AHATLayer, LinearLayer, ProductLayer, UnaryLayer)


def assert_attention_does_the_work(program):
  """Fails unless every layer is AHAT with fixed weights or one of the restricted position-wise kinds:

  * product: every output coordinate is ``a·b`` of exactly two coordinates; unary: ``op(a)`` of one, ``op``
    in exp / reciprocal / relu — the elementwise maps of one or two scalars;
  * linear: a fixed matrix none of whose output coordinates reads more than two coordinates; traced back
    through chains of linear layers to the coordinates another kind (or the input) wrote, an output combines
    at most one coordinate of any slot (a slot holds a vector: summing its coordinates is a reduction, in one
    layer or a tree of them) and at most four in all (U's encoder output ``X + att + b2 + ffn``); the program
    is single-assignment (a linear output is never added to a coordinate again);
  * AHAT: ``tol = 0``; every value coordinate reads one residual coordinate and every residual coordinate is
    written from one value coordinate (``W_V``, ``W_O`` at most one non-zero per column): attention routes
    values with a fixed scale, and the only sum it does is its average over the selected positions."""
  assert program.single_assignment, "the program may add to a coordinate twice"
  sources = {}   # coordinate written by a linear layer -> the non-linear coordinates it is a combination of
  for layer in program.layers:
    assert type(layer) in RESTRICTED, f"{layer.name!r} is a {type(layer).__name__}, not a restricted kind"
    if isinstance(layer, (ProductLayer, UnaryLayer)):
      wire = program.wiring[layer.name]
      operands = ("a", "b") if isinstance(layer, ProductLayer) else ("a",)
      assert set(wire) == {"out", *operands}, layer.name
      assert all(wire[k].shape == wire["out"].shape for k in operands), layer.name
      assert len(np.unique(wire["out"])) == len(wire["out"]), layer.name
      if isinstance(layer, UnaryLayer):
        assert layer.op in UNARY_OPS, layer.name
    elif isinstance(layer, LinearLayer):
      rows, cols, vals = program.linear_entries(layer.name)   # the non-zero entries of its matrix M
      width = program.layout.width
      assert np.all(vals != 0) and np.all((0 <= rows) & (rows < width) & (0 <= cols) & (cols < width))
      assert np.bincount(cols, minlength=1).max() <= 2, f"{layer.name!r}: an output reads more than two coords"
      for j in np.unique(cols).tolist():
        sources[j] = set().union(*(sources.get(i, {i}) for i in rows[cols == j].tolist()))
        slots = [program.layout.slot_of(int(i)) for i in sources[j]]
        assert len(set(slots)) == len(slots), \
            f"{layer.name!r}: an output sums coordinates of one slot through linear layers"
        assert len(slots) <= 4, f"{layer.name!r}: an output sums more than four coords through linear layers"
    else:
      assert layer.tol == 0.0, layer.name
      w = {k: np.asarray(a) for k, a in program.weights[layer.name].items()}
      assert np.count_nonzero(w["wv"], axis=0).max() <= 1, f"{layer.name!r}: a value sums coordinates"
      assert np.count_nonzero(w["wo"], axis=0).max() <= 1, f"{layer.name!r}: an output sums value coordinates"
