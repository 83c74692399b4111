"""``jaxmem bench assoc``: the associative-memory kernel's execution forms, timed together.

Delta rule (DeltaNet), ``B=1, H=8, D_k=D_v=64``, float32, L2-normalised keys. Reports, per
length ``T``: chunked vs recurrent (forward, and forward+backward of ``sum(o)``), chunked
forward vs causal :func:`jaxmem.kernels.attention.softmax_attention`, and the chunked
forward's arithmetic rate as a fraction of a plain ``jnp.dot`` (1024² × 1024²) measured
in the same run (with, for context, the rate of a batched 64×64 @ 64×64 matmul, the
block size the chunked form multiplies; the chunked rate is also given, for context only, as
a fraction of a batched 32 × 64³ matmul, one group's worth, whose operands stay in cache). A
second table compares chunk sizes at the longest ``T``.

FLOPs of the chunked forward (:func:`chunked_delta_flops`) count every matmul the
implementation performs, per chunk of ``C`` rows and head: ``K Kᵀ``, ``Q Kᵀ``, ``W``,
``U``, ``tril(Q Kᵀ) V'`` (``2C²D`` each), ``W S̃``, ``Kᵀ V'``, ``Q S̃`` (``2C D_k D_v`` each)
and the recursive triangular inverse (``≈ 2C³/3``); masked halves are counted because
they are computed.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxmem.bench.timing import time_call
from jaxmem.results import markdown_table


def chunked_delta_flops(T: int, H: int, d_k: int, d_v: int, chunk: int, batch: int = 1) -> float:
  """Matmul FLOPs of one chunked delta-rule forward (see the module docstring)."""
  C = min(chunk, T)
  n_chunks = -(-T // C)
  per_chunk = 2 * C * C * (3 * d_k + 2 * d_v) + 3 * 2 * C * d_k * d_v + 2 * C ** 3 / 3
  return float(batch * H * n_chunks * per_chunk)


def random_inputs(B, T, H, D):
  """Benchmark inputs ``(q, k, v [B, T, H, D], beta [B, T, H])``, float32, seeded by ``T``.

  ``q, v`` standard normal, ``k`` L2-normalised, ``beta = sigmoid(normal)`` (so ``β‖k‖² < 2``).
  """
  kq, kk, kv, kb = jax.random.split(jax.random.key(T), 4)
  q = jax.random.normal(kq, (B, T, H, D), jnp.float32)
  k = jax.random.normal(kk, (B, T, H, D), jnp.float32)
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)  # β‖k‖² < 2: the stable regime
  v = jax.random.normal(kv, (B, T, H, D), jnp.float32)
  beta = jax.nn.sigmoid(jax.random.normal(kb, (B, T, H), jnp.float32))
  return q, k, v, beta


def _matmul_gflops(repeats: int) -> float:
  """A plain ``jnp.dot`` of two 1024×1024 float32 matrices."""
  n = 1024
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  return 2 * n ** 3 / time_call(jax.jit(jnp.dot), a, b, repeats=repeats) / 1e9


def _block_matmul_gflops(repeats: int, blocks: int = 1024, n: int = 64) -> float:
  """A batched ``[blocks, 64, 64] @ [blocks, 64, 64]``: the size of the chunked form's matmuls."""
  a = jax.random.normal(jax.random.key(0), (blocks, n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (blocks, n, n), jnp.float32)
  return 2 * blocks * n ** 3 / time_call(jax.jit(jnp.matmul), a, b, repeats=repeats) / 1e9


def bench_assoc(quick: bool = False, repeats: int = 5, emit: Callable[[str], None] | None = None) -> str:
  """Delta-rule associative memory: chunked vs recurrent vs softmax attention vs matmul.

  ``emit``, if given, is called with each table's text as soon as that table is computed (so a later
  failure or interrupt loses nothing printed); the pieces concatenate to the returned section.
  """
  from jaxmem.kernels.assoc import associative_memory
  from jaxmem.kernels.attention import softmax_attention

  emit = emit or (lambda text: None)

  B, H, D, C = 1, 8, 64, 64
  # 2100: not a multiple of the chunk (33 chunks; padded to 2112, not to whole groups)
  lengths = (256, 1000) if quick else (512, 2048, 2100, 8192)

  def fwd(mode, chunk=C):
    return jax.jit(lambda q, k, v, b: associative_memory(
        q, k, v, b, rule="delta", mode=mode, chunk_size=chunk))

  def fwd_bwd(mode, chunk=C):
    loss = lambda q, k, v, b: associative_memory(
        q, k, v, b, rule="delta", mode=mode, chunk_size=chunk).sum()
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))

  attn = jax.jit(lambda q, k, v: softmax_attention(q, k, v, causal=True))
  rec_f, chk_f, rec_g, chk_g = fwd("recurrent"), fwd("chunked"), fwd_bwd("recurrent"), fwd_bwd("chunked")
  mm, bmm = _matmul_gflops(repeats), _block_matmul_gflops(repeats)
  # the chunked form multiplies one group of ~32 such blocks at a time, in cache: its
  # rate (no fresh 16 MB output to page in, unlike the 1024-block one) is the context ceiling
  bmm_group = _block_matmul_gflops(repeats, blocks=32)

  rows = []
  for T in lengths:
    x = random_inputs(B, T, H, D)
    t_rf, t_cf = time_call(rec_f, *x, repeats=repeats), time_call(chk_f, *x, repeats=repeats)
    t_rg, t_cg = time_call(rec_g, *x, repeats=repeats), time_call(chk_g, *x, repeats=repeats)
    t_sm = time_call(attn, *x[:3], repeats=repeats)
    gflops = chunked_delta_flops(T, H, D, D, C, B) / t_cf / 1e9
    rows.append([
        T, f"{t_rf * 1e3:.1f}", f"{t_cf * 1e3:.1f}", f"{t_rf / t_cf:.2f}×",
        f"{t_rg * 1e3:.1f}", f"{t_cg * 1e3:.1f}", f"{t_rg / t_cg:.1f}×",
        f"{t_sm * 1e3:.1f}", f"{t_sm / t_cf:.2f}×", f"{gflops:.1f}", f"{100 * gflops / mm:.0f}%",
        f"{100 * gflops / bmm_group:.0f}%",
    ])
  head = ["T", "recurrent fwd ms", "chunked fwd ms", "recurrent / chunked fwd",
          "recurrent fwd+bwd ms", "chunked fwd+bwd ms", "recurrent / chunked fwd+bwd",
          "softmax attn fwd ms", "softmax / chunked fwd", "chunked fwd GFLOP/s", "of matmul",
          "of 64³ block matmul"]

  platform = jax.devices()[0].platform
  main = (
      f"### assoc: delta rule, B={B}, H={H}, D_k=D_v={D}, chunk {C}, float32, {platform}\n\n"
      + markdown_table(head, rows)
      + f"\n\nRatios > 1 mean chunked is faster. In the same run `jnp.dot` 1024×1024 ran at "
      f"{mm:.1f} GFLOP/s and a batched 1024 × (64×64 @ 64×64) `jnp.matmul`, the block size "
      f"of the chunked form's products, at {bmm:.1f} GFLOP/s ({100 * bmm / mm:.0f}% of the "
      f"former); 32 × (64×64 @ 64×64), the size of one group of chunks, ran at {bmm_group:.1f} "
      f"GFLOP/s ({100 * bmm_group / mm:.0f}%). \"of matmul\" is the chunked forward's rate as a "
      f"fraction of the `jnp.dot` (the headline), \"of 64³ block matmul\" (context only) as a "
      f"fraction of the 32-block one. Chunked FLOPs count every matmul it performs "
      f"(`chunked_delta_flops`).\n\n")
  emit(main)

  T = lengths[-1]
  x = random_inputs(B, T, H, D)
  chunk_rows = []
  for c in (32, 64, 128):
    t_f = time_call(fwd("chunked", c), *x, repeats=repeats)
    t_g = time_call(fwd_bwd("chunked", c), *x, repeats=repeats)
    chunk_rows.append([c, f"{t_f * 1e3:.1f}", f"{t_g * 1e3:.1f}",
                       f"{chunked_delta_flops(T, H, D, D, c, B) / t_f / 1e9:.1f}"])

  chunks = (f"Chunk size at T={T}:\n\n"
            + markdown_table(["chunk", "fwd ms", "fwd+bwd ms", "fwd GFLOP/s"], chunk_rows) + "\n\n")
  emit(chunks)
  versus = _versus_fla(lengths, B, H, D, chk_f, chk_g, repeats)
  emit(versus)
  return main + chunks + versus


