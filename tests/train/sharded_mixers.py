"""Every registered mixer on a ``model`` axis of 2: ``python -m tests.train.sharded_mixers OUT.json`` (run
with 2 fake CPU devices). For each mixer (one of its config's ``examples()``, :data:`EXAMPLE`), a 2-layer
TransformerLM's loss and gradient on a ``(data=1, model=2)`` mesh (parameters laid out by their logical axes,
the memory kernels run per device on their heads) and on one device; saves the largest difference, the
per-device shapes of the mixer's parameters, the layout table and whether the sharded program runs its
kernel inside ``jax.shard_map`` (:func:`jaxmem.sharding.map_heads`)."""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxmem import sharding
from jaxmem.models import TransformerConfig, TransformerLM, mixers
from jaxmem.train import lm_loss

VOCAB, T, BATCH = 32, 12, 2
# one example per mixer, the one with the most parameters to lay out (grouped heads, a short convolution,
# gates): the last, except where an earlier one has more
EXAMPLE = {"assoc": 1, "topk_memory": 0}
# the prefill (decoding's `scan`) is compiled and compared with one device for a KV cache and a carried memory
PREFILL_COMPARED = {("softmax", 1), ("assoc", 1)}


def model_for(name: str, example: int) -> TransformerLM:
  cfg = mixers.lookup(name)[0].examples()[example]
  # grouped heads (an example's MQA, 1 key/value head for the contract test's 2 heads) as 2 groups of the 4
  # heads here, so that each of the 2 devices holds one group: a single key/value head cannot be split
  cfg = dataclasses.replace(cfg, **{f: 2 for f in ("n_kv_heads", "n_qk_heads") if getattr(cfg, f, 0)})
  return TransformerLM(TransformerConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=48,
                                         max_len=T, mixer=cfg), rngs=nnx.Rngs(0))


def main(out: str) -> None:
  assert jax.device_count() == 2, jax.devices()
  mesh = sharding.make_mesh(model=2)
  tokens = (np.arange(BATCH * (T + 1)).reshape(BATCH, T + 1) * 7) % VOCAB
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
  results = {}
  cases = [(n, EXAMPLE.get(n, len(mixers.lookup(n)[0].examples()) - 1)) for n in mixers.names()]
  assert PREFILL_COMPARED <= set(cases), (PREFILL_COMPARED, cases)
  for name, example in cases:
    g, p, r = nnx.split(model_for(name, example), nnx.Param, ...)
    loss_and_grad = lambda p, b, g=g, r=r: jax.value_and_grad(lambda p: lm_loss(nnx.merge(g, p, r), b)[0])(p)
    single = jax.jit(loss_and_grad)(p, batch)
    psh = sharding.state_shardings(p, mesh)
    f = jax.jit(loss_and_grad, in_shardings=(psh, NamedSharding(mesh, P())), out_shardings=(None, psh))
    with jax.set_mesh(mesh):
      # traced once: the jaxpr says whether the kernels run per device (map_heads -> jax.shard_map), and the
      # same trace is lowered and compiled (no second trace or compile for the check)
      p_sharded = jax.device_put(p, psh)
      traced = f.trace(p_sharded, batch)
      per_device = "shard_map" in str(traced.jaxpr)
      sharded = traced.lower().compile()(p_sharded, batch)
    diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
               for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded), strict=True))
    # the prefill (each mixer's `scan` from its decoding state, of right-padded rows of different lengths as
    # `generate` gives it): per device too, and equal to one device
    def prefill_logits(p, g=g, r=r):
      m = nnx.merge(g, p, r)
      return m.scan(m.init_state(BATCH, T), batch["inputs"], lengths=jnp.asarray([T, T - 5]))[1]
    with jax.set_mesh(mesh):   # traced for every mixer (cheap); compiled and compared for one cache, one memory
      traced_prefill = jax.jit(prefill_logits, in_shardings=(psh,)).trace(p_sharded)
      prefill_per_device = "shard_map" in str(traced_prefill.jaxpr)
      compare = (name, example) in PREFILL_COMPARED
      logits_sharded = traced_prefill.lower().compile()(p_sharded) if compare else None
    logits_single = jax.jit(prefill_logits)(p) if compare else None
    prefill_diff = float(np.max(np.abs(np.asarray(logits_single) - np.asarray(logits_sharded)))) if compare \
        else 0.0
    leaves = jax.tree_util.tree_leaves_with_path(sharded[1])
    shapes = {sharding.path_str(path): [list(x.shape), list(x.addressable_shards[0].data.shape)]
              for path, x in leaves if "/attn/" in sharding.path_str(path)}
    results[f"{name}/{example}"] = {"max_abs_diff": diff, "scale": float(np.abs(np.asarray(single[0]))),
                                    "shapes": shapes, "layout": sharding.layout_table(p, mesh),
                                    "shard_map": per_device, "prefill_shard_map": prefill_per_device,
                                    "prefill_max_abs_diff": prefill_diff,
                                    "prefill_scale": float(np.abs(np.asarray(logits_single)).max()) if compare
                                    else 1.0}
  with open(out, "w") as fh:
    json.dump(results, fh)


if __name__ == "__main__":
  main(sys.argv[1])
