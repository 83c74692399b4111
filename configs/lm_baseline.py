"""Baseline byte-level Transformer LM on Tiny Shakespeare.

Full (accelerator):  jaxmem train --config configs/lm_baseline.py --workdir runs/lm
  (``configs/lm_baseline.py:full`` is the same config)
Quick (2 CPU cores, ~5 min):
  jaxmem train --config configs/lm_baseline.py:quick --workdir runs/lm_quick
Expected (quick): validation 2.46 bits per byte (unigram 4.81, add-0.1 bigram 3.57).

Also the settings of the ``lm_baseline`` experiment (``jaxmem/experiments/foundation/lm_baseline.py``),
with n-gram baselines and a learning-curve figure:
  jaxmem reproduce --quick --only lm_baseline     (overrides: --config.lm_baseline.train.n_steps=100)

Every field of the model / data / train dataclasses is present (from their defaults), so
any of them can be overridden, e.g. a conditioning-circuit LM:
  --config.model.mixer.name=assoc --config.model.mixer.rule=delta --config.model.mixer.key_norm=true
"""

import ml_collections

from jaxmem.config_files import to_dict
from jaxmem.train.config import LMConfig


def get_config(arg=None):
  c = ml_collections.ConfigDict(to_dict(LMConfig()))
  c.model.update(vocab_size=256, d_model=384, n_layers=6, n_heads=6, d_ff=1536, max_len=256,
                 tie_embeddings=True, remat=False, dtype="float32")
  c.data.update(corpus="tinyshakespeare", path=None, seq_len=256, batch_size=64,
                eval_batch_size=64, eval_max_windows=64)
  c.train.update(n_steps=5000, lr=1e-3, min_lr_ratio=0.1, warmup_steps=200, weight_decay=0.1,
                 b1=0.9, b2=0.95, grad_clip=1.0, seed=0, ckpt_every=500, keep_checkpoints=3,
                 eval_every=500, log_every=10)
  if arg == "quick":
    c.model.update(d_model=128, n_layers=3, n_heads=4, d_ff=512, max_len=128)
    c.data.update(seq_len=128, batch_size=32, eval_max_windows=32)
    c.train.update(n_steps=600, lr=3e-3, warmup_steps=50, ckpt_every=200, eval_every=200,
                   log_every=10)
  elif arg not in (None, "full"):
    raise ValueError(f"lm_baseline config variant must be 'quick' or 'full' (or omitted), got {arg!r}.")
  return c