def load_fla_naive(family: str = "delta_rule"):
  """fla-core's PyTorch reference ``fla/ops/<family>/naive.py`` (e.g. ``"gated_delta_rule"``), loaded by file
  path.

  Importing ``fla`` itself needs Triton (absent on CPU machines); the naive modules only
  need torch and einops, so each is loaded on its own. None when fla-core / torch are
  not installed (``pip install -e '.[bench]'``).
  """
  import importlib.util
  try:
    import torch  # noqa: F401
    spec = importlib.util.find_spec("fla")
  except ImportError:
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  import pathlib
  path = pathlib.Path(spec.submodule_search_locations[0]) / "ops" / family / "naive.py"
  if not path.is_file():
    return None
  module_spec = importlib.util.spec_from_file_location(f"fla_{family}_naive", path)
  module = importlib.util.module_from_spec(module_spec)
  try:
    module_spec.loader.exec_module(module)
  except ImportError:
    return None
  return module


# fla-core's naive chunkwise form works on whole chunks of this many rows
FLA_CHUNK = 64


def fla_naive_chunkwise(naive, q, k, v, beta, chunk_size: int = FLA_CHUNK):
  """fla-core's naive ``delta_rule_chunkwise`` at any length: ``(o [b, h, T, d_v], S)``.

  ``q, k, v`` are torch tensors ``[b, h, T, d]`` and ``beta`` ``[b, h, T]`` (fla's layout). The naive
  chunkwise form needs ``T`` to be a multiple of ``chunk_size``; otherwise the inputs are zero-padded at
  the end to the next multiple (inside the call, so gradients reach the unpadded tensors) and the output is
  cut back to ``T``. The first ``T`` outputs are unchanged because the form is causal, and the final state
  ``S`` too: a padded step has ``k = 0`` and ``beta = 0``, so it writes nothing.
  """
  if chunk_size < 1:
    raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}.")
  import torch.nn.functional as F

  T = q.shape[2]
  pad = -T % chunk_size
  if pad:
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta = F.pad(beta, (0, pad))
  out = naive.delta_rule_chunkwise(q, k, v, beta, chunk_size=chunk_size)
  o, S = out if isinstance(out, tuple) else (out, None)
  return o[:, :, :T], S


