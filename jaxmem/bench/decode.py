"""``jaxmem bench decode``: :func:`jaxmem.generate` of a softmax LM (fixed-size KV cache) against a gated-delta
LM (a carried matrix state) of the same shape, at several context lengths and batch sizes, in one run.

Per model, context ``C`` and batch ``B``, ``generate``'s two phases timed apart (medians, compiled first):
prefill tokens per second (``init_state`` and the prompt through :func:`jaxmem.decode.prefill`, in pieces as
``generate`` runs it), decode ms per token (``n`` greedy ``step``s in one ``lax.scan`` from the prefilled
state, divided by ``n``), and the bytes of decoding state per sequence (``init_state``'s arrays: the KV cache
grows with the context, the memory does not).

Then mixed prompt lengths (:func:`bench_mixed_lengths`): ``generate``'s whole call (prefill and
:data:`MIXED_N` greedy tokens) on a batch of two prompts of ``C`` and :data:`SHORT` tokens against two of ``C``
(``C`` the largest context up to 2,048), per model: every row is prefilled through the parallel / chunked
forms whatever its length, so the ratio stays near 1."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxmem.bench.timing import time_host, time_interleaved
from jaxmem.results import markdown_table

QUICK = dict(contexts=(128, 512), batches=(1, 4), n=64, d_model=64, n_layers=2, n_heads=2)
FULL = dict(contexts=(512, 2048, 8192), batches=(1, 8), n=128, d_model=256, n_layers=4, n_heads=4)
SHORT = 8       # the short prompt of the mixed-lengths batch
MIXED_N = 8     # new tokens in the mixed-lengths timing: few, so that the prefill dominates


def _models(d_model: int, n_layers: int, n_heads: int) -> dict:
  from jaxmem.models import TransformerConfig, TransformerLM
  from jaxmem.models.mixers import AssocConfig, SoftmaxConfig
  base = dict(vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=n_heads, d_ff=4 * d_model,
              positions="sinusoidal", max_len=16)   # sinusoidal: no length limit
  softmax = TransformerLM(TransformerConfig(**base, mixer=SoftmaxConfig()), rngs=nnx.Rngs(0))
  return {"softmax (KV cache)": softmax,
          "gated delta (state)": TransformerLM(TransformerConfig(**base, mixer=AssocConfig(rule="gated_delta")),
                                               rngs=nnx.Rngs(0))}


def _state_bytes(model, context: int, n: int) -> int:
  state = jax.eval_shape(lambda: model.init_state(1, context + n))
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(state))


def _programs(model, B: int, C: int, n: int):
  """``generate``'s two phases as separately timed programs: the prefill (:func:`jaxmem.decode.prefill`, in
  pieces as ``generate`` does) ``params, prompt -> (state, last logits)``, and ``n`` greedy decode steps
  ``params, state, last -> tokens``."""
  from jaxmem.decode import PREFILL_CHUNK, prefill
  graphdef = nnx.graphdef(model)

  @jax.jit
  def pre(params, prompt):
    m = nnx.merge(graphdef, params)
    return prefill(m, graphdef, params, m.init_state(B, C + n), prompt, PREFILL_CHUNK)

  @jax.jit
  def dec(params, state, last):
    def body(carry, _):
      state, last = carry
      token = jnp.argmax(last, axis=-1).astype(jnp.int32)
      state, last = nnx.merge(graphdef, params, copy=True).step(state, token)
      return (state, last), token
    return jax.lax.scan(body, (state, last), None, length=n)[1]

  return pre, dec


def bench_mixed_lengths(quick: bool = False, repeats: int = 5, models=None) -> str:
  """``generate``'s wall time (ms, median of ``repeats`` after a compiling call, the two calls taking turns) for
  prompt lengths ``[C, SHORT]`` against ``[C, C]`` (one prompt array of width ``C``), per model, and their
  ratio: a Markdown section."""
  from jaxmem.decode import generate
  s = QUICK if quick else FULL
  C = max([c for c in s["contexts"] if c <= 2048] or [min(s["contexts"])])
  models = _models(s["d_model"], s["n_layers"], s["n_heads"]) if models is None else models
  prompt = np.random.RandomState(C).randint(0, 256, (2, C))
  rows = []
  for name, model in models.items():
    runs = {lengths: (lambda model=model, lengths=lengths: jax.block_until_ready(
        generate(model, prompt, MIXED_N, temperature=0.0, prompt_lengths=list(lengths))))
        for lengths in ((C, C), (C, SHORT))}
    ms = {lengths: 1e3 * t for lengths, t in time_interleaved(runs, repeats).items()}
    for lengths in ((C, C), (C, SHORT)):
      rows.append([f"[{lengths[0]}, {lengths[1]}]", name, f"{ms[lengths]:,.1f}",
                   f"{ms[lengths] / ms[C, C]:.2f}×"])
  dims = f"d_model={s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads"
  return (f"### decode: mixed prompt lengths, jaxmem.generate of {MIXED_N} greedy tokens, batch 2, {dims}, "
          f"{jax.devices()[0].platform}\n\n"
          + markdown_table(["prompt lengths", "model", "generate ms", "÷ equal lengths"], rows) + "\n")


def bench_decode(quick: bool = False, repeats: int = 5) -> str:
  s = QUICK if quick else FULL
  n = s["n"]
  models = _models(s["d_model"], s["n_layers"], s["n_heads"])
  rows, ms = [], {}
  for C in s["contexts"]:
    for B in s["batches"]:
      prompt = np.random.RandomState(C + B).randint(0, 256, (B, C))
      for name, model in models.items():
        pre, dec = _programs(model, B, C, n)
        params = nnx.state(model)
        state, last = pre(params, prompt)
        prefill = time_host(lambda pre=pre, params=params: jax.block_until_ready(pre(params, prompt)), repeats)
        decode = time_host(lambda dec=dec, params=params, state=state, last=last:
                           jax.block_until_ready(dec(params, state, last)), repeats)
        step = decode / n
        ms[name, C, B] = step * 1e3
        rows.append([name, C, B, f"{step * 1e3:.3g}", f"{B / step:,.0f}", f"{B * C / prefill:,.0f}",
                     f"{_state_bytes(model, C, n) / 2 ** 20:.2f}"])
  names = list(models)
  ratio_rows, crossover = [], {}
  for B in s["batches"]:
    for C in s["contexts"]:
      r = ms[names[0], C, B] / ms[names[1], C, B]
      ratio_rows.append([C, B, f"{r:.2f}×"])
      if r > 1 and B not in crossover:
        crossover[B] = C
  flat = {B: ms[names[1], s["contexts"][-1], B] / ms[names[1], s["contexts"][0], B] for B in s["batches"]}
  grow = {B: ms[names[0], s["contexts"][-1], B] / ms[names[0], s["contexts"][0], B] for B in s["batches"]}
  notes = "; ".join(f"batch {B}: gated delta's ms/token × {flat[B]:.2f} from context {s['contexts'][0]} to "
                    f"{s['contexts'][-1]} (softmax × {grow[B]:.2f}), faster from context "
                    f"{crossover.get(B, 'none of these')}" for B in s["batches"])
  dims = f"d_model={s['d_model']}, {s['n_layers']} layers, {s['n_heads']} heads"
  head = ["model", "context", "batch", "decode ms/token", "tokens/s", "prefill tokens/s", "state MiB / seq"]
  return (f"### decode: jaxmem.generate, {dims}, greedy, float32, {jax.devices()[0].platform}\n\n"
          + markdown_table(head, rows) + "\n\nsoftmax ms/token ÷ gated-delta ms/token (> 1: the recurrent "
          "model is faster):\n\n" + markdown_table(["context", "batch", "ratio"], ratio_rows)
          + f"\n\n{notes}.\n\n" + bench_mixed_lengths(quick, repeats, models))
