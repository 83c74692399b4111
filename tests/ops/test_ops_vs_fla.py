"""``jaxmem.ops`` against fla-core 0.6.0's own PyTorch references (``fla/ops/*/naive.py``), only when the
``bench`` extra is installed (``pip install -e '.[bench]'``): values, final states and gradients (torch autograd
through the naive loops) w.r.t. every input and the initial state, on T = 37 (not a multiple of fla's chunk 64),
K = 12, V = 9. fla's naive loops have no grouped value heads: the op runs with H = 1 key head for HV = 2 value
heads and the reference with that key head repeated."""

import numpy as np
import pytest

import jaxmem.ops as ops
from jaxmem.bench.assoc import load_fla_naive

B, T, H, HV, K, V = 2, 37, 1, 2, 12, 9


def naive(family):
  module = load_fla_naive(family)
  if module is None:
    pytest.skip("fla-core / torch not installed (pip install -e '.[bench]')")
  return module


def inputs():
  r = np.random.default_rng(3)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = r.normal(size=(B, T, H, K))
  k = unit(r.normal(size=(B, T, H, K)))
  v = r.normal(size=(B, T, HV, V))
  g = np.log(r.uniform(0.5, 1.0, (B, T, HV)))
  beta = r.uniform(0.1, 0.9, (B, T, HV))
  h0 = 0.5 * r.normal(size=(B, HV, K, V))
  cot_o, cot_h = r.normal(size=(B, T, HV, V)), r.normal(size=(B, HV, K, V))
  return [np.asarray(x, np.float32) for x in (q, k, v, g, beta, h0, cot_o, cot_h)]


def torch_grads(fn, xs, cot_o, cot_h):
  """fla's reference on float32 torch leaves: ``(o, h_T, grads)`` of ``<cot_o, o> + <cot_h, h_T>``."""
  import torch
  leaves = [torch.tensor(x, requires_grad=True) for x in xs]
  o, h = fn(*leaves)
  (o * torch.tensor(cot_o)).sum().add((h * torch.tensor(cot_h)).sum()).backward()
  return o.detach().numpy(), h.detach().numpy(), [x.grad.numpy() for x in leaves]


def jax_grads(fn, xs, cot_o, cot_h):
  import jax
  (o, h), pullback = jax.vjp(fn, *xs)
  return np.asarray(o), np.asarray(h), [np.asarray(x) for x in pullback((cot_o, cot_h))]