def _peer_error(e: Exception) -> str:
  """One table cell naming a peer's exception (no newlines or pipes, which would break the table)."""
  text = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
  text = " ".join(text.split()).replace("|", "/")
  return text if len(text) <= 120 else text[:117] + "..."


def _versus_fla(lengths, B, H, D, chk_f, chk_g, repeats) -> str:
  """jaxmem chunked delta vs fla-core's naive chunked delta (PyTorch, CPU), same sizes.

  A failure of fla's side in one row becomes that row's note; the other rows still run.
  """
  import numpy as np

  from jaxmem.bench.timing import time_host

  naive = load_fla_naive()
  if naive is None:
    return ("vs fla-core naive chunked delta (PyTorch): not installed — "
            "`pip install -e '.[bench]'` adds torch, dnc and fla-core.\n")
  import torch

  timed = lambda fn: time_host(fn, repeats)

  def fla_row(x, ours):
    """fla's forward ms, forward+backward ms and max |Δ output| against ``ours`` at these inputs."""
    q, k, v, beta = x
    # fla layout [b, h, l, d]; its naive form scales q by d^-1/2, so pass q·sqrt(d) for equal outputs
    tq, tk, tv = (torch.from_numpy(np.asarray(a).transpose(0, 2, 1, 3).copy()) for a in (q, k, v))
    tb = torch.from_numpy(np.asarray(beta).transpose(0, 2, 1).copy())
    tq = tq * D ** 0.5
    with torch.no_grad():
      o_ref, _ = fla_naive_chunkwise(naive, tq, tk, tv, tb)
      diff = float(np.max(np.abs(ours - o_ref.numpy())))
      t_fwd = timed(lambda: fla_naive_chunkwise(naive, tq, tk, tv, tb))
    leaves = [a.clone().requires_grad_(True) for a in (tq, tk, tv, tb)]

    def fwd_bwd():
      fla_naive_chunkwise(naive, *leaves)[0].sum().backward()
    return t_fwd, timed(fwd_bwd), diff

  rows = []
  for T in lengths:
    x = random_inputs(B, T, H, D)
    ours = np.asarray(chk_f(*x)).transpose(0, 2, 1, 3)
    t_of, t_og = time_call(chk_f, *x, repeats=repeats), time_call(chk_g, *x, repeats=repeats)
    padded = -(-T // FLA_CHUNK) * FLA_CHUNK
    try:
      t_fwd, t_bwd, diff = fla_row(x, ours)
    except Exception as e:  # noqa: BLE001 - a peer's failure is this row's note, not the end of the run
      rows.append([T, "—", f"{t_of * 1e3:.1f}", "—", "—", f"{t_og * 1e3:.1f}", "—", "—",
                   f"fla failed: {_peer_error(e)}"])
      continue
    rows.append([T, f"{t_fwd * 1e3:.1f}", f"{t_of * 1e3:.1f}", f"{t_fwd / t_of:.2f}×",
                 f"{t_bwd * 1e3:.1f}", f"{t_og * 1e3:.1f}", f"{t_bwd / t_og:.2f}×", f"{diff:.1e}",
                 f"fla padded to {padded}" if padded != T else ""])
  return (f"vs fla-core naive chunked delta rule (PyTorch CPU reference, chunk {FLA_CHUNK}), same inputs. "
          f"At a T that is not a multiple of {FLA_CHUNK} fla's inputs are zero-padded at the end to the "
          f"next multiple (k = 0, β = 0: the padded steps write nothing, and the form is causal) and its "
          f"output cut back to T, so its times include the padded rows (jaxmem's chunked form pads "
          f"internally too); a failure on fla's side is noted in its row:\n\n"
          + markdown_table(["T", "fla naive fwd ms", "jaxmem chunked fwd ms", "fla / jaxmem fwd",
                            "fla naive fwd+bwd ms", "jaxmem fwd+bwd ms", "fla / jaxmem fwd+bwd",
                            "max abs Δ output", "note"], rows) + "\n")
