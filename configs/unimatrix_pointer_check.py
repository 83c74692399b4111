"""The SparsePointer recall regression (``jaxmem/experiments/unimatrix/pointer_check.py``); each field is a
field of ``PointerCheckSettings``. Quick and full train alike; full scores on more held-out batches.

    jaxmem reproduce --quick --only unimatrix_pointer_check
    jaxmem reproduce --quick --only unimatrix_pointer_check \
      --config.unimatrix_pointer_check.options='{"slot_strength": "accumulate"}'   # strengths accumulated
"""

import ml_collections


def get_config(arg=None):
  if arg not in (None, "quick", "full"):
    raise ValueError(f"unimatrix_pointer_check config variant must be 'quick' or 'full', got {arg!r}.")
  c = ml_collections.ConfigDict()
  # full: the same training, scored on 16 held-out batches of 64 instead of 4
  c.update(seeds=(0, 1, 2), dropouts=(0.0, 0.1), num_pairs=4, seq_len=128, train_steps=300, batch_size=16,
           lr=3e-3, eval_batches=4 if arg == "quick" else 16, min_accuracy=0.9, options={})
  return c
