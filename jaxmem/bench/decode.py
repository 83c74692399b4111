"""``jaxmem bench decode``: :func:`jaxmem.generate` of a softmax LM (fixed-size KV cache) against a gated-delta
LM (a carried matrix state) of the same shape, at several context lengths and batch sizes, in one run.

Per model, context ``C`` and batch ``B``: prefill tokens per second from the median time ``t_p`` of the prefill
alone (``init_state`` then ``scan`` over the prompt, jitted); decode ms per token ``(t_g − t_p) / n`` with
``t_g`` the median time of ``generate`` of ``n`` new tokens after the prompt; and the bytes of decoding state
per sequence (``init_state``'s arrays: the KV cache grows with the context, the memory does not)."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jaxmem.bench.timing import time_host
from jaxmem.results import markdown_table

QUICK = dict(contexts=(128, 512), batches=(1, 4), n=64, d_model=64, n_layers=2, n_heads=2)
FULL = dict(contexts=(512, 2048, 8192), batches=(1, 8), n=128, d_model=256, n_layers=4, n_heads=4)


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


def bench_decode(quick: bool = False, repeats: int = 5) -> str:
  from jaxmem.decode import generate
  s = QUICK if quick else FULL
  n = s["n"]
  models = _models(s["d_model"], s["n_layers"], s["n_heads"])
  rows, ms = [], {}
  for C in s["contexts"]:
    for B in s["batches"]:
      prompt = np.random.RandomState(C + B).randint(0, 256, (B, C))
      for name, model in models.items():
        graphdef, params = nnx.split(model)
        pre = jax.jit(lambda params, p, graphdef=graphdef: nnx.merge(graphdef, params).scan(
            nnx.merge(graphdef, params).init_state(B, C + n), p)[1][:, -1])
        prefill = time_host(lambda params=params, pre=pre: jax.block_until_ready(pre(params, prompt)), repeats)
        gen = lambda model=model, prompt=prompt: generate(model, prompt, n, temperature=0.0)
        total = time_host(lambda gen=gen: jax.block_until_ready(gen()), repeats)
        step = (total - prefill) / n
        if step <= 0:
          raise RuntimeError(f"decode bench: {name} at context {C}, batch {B}: generate ({total:.4f} s) timed "
                             f"faster than its own prefill ({prefill:.4f} s); too noisy a machine to time.")
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
          + f"\n\n{notes}.\n")
