"""MQAR (Zoology) accuracy vs width: softmax attention vs each associative learning rule.

Settings of the ``mqar`` experiment (``jaxmem/experiments/pavlovian/mqar.py``,
``docs/papers/pavlovian.md``); each field is a field of ``MQARSettings``.

Quick (2 CPU cores, about 80 min):  jaxmem reproduce --quick --only mqar
Full (accelerator):                 jaxmem reproduce --only mqar
Smaller, e.g.:  jaxmem reproduce --quick --only mqar --config.mqar.widths='(16,)' --config.mqar.n_steps=200
Fewer models:   --config.mqar.models="('softmax', 'delta')"   (a subset of the six, trained in their order)

Expected (quick; accuracy at d_model = 16 / 32 / 64, one seed):
  softmax 0.999 / 1.000 / 1.000, hebb 0.149 / 0.229 / 0.933, delta 0.173 / 0.908 / 1.000,
  oja 0.169 / 0.216 / 1.000, decay 0.124 / 0.578 / 0.262, gated_delta 0.132 / 0.420 / 1.000.
(Measured before the mixer refactor, which reorders parameters; cells near a learning transition
can move with float round-off.)
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  if arg == "quick":
    c.update(vocab_size=256, seq_len=64, num_kv_pairs=4, widths=(16, 32, 64), n_layers=2, n_heads=2,
             short_conv=4, n_steps=1000, batch_size=64, lr=3e-3, eval_batches=8)
  elif arg in (None, "full"):
    c.update(vocab_size=8192, seq_len=256, num_kv_pairs=16, widths=(64, 128, 256), n_layers=2, n_heads=2,
             short_conv=4, n_steps=20000, batch_size=64, lr=1e-3, eval_batches=16)
  else:
    raise ValueError(f"pavlovian_mqar config variant must be 'quick' or 'full', got {arg!r}.")
  c.models = ("softmax", "hebb", "delta", "oja", "decay", "gated_delta")   # which of them to train
  return c
