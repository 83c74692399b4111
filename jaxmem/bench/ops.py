"""``jaxmem bench ops``: fla's op names (:mod:`jaxmem.ops`) timed against jaxmem's own kernel and against the
JAX peers that run on this machine, in one process, on the same inputs.

Inputs (:func:`random_inputs`): fla's layouts, ``B = 1, H = 4, K = V = 64``, float32; ``q`` standard
normal, ``k`` L2-normalised, ``v`` standard normal, ``β = σ(normal)``, the log decay ``g = log σ(normal + 3)``,
an initial state ``h0 [B, H, K, V]`` of scale 0.1, and fixed random cotangents for the output and the final
state. Every timed function takes ``(q, k, v, g, beta, h0)`` and returns ``(o [B, T, H, V], final state
[B, H, K, V])``; forward+backward is the gradient of ``Σ o·do + Σ S·dS`` with respect to ``q, k, v`` and the
gates the rule reads. Two functions compared are timed in turns (:func:`_alternate`), so that a change of
load on a shared machine reaches both alike, and each time is the fastest of its rounds after compilation (not
the median of :func:`jaxmem.bench.timing.time_call`): other processes' load and the first calls' costs only
add time, and on a shared 2-core machine they can last for several calls.

1. **Wrapper cost.** Each op under ``jax.jit`` against the same computation written directly on
   :func:`jaxmem.kernels.assoc.associative_memory` (``q`` multiplied by ``K ** -0.5``, the state transposed
   in and out, chunk 64): the ratio op / kernel, forward and forward+backward, and the largest difference
   between the two over the output, the final state and the gradients.
2. **Varlen with a state per sequence.** ``chunk_gated_delta_rule`` on one packed row (``cu_seqlens``) of a
   skewed batch (many short sequences and a long one) and a uniform one, without states (the packed call) and
   with an initial state per sequence and the final states returned, forward and forward+backward; the lengths
   are concrete (as an eager call or ``cu_seqlens_cpu`` gives them), the best case of any layout that measures
   them.
3. **Peers.** Each peer function (:data:`PEERS`) is first run on the inputs of its row and compared with the
   jaxmem op it computes (output and final state); it is timed, next to that op, only where the two agree
   (largest difference at most :data:`AGREE_REL` of the largest magnitude). A row whose peer fails or
   disagrees says so and why; the other rows still run. A peer that is not installed, or does not import,
   is listed in the closing note with the reason, as are the candidates that cannot run here at all.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import time
import traceback
import warnings
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jaxmem.results import markdown_table

B, H, K = 1, 4, 64
CHUNK = 64
AGREE_REL = 1e-3  # outputs agree when max |Δ| <= AGREE_REL · max |output|

# op name -> (associative_memory rule, its mode, the gates the op reads)
OPS = {
    "chunk_gated_delta_rule": ("gated_delta", "chunked", ("g", "beta")),
    "fused_recurrent_gated_delta_rule": ("gated_delta", "recurrent", ("g", "beta")),
    "chunk_delta_rule": ("delta", "chunked", ("beta",)),
    "fused_recurrent_delta_rule": ("delta", "recurrent", ("beta",)),
    "chunk_simple_gla": ("decay", "chunked", ("g",)),
    "fused_recurrent_simple_gla": ("decay", "recurrent", ("g",)),
    "chunk_linear_attn": ("hebb", "chunked", ()),
    "fused_recurrent_linear_attn": ("hebb", "recurrent", ()),
}
QUICK_OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "chunk_delta_rule",
             "chunk_simple_gla", "chunk_linear_attn")
GATES = ("g", "beta")  # their positions after (q, k, v) in every timed function


def lengths(quick: bool) -> tuple:
  """The sequence lengths of the wrapper table."""
  return (256, 1024) if quick else (512, 2048, 8192)


def peer_lengths(quick: bool) -> tuple:
  """The sequence lengths of the peer table."""
  return (1024,) if quick else (512, 2048, 8192)


def random_inputs(B: int, T: int, H: int, K: int, V: Optional[int] = None) -> dict:
  """Benchmark inputs in fla's layouts, float32, seeded by ``(T, K)`` (see the module docstring):
  ``q, k [B, T, H, K]``, ``v [B, T, H, V]``, ``g, beta [B, T, H]``, ``h0 [B, H, K, V]`` and the cotangents
  ``do [B, T, H, V]``, ``dS [B, H, K, V]``."""
  V = K if V is None else V
  for name, n in (("B", B), ("T", T), ("H", H), ("K", K), ("V", V)):
    if not isinstance(n, (int, np.integer)) or n < 1:
      raise ValueError(f"{name} must be a positive integer, got {n!r}.")
  keys = jax.random.split(jax.random.key(1000 * int(K) + int(T)), 8)
  normal = lambda i, shape: jax.random.normal(keys[i], shape, jnp.float32)
  k_BTHK = normal(1, (B, T, H, K))
  return {
      "q": normal(0, (B, T, H, K)),
      "k": k_BTHK / jnp.linalg.norm(k_BTHK, axis=-1, keepdims=True),
      "v": normal(2, (B, T, H, V)),
      "g": jax.nn.log_sigmoid(normal(3, (B, T, H)) + 3.0),
      "beta": jax.nn.sigmoid(normal(4, (B, T, H))),
      "h0": 0.1 * normal(5, (B, H, K, V)),
      "do": normal(6, (B, T, H, V)),
      "dS": normal(7, (B, H, K, V)),
  }


def _args(x: dict) -> tuple:
  return x["q"], x["k"], x["v"], x["g"], x["beta"], x["h0"]


def _grad_args(x: dict) -> tuple:
  return _args(x) + (x["do"], x["dS"])


def op_forward(name: str) -> Callable:
  """The fla-named op ``name`` as ``(q, k, v, g, beta, h0) -> (o, final state)``."""
  if name not in OPS:
    raise ValueError(f"unknown op {name!r}; known: {sorted(OPS)}.")
  from jaxmem import ops
  op, (rule, _, gates) = getattr(ops, name), OPS[name]
  extra = {"normalize": False} if rule == "hebb" else {}

  def forward(q, k, v, g, beta, h0):
    gate_kw = {n: x for n, x in zip(GATES, (g, beta), strict=True) if n in gates}
    return op(q, k, v, **gate_kw, initial_state=h0, output_final_state=True, **extra)
  return forward


def kernel_forward(name: str) -> Callable:
  """The computation of op ``name`` written directly on :func:`associative_memory`: ``q`` scaled by
  ``K ** -0.5`` and the state transposed in (fla's ``[K, V]`` to jaxmem's ``[V, K]``) and out."""
  if name not in OPS:
    raise ValueError(f"unknown op {name!r}; known: {sorted(OPS)}.")
  from jaxmem.kernels.assoc import associative_memory
  rule, mode, gates = OPS[name]

  def forward(q, k, v, g, beta, h0):
    o, S = associative_memory(q * q.shape[-1] ** -0.5, k, v, beta if "beta" in gates else None, rule=rule,
                              mode=mode, chunk_size=CHUNK, log_decay=g if "g" in gates else None,
                              initial_state=jnp.swapaxes(h0, -1, -2), return_state=True)
    return o, jnp.swapaxes(S, -1, -2)
  return forward


def fwd_bwd(forward: Callable, gates: tuple) -> Callable:
  """jit of the gradient of ``Σ o·do + Σ S·dS`` w.r.t. ``q, k, v`` and ``gates``; arguments
  ``(q, k, v, g, beta, h0, do, dS)``."""
  def loss(q, k, v, g, beta, h0, do, dS):
    o, S = forward(q, k, v, g, beta, h0)
    return jnp.vdot(o, do) + jnp.vdot(S, dS)
  argnums = (0, 1, 2) + tuple(3 + GATES.index(n) for n in gates)
  return jax.jit(jax.grad(loss, argnums=argnums))


def _max_diff(a, b) -> float:
  """Largest absolute difference between two pytrees of arrays of the same structure."""
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  if len(la) != len(lb):
    raise ValueError(f"the two results have {len(la)} and {len(lb)} arrays.")
  as64 = lambda x: np.asarray(x, np.float64)
  return max(float(np.max(np.abs(as64(x) - as64(y)))) for x, y in zip(la, lb, strict=True))


def _max_abs(a) -> float:
  return max(float(np.max(np.abs(np.asarray(x)))) for x in jax.tree_util.tree_leaves(a))


def _ms(seconds: float) -> str:
  ms = seconds * 1e3
  return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def _error(e: BaseException, package: Optional[str] = None) -> str:
  """One table cell naming an exception: its type, the first line of its message and, given ``package``, the
  innermost line of that package it passed through (no newlines or pipes, which would break the table)."""
  first = str(e).strip().split("\n")[0]
  text = f"{type(e).__name__}: {first}" if first else type(e).__name__
  if len(text) > 160:
    text = text[:157] + "..."
  if package:
    paths = [(f.filename.replace("\\", "/"), f.lineno) for f in traceback.extract_tb(e.__traceback__)]
    frames = [(path, line) for path, line in paths if f"/{package}/" in path]
    if frames:
      path, line = frames[-1]
      text += f" (at {path[path.rindex(f'/{package}/') + 1:]}:{line})"
  return " ".join(text.split()).replace("|", "/")


def _geomean(xs) -> float:
  return math.exp(sum(math.log(x) for x in xs) / len(xs))


_BUDGET_S = 10.0  # about this many seconds of timed rounds for a set of calls too slow for every round


def _alternate(calls, repeats: int, budget_s: float = _BUDGET_S, warmup: bool = True) -> list:
  """The fastest wall seconds of each zero-argument call (each blocks until its result is ready), timed in
  turns.

  Each call runs once untimed (compilation; ``warmup=False`` when they have run already), then the calls run in
  turn, ``repeats`` rounds, so that a change of load on a shared machine reaches all of them alike; each call's
  time is the fastest of its rounds, because other processes' load and first-use costs (fresh memory) only
  add time. Rounds stop early once as many as fit in ``budget_s`` at the fastest round's pace have run (at
  least one).
  """
  if repeats < 1:
    raise ValueError(f"repeats must be at least 1, got {repeats}.")
  for call in calls if warmup else ():
    call()
  times, fastest = [[] for _ in calls], math.inf
  for r in range(1, repeats + 1):
    start = time.perf_counter()
    for i, call in enumerate(calls):
      t0 = time.perf_counter()
      call()
      times[i].append(time.perf_counter() - t0)
    fastest = min(fastest, time.perf_counter() - start)
    if r >= budget_s / max(fastest, 1e-9):
      break
  return [min(t) for t in times]


def _blocking(fn, args):
  return lambda: jax.block_until_ready(fn(*args))


class _Jaxmem:
  """The jitted forward and forward+backward of each op (compiled once per shape) and the inputs per size."""

  def __init__(self):
    self.fwd, self.grad, self.inputs = {}, {}, {}

  def functions(self, name):
    if name not in self.fwd:
      self.fwd[name] = jax.jit(op_forward(name))
      self.grad[name] = fwd_bwd(op_forward(name), OPS[name][2])
    return self.fwd[name], self.grad[name]

  def x(self, T, width=None):
    """The inputs at length ``T`` and head width ``width`` (``K`` when None), made once."""
    width = K if width is None else width
    if (T, width) not in self.inputs:
      self.inputs[T, width] = random_inputs(B, T, H, width)
    return self.inputs[T, width]


def varlen_batches(quick: bool) -> tuple:
  """``(name, lengths)`` of the varlen table's packed rows: a skewed batch (many short sequences and one long)
  and a uniform one, ``T = 4096`` (1024 with ``quick``)."""
  if quick:
    return (("skewed", (16,) * 31 + (528,)), ("uniform", (128,) * 8))
  return (("skewed", (32,) * 63 + (2080,)), ("uniform", (256,) * 16))


VARLEN_OP = "chunk_gated_delta_rule"


def _varlen_functions(cu: np.ndarray, states: bool):
  """jit of ``VARLEN_OP`` on a packed row with the concrete ``cu`` (with per-sequence states or without), and
  jit of the gradient of ``Σ o·do (+ Σ S·dS)`` w.r.t. ``q, k, v, g, beta``; arguments
  ``(q, k, v, g, beta, h0[, do, dS])``."""
  from jaxmem import ops
  op = getattr(ops, VARLEN_OP)

  def forward(q, k, v, g, beta, h0):
    kw = dict(initial_state=h0, output_final_state=True) if states else {}
    return op(q, k, v, g, beta, cu_seqlens=cu, **kw)

  def loss(q, k, v, g, beta, h0, do, dS):
    o, S = forward(q, k, v, g, beta, h0)
    return jnp.vdot(o, do) + (0.0 if S is None else jnp.vdot(S, dS))
  return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))


def _varlen_table(quick, repeats):
  """Rows ``[batch, N, T, packed fwd, states fwd, ratio, packed fwd+bwd, states fwd+bwd, ratio]`` and the
  ratios."""
  rows, ratios = [], []
  for name, lengths in varlen_batches(quick):
    T, N = sum(lengths), len(lengths)
    cu = np.cumsum((0,) + tuple(lengths)).astype(np.int32)
    x = random_inputs(B, T, H, K)
    h0 = jnp.concatenate([x["h0"]] * N)  # [N, H, K, V]
    dS = jnp.concatenate([x["dS"]] * N)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], h0)
    grad_args = args + (x["do"], dS)
    (p_f, p_g), (s_f, s_g) = _varlen_functions(cu, False), _varlen_functions(cu, True)
    t_pf, t_sf = _alternate([_blocking(p_f, args), _blocking(s_f, args)], repeats)
    t_pg, t_sg = _alternate([_blocking(p_g, grad_args), _blocking(s_g, grad_args)], repeats)
    ratios.append((t_sf / t_pf, t_sg / t_pg))
    label = f"{name}: " + " + ".join(f"{lengths.count(n)} × {n}" for n in sorted(set(lengths)))
    rows.append([label, N, T, _ms(t_pf), _ms(t_sf), f"{t_sf / t_pf:.2f}", _ms(t_pg), _ms(t_sg),
                 f"{t_sg / t_pg:.2f}"])
  return rows, ratios


VARLEN_HEAD = ["batch (sequence lengths)", "N", "T", "packed fwd ms", "with states fwd ms",
               "states / packed fwd", "packed fwd+bwd ms", "with states fwd+bwd ms", "states / packed fwd+bwd"]


def _wrapper_table(quick, repeats, jm):
  """Rows ``[op, T, op fwd, kernel fwd, ratio, op fwd+bwd, kernel fwd+bwd, ratio, max |Δ|]``, the ratios and
  the differences."""
  rows, ratios, diffs = [], [], []
  names = QUICK_OPS if quick else tuple(OPS)
  for name in names:
    op_f, op_g = jm.functions(name)
    ker_f, ker_g = jax.jit(kernel_forward(name)), fwd_bwd(kernel_forward(name), OPS[name][2])
    for T in lengths(quick):
      a, ga = _args(jm.x(T)), _grad_args(jm.x(T))
      diff = max(_max_diff(op_f(*a), ker_f(*a)), _max_diff(op_g(*ga), ker_g(*ga)))
      t_of, t_kf = _alternate([_blocking(op_f, a), _blocking(ker_f, a)], repeats)
      t_og, t_kg = _alternate([_blocking(op_g, ga), _blocking(ker_g, ga)], repeats)
      ratios.append((t_of / t_kf, t_og / t_kg))
      diffs.append(diff)
      rows.append([f"`{name}`", T, _ms(t_of), _ms(t_kf), f"{t_of / t_kf:.2f}", _ms(t_og), _ms(t_kg),
                   f"{t_og / t_kg:.2f}", f"{diff:.1e}"])
  return rows, ratios, diffs


WRAPPER_HEAD = ["op", "T", "op fwd ms", "kernel fwd ms", "op / kernel fwd", "op fwd+bwd ms",
                "kernel fwd+bwd ms", "op / kernel fwd+bwd", "max abs Δ op vs kernel"]
PEER_HEAD = ["peer", "function", "jaxmem op", "K", "T", "max abs Δ (rel)", "peer fwd ms", "jaxmem fwd ms",
             "peer / jaxmem fwd", "peer fwd+bwd ms", "jaxmem fwd+bwd ms", "peer / jaxmem fwd+bwd", "note"]


# --- peers ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Peer:
  """One peer function compared with one jaxmem op.

  ``make(module)`` returns the peer as ``(q, k, v, g, beta, h0) -> (o [B, T, H, V], final state [B, H, K, V])``
  in JAX (``torch=False``) or, for a PyTorch peer, the same on torch tensors. ``module`` is what is imported
  (``load_fla_naive`` families are written ``"fla-naive:<family>"``), ``dist`` the distribution whose version is
  shown and ``install`` how to get it.
  """

  dist: str
  module: str
  function: str
  op: str
  make: Callable
  K: int = K
  quick: bool = True
  torch: bool = False
  note: str = ""
  install: str = ""
  max_T: Optional[int] = None  # longer rows are not run (a peer too slow for this bench there)


def _bcast_K(x_BTH, width):
  return jnp.broadcast_to(x_BTH[..., None], x_BTH.shape + (width,))


def _ej_gdr(m, with_decay):
  def forward(q, k, v, g, beta, h0):
    return m.xla.gated_delta_rule(q, k, v, beta, g if with_decay else None, chunk_size=CHUNK, initial_state=h0,
                                  use_qk_l2norm=False)
  return forward


def _ej_recurrent(m, with_decay):
  def forward(q, k, v, g, beta, h0):
    gate = {"g": _bcast_K(g, q.shape[-1])} if with_decay else {}
    return m.xla.recurrent(q, k, v, **gate, initial_state=h0)
  return forward


def _jla(m, kind, impl, zero_decay=False):
  def forward(q, k, v, g, beta, h0):
    gates = {"gated_deltanet": {"g": g, "beta": beta}, "deltanet": {"beta": beta},
             "simple_gla": {"g": jnp.zeros_like(g) if zero_decay else g}}[kind]
    return m.linear_attention(kind, q, k, v, impl=impl, **gates, initial_state=h0, output_final_state=True)
  return forward


def _deltanet_tpu(m, fallback_scan):
  def forward(q, k, v, g, beta, h0):
    with warnings.catch_warnings():  # "running on non-TPU backend": what this row measures
      warnings.simplefilter("ignore", UserWarning)
      return m.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=128,
                         precision="fp32", fallback_scan=fallback_scan)
  return forward


def _atomic_ops(m):
  def forward(q, k, v, g, beta, h0):
    Kq, Vv = q.shape[-1], v.shape[-1]
    w, b = _bcast_K(beta, Vv), _bcast_K(beta, Kq)
    return m.gdn2_forward_trainable(q, k, v, w, b, _bcast_K(g, Kq), Kq ** -0.5, h0=h0)
  return forward


def _fla_naive(m, family):
  def forward(q, k, v, g, beta, h0):
    if family == "gated_delta_rule":
      return m.naive_chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=CHUNK, initial_state=h0,
                                            output_final_state=True)
    return m.naive_chunk_simple_gla(q, k, v, g, initial_state=h0, output_final_state=True, chunk_size=CHUNK)
  return forward


_EJ = dict(dist="ejkernel", module="ejkernel.kernels", install="`pip install -e '.[bench]'`")
_JLA = dict(dist="jax-linear-attention", module="jla.ops",
            install="needs Python ≥ 3.12 and jax 0.11.2; `pip install --no-deps --ignore-requires-python "
                    "jax-linear-attention` runs its plain-JAX ops here")
_DT = dict(dist="deltanet-tpu", module="deltanet_tpu", K=128,
           install="needs Python ≥ 3.12 and jax ≥ 0.11.2; `pip install --no-deps --ignore-requires-python "
                   "deltanet-tpu` runs it here")
_AO = dict(dist="atomic-ops", module="atomic_ops", install="`pip install -e '.[bench]'`")
_FLA = dict(dist="fla-core", torch=True, install="`pip install -e '.[bench]'` (torch, fla-core)")

PEERS = (
    Peer(**_EJ, function="`kernels.xla.gated_delta_rule`", op="chunk_gated_delta_rule",
         make=lambda m: _ej_gdr(m, True), note="chunk 64, `use_qk_l2norm=False`; scale fixed at K^-0.5"),
    Peer(**_EJ, function="`kernels.xla.gated_delta_rule`, no decay", op="chunk_delta_rule",
         make=lambda m: _ej_gdr(m, False), quick=False, note="`decay=None`"),
    Peer(**_EJ, function="`kernels.xla.recurrent`, `g` per key channel", op="fused_recurrent_simple_gla",
         make=lambda m: _ej_recurrent(m, True), quick=False, note="per-token scan; `g` broadcast over K"),
    Peer(**_EJ, function="`kernels.xla.recurrent`", op="fused_recurrent_linear_attn",
         make=lambda m: _ej_recurrent(m, False), quick=False, note="per-token scan"),
    Peer(**_JLA, function="`linear_attention('gated_deltanet', impl='chunked')`", op="chunk_gated_delta_rule",
         make=lambda m: _jla(m, "gated_deltanet", "chunked"), note="plain-JAX chunked form, chunk 64"),
    Peer(**_JLA, function="`linear_attention('deltanet', impl='chunked')`", op="chunk_delta_rule",
         make=lambda m: _jla(m, "deltanet", "chunked"), quick=False),
    Peer(**_JLA, function="`linear_attention('simple_gla', impl='chunked')`", op="chunk_simple_gla",
         make=lambda m: _jla(m, "simple_gla", "chunked"), quick=False),
    Peer(**_JLA, function="`linear_attention('simple_gla', impl='chunked')`, g = 0", op="chunk_linear_attn",
         make=lambda m: _jla(m, "simple_gla", "chunked", zero_decay=True), quick=False,
         note="no plain linear-attention kind: simple GLA with g = 0"),
    Peer(**_JLA, function="`linear_attention('gated_deltanet', impl='reference')`",
         op="fused_recurrent_gated_delta_rule", make=lambda m: _jla(m, "gated_deltanet", "reference"),
         quick=False, note="per-token scan"),
    Peer(**_DT, function="`chunk_gdn(precision='fp32')`", op="chunk_gated_delta_rule",
         make=lambda m: _deltanet_tpu(m, False), quick=False,
         note="Pallas TPU kernel in interpret mode; K = V = 128 and chunk 128 required"),
    Peer(**_DT, function="`chunk_gdn(precision='fp32', fallback_scan=True)`", op="chunk_gated_delta_rule",
         make=lambda m: _deltanet_tpu(m, True), quick=False, note="its pure-JAX chunked scan; K = V = 128"),
    Peer(**_AO, function="`gdn2_forward_trainable`, b = w = β", op="chunk_gated_delta_rule",
         make=_atomic_ops, quick=False, max_T=2048,
         note="GDN-2 with b = w = β and g broadcast over K; off TPU its chunked WY reference, chunk 256"),
    Peer(**_FLA, module="fla-naive:gated_delta_rule", function="`naive_chunk_gated_delta_rule` (PyTorch)",
         op="chunk_gated_delta_rule", make=lambda m: _fla_naive(m, "gated_delta_rule"),
         note="PyTorch CPU reference, chunk 64"),
    Peer(**_FLA, module="fla-naive:simple_gla", function="`naive_chunk_simple_gla` (PyTorch)",
         op="chunk_simple_gla", make=lambda m: _fla_naive(m, "simple_gla"), quick=False,
         note="PyTorch CPU reference, chunk 64"),
)

# candidates that are not run here, with the reason (each found on PyPI when this bench was written)
NOT_RUN = (
    ("tokamax", "0.0.17's `causal_conv1d_gated_delta_rule` (a short convolution fused with the gated delta "
                "rule, for TPU serving) needs Python ≥ 3.12 (its source does not parse on 3.11) and jax ≥ "
                "0.11.1; 0.0.12, the last release for Python 3.11, has no linear-attention op"),
    ("gdn2-pallas", "an earlier release of atomic-ops' `atomic_ops` package (the same import name); atomic-ops "
                    "is the one run"),
    ("jax-linear-attention's and deltanet-tpu's compiled kernels", "Pallas Mosaic GPU (Hopper) and Mosaic TPU "
     "kernels do not compile for a CPU; their plain-JAX forms (and deltanet-tpu's kernels in interpret mode) "
     "are the rows above"),
    ("cuda-linear-attention, flash-qla, kernel-fun, mps-linear-attn, opengdn", "PyTorch packages (most CUDA or "
     "Metal only), not JAX"),
)


def _import_peer(peer: Peer):
  """``(module, None)``, or ``(None, why)`` when the peer is not installed or does not import."""
  try:
    if peer.module.startswith("fla-naive:"):
      from jaxmem.bench.assoc import load_fla_naive
      module = load_fla_naive(peer.module.split(":", 1)[1])
      return (module, None) if module is not None else (None, f"not installed ({peer.install})")
    return importlib.import_module(peer.module), None
  except ModuleNotFoundError as e:
    if e.name and peer.module.split(".")[0] == e.name.split(".")[0]:
      return None, f"not installed ({peer.install})"
    return None, f"does not import: {_error(e)}"
  except Exception as e:  # noqa: BLE001 - e.g. a SyntaxError on this Python: the reason goes in the note
    return None, f"does not import: {_error(e)}"


def _package(peer: Peer) -> str:
  """The top-level package a peer's code lives in (for locating its errors)."""
  return "fla" if peer.module.startswith("fla-naive:") else peer.module.split(".")[0]


