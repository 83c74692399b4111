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


TOKENS = jax.random.randint(jax.random.key(1), (2, T + 1), 0, 64)
BATCH = {"inputs": TOKENS[:, :-1], "targets": TOKENS[:, 1:]}


def _grad_and_temp_bytes(model):
  """The parameter gradients of the LM loss and XLA's temp memory of that compiled backward pass: one compile
  serves both (``lower().compile()`` then the compiled program's call)."""
  g, p, r = nnx.split(model, nnx.Param, ...)
  compiled = jax.jit(jax.grad(lambda p: lm_loss(nnx.merge(g, p, r), BATCH)[0])).lower(p).compile()
  return jax.tree.leaves(compiled(p)), compiled.memory_analysis().temp_size_in_bytes


def _scan_residuals(model, capsys) -> list:
  """Trailing dims of the per-layer tensors the backward pass keeps from the layer / depth scan (traced)."""
  g, p, r = nnx.split(model, nnx.Param, ...)
  capsys.readouterr()
  print_saved_residuals(lambda p: lm_loss(nnx.merge(g, p, r), BATCH)[0], p)
  lines = capsys.readouterr().out.splitlines()
  pattern = re.compile(rf"f32\[\d+,2,{T},(\d+)\] output of scan")
  return sorted(int(m.group(1)) for line in lines if (m := pattern.match(line)))


@pytest.mark.parametrize("make", [_transformer, _unimatrix], ids=["transformer_assoc", "unimatrix_core"])
@pytest.mark.slow
def test_every_policy_gives_the_same_gradients_keeps_what_it_says_and_saves_memory(make, capsys):
  ref, mem_none = _grad_and_temp_bytes(make())
  kept = {}
  for name in REMAT_POLICIES:
    model = make(remat=True, remat_policy=name)
    grads, mem = _grad_and_temp_bytes(model)
    for a, b in zip(grads, ref, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=name)
    if name == "full":
      assert mem < 0.6 * mem_none, (mem, mem_none)   # XLA's compiled temp memory of the backward pass
    kept[name] = _scan_residuals(model, capsys)
  D, H, F = 64, 4, 256
  assert kept["full"] == [D]                        # only each layer's input
  assert {3 * D, F} <= set(kept["dots"]) and H in kept["dots"] and D in kept["dots"]  # + q/k/v, FFN, gates


def test_unknown_policies_raise():
  with pytest.raises(ValueError, match="TransformerConfig.remat_policy"):
    TransformerConfig(remat_policy="some")
  with pytest.raises(ValueError, match="UniMatrixConfig.remat_policy"):
    UniMatrixConfig(variant="core", vocab_size=8, remat_policy=None)
