"""Byte LM bits per byte for the UniMatrix family (``jaxmem/experiments/unimatrix/lm.py``); each field is a
field of ``LMSettings``. Needs Tiny Shakespeare (``JAXMEM_DATA_DIR``); WikiText-2 runs when its files are there.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_lm
Full (accelerator):    jaxmem reproduce --only unimatrix_lm
"""

import ml_collections

MODELS = ("transformer", "transformer_matched", "core", "rosa", "discovery", "hybrid", "triple_latent",
          "core_carry_state")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    # Discovery (recurrent form with an SVD per token for its spectral norm) is left to the full size
    c.update(corpora=("tinyshakespeare", "wikitext2"), models=tuple(m for m in MODELS if m != "discovery"),
             seq_len=128, batch_size=16, paper_steps=80, paper_lr=3e-4, curve_steps=300, curve_lr=3e-3,
             eval_every=100, eval_windows=32, seeds=(0, 1, 2))
  elif arg in (None, "full"):
    c.update(corpora=("tinyshakespeare", "wikitext2"), models=MODELS, seq_len=128, batch_size=16,
             paper_steps=80, paper_lr=3e-4, curve_steps=20000, curve_lr=2e-3, eval_every=1000, eval_windows=256,
             seeds=(0, 1, 2))
  else:
    raise ValueError(f"unimatrix_lm config variant must be 'quick' or 'full', got {arg!r}.")
  return c