def _version(dist: str) -> str:
  try:
    from importlib.metadata import version
    return f"{dist} {version(dist)}"
  except Exception:  # noqa: BLE001 - a module found without its metadata still runs
    return dist


def _to_torch(x: dict) -> dict:
  import torch
  return {n: torch.from_numpy(np.asarray(a).copy()) for n, a in x.items()}


def _peer_calls(peer: Peer, forward: Callable, x: dict):
  """``(outputs, fwd call, fwd+bwd call)`` of a peer on inputs ``x``: its ``(o, final state)`` as numpy or JAX
  arrays, and zero-argument calls that run its forward and its forward+backward to completion."""
  gates = OPS[peer.op][2]
  if not peer.torch:
    fwd, grad = jax.jit(forward), fwd_bwd(forward, gates)
    return fwd(*_args(x)), _blocking(fwd, _args(x)), _blocking(grad, _grad_args(x))
  import torch
  tx = _to_torch(x)
  names = ("q", "k", "v", "g", "beta", "h0")
  args = [tx[n] for n in names]
  differentiated = [i < 3 or n in gates for i, n in enumerate(names)]

  def fwd_only():
    with torch.no_grad():
      return tuple(t.numpy() for t in forward(*args))

  def fwd_and_bwd():
    leaves = [a.clone().requires_grad_(d) for a, d in zip(args, differentiated, strict=True)]
    o, S = forward(*leaves)
    ((o * tx["do"]).sum() + (S * tx["dS"]).sum()).backward()
  return fwd_only(), fwd_only, fwd_and_bwd