def repeat_heads(x):
  import torch
  return torch.repeat_interleave(x, HV // H, dim=2)


def compare(got, want, names):
  o, h, grads = got
  ro, rh, rgrads = want
  # fla's loops and ours round differently in float32: values of order 1 after 37 tokens
  np.testing.assert_allclose(o, ro, rtol=1e-4, atol=5e-5)
  np.testing.assert_allclose(h, rh, rtol=1e-4, atol=5e-5)
  for name, a, b in zip(names, grads, rgrads, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4, err_msg=f"d/d{name}")


@pytest.mark.parametrize("op", [ops.chunk_gated_delta_rule, ops.fused_recurrent_gated_delta_rule])
@pytest.mark.parametrize("reference", ["naive_recurrent_gated_delta_rule", "naive_chunk_gated_delta_rule"])
def test_gated_delta_rule_equals_fla_naive(op, reference):
  module = naive("gated_delta_rule")
  q, k, v, g, beta, h0, cot_o, cot_h = inputs()
  if reference == "naive_recurrent_gated_delta_rule":
    ref = lambda q, k, v, g, beta, h0: module.naive_recurrent_gated_delta_rule(
        repeat_heads(q), repeat_heads(k), v, beta, g, initial_state=h0, output_final_state=True)
  else:
    ref = lambda q, k, v, g, beta, h0: module.naive_chunk_gated_delta_rule(
        repeat_heads(q), repeat_heads(k), v, g, beta, initial_state=h0, output_final_state=True)
  ours = lambda q, k, v, g, beta, h0: op(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True)
  xs = (q, k, v, g, beta, h0)
  compare(jax_grads(ours, xs, cot_o, cot_h), torch_grads(ref, xs, cot_o, cot_h), "q k v g beta h0".split())


@pytest.mark.parametrize("op", [ops.chunk_delta_rule, ops.fused_recurrent_delta_rule])
def test_delta_rule_equals_fla_naive(op):
  module = naive("delta_rule")
  q, k, v, _, beta, h0, cot_o, cot_h = inputs()
  t = lambda x: x.transpose(1, 2)  # its loop is [B, H, T, D]
  def ref(q, k, v, beta, h0):
    o, h = module.delta_rule_recurrence(t(repeat_heads(q)), t(repeat_heads(k)), t(v), t(beta), initial_state=h0)
    return t(o), h
  ours = lambda q, k, v, beta, h0: op(q, k, v, beta, initial_state=h0, output_final_state=True)
  xs = (q, k, v, beta, h0)
  compare(jax_grads(ours, xs, cot_o, cot_h), torch_grads(ref, xs, cot_o, cot_h), "q k v beta h0".split())


@pytest.mark.parametrize("op", [ops.chunk_simple_gla, ops.fused_recurrent_simple_gla])
def test_simple_gla_equals_fla_naive(op):
  module = naive("simple_gla")
  q, k, v, g, _, h0, cot_o, cot_h = inputs()
  q, k = (np.repeat(x, HV, axis=2) for x in (q, k))  # fla's simple_gla has H value heads
  ref = lambda q, k, v, g, h0: module.naive_recurrent_simple_gla(q, k, v, g, initial_state=h0)
  ours = lambda q, k, v, g, h0: op(q, k, v, g=g, initial_state=h0, output_final_state=True)
  xs = (q, k, v, g, h0)
  compare(jax_grads(ours, xs, cot_o, cot_h), torch_grads(ref, xs, cot_o, cot_h), "q k v g h0".split())


@pytest.mark.parametrize("op", [ops.chunk_linear_attn, ops.fused_recurrent_linear_attn])
def test_linear_attn_equals_fla_naive(op):
  module = naive("linear_attn")
  q, k, v, _, _, h0, cot_o, cot_h = inputs()
  q, k = (np.repeat(x, HV, axis=2) for x in (q, k))
  ref = lambda q, k, v, h0: module.naive_recurrent_linear_attn(q, k, v, initial_state=h0,
                                                               output_final_state=True)
  ours = lambda q, k, v, h0: op(q, k, v, initial_state=h0, output_final_state=True, normalize=False)
  xs = (q, k, v, h0)
  compare(jax_grads(ours, xs, cot_o, cot_h), torch_grads(ref, xs, cot_o, cot_h), "q k v h0".split())


@pytest.mark.parametrize("op", [ops.chunk_linear_attn, ops.fused_recurrent_linear_attn])
def test_normalized_linear_attn_equals_fla_naive(op):
  # positive features (|q|, |k|): fla's normaliser q · (z_0 + Σ k) stays away from 0; the state is the pair
  # (h, z)
  module = naive("linear_attn")
  q, k, v, _, _, h0, cot_o, cot_h = inputs()
  q, k = (np.abs(np.repeat(x, HV, axis=2)) for x in (q, k))
  z0 = np.abs(h0[..., 0])[:, None]  # [B, 1, H, K]
  cot_z = np.ones_like(z0)

  ref = lambda q, k, v, h0, z0: module.naive_recurrent_linear_attn(q, k, v, initial_state=(h0, z0),
                                                                   output_final_state=True, normalize=True)
  ours = lambda q, k, v, h0, z0: op(q, k, v, initial_state=(h0, z0), output_final_state=True, normalize=True)
  xs = (q, k, v, h0, z0)
  import jax
  import torch
  (o, (h, z)), pullback = jax.vjp(ours, *xs)
  grads = pullback((cot_o, (cot_h, cot_z)))
  leaves = [torch.tensor(x, requires_grad=True) for x in xs]
  ro, (rh, rz) = ref(*leaves)
  loss = sum((x * torch.tensor(c)).sum() for x, c in ((ro, cot_o), (rh, cot_h), (rz, cot_z)))
  loss.backward()
  np.testing.assert_allclose(o, ro.detach().numpy(), rtol=1e-4, atol=5e-5)
  np.testing.assert_allclose(h, rh.detach().numpy(), rtol=1e-4, atol=5e-5)
  np.testing.assert_allclose(z, rz.detach().numpy(), rtol=1e-5, atol=1e-5)
  for name, a, b in zip("q k v h0 z0".split(), grads, leaves, strict=True):
    np.testing.assert_allclose(a, b.grad.numpy(), rtol=1e-4, atol=1e-4, err_msg=f"d/d{name}")
