"""Depth vs width at equal parameters on associative recall, trained (Pavlovian paper, result 2).

Settings of the ``assoc_depth_width`` experiment (``jaxmem/experiments/pavlovian/depth_width.py``,
``docs/papers/pavlovian.md``); each field is a field of ``DepthWidthSettings``, ``tasks`` a
list of ``{name, hops, num_items}`` (``hops`` 1: MQAR with ``num_items`` pairs; ≥ 2:
multi-hop recall with ``num_items`` chains) and ``shapes`` ``(L, d_model)`` pairs at about
equal ``L·d_model²``, wide-shallow first.

Quick (2 CPU cores, about 55 min):  jaxmem reproduce --quick --only assoc_depth_width
Full (accelerator):                 jaxmem reproduce --only assoc_depth_width
Smaller, e.g.:  jaxmem reproduce --quick --only assoc_depth_width --config.assoc_depth_width.seeds='(0,)'

Expected (quick; delta rule, MQAR with 8 pairs, mean of three seeds): wide-shallow wins,
0.764 (L=2, d=64) vs 0.575 (L=4, d=48) vs 0.136 (L=8, d=32); the widest beats the deepest
on every seed.
(Measured before the mixer refactor, which reorders parameters; a seed near the learning
transition can move with float round-off.)

The full shape (6, 90) is not a multiple of head_dim 16, so the full run stops there with a
ValueError (kept as it was; (6, 96) would hold L·d² within 13 %).
"""

import ml_collections


def get_config(arg=None):
  c = ml_collections.ConfigDict()
  c.update(tasks=[dict(name="MQAR", hops=1, num_items=8)], shapes=((2, 64), (4, 48), (8, 32)),
           rules=("delta",), head_dim=16, vocab_size=128, seq_len=64, short_conv=4, n_steps=1000,
           batch_size=64, lr=3e-3, eval_batches=8, seeds=(0, 1, 2))
  if arg in (None, "full"):
    c.update(tasks=[dict(name="MQAR", hops=1, num_items=16), dict(name="2-hop recall", hops=2, num_items=8),
                    dict(name="3-hop recall", hops=3, num_items=6)],
             shapes=((3, 128), (6, 90), (12, 64)), rules=("hebb", "delta", "gated_delta", "softmax"),
             vocab_size=512, seq_len=128, n_steps=6000)
  elif arg != "quick":
    raise ValueError(f"pavlovian_depth_width config variant must be 'quick' or 'full', got {arg!r}.")
  return c
