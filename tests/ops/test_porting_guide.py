"""``docs/porting_from_fla.md``'s GatedDeltaNet layer, executed from the guide's own code block (so the guide
cannot drift from what is tested), on three packed documents against three separate runs; and the library
pieces it ports fla's layer with: :class:`jaxmem.models.layers.RMSNormGated` (fla's ``FusedRMSNormGated``)
against NumPy, values and gradients, and :func:`jaxmem.kernels.segments.attention_mask_to_segment_ids`.
"""

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.kernels.segments import attention_mask_to_segment_ids
from jaxmem.models.layers import RMSNormGated

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "porting_from_fla.md"
MARKER = "<!-- the code block below is executed by tests/ops/test_porting_guide.py -->"


def guide_code() -> str:
  """The ``python`` code block right after the guide's marker."""
  text = GUIDE.read_text(encoding="utf-8")
  assert text.count(MARKER) == 1, "the guide's tested code block lost its marker"
  block = re.match(r"\s*```python\n(.*?)\n```", text.split(MARKER, 1)[1], re.S)
  assert block, "no ```python block after the marker"
  return block.group(1)


@functools.cache
def guide_layer():
  """The guide's ``GatedDeltaNet`` with small sizes: 2 key heads of 4, 4 value heads of 6 (grouped), width 8."""
  namespace = {}
  exec(compile(guide_code(), str(GUIDE), "exec"), namespace)
  return namespace["GatedDeltaNet"](hidden_size=8, expand_v=1.5, head_dim=4, num_heads=2, num_v_heads=4,
                                    conv_bias=True, rngs=nnx.Rngs(0))


LENGTHS = (5, 1, 11)  # three documents: one shorter than the convolution, one of a single token
CU = np.cumsum((0,) + LENGTHS).astype(np.int32)
HV, DV, DK = 4, 6, 4


def documents():
  """The packed row ``x [1, 17, 8]``, initial states ``[3, HV, V, K]`` (``state_v_first``) and cotangents."""
  r = np.random.default_rng(0)
  x = r.normal(size=(1, int(CU[-1]), 8)).astype(np.float32)
  h0 = (0.5 * r.normal(size=(3, HV, DV, DK))).astype(np.float32)
  cot_o = r.normal(size=x.shape).astype(np.float32)
  cot_h = r.normal(size=h0.shape).astype(np.float32)
  return x, h0, cot_o, cot_h


def packed(params, x, h0, graphdef):
  return nnx.merge(graphdef, params)(x, cu_seqlens=CU, initial_state=h0, use_cache=True)


def separate(params, x, h0, graphdef):
  """Each document through the layer by itself (B = 1, no varlen), outputs concatenated, states stacked."""
  layer = nnx.merge(graphdef, params)
  outs = [layer(x[:, CU[n]:CU[n + 1]], initial_state=h0[n:n + 1], use_cache=True) for n in range(3)]
  return jnp.concatenate([o for o, _ in outs], axis=1), jnp.concatenate([h for _, h in outs])


@functools.cache
def values_and_grads(how):
  """``((o, state), grads)`` of the packed call or of the separate ones, one jitted program each: the gradients
  of ``<cot, (o, state)>`` w.r.t. every parameter, the input and the initial states."""
  graphdef, params = nnx.split(guide_layer())
  x, h0, cot_o, cot_h = documents()
  f = functools.partial(packed if how == "packed" else separate, graphdef=graphdef)

  def run(params, x, h0):
    out, pullback = jax.vjp(f, params, x, h0)
    return out, pullback((cot_o, cot_h))

  return jax.jit(run)(params, x, h0)


def test_guide_layer_on_packed_documents_equals_each_document_alone():
  # cu_seqlens (B = 1, a state per document): outputs, final states, and the gradients w.r.t. the input, the
  # initial states and every parameter. Seen failing with the convolutions' segment ids removed from the guide
  # (documents 2 and 3 then read the previous document's last tokens)
  (o, h), grads = values_and_grads("packed")
  (want_o, want_h), want_grads = values_and_grads("separate")
  # float32 through <= 11 tokens and a few width-8..24 matmuls: values of order 1, rounding ~1e-6 per step
  np.testing.assert_allclose(o, want_o, rtol=1e-4, atol=2e-5, err_msg="o")
  np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=2e-5, err_msg="final states")
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(want_grads), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-4, atol=5e-5, err_msg=f"d/d{jax.tree_util.keystr(path)}")


def test_guide_layer_with_an_attention_mask_equals_each_document_alone():
  # fla's attention_mask [B, T]: each row one document, padded left or right; the layer's output is each
  # document's own at its tokens and 0 at the padding (fla re-pads with zeros), the state each row's
  layer = guide_layer()
  x, h0, _, _ = documents()
  T = max(LENGTHS)
  mask = np.zeros((3, T), np.int32)
  rows = np.random.default_rng(7).normal(size=(3, T, 8)).astype(np.float32)  # padding holds garbage, unread
  where = [np.arange(5), np.array([T - 1]), np.arange(T)]  # row 0 right-padded, row 1 left-padded, row 2 full
  for n, at in enumerate(where):
    mask[n, at] = 1
    rows[n, at] = x[0, CU[n]:CU[n + 1]]
  o, h = layer(rows, attention_mask=mask, initial_state=h0, use_cache=True)
  (want_o, want_h), _ = values_and_grads("separate")
  for n, at in enumerate(where):
    np.testing.assert_allclose(o[n, at], want_o[0, CU[n]:CU[n + 1]], rtol=1e-4, atol=2e-5, err_msg=f"row {n}")
    assert not np.any(np.delete(np.asarray(o[n]), at, axis=0)), f"row {n}: padding outputs 0"
  np.testing.assert_allclose(h, want_h, rtol=1e-4, atol=2e-5, err_msg="final states")


