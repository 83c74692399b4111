"""The Mamba-2 mixer (``"ssd"``): its forward against a float64 NumPy re-implementation of the block written
here from the module's own parameter values, token-by-token decoding and ``scan`` from a state (a prefill, then
the rest) against the forward and the reference's states, the size of the decoding state, the body
(``TransformerLM``) with it alone and beside softmax attention, and the logical axes of every parameter (hence
its layout and weight decay).

The reference re-derives every step from the equations of ``jaxmem/models/mixers/ssd.py``'s docstring
(Dao & Gu 2024, arXiv:2405.21060): the convolution as a sum over lags ``y_t = b + Σ_l w_{K−1−l} u_{t−l}``, the
SSD recurrence as a per-(row, head, token) loop, the gated norm per group of channels. Before comparing,
the parameters that initialisation makes trivial are set to random values (``D``, the norm weight, ``A_log``,
``dt_bias`` so that ``Δ`` is O(1), a larger output projection), so that each of them has an O(1) effect.

Tolerances: the float32 forward sums at most a few hundred O(1) products per output (projections of width
16–32, the recurrence over 13 tokens of N = 5, the output projection of width 32), so its rounding error is
below ``~300 · ε₃₂ ≈ 4e-5`` of the output scale in the worst case; entries are compared with
``atol = 1e-4 · max|reference|``, ``rtol = 1e-4``. The mutants these tests are meant to catch change outputs
by O(1) of that scale.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem import sharding
from jaxmem.arrays import device_array
from jaxmem.models import SoftmaxConfig, TransformerConfig, TransformerLM, mixers
from jaxmem.models.mixers.ssd import Mamba2, SSDConfig
from tests.models.jitted import decode, forward

D_MODEL, N_HEADS, N_LAYERS = 16, 4, 2
NB, T = 2, 13
# G = 2 groups, chunked with chunk 5 (13 = 2·5 + 3: the last chunk padded), B / C broadcast to heads before
# the kernel; and G = 1 (B / C passed shared) in the recurrent form with a convolution of width 2 and an ε
# of the norm large enough to be seen
CONFIGS = {
    "groups2_chunked": SSDConfig(d_state=5, n_groups=2, d_conv=4, chunk_size=5, mode="chunked"),
    "groups1_recurrent": SSDConfig(d_state=3, n_groups=1, d_conv=2, expand=1, mode="recurrent", norm_eps=0.3),
}


def silu(v):
  return v / (1.0 + np.exp(-v))


def numpy_mamba2(p: dict, x, cfg: SSDConfig, H: int):
  """The Mamba-2 block in float64 from parameter values ``p`` (NumPy arrays).

  Returns ``(out [batch, T, d_model], h_T [batch, H, P, N], raw conv inputs [batch, T, d_inner + 2·G·N])``.
  """
  x = np.asarray(x, np.float64)
  nb, T, _ = x.shape
  G, N, K = cfg.n_groups, cfg.d_state, cfg.d_conv
  z, u, B, C, dt = (x @ p[name] for name in ("in_z", "in_x", "in_B", "in_C", "in_dt"))
  raw = np.concatenate([u, B, C], axis=-1)

  def conv(v, w, b):  # causal: lag l uses tap K − 1 − l, inputs before the first token are 0
    out = np.zeros_like(v) + b
    for t in range(T):
      for lag in range(min(K, t + 1)):
        out[:, t] += w[K - 1 - lag] * v[:, t - lag]
    return out

  u = silu(conv(u, p["conv_x_kernel"], p["conv_x_bias"]))
  B = silu(conv(B, p["conv_B_kernel"], p["conv_B_bias"])).reshape(nb, T, G, N)
  C = silu(conv(C, p["conv_C_kernel"], p["conv_C_bias"])).reshape(nb, T, G, N)
  dt = np.logaddexp(0.0, dt + p["dt_bias"])  # softplus
  A = -np.exp(p["A_log"])
  d_inner = u.shape[-1]
  P = d_inner // H
  u = u.reshape(nb, T, H, P)
  y, hT = np.zeros((nb, T, H, P)), np.zeros((nb, H, P, N))
  for b in range(nb):
    for h in range(H):
      g = h // (H // G)
      S = np.zeros((P, N))
      for t in range(T):
        S = np.exp(dt[b, t, h] * A[h]) * S + dt[b, t, h] * np.outer(u[b, t, h], B[b, t, g])
        y[b, t, h] = S @ C[b, t, g] + p["D"][h] * u[b, t, h]
      hT[b, h] = S
  gated = y.reshape(nb, T, d_inner) * silu(z)
  groups = gated.reshape(nb, T, G, d_inner // G)
  normed = groups / np.sqrt(np.mean(groups ** 2, axis=-1, keepdims=True) + cfg.norm_eps)
  return normed.reshape(nb, T, d_inner) * p["norm"] @ p["out"], hT, raw


def params_of(m: Mamba2) -> dict:
  f64 = lambda v: np.asarray(v[...], np.float64)
  p = {name: f64(getattr(m, name).kernel) for name in ("in_z", "in_x", "in_B", "in_C", "in_dt", "out")}
  for name in ("conv_x", "conv_B", "conv_C"):
    p[f"{name}_kernel"], p[f"{name}_bias"] = f64(getattr(m, name).taps), f64(getattr(m, name).bias)
  p.update({name: f64(getattr(m, name)) for name in ("dt_bias", "A_log", "D", "norm")})
  return p


@functools.cache
def model(key: str) -> Mamba2:
  """The mixer of ``CONFIGS[key]`` with its trivially initialised parameters randomised (module docstring)."""
  cfg = CONFIGS[key]
  m = mixers.build(cfg, d_model=D_MODEL, n_heads=N_HEADS, n_layers=N_LAYERS, dtype="float32", rngs=nnx.Rngs(0))
  r = np.random.default_rng(1)
  H, d_inner = N_HEADS, cfg.expand * D_MODEL
  m.dt_bias[...] = device_array(r.normal(0.0, 0.5, H), np.float32)  # Δ = softplus(...) ≈ 0.3 … 1.2
  m.A_log[...] = device_array(np.log(r.uniform(0.2, 1.5, H)), np.float32)
  m.D[...] = device_array(r.normal(size=H), np.float32)
  m.norm[...] = device_array(1.0 + 0.3 * r.normal(size=d_inner), np.float32)
  m.out.kernel[...] = device_array(r.normal(size=(d_inner, D_MODEL)) / math.sqrt(d_inner), np.float32)
  return m


@functools.cache
def inputs():
  return device_array(np.random.default_rng(2).normal(size=(NB, T, D_MODEL)), np.float32)


@functools.cache
def reference(key: str):
  return numpy_mamba2(params_of(model(key)), inputs(), CONFIGS[key], N_HEADS)




def assert_close(got, want, msg, atol_scale=1e-4, rtol=1e-4):
  want = np.asarray(want, np.float64)
  np.testing.assert_allclose(got, want, rtol=rtol, atol=atol_scale * np.abs(want).max(), err_msg=msg)


# ----------------------------------------------------------------------------------------
# (a) the forward against the float64 re-implementation, (b) decoding: step and scan from a state


@pytest.mark.parametrize("key", CONFIGS)
def test_forward_equals_the_float64_block(key):
  y = forward(model(key), inputs())
  assert y.shape == (NB, T, D_MODEL) and y.dtype == jnp.float32
  assert_close(y, reference(key)[0], key)


@pytest.mark.parametrize("key", CONFIGS)
def test_step_token_by_token_equals_the_forward_and_carries_the_states(key):
  m, cfg = model(key), CONFIGS[key]
  y, state = decode(m, inputs())
  assert_close(y, forward(m, inputs()), f"{key}: step vs __call__", atol_scale=2e-5)
  ref_y, ref_h, raw = reference(key)
  assert_close(y, ref_y, f"{key}: step vs reference")
  assert_close(state["ssm"], ref_h, f"{key}: final SSM state")
  # the convolution's window: the last d_conv − 1 raw inputs of its x, B, C channels, oldest first
  assert_close(state["conv"], raw[:, T - (cfg.d_conv - 1):], f"{key}: conv window")


SPLIT = 6  # of the 13 tokens: the chunk-5 config's pieces each end in a padded chunk, and the width-4
# convolution's window spans the split


@nnx.jit
def _scan_split(m, x_BTD):
  """``scan`` over the first ``SPLIT`` tokens from ``init_state``, then over the rest from the state it
  returned: ``(state after SPLIT, final state, y)``."""
  mid, y1 = m.scan(m.init_state(x_BTD.shape[0], x_BTD.shape[1]), x_BTD[:, :SPLIT])
  final, y2 = m.scan(mid, x_BTD[:, SPLIT:])
  return mid, final, jnp.concatenate([y1, y2], axis=1)


@pytest.mark.parametrize("key", CONFIGS)
def test_scan_from_a_state_continues_the_sequence(key):
  # a prefill of SPLIT tokens, then the rest from its state: the forward's outputs, and after each piece the
  # reference's SSM state and convolution window (the last d_conv − 1 raw inputs)
  m, cfg = model(key), CONFIGS[key]
  mid, final, y = _scan_split(m, inputs())
  ref_y, ref_h, raw = reference(key)
  assert_close(y, forward(m, inputs()), f"{key}: scan split vs __call__", atol_scale=2e-5)
  assert_close(y, ref_y, f"{key}: scan split vs reference")
  prefix_h = numpy_mamba2(params_of(m), inputs()[:, :SPLIT], cfg, N_HEADS)[1]
  K = cfg.d_conv
  for name, state, h, window in (("after the prefill", mid, prefix_h, raw[:, SPLIT - (K - 1):SPLIT]),
                                 ("final", final, ref_h, raw[:, T - (K - 1):])):
    assert state["ssm"].dtype == jnp.float32 and state["conv"].dtype == jnp.float32
    assert_close(state["ssm"], h, f"{key}: SSM state {name}")
    assert_close(state["conv"], window, f"{key}: conv window {name}")


# ----------------------------------------------------------------------------------------
# (c) the decoding state's size


@pytest.mark.parametrize("key", CONFIGS)
def test_init_state_holds_state_floats(key):
  m, cfg = model(key), CONFIGS[key]
  count = lambda tree: sum(leaf.size for leaf in jax.tree.leaves(tree))
  want = cfg.state_floats(d_model=D_MODEL, n_heads=N_HEADS, seq_len=T)
  assert count(m.init_state(1, T)) == want
  assert count(m.init_state(3, 1000)) == 3 * want  # per sequence, independent of the length
  assert cfg.state_floats(d_model=D_MODEL, n_heads=N_HEADS, seq_len=10_000) == want
  state = m.init_state(2, T)
  assert state["ssm"].shape == (2, N_HEADS, cfg.expand * D_MODEL // N_HEADS, cfg.d_state)
  assert state["ssm"].dtype == jnp.float32
  # the default config at d_model 16, 4 heads: H·P·N = 32·16, plus 3 taps × (32 + 2·16) channels
  assert SSDConfig().state_floats(d_model=16, n_heads=4, seq_len=1) == 32 * 16 + 3 * (32 + 32)


# ----------------------------------------------------------------------------------------
# (d) in the body


def _lm_loss(model, tokens):
  logits = model(tokens[:, :-1])
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


_loss_and_grad = nnx.jit(nnx.value_and_grad(_lm_loss))


@pytest.mark.parametrize("mixer", [SSDConfig(d_state=4, chunk_size=4),
                                   (SSDConfig(d_state=4, n_groups=2, chunk_size=4), SoftmaxConfig())],
                         ids=["ssd", "ssd_softmax"])
def test_transformer_lm_builds_runs_and_differentiates(mixer):
  cfg = TransformerConfig(d_model=D_MODEL, n_layers=2, n_heads=N_HEADS, d_ff=32, max_len=16, mixer=mixer)
  lm = TransformerLM(cfg, rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.key(3), (2, 10), 0, 256)
  loss, grads = _loss_and_grad(lm, tokens)
  assert np.isfinite(float(loss))
  leaves = jax.tree_util.tree_leaves_with_path(nnx.state(grads, nnx.Param))
  assert all(np.all(np.isfinite(v)) for _, v in leaves)
  ssd_leaves = {sharding.path_str(p): v for p, v in leaves if "A_log" in sharding.path_str(p)}
  assert ssd_leaves and all(np.any(v != 0) for v in ssd_leaves.values())  # the SSM's A is trained


# ----------------------------------------------------------------------------------------
# (e) logical axes, layout and weight decay


EXPECTED_AXES = {
    "in_z/kernel": ("embed", "heads"), "in_x/kernel": ("embed", "heads"), "in_dt/kernel": ("embed", "heads"),
    "in_B/kernel": ("embed", "state"), "in_C/kernel": ("embed", "state"),
    "conv_x/taps": ("conv", "heads"), "conv_x/bias": ("heads",),
    "conv_B/taps": ("conv", "state"), "conv_B/bias": ("state",),
    "conv_C/taps": ("conv", "state"), "conv_C/bias": ("state",),
    "dt_bias": ("heads",), "A_log": ("heads",), "D": ("heads",), "norm": ("heads",),
    "out/kernel": ("heads", "embed"),
}
DECAYED = {"in_z/kernel", "in_x/kernel", "in_dt/kernel", "in_B/kernel", "in_C/kernel", "conv_x/taps",
           "conv_B/taps", "conv_C/taps", "out/kernel"}


def test_every_parameter_carries_logical_axes_and_only_matrices_decay():
  params = nnx.state(model("groups2_chunked"), nnx.Param)
  assert sharding.unannotated(params) == []
  axes = {sharding.path_str(p): a for p, a in jax.tree_util.tree_leaves_with_path(
      sharding.param_axes(params), is_leaf=lambda t: isinstance(t, tuple))}
  assert axes == EXPECTED_AXES
  mask = {sharding.path_str(p): v for p, v in jax.tree_util.tree_leaves_with_path(sharding.decay_mask(params))}
  assert {name for name, decays in mask.items() if decays} == DECAYED
  assert set(mask) == set(EXPECTED_AXES)


# ----------------------------------------------------------------------------------------
# initialisation and configuration


def test_initialisation_follows_mamba2():
  cfg = SSDConfig(d_state=4, dt_min=0.01, dt_max=0.05, a_init_range=(2.0, 3.0), d_conv=3)
  m = Mamba2(cfg, d_model=8, n_heads=2, n_layers=3, dtype="float32", rngs=nnx.Rngs(5))
  dt = np.logaddexp(0.0, np.asarray(m.dt_bias[...], np.float64))  # softplus(dt_bias) = Δ₀
  assert np.all((dt >= 0.01 * (1 - 1e-5)) & (dt <= 0.05 * (1 + 1e-5))), dt
  minus_A = np.exp(np.asarray(m.A_log[...]))
  assert np.all((minus_A >= 2.0 - 1e-5) & (minus_A <= 3.0 + 1e-5)), minus_A
  assert np.all(np.asarray(m.D[...]) == 1.0) and np.all(np.asarray(m.norm[...]) == 1.0)
  for conv in (m.conv_x, m.conv_B, m.conv_C):
    assert np.all(np.abs(np.asarray(conv.taps[...])) <= 1 / math.sqrt(3))
    assert np.all(np.abs(np.asarray(conv.bias[...])) <= 1 / math.sqrt(3))
    assert conv.taps.shape[0] == 3
  floored = Mamba2(SSDConfig(dt_min=1e-6, dt_max=2e-6, dt_init_floor=1e-3), d_model=8, n_heads=2, n_layers=1,
                   dtype="float32", rngs=nnx.Rngs(0))
  np.testing.assert_allclose(np.logaddexp(0.0, np.asarray(floored.dt_bias[...], np.float64)), 1e-3, rtol=1e-4)


def test_config_round_trips_and_is_registered():
  assert mixers.lookup("ssd") == (SSDConfig, Mamba2)
  cfg = SSDConfig(d_state=8, n_groups=2, a_init_range=(1.0, 4.0))
  values = cfg.to_dict()
  assert values["name"] == "ssd"
  values["a_init_range"] = list(values["a_init_range"])  # as a config file holds it
  assert mixers.MixerConfig.from_dict(values) == cfg
  assert SSDConfig(a_init_range=[1.0, 2.0]).a_init_range == (1.0, 2.0)


@pytest.mark.parametrize("kwargs,match", [
    ({"d_state": 0}, r"SSDConfig.d_state must be a positive integer, got 0"),
    ({"expand": 1.5}, r"SSDConfig.expand must be a positive integer"),
    ({"n_groups": 0}, r"SSDConfig.n_groups must be a positive integer"),
    ({"d_conv": 0}, r"SSDConfig.d_conv must be a positive integer"),
    ({"chunk_size": -1}, r"SSDConfig.chunk_size must be a positive integer"),
    ({"dt_min": 0.0}, r"SSDConfig.dt_min must be a finite positive number"),
    ({"dt_max": float("inf")}, r"SSDConfig.dt_max must be a finite positive number"),
    ({"dt_min": 0.2, "dt_max": 0.1}, r"SSDConfig.dt_min=0.2 must not exceed dt_max=0.1"),
    ({"dt_init_floor": -1e-4}, r"SSDConfig.dt_init_floor must be a finite number >= 0"),
    ({"a_init_range": (0.0, 1.0)}, r"SSDConfig.a_init_range must be a pair \(lo, hi\)"),
    ({"a_init_range": (4.0, 2.0)}, r"SSDConfig.a_init_range must be a pair"),
    ({"a_init_range": (1.0,)}, r"SSDConfig.a_init_range must be a pair"),
    ({"mode": "fast"}, r"SSDConfig.mode must be one of"),
    ({"norm_eps": 0.0}, r"SSDConfig.norm_eps must be a finite positive number"),
    ({"precision": "fp8"}, r"SSDConfig.precision must be one of"),
])
def test_config_rejects_bad_fields(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SSDConfig(**kwargs)


def test_heads_and_groups_must_fit():
  with pytest.raises(ValueError, match=r"n_heads=3 must divide d_inner = expand·d_model = 16"):
    SSDConfig(expand=1).state_floats(d_model=16, n_heads=3, seq_len=1)
  with pytest.raises(ValueError, match=r"SSDConfig.n_groups=3 must divide n_heads=4"):
    mixers.build(SSDConfig(n_groups=3), d_model=16, n_heads=4, n_layers=1, dtype="float32", rngs=nnx.Rngs(0))
