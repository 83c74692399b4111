"""Feature maps ``φ`` for keys and queries of associative (linear-attention) memories.

An associative memory read ``o = S φ(q)`` with ``S = Σ v φ(k)ᵀ`` is a kernel smoother with
kernel ``φ(q)·φ(k)``; ``φ`` decides how many keys it can keep apart. One spelling per map,
used by the model config, the experiments and their reports:

========== ========================= ============ ==========================================
name       ``φ(x)``                  width        source
========== ========================= ============ ==========================================
identity   ``x``                     ``d``        (the raw keys)
elu1       ``ELU(x) + 1``            ``d``        Katharopoulos et al. 2020, arXiv:2006.16236
dpfp1      DPFP with ``ν = 1``       ``2d``       Schlag, Irie & Schmidhuber 2021,
dpfp2      DPFP with ``ν = 2``       ``4d``       arXiv:2102.11174, §5.3
========== ========================= ============ ==========================================

:func:`normalized_features` applies ``φ`` and then one of the key normalisations
:data:`NORMS` (the capacity experiments of ``docs/papers/pavlovian.md`` use both).

Tested in ``tests/kernels/test_feature_maps.py`` against the papers' definitions written
as plain loops.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp


def identity(x: jax.Array) -> jax.Array:
  return x


def elu1(x: jax.Array) -> jax.Array:
  """``φ(x) = ELU(x) + 1`` (Katharopoulos et al. 2020): positive, width unchanged."""
  return jax.nn.elu(x) + 1.0


def dpfp(x: jax.Array, nu: int) -> jax.Array:
  """DPFP-ν (Schlag, Irie & Schmidhuber 2021, their deterministic parameter-free projection).

  With ``r = ReLU`` and ``z = r([x, −x]) ∈ R^{2d}`` (indices cyclic mod ``2d``), the paper defines
  ``φ_{i + 2d(j−1)}(x) = z_i z_{i+j}`` for ``i = 1..2d`` and ``j = 1..ν``: products of each entry
  with its ``j``-th cyclic neighbour, the blocks ``j = 1..ν`` concatenated — width ``2dν``.
  Written here as ``z · roll(z, −j)`` (``roll(z, −j)_i = z_{i+j}``). Degree-2 homogeneous, so
  ``φ(s x) = s² φ(x)`` for ``s > 0`` and any normalisation of ``φ`` removes the key's scale.
  """
  if isinstance(nu, bool) or not isinstance(nu, int) or nu < 1:
    raise ValueError(f"DPFP needs an integer nu >= 1, got {nu!r}.")
  z = jax.nn.relu(jnp.concatenate([x, -x], axis=-1))
  return jnp.concatenate([z * jnp.roll(z, -j, axis=-1) for j in range(1, nu + 1)], axis=-1)


# name -> (φ, feature width for input width d)
FEATURE_MAPS: dict[str, tuple[Callable[[jax.Array], jax.Array], Callable[[int], int]]] = {
    "identity": (identity, lambda d: d),
    "elu1": (elu1, lambda d: d),
    "dpfp1": (functools.partial(dpfp, nu=1), lambda d: 2 * d),
    "dpfp2": (functools.partial(dpfp, nu=2), lambda d: 4 * d),
}


def check_feature_map(name: str, owner: str = "feature_map") -> str:
  if name not in FEATURE_MAPS:
    raise ValueError(f"{owner} must be one of {list(FEATURE_MAPS)}, got {name!r}.")
  return name


def feature_map(name: str) -> Callable[[jax.Array], jax.Array]:
  """The map ``φ`` called ``name`` (see the table above)."""
  return FEATURE_MAPS[check_feature_map(name)][0]


def feature_width(name: str, d: int) -> int:
  """Width of ``φ(x)`` for inputs of width ``d``."""
  return FEATURE_MAPS[check_feature_map(name)][1](d)


# Normalisations of φ(k), applied to keys and queries alike: "sum" is Schlag et al. 2021's
# φ(k) / Σ_j φ(k)_j (introduced with their delta rule, as stated from memory of the paper; no
# denominator in the read); "l2" is φ(k) / ‖φ(k)‖₂ (DeltaNet's convention: β = 1 writes a key fully).
NORMS = ("sum", "l2")


def normalized_features(k: jax.Array, name: str, norm: str) -> jax.Array:
  """``φ(k) / Σ_j φ(k)_j`` (``norm="sum"``) or ``φ(k) / ‖φ(k)‖₂`` (``"l2"``) for the map ``name``.

  ``k [..., d]`` -> ``[..., feature_width(name, d)]``. A ``φ(k) = 0`` (possible for DPFP at tiny
  key widths) stays 0: such a key reads and writes nothing instead of NaN.
  """
  if norm not in NORMS:
    raise ValueError(f"norm must be one of {NORMS}, got {norm!r}.")
  f = feature_map(name)(k)
  denom = jnp.sum(f, axis=-1, keepdims=True) if norm == "sum" else jnp.linalg.norm(f, axis=-1, keepdims=True)
  return f / jnp.maximum(denom, jnp.finfo(f.dtype).tiny)


__all__ = ["FEATURE_MAPS", "NORMS", "check_feature_map", "dpfp", "elu1", "feature_map", "feature_width",
           "identity", "normalized_features"]