# ----------------------------------------------------------------------------------------
# RMSNormGated: fla's FusedRMSNormGated against NumPy


def numpy_rms_norm_gated(x, g, w, eps, activation, cot):
  """float64 ``y = x / sqrt(mean(x²) + eps) · w ⊙ act(g)`` and its gradients w.r.t. ``x, g, w`` for the
  cotangent ``cot``, by hand: with ``r = (mean(x²) + eps)^(-1/2)`` and ``u = cot · w · act(g)``,
  ``dx = r u − x r³ Σ(u x) / D``, ``dg = cot · x r w · act'(g)``, ``dw = Σ_rows cot · x r act(g)``."""
  x, g, w, cot = (np.asarray(a, np.float64) for a in (x, g, w, cot))
  r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
  s = 1.0 / (1.0 + np.exp(-g))
  act, dact = (s, s * (1 - s)) if activation == "sigmoid" else (g * s, s * (1 + g * (1 - s)))
  y = x * r * w * act
  u = cot * w * act
  dx = r * u - x * r ** 3 * np.sum(u * x, axis=-1, keepdims=True) / x.shape[-1]
  dg = cot * x * r * w * dact
  dw = np.sum(cot * x * r * act, axis=tuple(range(x.ndim - 1)))
  return y, dx, dg, dw


@pytest.mark.parametrize("activation,eps", [("swish", 1e-5), ("silu", 1e-5), ("sigmoid", 1e-3)])
def test_rms_norm_gated_matches_numpy_values_and_gradients(activation, eps):
  # [B, T, H, D] = [2, 3, 4, 6] with one all-zero head (a padded token's output: y = 0, finite gradients) and
  # a non-unit weight
  r = np.random.default_rng(1)
  x, g, cot = (r.normal(size=(2, 3, 4, 6)).astype(np.float32) for _ in range(3))
  x[0, 1, 2] = 0.0
  w = r.uniform(0.5, 1.5, 6).astype(np.float32)
  norm = RMSNormGated(6, eps=eps, activation=activation)
  norm.weight[...] = w
  graphdef, state = nnx.split(norm)
  y, pullback = jax.vjp(lambda state, x, g: nnx.merge(graphdef, state)(x, g), state, x, g)
  d_state, dx, dg = pullback(cot)
  want_y, want_dx, want_dg, want_dw = numpy_rms_norm_gated(x, g, w, eps, activation, cot)
  # float32 of values of order 1 (a few ops, D = 6 terms per sum): relative rounding ~1e-6
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dg, want_dg, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(d_state["weight"][...], want_dw, rtol=1e-5, atol=1e-5)
  assert not np.any(y[0, 1, 2]) and np.all(np.isfinite(dx))


def test_rms_norm_gated_computes_in_float32_and_returns_the_input_dtype():
  # fla's kernel: float32 inside, y in x's dtype; bfloat16 in, the float32 result rounded once
  r = np.random.default_rng(2)
  x, g = (r.normal(size=(3, 8)).astype(np.float32) for _ in range(2))
  xb, gb = jnp.asarray(x, jnp.bfloat16), jnp.asarray(g, jnp.bfloat16)
  y = RMSNormGated(8)(xb, gb)
  assert y.dtype == jnp.bfloat16
  want, *_ = numpy_rms_norm_gated(np.asarray(xb, np.float32), np.asarray(gb, np.float32), np.ones(8), 1e-5,
                                  "swish", np.zeros((3, 8)))
  # one rounding to bfloat16 (8 bits of mantissa): within 2^-8 relative
  np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=2 ** -8, atol=1e-6)


@pytest.mark.parametrize("make,match", [
    (lambda: RMSNormGated(6)(jnp.zeros((2, 6)), jnp.zeros((2, 5))), r"`x` and `g` must have the same shape"),
    (lambda: RMSNormGated(6)(jnp.zeros((2, 5)), jnp.zeros((2, 5))), r"features = 6"),
    (lambda: RMSNormGated(6, activation="gelu"), r"`activation` must be one of \['swish', 'silu', 'sigmoid'\]"),
    (lambda: RMSNormGated(6, eps=0.0), r"`eps` must be a finite positive number"),
])
def test_rms_norm_gated_refuses_bad_input(make, match):
  with pytest.raises(ValueError, match=match):
    make()


# ----------------------------------------------------------------------------------------
# attention_mask -> segment_ids


def test_attention_mask_to_segment_ids():
  mask = np.array([[1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 1, 0]])
  np.testing.assert_array_equal(attention_mask_to_segment_ids(mask), mask)
  ids = attention_mask_to_segment_ids(mask.astype(bool))
  assert ids.dtype == jnp.int32
  np.testing.assert_array_equal(ids, mask)
  traced = jax.jit(attention_mask_to_segment_ids)(jnp.asarray(mask) * 3)  # under jit: non-zero is a token
  np.testing.assert_array_equal(traced, mask)
  with pytest.raises(ValueError, match=r"`attention_mask` must have shape \[B, T\]"):
    attention_mask_to_segment_ids(np.ones((2, 3, 3), np.int32))
  with pytest.raises(ValueError, match=r"`attention_mask` must hold integers or booleans"):
    attention_mask_to_segment_ids(np.ones((2, 3), np.float32))
  with pytest.raises(ValueError, match=r"must hold 0 \(padding\) and 1 \(token\), got values such as \[2\]"):
    attention_mask_to_segment_ids(np.array([[1, 2, 0]]))