def _peer_row(peer: Peer, module, x: dict, op_f, op_g, repeats: int) -> tuple:
  """``(max |Δ|, rel, peer fwd s, op fwd s, peer fwd+bwd s, op fwd+bwd s, note)`` of one peer row, the
  times None where not measured: the peer is timed (in turns with the op) only when its outputs agree with the
  op's."""
  ours = op_f(*_args(x))
  theirs, p_fwd, p_grad = _peer_calls(peer, peer.make(module), x)
  diff = _max_diff(theirs, ours)
  rel = diff / _max_abs(ours)
  if not rel <= AGREE_REL:  # NaN disagrees too
    return diff, rel, None, None, None, None, "outputs disagree: not timed"
  t_pf, t_of = _alternate([p_fwd, _blocking(op_f, _args(x))], repeats, warmup=False)  # both ran above
  try:
    p_grad()
  except Exception as e:  # noqa: BLE001 - a peer without a working backward still has its forward row
    return diff, rel, t_pf, t_of, None, None, f"fwd+bwd failed: {_error(e, _package(peer))}"
  _blocking(op_g, _grad_args(x))()  # compiled, if the wrapper table did not
  t_pg, t_og = _alternate([p_grad, _blocking(op_g, _grad_args(x))], repeats, warmup=False)
  return diff, rel, t_pf, t_of, t_pg, t_og, ""


