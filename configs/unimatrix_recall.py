"""The paper's associative recall and slot ablation (``jaxmem/experiments/unimatrix/recall.py``,
``docs/papers/unimatrix.md``); each field is a field of ``RecallSettings``.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_recall
Full (accelerator):    jaxmem reproduce --only unimatrix_recall
Smaller, e.g.:         jaxmem reproduce --quick --only unimatrix_recall \
                         --config.unimatrix_recall.train_steps=200
"""

import ml_collections

MODELS = ("transformer", "core", "rosa", "discovery", "assoc", "sparse_pointer", "sparse_pointer_dropout")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(models=MODELS, num_pairs=4, seq_len=128, train_steps=300, batch_size=16, lr=3e-3, eval_batches=4,
             ablation_pairs=(4,), ablation_rows=(3, 4, 5, 6, 7, 8))
  elif arg in (None, "full"):
    c.update(models=MODELS, num_pairs=4, seq_len=128, train_steps=5000, batch_size=64, lr=1e-3, eval_batches=16,
             ablation_pairs=(4, 6, 8), ablation_rows=(0, 1, 2, 3, 4, 5, 6, 7, 8))
  else:
    raise ValueError(f"unimatrix_recall config variant must be 'quick' or 'full', got {arg!r}.")
  return c
