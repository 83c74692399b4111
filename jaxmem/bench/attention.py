"""``jaxmem bench attention``: our causal softmax attention vs jax.nn (and torch SDPA)."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.bench.timing import time_call, time_host
from jaxmem.results import markdown_table


def _torch_sdpa_timer(B, T, H, D, repeats) -> Optional[Callable]:
  try:
    import torch
  except ImportError:
    return None
  q = torch.randn(B, H, T, D)
  def run():
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
  def timed():
    with torch.no_grad():
      return time_host(run, repeats)
  return timed


QUICK_LENGTHS = (256, 1024)   # the sequence lengths of the quick run


def bench_attention(quick: bool = False, repeats: int = 5) -> str:
  """Causal softmax attention (ours) vs ``jax.nn.dot_product_attention`` (and torch SDPA)."""
  from jaxmem.kernels.attention import softmax_attention
  B, H, D = 1, 8, 64
  lengths = QUICK_LENGTHS if quick else (512, 2048, 4096)
  ours_f = jax.jit(lambda q, k, v: softmax_attention(q, k, v, causal=True))
  ref_f = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
  grad = lambda f: jax.jit(jax.grad(lambda q, k, v: f(q, k, v).sum(), argnums=(0, 1, 2)))
  ours_g, ref_g = grad(ours_f), grad(ref_f)
  rows = []
  for T in lengths:
    x = jax.random.normal(jax.random.key(T), (B, T, H, D), jnp.float32)
    tf_ours, tf_ref = time_call(ours_f, x, x, x, repeats=repeats), time_call(ref_f, x, x, x, repeats=repeats)
    tg_ours, tg_ref = time_call(ours_g, x, x, x, repeats=repeats), time_call(ref_g, x, x, x, repeats=repeats)
    torch_timer = _torch_sdpa_timer(B, T, H, D, repeats)
    t_torch = torch_timer() if torch_timer else float("nan")
    rows.append([T, f"{tf_ours * 1e3:.2f}", f"{tf_ref / tf_ours:.2f}×", f"{tg_ours * 1e3:.2f}",
                 f"{tg_ref / tg_ours:.2f}×",
                 "n/a (pip install 'jaxmem[bench]')" if np.isnan(t_torch) else f"{t_torch / tf_ours:.2f}×"])
  head = ["T", "ours fwd ms", "jax.nn fwd / ours", "ours fwd+bwd ms", "jax.nn fwd+bwd / ours",
          "torch SDPA fwd / ours"]
  return (f"### attention: causal softmax, B={B}, H={H}, D={D}, float32, "
          f"{jax.devices()[0].platform}\n\n" + markdown_table(head, rows) +
          "\n\nRatios > 1 mean ours is faster.\n")
