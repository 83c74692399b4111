"""The structure check shared by the simulator's tests: a program is built only from AHAT layers with fixed
weights and the restricted position-wise kinds, and no layer but an AHAT aggregation sums anything."""

import numpy as np

from jaxmem.machine import UNARY_OPS, AHATLayer, LinearLayer, ProductLayer, UnaryLayer

RESTRICTED = (AHATLayer, LinearLayer, ProductLayer, UnaryLayer)


def assert_attention_does_the_work(program):
  """Fails unless every layer is AHAT with fixed weights or one of the restricted position-wise kinds:

  * product: every output coordinate is ``a·b`` of exactly two coordinates; unary: ``op(a)`` of one, ``op``
    in exp / reciprocal / relu — the elementwise maps of one or two scalars;
  * linear: a fixed matrix none of whose output coordinates reads more than two coordinates, so no sum over
    a matrix dimension hides in a linear map;
  * AHAT: ``tol = 0``; every value coordinate reads one residual coordinate and every residual coordinate is
    written from one value coordinate (``W_V``, ``W_O`` at most one non-zero per column): attention routes
    values with a fixed scale, and the only sum it does is its average over the selected positions."""
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
      m = np.asarray(program.weights[layer.name]["w"])
      assert m.shape == (program.layout.width,) * 2
      assert np.count_nonzero(m, axis=0).max() <= 2, f"{layer.name!r}: an output reads more than two coords"
    else:
      assert layer.tol == 0.0, layer.name
      w = {k: np.asarray(a) for k, a in program.weights[layer.name].items()}
      assert np.count_nonzero(w["wv"], axis=0).max() <= 1, f"{layer.name!r}: a value sums coordinates"
      assert np.count_nonzero(w["wo"], axis=0).max() <= 1, f"{layer.name!r}: an output sums value coordinates"
