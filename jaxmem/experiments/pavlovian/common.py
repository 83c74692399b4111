"""Shared by the Pavlovian experiments: segment-wise memory writes with probing, published anchor
points, and the threshold / slope fits their tables report (``docs/papers/pavlovian.md``)."""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.kernels.assoc import associative_memory, init

PAPER = "pavlovian"

# Published points, Schlag, Irie & Schmidhuber 2021 synthetic experiments
# (docs/papers/pavlovian.md#schlag-et-al-2021); loss 0.5‖y − ŷ‖², one-hot y, key width 64 before φ.
# (setting, rule, feature map, n, loss, "up to n"). setting "distinct": n distinct keys; "overwrite":
# n unique keys in a longer stream, latest value wanted. The sum rule's overwrite point does not name
# its feature map; it is listed under both DPFP widths.
SCHLAG_2021 = (
    ("distinct", "hebb", "elu1", 40, 0.0, False),
    ("distinct", "hebb", "elu1", 60, 0.025, False),
    ("distinct", "hebb", "elu1", 80, 0.108, False),
    ("distinct", "hebb", "dpfp2", 240, 0.0, False),
    ("overwrite", "hebb", "dpfp1", 20, 0.097, False),
    ("overwrite", "hebb", "dpfp2", 20, 0.097, False),
    ("overwrite", "delta", "dpfp1", 100, 0.0, True),
    ("overwrite", "delta", "dpfp2", 200, 0.0, True),
)


def scan_segments(k_BTK, v_BTV, xs, probe: Callable, *, rule: str, seg: int, beta: float = 1.0,
                  decay: Optional[float] = None):
  """Writes the stream with the kernel, ``seg`` tokens per call, and probes each state.

  A ``lax.scan`` over ``T / seg`` segments; each step writes its segment with
  ``associative_memory(..., mode="chunked", initial_state=S, return_state=True)`` (one
  head) and returns ``probe(S [B, D_v, D_k], x)`` for that segment's slice ``x`` of ``xs``
  (leading axis = segment). Queries of the write call are the keys; its reads are unused.
  So the state after every segment is available without a Python loop over time.
  """
  B, T, K = k_BTK.shape
  V = v_BTV.shape[-1]
  n = T // seg
  split = lambda x: jnp.moveaxis(x.reshape((B, n, seg) + x.shape[2:]), 1, 0)[:, :, :, None]

  def body(S_BHVK, x):
    k_s, v_s, ex = x
    _, S_BHVK = associative_memory(k_s, k_s, v_s, jnp.full(k_s.shape[:3], beta, k_s.dtype), rule=rule,
                                   mode="chunked", chunk_size=seg, decay=decay, initial_state=S_BHVK,
                                   return_state=True)
    return S_BHVK, probe(S_BHVK[:, 0], ex)

  _, out = jax.lax.scan(body, init(B, 1, K, V, k_BTK.dtype), (split(k_BTK), split(v_BTV), xs))
  return out


def threshold_capacity(n, ok) -> tuple[int, bool]:
  """Largest probed ``n`` with ``ok`` at it and every smaller probed n; (n*, censored at n_max)."""
  ok = np.asarray(ok, bool)
  first_bad = int(np.argmin(ok)) if not ok.all() else len(ok)
  return (int(n[first_bad - 1]) if first_bad else 0), first_bad == len(ok)


def loglog_slope(d_ks, n_stars, censored=None) -> float:
  """Least-squares slope of ``log n*`` vs ``log d_k`` over the widths with ``n* > 0``, not censored."""
  censored = [False] * len(d_ks) if censored is None else censored
  pts = [(d, n) for d, n, c in zip(d_ks, n_stars, censored, strict=True) if n > 0 and not c]
  if len(pts) < 2:
    return float("nan")
  d, n = np.log(np.array(pts, float)).T
  return float(np.polyfit(d, n, 1)[0])


def linear_fit(x, y) -> tuple[float, float, float]:
  """Least squares ``y = a x + b``: (a, b, R²); R² = 1 for a constant y."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  a, b = np.polyfit(x, y, 1)
  ss = float(np.sum((y - y.mean()) ** 2))
  r2 = 1.0 - float(np.sum((y - (a * x + b)) ** 2)) / ss if ss > 0 else 1.0
  return float(a), float(b), r2


def log_slope_vs_heads(heads, errs) -> tuple[float, float, int]:
  """Slope of ``ln err`` on ``H`` over the heads with ``err > 0``: (slope, R², points used)."""
  pts = [(h, e) for h, e in zip(heads, errs, strict=True) if e > 0]
  if len(pts) < 2:
    return float("nan"), float("nan"), len(pts)
  h, e = np.array(pts, float).T
  a, _, r2 = linear_fit(h, np.log(e))
  return a, r2, len(pts)


__all__ = ["PAPER", "SCHLAG_2021", "linear_fit", "log_slope_vs_heads", "loglog_slope", "scan_segments",
           "threshold_capacity"]
