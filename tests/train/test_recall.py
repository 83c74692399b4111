"""jaxmem.train.recall: recall loss and accuracy count only query positions; mixers, schedule,
state sizes; a second call in a finished workdir returns the trained weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxmem.models import AssocConfig, SoftmaxConfig, TransformerConfig, TransformerLM
from jaxmem.tasks.mqar import mqar_stream
from jaxmem.train.losses import recall_loss
from jaxmem.train.recall import recall_accuracy, recall_mixer, recall_train_config, train_recall


@pytest.mark.slow
def test_recall_loss_counts_only_query_positions():
  class Oracle:
    def __call__(self, inputs):
      logits = jnp.full(inputs.shape + (8,), -10.0)
      return logits.at[0, 1, 5].set(10.0).at[0, 3, 2].set(10.0)  # right at t=1, wrong at t=3
  batch = {"inputs": jnp.zeros((1, 4), jnp.int32), "targets": jnp.array([[0, 5, 0, 7]]),
           "mask": jnp.array([[0.0, 1.0, 0.0, 1.0]])}
  loss, metrics = recall_loss(Oracle(), batch)
  assert float(metrics["accuracy"]) == 0.5
  assert float(loss) > 0
  # the loss is the mean NLL over the two query positions only: ≈ 0 at t=1, ≈ 20 at t=3
  assert abs(float(loss) - (np.log1p(7 * np.exp(-20.0)) + 20.0 + np.log1p(7 * np.exp(-20.0))) / 2) < 1e-4


class Lookup(nnx.Module):
  """Logits that are a fixed table of the input token (a trainable-free, deterministic model)."""

  def __init__(self, vocab: int):
    self.table = nnx.Param(jnp.asarray(np.random.default_rng(0).normal(size=(vocab, vocab)), jnp.float32))

  def __call__(self, inputs):
    return self.table[inputs]


def test_recall_accuracy_matches_numpy_at_query_positions():
  model, stream = Lookup(32), mqar_stream(3, batch_size=8, vocab_size=32, seq_len=16, num_kv_pairs=2)
  accs = []
  for i in range(3):
    b = stream.batch_at(i)
    hit = (np.asarray(model.table)[b["inputs"]].argmax(-1) == b["targets"]) & (b["mask"] > 0)
    accs.append(hit.sum() / (b["mask"] > 0).sum())
  assert abs(recall_accuracy(model, stream, 3) - float(np.mean(accs))) < 1e-6


def test_recall_mixer_and_schedule():
  assert recall_mixer("softmax", 4) == SoftmaxConfig(short_conv=4)
  for rule in ("hebb", "delta", "oja", "decay", "gated_delta"):
    m = recall_mixer(rule)
    assert isinstance(m, AssocConfig) and m.rule == rule and m.mode == "chunked" and m.chunk_size == 16
    assert m.key_norm == (rule in ("delta", "oja", "gated_delta")) and m.short_conv == 0
  c = recall_train_config(1000, 3e-3, seed=2)
  assert (c.n_steps, c.lr, c.warmup_steps, c.weight_decay, c.grad_clip, c.ckpt_every, c.keep_checkpoints,
          c.log_every, c.seed) == (1000, 3e-3, 100, 0.0, 1.0, 250, 1, 25, 2)
  assert recall_train_config(20, 1e-3).warmup_steps == 2


def test_state_floats_closed_forms():
  base = dict(vocab_size=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, max_len=16)
  assert TransformerConfig(**base, mixer=recall_mixer("softmax")).state_floats(16) == 3 * 2 * 16 * 32
  assert TransformerConfig(**base, mixer=recall_mixer("delta")).state_floats(16) == 3 * 4 * 8 * 8
  # a short convolution carries its last K − 1 inputs of q, k and v
  assert TransformerConfig(**base, mixer=recall_mixer("delta", 4)).state_floats(16) == 3 * (4 * 8 * 8 + 3 * 96)
  # a per-layer tuple counts each layer's own state: one KV cache + two matrix memories
  mixed = (recall_mixer("softmax"), recall_mixer("delta"), recall_mixer("delta"))
  assert TransformerConfig(**base, mixer=mixed).state_floats(16) == 2 * 16 * 32 + 2 * 4 * 8 * 8


@pytest.mark.slow
def test_train_recall_trains_and_a_second_call_returns_the_same_weights(tmp_path):
  mcfg = TransformerConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_len=16,
                           mixer=recall_mixer("delta"))
  stream = lambda: mqar_stream(0, batch_size=4, vocab_size=32, seq_len=16, num_kv_pairs=2)
  cfg = recall_train_config(4, 1e-2)
  first = train_recall(mcfg, stream(), cfg, tmp_path / "w", progress=False)
  init = TransformerLM(mcfg, rngs=nnx.Rngs(cfg.seed))   # the loop's initialisation
  again = train_recall(mcfg, stream(), cfg, tmp_path / "w", progress=False)
  leaves = lambda m: [np.asarray(x) for x in jax.tree.leaves(nnx.state(m, nnx.Param))]
  assert any(not np.array_equal(a, b) for a, b in zip(leaves(first), leaves(init), strict=True))  # trained
  for a, b in zip(leaves(first), leaves(again), strict=True):                                       # restored
    np.testing.assert_array_equal(a, b)
