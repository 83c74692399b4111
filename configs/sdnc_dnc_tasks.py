"""DNC vs Transformer (= sDNC) vs the hybrids on copy, repeat copy and associative recall.

Settings of the ``dnc_tasks`` experiment (``jaxmem/experiments/sdnc/dnc_tasks.py``,
``docs/papers/sdnc.md``); each field is a field of ``DNCTasksSettings`` (``dnc``: its
``DNCSizes``). Every model trains on lengths ≤ L and is scored at L, 2L, 3L and 4L.

Quick (2 CPU cores):  jaxmem reproduce --quick --only dnc_tasks
Full (accelerator):   jaxmem reproduce --only dnc_tasks
One task, e.g.:       jaxmem reproduce --quick --only dnc_tasks --config.dnc_tasks.tasks="('copy',)"

Expected (quick, about 30 min on 2 cores; bit error in range / at 2L / 3L / 4L):
  copy (L=6): DNC 0.00% / 0.07% / 5.40% / 17.58%; Transformer = sDNC 0.15% / 44.62% / 45.38% / 40.13%
    (same weights, max |Δ logits| ≈ 3e-5); the hybrids 0.00% in range, 42–48% beyond;
  repeat copy (L=3): DNC 9.56%, Transformer and hybrids 0.00–0.12% in range, 30–48% beyond;
  associative recall (4 items): DNC 24.87%, Transformer 15.53%, hybrids 15–17% in range, 42–50% beyond.
The Transformer rows fit the training range and guess beyond it, so they move by a few points with
any float round-off (e.g. the order in which global-norm clipping sums the gradient); the runs are
bitwise reproducible on one machine.
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.update(tasks=("copy", "repeat_copy", "associative_recall"), num_bits=6, norm_max=10,
           models=("dnc", "transformer", "+write_gate", "+erase", "+link_reads", "+all_three"),
           longer=(2, 3, 4))   # the models trained; the longer lengths scored, as multiples of L
  if arg == "quick":
    c.update(copy_length=6, repeat_length=3, max_repeats=2, item_length=2, max_items=4, d_model=48,
             dnc=dict(memory_size=64, word_size=16, num_reads=1, hidden_size=64),
             n_steps=1500, batch_size=16, lr=3e-3, log_every=25, eval_batches=(8, 4))
  elif arg in (None, "full"):
    c.update(copy_length=10, repeat_length=5, max_repeats=3, item_length=3, max_items=6, d_model=128,
             dnc=dict(memory_size=128, word_size=32, num_reads=4, hidden_size=256),
             n_steps=20000, batch_size=32, lr=1e-3, log_every=100, eval_batches=(16, 8))
  else:
    raise ValueError(f"sdnc_dnc_tasks config variant must be 'quick' or 'full', got {arg!r}.")
  return c
