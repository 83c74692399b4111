"""The byte-level RULER subset (``jaxmem/experiments/unimatrix/ruler.py``); each field is a field of
``RulerSettings``. The tasks' smallest prompts are 444 (niah_single_1) to 1,017 (cwe) bytes, so lengths start
at 512, where only niah_single_1 fits; every task fits from 1,024.

Quick (2 CPU cores):   jaxmem reproduce --quick --only unimatrix_ruler
Full (accelerator):    jaxmem reproduce --only unimatrix_ruler
One task, e.g.:        jaxmem reproduce --quick --only unimatrix_ruler \
                         --config.unimatrix_ruler.tasks="('niah_single_1',)"
"""

import ml_collections

MODELS = ("transformer", "core", "sparse_pointer")
TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe")


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(models=MODELS, tasks=TASKS, lengths=(512, 1024), seeds=(0, 1), train_steps=8, batch_size=4,
             lr=3e-3, eval_examples=4)
  elif arg in (None, "full"):
    c.update(models=MODELS, tasks=TASKS, lengths=(1024, 2048, 4096), seeds=(0, 1, 2), train_steps=2000,
             batch_size=32, lr=1e-3, eval_examples=100)
  else:
    raise ValueError(f"unimatrix_ruler config variant must be 'quick' or 'full', got {arg!r}.")
  return c
