"""Recurrent form: the literal update equations, one token per ``lax.scan`` step.

Per head, state ``S [D_v, D_k]``, inputs ``q, k [T, D_k]``, ``v [T, D_v]``, ``β, log γ [T]``;
each step writes with :func:`update` (e.g. delta: ``S_t = S_{t−1} + β_t (v_t − S_{t−1} k_t) k_tᵀ``)
and then reads ``o_t = S_t q_t``. This is the reference every other form is compared with,
and :func:`update` is also the body of the inference :func:`jaxmem.kernels.assoc.step`.

Tested: ``tests/kernels/test_assoc.py::test_every_mode_matches_numpy_loop_with_initial_state``
(against an independent float64 numpy loop, outputs and states, every rule) and
``::test_step_over_a_sequence_equals_the_sequence_form``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxmem.checks import check_choice
from jaxmem.kernels.assoc.common import DECAY_RULES, HIGHEST, RULES
from jaxmem.kernels.precision import Matmul


def update(rule: str, S_VK, k_K, v_V, b, g, dot: Matmul = HIGHEST):
  """One write of ``rule`` on ``S [D_v, D_k]``; ``b`` = β_t, ``g`` = γ_t (scalars).

  ``k_K [D_k]``, ``v_V [D_v]``; returns ``S_t [D_v, D_k]`` (equations in :mod:`jaxmem.kernels.assoc`).
  """
  if rule in DECAY_RULES:
    S_VK = g * S_VK
  if rule in ("hebb", "decay"):
    return S_VK + b * (v_V[:, None] * k_K[None, :])
  if rule in ("delta", "gated_delta"):
    err_V = v_V - dot(S_VK, k_K)  # gated: S already decayed, i.e. v − γ S_{t−1} k
    return S_VK + b * (err_V[:, None] * k_K[None, :])
  # oja / gated_oja (S already decayed): S + β (v kᵀ − v (vᵀ S))
  return S_VK + b * (v_V[:, None] * (k_K - dot(v_V, S_VK))[None, :])


def recurrent_head(q_TK, k_TK, v_TV, beta_T, logg_T, S_VK, *, rule: str, dot: Matmul = HIGHEST):
  """One head, ``lax.scan`` over time; returns ``(o [T, D_v], S_T [D_v, D_k])``.

  ``logg_T`` is the log-decay ``log γ`` (None for rules without decay). Inputs in the
  accumulation dtype; no argument checks (see :func:`jaxmem.kernels.assoc.associative_memory`).
  """
  check_choice("rule", rule, RULES)
  gamma_T = jnp.exp(logg_T) if logg_T is not None else jnp.ones_like(beta_T)

  def body(S_VK, x):
    q_K, k_K, v_V, b, g = x
    S_VK = update(rule, S_VK, k_K, v_V, b, g, dot)
    return S_VK, dot(S_VK, q_K)  # read after write

  S_VK, o_TV = jax.lax.scan(body, S_VK, (q_TK, k_TK, v_TV, beta_T, gamma_T))
  return o_TV, S_VK
