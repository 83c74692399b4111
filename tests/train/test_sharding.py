"""Data × model sharding (jaxmem.sharding): the layout rules, and a (data=2, model=4) mesh of 8 fake CPU
devices training exactly as one device does, for the baseline, an associative-memory LM and a UniMatrix LM."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend.core import jaxprs_in_params
from jax.sharding import PartitionSpec as P

from jaxmem import sharding
from jaxmem.train import TrainConfig, lm_loss, train_lm
from tests.conftest import REPO, subprocess_env, tiny_lm_config
from tests.train import sharded_models


class _FakeMesh:  # spec_for only reads axis names and sizes
  def __init__(self, data, model):
    self.axis_names = ("data", "model")
    self.devices = np.empty((data, model))


def _specs(name, data=2, model=4):
  model_ = sharded_models.make_model(name, nnx.Rngs(0))
  params = nnx.state(model_, nnx.Param)
  mesh = _FakeMesh(data, model)
  specs = sharding.state_specs(params, mesh)
  return {sharding.path_str(p): s for p, s in jax.tree_util.tree_leaves_with_path(specs)}


def test_heads_and_ffn_hidden_go_to_model_and_the_rest_is_replicated():
  s = _specs("baseline")
  assert s["blocks/attn/qkv/kernel"] == P(None, None, "model")  # [layers, embed, 3·heads·head_dim]
  assert s["blocks/attn/out/kernel"] == P(None, "model")         # [layers, heads·head_dim, embed]
  assert s["blocks/ffn/up/kernel"] == P(None, None, "model")
  assert s["blocks/ffn/up/bias"] == P(None, "model")
  assert s["blocks/ffn/down/kernel"] == P(None, "model")
  for name in ("embed/embedding", "pos", "ln_f/scale", "blocks/ln1/scale", "blocks/ffn/down/bias"):
    assert s[name] == P(), name
  a = _specs("assoc")
  assert a["blocks/attn/beta/kernel"] == P(None, None, "model")
  assert a["blocks/attn/beta/bias"] == P(None, "model")
  u = _specs("unimatrix")
  assert u["block/mixer/proj/kernel"] == P(None, "model") and u["block/mixer/rho/kernel"] == P(None, "model")
  assert u["block/mixer/out/kernel"] == P("model") and u["block/mixer/gate/kernel"] == P()


def test_a_dimension_the_axis_does_not_divide_stays_replicated_and_model_1_is_pure_data_parallel():
  s = _specs("unimatrix", data=1, model=8)   # 4 heads over 8 devices: rho's head axis cannot split
  assert s["block/mixer/rho/kernel"] == P() and s["block/mixer/proj/kernel"] == P(None, "model")
  assert all(v == P() for v in _specs("baseline", data=8, model=1).values())


def test_optimizer_state_gets_the_parameters_layout():
  # the train state as train() builds it: AdamW's mu / nu mirror the parameters, logical axes included
  import optax
  params = nnx.state(nnx.eval_shape(lambda: sharded_models.make_model("baseline", nnx.Rngs(0))), nnx.Param)
  tree = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": optax.adamw(1e-3).init(params)}
  specs = sharding.state_specs(tree, _FakeMesh(2, 4))
  assert jax.tree.structure(specs) == jax.tree.structure(tree)
  by_path = {sharding.path_str(p): s for p, s in jax.tree_util.tree_leaves_with_path(specs)}
  assert by_path["params/blocks/attn/qkv/kernel"] == P(None, None, "model")
  assert by_path["opt_state/0/mu/blocks/attn/qkv/kernel"] == P(None, None, "model")
  assert by_path["opt_state/0/nu/blocks/ffn/down/kernel"] == P(None, "model")
  assert by_path["opt_state/0/count"] == P() and by_path["step"] == P()


def test_constrain_is_the_identity_without_a_mesh_and_bad_meshes_raise():
  x = jnp.arange(24.0).reshape(1, 2, 3, 4)
  assert sharding.constrain_heads(x) is x
  with pytest.raises(ValueError, match="`model`=3 does not divide the 1 devices"):
    sharding.make_mesh(model=3, devices=[jax.devices()[0]])
  with pytest.raises(ValueError, match="distinct devices"):
    sharding.make_mesh(devices=[jax.devices()[0]] * 2)
  with pytest.raises(ValueError, match="distinct devices"):
    sharding.make_mesh(devices=[])
  with pytest.raises(ValueError, match="`model`"):
    sharding.make_mesh(model=0)
  with pytest.raises(ValueError, match="`data`=2"):
    sharding.make_mesh(data=2, model=1, devices=[jax.devices()[0]])
  with pytest.raises(ValueError, match="model_axis"):
    TrainConfig(model_axis=0)


@pytest.mark.slow
def test_bfloat16_transformer_computes_in_bf16_and_keeps_float32_state(tmp_path):
  """Mixed precision is ``TransformerConfig.dtype="bfloat16"``: every matmul against a weight matrix takes
  bf16 operands, while parameters, gradients, optimizer state and the loss stay float32."""
  from jaxmem.train.loop import make_optimizer, make_train_step
  model = sharded_models.make_model("baseline", nnx.Rngs(0), "bfloat16")
  g, params, counters, rest = nnx.split(model, nnx.Param, nnx.RngCount, ...)
  tx = make_optimizer(TrainConfig(n_steps=4, warmup_steps=1))
  state = {"step": jnp.zeros((), jnp.int32), "params": params, "opt_state": tx.init(params)}
  zeros = jnp.zeros((2, sharded_models.T), jnp.int32)
  batch = {"inputs": zeros, "targets": zeros}
  jaxpr = jax.make_jaxpr(make_train_step(g, lm_loss, tx))(state, batch, rest)
  dots = []

  def walk(jp):
    for eqn in jp.eqns:
      if eqn.primitive.name == "dot_general":
        if min(len(v.aval.shape) for v in eqn.invars) == 2:   # a weight matrix: projections, FFN, logits
          dots.append(tuple(str(v.aval.dtype) for v in eqn.invars))
      for sub in jaxprs_in_params(eqn.params):
        walk(sub)
  walk(jaxpr.jaxpr)
  # forward and backward of q/k/v, out, FFN up/down and the tied read-out; the attention kernel keeps its
  # softmax and P·V in float32 (jaxmem.kernels.attention)
  assert len(dots) >= 10 and all(d == ("bfloat16", "bfloat16") for d in dots), sorted(set(dots))
  out_state = jax.eval_shape(make_train_step(g, lm_loss, tx), state, batch, rest)[0]
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(out_state["params"]))
  assert all(x.dtype in (jnp.float32, jnp.int32) for x in jax.tree.leaves(out_state["opt_state"]))
  res32 = sharded_models.run("baseline", tmp_path / "f32", model_axis=1, steps=4)
  res16 = sharded_models.run("baseline", tmp_path / "bf16", model_axis=1, steps=4, dtype="bfloat16")
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(res16.model, nnx.Param)))
  l32 = [r["loss"] for r in res32.history]
  l16 = [r["loss"] for r in res16.history]
  np.testing.assert_allclose(l16, l32, rtol=2e-2)        # bf16 activations: ~3 significant digits
  assert not np.allclose(l16, l32, rtol=1e-6)            # and they are bf16
  assert l16[-1] < l16[0]


@pytest.mark.slow
def test_8_devices_equal_one_device_data2_model4_and_data8(synthetic_data_dir, tmp_path):
  """One subprocess with 8 fake CPU devices: the three models on a (data=2, model=4) mesh, and the byte LM
  (train_lm: training and the sharded validation pass) data-parallel over all 8, each equal to 1 device."""
  out = str(tmp_path / "sharded.npz")
  env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
  # the 1-device references train here after the subprocess (not beside it: on 2 cores that was no faster)
  r = subprocess.run([sys.executable, "-m", "tests.train.sharded_models", out, str(tmp_path / "w8")], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  single_lm = train_lm(tiny_lm_config(*sharded_models.LM_STEPS), tmp_path / "lm1", progress=False)
  singles = {name: sharded_models.run(name, tmp_path / f"w1_{name}", model_axis=1)
             for name in sharded_models.MODELS}
  sharded = np.load(out)
  meta = json.loads(open(out + ".json").read())
  for name in sharded_models.MODELS:
    single = singles[name]
    leaves = sharded_models.param_leaves(single.model)
    assert len(leaves) == sum(k.startswith(name + ":") for k in sharded.files)
    for path, a in leaves:
      key = sharding.path_str(path)
      np.testing.assert_allclose(sharded[f"{name}:{key}"], a, rtol=2e-5, atol=2e-6, err_msg=f"{name} {key}")
    # the parameters really were split over the 4 model devices
    shards = meta[name]["shards"]
    if name == "unimatrix":
      assert shards["block/mixer/proj/kernel"] == [32, 24] and shards["block/ffn/up/kernel"] == [32, 12]
    else:
      assert shards["blocks/attn/qkv/kernel"] == [2, 32, 24] and shards["blocks/ffn/down/kernel"] == [2, 12, 32]
      assert shards["embed/embedding"] == [32, 32]
  # the memory kernels run per device on their own heads (jaxmem.sharding.map_heads): they add no
  # all-gather to the softmax baseline's (its fused q/k/v reshape); GSPMD alone gathered heads inside
  # the kernels' scans over time (14 / 13 all-gathers for assoc / unimatrix instead of 2)
  col = {name: meta[name]["collectives"] for name in sharded_models.MODELS}
  assert col["assoc"]["all-gather"] <= col["baseline"]["all-gather"], col
  assert col["unimatrix"]["all-gather"] <= col["baseline"]["all-gather"], col
  assert all(c["all-to-all"] == 0 for c in col.values()), col
  print("\ncollectives per sharded gradient:", col)
  # data-parallel over 8: the same parameters and validation bpb as one device; a batch of 12 is refused
  single = single_lm
  leaves = jax.tree.leaves(nnx.state(single.model, nnx.Param))
  assert len(leaves) == sum(k.startswith("lm:") for k in sharded.files)
  for i, a in enumerate(leaves):
    np.testing.assert_allclose(sharded[f"lm:{i}"], a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(meta["lm"]["val_bpb"], single.final_metrics["val_bpb"], rtol=1e-5)
  assert "batch size 12" in meta["lm"]["divisibility_error"] and "8 devices" in meta["lm"]["divisibility_error"]


@pytest.mark.slow
def test_every_mixer_splits_its_heads_on_a_model_axis_of_2_and_computes_as_one_device(tmp_path):
  """Each registered mixer, laid out by its parameters' logical axes alone (jaxmem.sharding): a 2-layer LM's
  loss and gradient on a (data=1, model=2) mesh of 2 fake CPU devices equal one device's, its kernel runs per
  device (inside jax.shard_map), and some of its parameters really are split in half."""
  out = tmp_path / "mixers.json"
  env = subprocess_env(XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "tests.train.sharded_mixers", str(out)], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads(out.read_text())
  from jaxmem.models import mixers
  assert sorted({k.split("/")[0] for k in results}) == mixers.names()
  for name, res in results.items():
    # float32 sums regrouped across two devices: a few ulps of the loss's scale
    assert res["max_abs_diff"] <= 1e-5 * max(1.0, res["scale"]), (name, res["max_abs_diff"])
    # the per-head kernel runs per device (map_heads: QKVMixer's for every QKV mixer, the others' own), not
    # left to GSPMD, which all-gathers heads inside scans over time
    assert res["shard_map"], f"{name}: its kernel does not run under jax.shard_map (jaxmem.sharding.map_heads)"
    # decoding's prefill (`scan` from the decoding state) too, with the same logits as on one device
    assert res["prefill_shard_map"], f"{name}: its prefill kernel does not run under jax.shard_map"
    assert res["prefill_max_abs_diff"] <= 1e-5 * max(1.0, res["prefill_scale"]), \
        (name, res["prefill_max_abs_diff"])
    split = [p for p, (full, local) in res["shapes"].items() if full != local]
    assert split, f"{name}: no parameter of its mixer is split over the model axis\n{res['layout']}"
    for p in split:
      full, local = res["shapes"][p]
      assert sorted(a // b for a, b in zip(full, local, strict=True) if a != b) == [2], (name, p, full, local)
