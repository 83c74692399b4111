"""Names shared by the associative-memory forms: rule sets, dtypes, masks, the default matmul.

Shapes follow the package convention (:mod:`jaxmem.kernels.assoc`): log-decays ``[.., T]``,
masks ``[.., C, C]``, state ``S [D_v, D_k]``. :func:`decay_mask` gives
``M_ti = Π_{i<s≤t} γ_s`` and ``G_t = Π_{s≤t} γ_s`` from segment sums of ``log γ``; its
segment sums are checked against direct sums (exact at ``−inf``) in
``tests/kernels/test_assoc_numerics.py::test_segsum_matches_direct_sums_and_is_exact_at_minus_inf``,
and the masks through every form's comparison with the numpy loop (``tests/kernels/test_assoc.py``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from jaxmem.kernels.precision import Matmul
from jaxmem.kernels.segsum import segsum

RULES = ("hebb", "delta", "oja", "decay", "gated_delta", "gated_oja")
MODES = ("auto", "recurrent", "parallel", "chunked")
DECAY_RULES = ("decay", "gated_delta", "gated_oja")
# Rules whose update multiplies the state by (I − β a aᵀ) and so need β‖a‖² in [0, 2].
ERASE_RULES = ("delta", "gated_delta", "oja", "gated_oja")
# Rules that erase along the value (write with key v, value k on S [D_v, D_k]): no parallel form.
OJA_RULES = ("oja", "gated_oja")
# Each rule with a decay added: a segment boundary is a decay of 0 (log γ = −inf) at its first token.
WITH_DECAY = {"hebb": "decay", "delta": "gated_delta", "oja": "gated_oja",
              "decay": "decay", "gated_delta": "gated_delta", "gated_oja": "gated_oja"}

HIGHEST = Matmul()  # the default matmul of every form: float32 operands on every platform


def acc_dtype(*xs) -> Any:
  """The accumulation dtype of ``xs``: their promoted dtype, at least float32."""
  return jnp.promote_types(jnp.result_type(*xs), jnp.float32)


def decay_mask(logg_TX):
  """``(M [.., T, T], G [.., T], G_end / G [.., T], G_end [..])`` from log-decays ``[.., T]``.

  ``M_ti = Π_{i<s≤t} γ_s`` (0 above the diagonal), ``G_t = Π_{s≤t} γ_s``, all as ``exp`` of
  segment sums (no subtraction of cumulative sums).
  """
  seg = segsum(logg_TX)
  g = logg_TX[..., :1] + seg[..., :, 0]  # Σ_{s≤t} log γ_s
  return jnp.exp(seg), jnp.exp(g), jnp.exp(seg[..., -1, :]), jnp.exp(g[..., -1])


def mT(x):
  """``x`` with its last two axes swapped (a batched transpose)."""
  return jnp.swapaxes(x, -1, -2)


def causal(C: int, ndim: int, strict: bool = False):
  """Lower-triangular ``[1, .., 1, C, C]`` mask: row ``t`` sees column ``i ≤ t`` (``i < t``)."""
  t, i = jnp.arange(C)[:, None], jnp.arange(C)[None, :]
  return ((t > i) if strict else (t >= i)).reshape((1,) * (ndim - 2) + (C, C))


def eye(n: int, ndim: int, dtype):
  """The identity ``[1, .., 1, n, n]`` (``ndim`` axes)."""
  return jnp.eye(n, dtype=dtype).reshape((1,) * (ndim - 2) + (n, n))