def _peer_table(quick, repeats, jm):
  """Rows of the peer table, the ratios of the rows that agreed, the peers that did not import, and the number
  of rows left to the full run."""
  rows, ratios, missing, skipped = [], [], {}, 0
  for peer in PEERS:
    if quick and not peer.quick:
      skipped += 1
      continue
    if peer.dist in missing:
      continue
    module, why = _import_peer(peer)
    if module is None:
      missing[peer.dist] = why
      continue
    label = _version(peer.dist)
    op_f, op_g = jm.functions(peer.op)
    for T in peer_lengths(quick):
      head = [label, peer.function, f"`{peer.op}`", peer.K, T]
      if peer.max_T is not None and T > peer.max_T:
        rows.append(head + ["—"] * 7 + [f"not run at T > {peer.max_T} (too slow for this bench)"])
        continue
      try:
        diff, rel, t_pf, t_of, t_pg, t_og, note = _peer_row(peer, module, jm.x(T, peer.K), op_f, op_g, repeats)
      except Exception as e:  # noqa: BLE001 - a peer's failure is its row's note, not the end of the run
        failed = f"peer failed: {_error(e, _package(peer))}"
        rows.append(head + ["—"] * 7 + ["; ".join(s for s in (failed, peer.note) if s)])
        continue
      cells = [f"{diff:.1e} ({rel:.0e})"]
      cells += ["—"] * 3 if t_pf is None else [_ms(t_pf), _ms(t_of), f"{t_pf / t_of:.2f}×"]
      cells += ["—"] * 3 if t_pg is None else [_ms(t_pg), _ms(t_og), f"{t_pg / t_og:.2f}×"]
      rows.append(head + cells + ["; ".join(s for s in (note, peer.note) if s)])
      if t_pf is not None:
        ratios.append((label, peer.function, peer.op, T, t_pf / t_of, None if t_pg is None else t_pg / t_og))
  return rows, ratios, missing, skipped


