"""The corrected three-token benchmark (``jaxmem/experiments/unimatrix/three_token.py``); each field is a
field of ``ThreeTokenSettings``.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_three_token
Full (accelerator):    jaxmem reproduce --only unimatrix_three_token
Typed-Latent only:     jaxmem reproduce --only unimatrix_three_token \
                         --config.unimatrix_three_token.models="('typed_latent',)"

Typed-Latent has its own budget (``budgets``): 1,000 steps × batch 128 at peak lr 3e-2, the same in both
sizes. The quick size gives the other models 200 steps × batch 32 (full: 10,000 × 64) and two seeds (full:
three).
"""

import ml_collections

MODELS = ("transformer", "core", "sparse_pointer", "typed_latent", "triple_latent")
TYPED_LATENT = ("typed_latent", 1000, 128, 3e-2)


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(models=MODELS, seq_len=49, num_tags=4, train_steps=200, batch_size=32, lr=3e-3,
             budgets=(TYPED_LATENT,), seeds=(0, 1), eval_every=100, eval_batches=16)
  elif arg in (None, "full"):
    c.update(models=MODELS, seq_len=49, num_tags=4, train_steps=10000, batch_size=64, lr=1e-3,
             budgets=(TYPED_LATENT,), seeds=(0, 1, 2), eval_every=100, eval_batches=32)
  else:
    raise ValueError(f"unimatrix_three_token config variant must be 'quick' or 'full', got {arg!r}.")
  return c
