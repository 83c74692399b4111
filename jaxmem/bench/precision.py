"""``jaxmem bench precision``: what each matmul precision costs the memory kernels in accuracy.

For every rule × execution form of :func:`jaxmem.kernels.assoc.associative_memory`, the max
abs error of the output against a float64 loop over tokens, at float32 operands
(``"highest"``, the kernels' default) and at the precisions a platform's default gives,
emulated on CPU by :func:`jaxmem.kernels.precision.emulate_matmul_precision`: TF32 (an
Ampere+ GPU at ``"default"``), bfloat16 (a TPU at ``"default"``) and bfloat16×3 (a TPU at
``"high"``). Inputs: ``B = 1, H = 1, D_k = D_v = 16``, unit keys and values, β ∈ (0.1, 1.5),
γ ∈ (0.6, 1), zero initial state. Not a timing: the table is the same on any machine.
"""

from __future__ import annotations

import numpy as np

from jaxmem.results import markdown_table


def reference_loop(q, k, v, beta, decay, rule):
  """float64 loop over tokens of ``rule`` (heads vectorised); ``[B, T, H, ·]`` -> ``o``."""
  q, k, v, beta = (np.asarray(x, np.float64) for x in (q, k, v, beta))
  decay = np.ones(beta.shape) if decay is None else np.asarray(decay, np.float64)
  B, T, H, Dk = q.shape
  S = np.zeros((B, H, v.shape[-1], Dk))
  out = np.zeros((B, T, H, v.shape[-1]))
  for t in range(T):
    kt, vt, qt = k[:, t], v[:, t], q[:, t]
    b, g = beta[:, t, :, None, None], decay[:, t, :, None, None]
    Sk = np.einsum("bhvk,bhk->bhv", S, kt)[..., None]
    if rule == "hebb":
      S = S + b * vt[..., None] * kt[..., None, :]
    elif rule == "delta":
      S = S + b * (vt[..., None] - Sk) * kt[..., None, :]
    elif rule == "oja":
      S = S + b * vt[..., None] * (kt - np.einsum("bhv,bhvk->bhk", vt, S))[..., None, :]
    elif rule == "decay":
      S = g * S + b * vt[..., None] * kt[..., None, :]
    elif rule == "gated_oja":
      S = g * S
      S = S + b * vt[..., None] * (kt - np.einsum("bhv,bhvk->bhk", vt, S))[..., None, :]
    else:
      S = g * S + b * (vt[..., None] - g * Sk) * kt[..., None, :]
    out[:, t] = np.einsum("bhvk,bhk->bhv", S, qt)
  return out


def _inputs(T, D, seed=0):
  r = np.random.default_rng(seed)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q = r.normal(size=(1, T, 1, D))
  k = unit(r.normal(size=(1, T, 1, D)))
  v = unit(r.normal(size=(1, T, 1, D)))
  beta = r.uniform(0.1, 1.5, size=(1, T, 1))
  decay = r.uniform(0.6, 1.0, size=(1, T, 1))
  return q, k, v, beta, decay


SETTINGS = (  # (column, kernel precision, emulated platform default or None)
    ("highest (float32)", "highest", None),
    ("TF32 (GPU default)", "default", "tensorfloat32"),
    ("bf16×3 (TPU high)", "high", "bfloat16"),
    ("bf16 (TPU default)", "default", "bfloat16"),
)


def precision_table(T: int = 2048, D: int = 16, chunk_size: int = 64):
  """Rows ``[rule, mode, err per setting...]`` (max abs error vs the float64 loop)."""
  import jax.numpy as jnp

  from jaxmem.kernels.assoc import DECAY_RULES, OJA_RULES, RULES, associative_memory
  from jaxmem.kernels.precision import emulate_matmul_precision

  q, k, v, beta, decay = _inputs(T, D)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  rows = []
  for rule in RULES:
    d = decay if rule in DECAY_RULES else None
    ref = reference_loop(q, k, v, beta, d, rule)
    for mode in ("recurrent", "chunked") + (() if rule in OJA_RULES else ("parallel",)):
      errs = []
      for _, precision, platform in SETTINGS:
        def run():
          return np.asarray(associative_memory(
              f32(q), f32(k), f32(v), f32(beta), rule=rule, mode=mode, chunk_size=chunk_size,
              decay=None if d is None else f32(d), precision=precision))
        if platform is None:
          o = run()
        else:
          with emulate_matmul_precision(platform):
            o = run()
        errs.append(float(np.abs(o - ref).max()))
      rows.append([rule, mode] + errs)
  return rows


def bench_precision(quick: bool = False, repeats: int = 5) -> str:
  del repeats
  T, D = (512, 16) if quick else (2048, 16)
  rows = precision_table(T, D)
  body = [[r[0], r[1]] + [f"{e:.1e}" for e in r[2:]] for r in rows]
  return (f"### precision: max abs error vs a float64 loop, T={T}, D_k=D_v={D}, chunk 64 "
          f"(reduced precisions emulated on CPU)\n\n"
          + markdown_table(["rule", "mode"] + [s[0] for s in SETTINGS], body) + "\n")