def bench_ops(quick: bool = False, repeats: int = 5, emit: Callable[[str], None] | None = None) -> str:
  """fla-named ops: wrapper cost against jaxmem's kernel, and peers on the same inputs (module docstring).

  ``emit``, if given, is called with each table's text as soon as that table is computed (so a later
  failure or interrupt loses nothing printed); the pieces concatenate to the returned section.
  """
  emit = emit or (lambda text: None)
  jm = _Jaxmem()
  platform = jax.devices()[0].platform

  rows, ratios, diffs = _wrapper_table(quick, repeats, jm)
  wrapper = (f"### ops: fla-named ops (`jaxmem.ops`), B={B}, H={H}, K=V={K}, float32, {platform}\n\n"
             f"Wrapper cost: each op under `jax.jit` against the same computation written directly on "
             f"`associative_memory` (q scaled by K^-0.5, the state transposed in and out, chunk {CHUNK}), "
             f"with an initial state and the final state returned; fwd+bwd is the gradient of a random inner "
             f"product with the output and the final state w.r.t. q, k, v and the op's gates. The two are "
             f"timed in turns, each the fastest of {repeats} rounds after compilation. Max abs Δ is over the "
             f"output, the "
             f"final state and the gradients.\n\n"
             + markdown_table(WRAPPER_HEAD, rows) + "\n\n")
  emit(wrapper)

  varlen_rows, _ = _varlen_table(quick, repeats)
  varlen = (f"Varlen with a state per sequence: `{VARLEN_OP}` on one packed row (`cu_seqlens`, concrete), "
            f"without states (the packed call) and with an initial state per sequence and the final states "
            f"returned (`jaxmem/kernels/assoc/varlen.py`); fwd+bwd w.r.t. q, k, v, g, β (and the final "
            f"states' cotangent). Timed as above.\n\n" + markdown_table(VARLEN_HEAD, varlen_rows) + "\n\n")
  emit(varlen)

  peer_rows, peer_ratios, missing, skipped = _peer_table(quick, repeats, jm)
  more = f" {skipped} more rows run without `--quick`." if quick and skipped else ""
  peers = (f"Peers on the same inputs (fla's layouts: q, k, v, g, β and an initial state), each timed in turns "
           f"with the jaxmem op only where its output and final state agree with the op's (max abs Δ at most "
           f"{AGREE_REL:g} of the largest magnitude; the relative figure in brackets). Ratios > 1 mean the "
           f"peer is slower. K is the head width of the row's inputs: a peer that needs another gets its "
           f"own inputs, and the op is timed on them too. Times as above (fastest of the rounds, in turns); "
           f"a pair slower than about {_BUDGET_S / max(repeats, 1):.2g} s a round gets fewer rounds.{more}\n\n"
           + (markdown_table(PEER_HEAD, peer_rows) if peer_rows else "No peer is installed.") + "\n\n")
  emit(peers)

  closing = _closing_note(ratios, diffs, peer_ratios, missing)
  emit(closing)
  return wrapper + varlen + peers + closing


