"""The theorem as a test: causal attention == the read of a write-once (stateless) DNC memory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_cross_attention


def rand(key, shape):
  return jax.random.normal(jax.random.key(key), shape)


@pytest.mark.parametrize("B,T,H,D,E", [(2, 7, 3, 5, 5), (1, 13, 4, 6, 9), (1, 1, 2, 3, 3)])
def test_attention_is_sdnc_read_values_and_gradients(B, T, H, D, E):
  q, k, v = rand(0, (B, T, H, D)), rand(1, (B, T, H, D)), rand(2, (B, T, H, E))
  cot = rand(3, (B, T, H, E))
  f_sdnc = lambda q, k, v: jnp.sum(sdnc_attention(q, k, v) * cot)
  f_attn = lambda q, k, v: jnp.sum(softmax_attention(q, k, v, causal=True) * cot)
  np.testing.assert_allclose(sdnc_attention(q, k, v), softmax_attention(q, k, v), rtol=1e-5, atol=1e-6)
  g_s = jax.grad(f_sdnc, argnums=(0, 1, 2))(q, k, v)
  g_a = jax.grad(f_attn, argnums=(0, 1, 2))(q, k, v)
  for name, a, b in zip("qkv", g_s, g_a, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"d/d{name}")


def test_read_weights_are_attention_weights_and_ignore_unwritten_slots():
  q, k, v = rand(0, (1, 6, 2, 4)), rand(1, (1, 6, 2, 4)), rand(2, (1, 6, 2, 4))
  _, w = sdnc_attention(q, k, v, scale=0.7, return_weights=True)  # [B, H, T, T]
  logits = jnp.einsum("bthd,bshd->bhts", q, k) * 0.7
  mask = jnp.tril(jnp.ones((6, 6), bool))
  ref = jax.nn.softmax(jnp.where(mask, logits, -jnp.inf), axis=-1)
  np.testing.assert_allclose(w, ref, rtol=1e-5, atol=1e-7)
  assert np.all(np.asarray(w)[..., ~np.asarray(mask)] == 0.0)


@pytest.mark.parametrize("T,S", [(5, 9), (8, 3)])
def test_cross_attention_is_a_fixed_encoder_memory(T, S):
  q, k, v = rand(0, (2, T, 3, 6)), rand(1, (2, S, 3, 6)), rand(2, (2, S, 3, 4))
  cot = rand(3, (2, T, 3, 4))
  np.testing.assert_allclose(sdnc_cross_attention(q, k, v),
                             softmax_attention(q, k, v, causal=False), rtol=1e-5, atol=1e-6)
  g1 = jax.grad(lambda q, k, v: jnp.sum(sdnc_cross_attention(q, k, v) * cot), (0, 1, 2))(q, k, v)
  g2 = jax.grad(lambda q, k, v: jnp.sum(softmax_attention(q, k, v, causal=False) * cot),
                (0, 1, 2))(q, k, v)
  for a, b in zip(g1, g2, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_bad_input_raises():
  x = jnp.zeros((1, 5, 2, 4))
  with pytest.raises(ValueError, match="writes one slot per query"):
    sdnc_attention(x, jnp.zeros((1, 6, 2, 4)), jnp.zeros((1, 6, 2, 4)))
  with pytest.raises(ValueError, match="read heads"):
    sdnc_attention(x, jnp.zeros((1, 5, 3, 4)), jnp.zeros((1, 5, 3, 4)))
  with pytest.raises(ValueError, match="`q` must have rank 4"):
    sdnc_cross_attention(x[0], x, x)


# ---- hybrids: parallel form == literal memory scan (presence, erase, DNC link matrix) ----

from jaxmem.kernels.sdnc import sdnc_hybrid_attention, sdnc_hybrid_memory  # noqa: E402

HB = dict(B=2, T=9, H=3, D=5, E=4)


def _hybrid_inputs(seed=0):
  B, T, H, D, E = HB.values()
  return (rand(seed, (B, T, H, D)), rand(seed + 1, (B, T, H, D)), rand(seed + 2, (B, T, H, E)),
          {"write_gate": rand(seed + 3, (B, T, H)), "erase_gate": rand(seed + 4, (B, T, H)) + 1.0,
           "read_modes": rand(seed + 5, (B, T, H, 3))})


@pytest.mark.parametrize("ops", [(), ("write_gate",), ("erase_gate",), ("read_modes",),
                                 ("write_gate", "erase_gate", "read_modes")])
def test_hybrid_parallel_equals_memory_scan_values_and_gradients(ops):
  q, k, v, gates = _hybrid_inputs()
  kw = {name: gates[name] for name in ops}
  cot = rand(9, v.shape[:3] + (v.shape[-1],))
  np.testing.assert_allclose(sdnc_hybrid_attention(q, k, v, **kw), sdnc_hybrid_memory(q, k, v, **kw),
                             rtol=1e-5, atol=1e-6)
  def loss(fn):
    return lambda q, k, v, kw: jnp.sum(fn(q, k, v, **kw) * cot)
  g_par = jax.grad(loss(sdnc_hybrid_attention), argnums=(0, 1, 2, 3))(q, k, v, kw)
  g_mem = jax.grad(loss(sdnc_hybrid_memory), argnums=(0, 1, 2, 3))(q, k, v, kw)
  for a, b in zip(jax.tree.leaves(g_par), jax.tree.leaves(g_mem), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_hybrid_with_everything_off_is_softmax_attention_exactly():
  q, k, v, _ = _hybrid_inputs(1)
  np.testing.assert_array_equal(sdnc_hybrid_attention(q, k, v), softmax_attention(q, k, v))


def test_hybrid_at_neutral_gate_values_is_softmax_attention():
  q, k, v, gates = _hybrid_inputs(2)
  neutral = {"write_gate": jnp.full_like(gates["write_gate"], 1e4),
             "erase_gate": jnp.full_like(gates["erase_gate"], 1e4),
             "read_modes": jnp.broadcast_to(jnp.array([-1e4, 1e4, -1e4]), gates["read_modes"].shape)}
  np.testing.assert_allclose(sdnc_hybrid_attention(q, k, v, **neutral), softmax_attention(q, k, v),
                             rtol=1e-6, atol=1e-7)


def test_forward_mode_reads_the_successor_of_the_attended_slot():
  T, D = 6, 8
  keys = jnp.eye(T, D)[None, :, None, :] * 20.0  # orthogonal, sharp addressing
  v = rand(3, (1, T, 1, 4))
  q = jnp.broadcast_to(keys[:, 2:3], keys.shape)  # every step attends slot 2 (once written)
  fwd = jnp.broadcast_to(jnp.array([-1e4, -1e4, 1e4]), (1, T, 1, 3))
  out = sdnc_hybrid_attention(q, keys, v, read_modes=fwd, scale=1.0)
  np.testing.assert_allclose(out[0, 4:, 0], jnp.broadcast_to(v[0, 3, 0], (2, 4)), atol=1e-4)
  back = jnp.broadcast_to(jnp.array([1e4, -1e4, -1e4]), (1, T, 1, 3))
  out = sdnc_hybrid_attention(q, keys, v, read_modes=back, scale=1.0)
  np.testing.assert_allclose(out[0, 4:, 0], jnp.broadcast_to(v[0, 1, 0], (2, 4)), atol=1e-4)


def test_erase_forgets_old_slots_and_write_gate_hides_slots():
  T = 5
  q = jnp.zeros((1, T, 1, 3))  # uniform content weights over written slots
  k = jnp.zeros((1, T, 1, 3))
  v = jnp.arange(T, dtype=jnp.float32).reshape(1, T, 1, 1)
  erase_all = jnp.full((1, T, 1), -1e4)  # f_t = 0: only the newest slot survives
  out = sdnc_hybrid_attention(q, k, v, erase_gate=erase_all)
  np.testing.assert_allclose(out[0, :, 0, 0], jnp.arange(T), atol=1e-5)
  hide_odd = jnp.where(jnp.arange(T) % 2 == 1, -1e4, 1e4).reshape(1, T, 1)
  out = sdnc_hybrid_attention(q, k, v, write_gate=hide_odd)
  np.testing.assert_allclose(out[0, 4, 0, 0], (0 + 2 + 4) / 3, atol=1e-5)


def test_hybrid_bad_gate_shapes_raise():
  q, k, v, gates = _hybrid_inputs()
  with pytest.raises(ValueError, match=r"`erase_gate` must have shape \[2, 9, 3\]"):
    sdnc_hybrid_attention(q, k, v, erase_gate=gates["erase_gate"][:, :5])
  with pytest.raises(ValueError, match=r"`read_modes` must have shape \[2, 9, 3, 3\]"):
    sdnc_hybrid_attention(q, k, v, read_modes=gates["read_modes"][..., :2])


def test_hybrid_erase_keeps_float32_accuracy_on_long_sequences_and_at_zero_retention():
  # retention f_t = σ(z_t) compounded over T = 4096 steps: the decay of slot s at step t is
  # a segment sum of log f, not the difference of two cumulative sums (2e-4 error before)
  from jaxmem.kernels.sdnc import sdnc_hybrid_attention
  T, D = 4096, 4
  r = np.random.default_rng(0)
  q, k, v = (jnp.asarray(r.normal(size=(1, T, 1, D)), jnp.float32) for _ in range(3))
  z = r.normal(size=(1, T, 1)) + 2.0  # retention ≈ 0.88 on average
  out = np.asarray(sdnc_hybrid_attention(q, k, v, erase_gate=jnp.asarray(z, jnp.float32)))[0, :, 0]
  # float64 reference: w_t[s] ∝ exp(q_t·k_s / √D + Σ_{s<τ≤t} log σ(z_τ))
  qn, kn, vn = (np.asarray(x, np.float64)[0, :, 0] for x in (q, k, v))
  logf = -np.logaddexp(0.0, -z[0, :, 0])
  c = np.cumsum(logf)  # exact enough in float64 for the reference
  logits = qn @ kn.T / np.sqrt(D) + (c[:, None] - c[None, :])
  logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  ref = (w / w.sum(-1, keepdims=True)) @ vn
  assert np.abs(out - ref).max() < 2e-5, np.abs(out - ref).max()
  # retention exactly 0 (σ(−200) underflows; log σ stays finite): each step reads its own slot
  z0 = jnp.full((1, 8, 1), -200.0)
  q8, k8, v8 = q[:, :8], k[:, :8], v[:, :8]
  f = lambda q, k, v, z: jnp.sum(sdnc_hybrid_attention(q, k, v, erase_gate=z))
  np.testing.assert_allclose(sdnc_hybrid_attention(q8, k8, v8, erase_gate=z0), v8, rtol=1e-6, atol=1e-6)
  for g in jax.grad(f, argnums=(0, 1, 2, 3))(q8, k8, v8, z0):
    assert np.isfinite(np.asarray(g)).all()
