"""Feature maps φ against the papers' definitions written as plain loops, and the key normalisations.

The references are scalar loops over the defining formulas: ELU(x) + 1 (Katharopoulos et al. 2020)
and DPFP-ν, ``φ_{i + 2d(j−1)}(x) = z_i z_{(i+j) mod 2d}`` with ``z = ReLU([x, −x])`` (Schlag, Irie &
Schmidhuber 2021). The check is shown to catch deliberately broken maps. One input (``X``, width 7,
with a zero entry at the kinks of ELU and ReLU) serves every test but the 1-wide one: the maps run
eagerly, and each of their operations compiles once, for that shape.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels import feature_maps as fm

X = np.random.default_rng(0).normal(size=(3, 5, 7)).astype(np.float32)
X[0, 0, 0] = 0.0  # ELU at its kink, ReLU at its kink


def dpfp_reference(x, nu):
  """DPFP-ν from the paper's formula, one entry at a time: φ_{i + 2d(j−1)} = z_i z_{(i+j) mod 2d}."""
  x = np.asarray(x, np.float64)
  z = np.maximum(np.concatenate([x, -x], axis=-1), 0.0)
  two_d = z.shape[-1]
  out = np.zeros(x.shape[:-1] + (two_d * nu,))
  for j in range(1, nu + 1):
    for i in range(two_d):
      out[..., (j - 1) * two_d + i] = z[..., i] * z[..., (i + j) % two_d]
  return out


def elu1_reference(x):
  """ELU(x) + 1 entry by entry: ELU(x) = x for x > 0, e^x − 1 otherwise."""
  x = np.asarray(x, np.float64)
  out = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    out[idx] = (x[idx] if x[idx] > 0 else math.exp(x[idx]) - 1.0) + 1.0
  return out


def matches(phi, reference, x) -> bool:
  got = np.asarray(phi(jnp.asarray(x)))
  want = reference(x)
  return got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("nu", [1, 2, 3])
def test_dpfp_matches_numpy_definition(nu):
  got = np.asarray(fm.dpfp(jnp.asarray(X), nu))
  assert got.shape == (3, 5, 2 * 7 * nu)
  np.testing.assert_allclose(got, dpfp_reference(X, nu), rtol=1e-6, atol=1e-6)
  assert fm.FEATURE_MAPS[f"dpfp{min(nu, 2)}"][1](7) == 2 * 7 * min(nu, 2)
  # feature maps and normalisations: elu1 keeps the width, sum norm gives Σφ = 1, l2 gives ‖φ‖ = 1
  np.testing.assert_allclose(np.asarray(fm.elu1(jnp.asarray(X))),
                             np.where(X > 0, X + 1.0, np.exp(X)), rtol=1e-6)
  for name in ("elu1", "dpfp1", "dpfp2"):
    phi = fm.feature_map(name)
    nonzero = np.asarray(phi(jnp.asarray(X))).sum(-1) > 0   # DPFP of a 7-wide key can vanish
    f = np.asarray(fm.normalized_features(jnp.asarray(X), name, "sum"))
    np.testing.assert_allclose(f.sum(-1), np.where(nonzero, 1.0, 0.0), rtol=1e-5)
    assert (f >= 0).all()
    f2 = np.asarray(fm.normalized_features(jnp.asarray(X), name, "l2"))
    np.testing.assert_allclose(np.linalg.norm(f2, axis=-1), np.where(nonzero, 1.0, 0.0), rtol=1e-5)


def _wrong_side(v, nu):
  """DPFP with the neighbour on the other side, z_i z_{i−j}."""
  z = jax.nn.relu(jnp.concatenate([v, -v], -1))
  return jnp.concatenate([z * jnp.roll(z, j, axis=-1) for j in range(1, nu + 1)], axis=-1)


def _no_negation(v, nu):
  """DPFP without the negated half ([x, x] instead of [x, −x])."""
  return fm.dpfp(jnp.abs(v), nu)


def _one_short(v, nu):
  """DPFP missing its last feature."""
  return fm.dpfp(v, nu)[..., :-1]


def _relu_plus_1(v):
  """ReLU for ELU."""
  return jax.nn.relu(v) + 1.0


def test_maps_match_plain_loop_references_and_broken_maps_do_not():
  assert matches(fm.elu1, elu1_reference, X)
  assert matches(fm.feature_map("elu1"), elu1_reference, X)
  for nu in (1, 2):
    ref = functools.partial(dpfp_reference, nu=nu)
    assert matches(fm.feature_map(f"dpfp{nu}"), ref, X)
    assert fm.feature_width(f"dpfp{nu}", 7) == ref(X).shape[-1]
    # deliberately broken: neighbour on the other side (z_i z_{i−j}), no negated half ([x, x]), one block short
    for broken in (_wrong_side, _no_negation, _one_short):
      assert not matches(functools.partial(broken, nu=nu), ref, X), broken.__name__
  assert not matches(jax.nn.elu, elu1_reference, X)      # the +1 forgotten
  assert not matches(_relu_plus_1, elu1_reference, X)    # ReLU for ELU


def test_names_widths_and_errors():
  assert set(fm.FEATURE_MAPS) == {"identity", "elu1", "dpfp1", "dpfp2"}
  assert [fm.feature_width(n, 8) for n in ("identity", "elu1", "dpfp1", "dpfp2")] == [8, 8, 16, 32]
  x = jnp.ones((2, 3))
  np.testing.assert_array_equal(np.asarray(fm.feature_map("identity")(x)), np.ones((2, 3)))
  with pytest.raises(ValueError, match="must be one of"):
    fm.feature_map("ELU+1")
  with pytest.raises(ValueError, match="norm must be one of"):
    fm.normalized_features(x, "elu1", "max")
  with pytest.raises(ValueError, match="integer nu >= 1"):
    fm.dpfp(x, 0)


def test_all_zero_features_stay_zero():
  """DPFP of a 1-wide key is z_0 z_1 = ReLU(x) ReLU(−x) = 0: normalising keeps it 0, not NaN."""
  x = jnp.asarray([[0.7], [-1.3]])
  for norm in fm.NORMS:
    f = np.asarray(fm.normalized_features(x, "dpfp1", norm))
    assert f.shape == (2, 2) and np.all(f == 0.0)
