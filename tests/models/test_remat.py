"""Rematerialisation policies (jaxmem.models.remat): same gradients as no remat, less compiled memory,
and each policy keeps what it says (the residuals jax saves from the layer / depth scan)."""

import re

import jax
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from jaxmem.models import TransformerConfig, TransformerLM, UniMatrixConfig, UniMatrixLM
from jaxmem.models.mixers import AssocConfig
from jaxmem.models.remat import REMAT_POLICIES
from jaxmem.train import lm_loss

T = 128


def _transformer(**kw):
  return TransformerLM(TransformerConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_len=T,
                                         mixer=AssocConfig(rule="delta", chunk_size=32), **kw),
                       rngs=nnx.Rngs(0))


def _unimatrix(**kw):
  return UniMatrixLM(UniMatrixConfig(variant="core", vocab_size=64, d_model=64, n_heads=4, state_dim=16,
                                     max_len=T, **kw), rngs=nnx.Rngs(0))


def _grad_and_temp_bytes(model):
  g, p, r = nnx.split(model, nnx.Param, ...)
  tokens = jax.random.randint(jax.random.key(1), (2, T + 1), 0, 64)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  f = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(g, p, r), batch)[0]))
  temp = f.lower(p).compile().memory_analysis().temp_size_in_bytes
  return jax.tree.leaves(f(p)), temp


def _scan_residuals(model, capsys) -> list:
  """Trailing dims of the per-layer tensors the backward pass keeps from the layer / depth scan."""
  g, p, r = nnx.split(model, nnx.Param, ...)
  tokens = jax.random.randint(jax.random.key(1), (2, T + 1), 0, 64)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  capsys.readouterr()
  print_saved_residuals(lambda p: lm_loss(nnx.merge(g, p, r), batch)[0], p)
  lines = capsys.readouterr().out.splitlines()
  pattern = re.compile(r"f32\[\d+,2,128,(\d+)\] output of scan")
  return sorted(int(m.group(1)) for line in lines if (m := pattern.match(line)))


@pytest.mark.parametrize("make", [_transformer, _unimatrix], ids=["transformer_assoc", "unimatrix_core"])
def test_every_policy_gives_the_same_gradients_keeps_what_it_says_and_saves_memory(make, capsys):
  ref, mem_none = _grad_and_temp_bytes(make())
  for name in REMAT_POLICIES:
    grads, mem = _grad_and_temp_bytes(make(remat=True, remat_policy=name))
    for a, b in zip(grads, ref, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=name)
    if name == "full":
      assert mem < 0.6 * mem_none, (mem, mem_none)   # XLA's compiled temp memory of the backward pass
  D, H, F = 64, 4, 256
  kept = {name: _scan_residuals(make(remat=True, remat_policy=name), capsys) for name in REMAT_POLICIES}
  assert kept["full"] == [D]                        # only each layer's input
  assert {3 * D, F} <= set(kept["dots"]) and H in kept["dots"] and D in kept["dots"]  # + q/k/v, FFN, gates


def test_unknown_policies_raise():
  with pytest.raises(ValueError, match="TransformerConfig.remat_policy"):
    TransformerConfig(remat_policy="some")
  with pytest.raises(ValueError, match="UniMatrixConfig.remat_policy"):
    UniMatrixConfig(variant="core", vocab_size=8, remat_policy=None)
