"""The paper's associative recall and slot ablation (``jaxmem/experiments/unimatrix/recall.py``,
``docs/papers/unimatrix.md``); each field is a field of ``RecallSettings``.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_recall
Full (accelerator):    jaxmem reproduce --only unimatrix_recall
Smaller, e.g.:         jaxmem reproduce --quick --only unimatrix_recall \
                         --config.unimatrix_recall.seeds='(0,)' --config.unimatrix_recall.ablation_pairs='()'

Ablation rows (``ablation_row``): ``"<slots> [no-pointer] [no-gate]"``, or ``"accumulate"`` (strengths
accumulated on a merge), ``"prev_token"`` (slot query ``E[x_{t−1}]``) and ``"merge_by_id"`` (merges by the key
token's id instead of the cosine).
"""

import ml_collections

MODELS = ("transformer", "core", "rosa", "discovery", "dense_memory", "hybrid", "sparse_pointer",
          "sparse_pointer_dropout")
# every slots × pointer × write-gate cell of the paper's ablation and the cells it leaves out
GRID = tuple(f"{n}{p}{g}" for n in (4, 8, 16, 32) for p in ("", " no-pointer") for g in ("", " no-gate"))
# the paper's rows at 8, 16 and 32 slots
PAPER_ROWS = ("8", "16", "32 no-pointer", "32", "32 no-gate")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(models=MODELS, num_pairs=4, seq_len=128, train_steps=300, batch_size=16, lr=3e-3, eval_batches=4,
             seeds=(0, 1, 2), ablation_pairs=(4, 6, 8), ablation_rows=PAPER_ROWS + ("merge_by_id",))
  elif arg in (None, "full"):
    c.update(models=MODELS, num_pairs=4, seq_len=128, train_steps=5000, batch_size=64, lr=1e-3, eval_batches=16,
             seeds=(0, 1, 2), ablation_pairs=(4, 6, 8),
             ablation_rows=GRID + ("accumulate", "prev_token", "merge_by_id"))
  else:
    raise ValueError(f"unimatrix_recall config variant must be 'quick' or 'full', got {arg!r}.")
  return c
