"""The corrected three-token benchmark (``jaxmem/experiments/unimatrix/three_token.py``); each field is a
field of ``ThreeTokenSettings``.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_three_token
Full (accelerator):    jaxmem reproduce --only unimatrix_three_token
"""

import ml_collections

MODELS = ("transformer", "core", "sparse_pointer", "typed_latent", "triple_latent")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(models=MODELS, seq_len=49, num_tags=4, train_steps=400, batch_size=32, lr=3e-3, eval_batches=4)
  elif arg in (None, "full"):
    c.update(models=MODELS, seq_len=49, num_tags=4, train_steps=10000, batch_size=64, lr=1e-3, eval_batches=16)
  else:
    raise ValueError(f"unimatrix_three_token config variant must be 'quick' or 'full', got {arg!r}.")
  return c
