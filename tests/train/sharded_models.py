"""The three models of the sharding tests and a runner: ``python -m tests.train.sharded_models OUT.npz
WORKROOT`` (run it with 8 fake CPU devices) first trains the tiny byte LM (``tests.conftest.tiny_lm_config``)
data-parallel over all 8 devices, saves its parameters and validation bpb, and records the error a batch the
8 devices do not divide raises; then trains each model for 3 steps on a ``(data=2, model=4)`` mesh and saves
the parameters, their per-device shard shapes, the layout tables and the collectives of the sharded
gradient. (The byte LM goes first: run after the three models, the same run took several times longer.)"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from flax import nnx

from jaxmem.data import RandomWindows
from jaxmem.models import TransformerConfig, TransformerLM, UniMatrixConfig, UniMatrixLM
from jaxmem.models.mixers import AssocConfig
from jaxmem.train import TrainConfig, TrainTask, lm_loss, train, train_lm

VOCAB, T, BATCH = 32, 12, 8


def make_model(name: str, rngs: nnx.Rngs, dtype: str = "float32") -> nnx.Module:
  if name == "baseline":
    return TransformerLM(TransformerConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=48,
                                           max_len=T, dtype=dtype), rngs=rngs)
  if name == "assoc":
    return TransformerLM(TransformerConfig(vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, d_ff=48,
                                           max_len=T, mixer=AssocConfig(rule="delta", chunk_size=4)), rngs=rngs)
  if name == "unimatrix":
    return UniMatrixLM(UniMatrixConfig(variant="core", vocab_size=VOCAB, d_model=32, n_heads=4, state_dim=8,
                                       depth=2, max_len=T, d_ff=48), rngs=rngs)
  raise ValueError(name)


MODELS = ("baseline", "assoc", "unimatrix")
LM_STEPS = ("--config.train.n_steps=4",)   # the byte LM's run, data-parallel over 8 devices vs 1


def run(name: str, workdir: str, *, model_axis: int, devices=None, steps: int = 3, dtype: str = "float32"):
  tokens = (np.arange(4000) * 7 + np.arange(4000) // 5) % VOCAB
  task = TrainTask(init_model=lambda rngs: make_model(name, rngs, dtype), loss_fn=lm_loss,
                   train_iter=RandomWindows(tokens, T, BATCH, seed=1))
  cfg = TrainConfig(n_steps=steps, lr=3e-3, warmup_steps=1, ckpt_every=100, log_every=1, model_axis=model_axis)
  return train(task, cfg, workdir, progress=False, devices=devices)


def param_leaves(model) -> list:
  return jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def collectives(name: str, mesh) -> dict:
  """How many of each collective the compiled, sharded gradient of the LM loss contains."""
  import re

  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxmem import sharding
  g, p, r = nnx.split(make_model(name, nnx.Rngs(0)), nnx.Param, ...)
  psh = sharding.state_shardings(p, mesh)
  f = jax.jit(jax.grad(lambda p, b: lm_loss(nnx.merge(g, p, r), b)[0]),
              in_shardings=(psh, NamedSharding(mesh, P("data"))), out_shardings=psh)
  b = {"inputs": jnp.zeros((BATCH, T), jnp.int32), "targets": jnp.zeros((BATCH, T), jnp.int32)}
  with jax.set_mesh(mesh):
    hlo = f.lower(p, b).compile().as_text()
  return {op: len(re.findall(rf"\s{op}(?:-start)?\(", hlo)) for op in COLLECTIVES}


def main(out: str, workroot: str) -> None:
  from jaxmem import sharding
  assert jax.device_count() == 8, jax.devices()
  arrays, meta = {}, {}
  from tests.conftest import tiny_lm_config
  lm = train_lm(tiny_lm_config(*LM_STEPS), f"{workroot}/lm", progress=False)
  for i, x in enumerate(jax.tree.leaves(nnx.state(lm.model, nnx.Param))):
    arrays[f"lm:{i}"] = np.asarray(x)
  meta["lm"] = {"val_bpb": lm.final_metrics["val_bpb"]}
  try:
    train_lm(tiny_lm_config("--config.data.batch_size=12"), f"{workroot}/lm_bad", progress=False)
  except ValueError as e:
    meta["lm"]["divisibility_error"] = str(e)
  for name in MODELS:
    res = run(name, f"{workroot}/{name}", model_axis=4)
    mesh = sharding.make_mesh(model=4)
    meta[name] = {"layout": sharding.layout_table(nnx.state(res.model, nnx.Param), mesh), "shards": {},
                  "collectives": collectives(name, mesh)}
    for path, x in param_leaves(res.model):
      key = f"{name}:{sharding.path_str(path)}"
      arrays[key] = np.asarray(x)
      meta[name]["shards"][sharding.path_str(path)] = list(x.addressable_shards[0].data.shape)
  np.savez(out, **arrays)
  with open(out + ".json", "w") as f:
    json.dump(meta, f)
  print("SHARDED RUNS OK")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2])