def _closing_note(ratios, diffs, peer_ratios, missing) -> str:
  """The ratios in words: the wrapper's range and geometric mean, each agreeing peer's ratios, and the
  candidates that did not run, with the reason."""
  fwd, grad = [r[0] for r in ratios], [r[1] for r in ratios]
  lines = [f"Wrapper cost over {len(ratios)} rows: op / kernel forward {min(fwd):.2f}–{max(fwd):.2f} "
           f"(geometric mean {_geomean(fwd):.2f}), forward+backward {min(grad):.2f}–{max(grad):.2f} "
           f"(geometric mean {_geomean(grad):.2f}); largest abs Δ op vs kernel {max(diffs):.1e}."]
  if peer_ratios:
    lines += ["", "Peers that agree, peer / jaxmem time (forward; forward+backward):", ""]
    by_fn = {}
    for label, fn, op, T, rf, rg in peer_ratios:
      by_fn.setdefault((label, fn, op), []).append(f"T={T} {rf:.2f}×; " + ("—" if rg is None else f"{rg:.2f}×"))
    lines += [f"- {label} {fn} vs `{op}`: " + ", ".join(cells) for (label, fn, op), cells in by_fn.items()]
  lines += ["", "Not run here:", ""]
  lines += [f"- {dist}: {why}" for dist, why in missing.items()]
  lines += [f"- {dist}: {why}" for dist, why in NOT_RUN]
  return "\n".join(lines) + "\n"
