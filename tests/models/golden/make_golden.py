"""Writes ``golden.npz``: logits of the pre-mixer Transformer, the reference the mixer refactor is held to.

Run once, on the tree *before* token mixers became modules (commit bc9c4d3, where the
memory was chosen by flat ``TransformerConfig`` fields)::

  git worktree add /tmp/old bc9c4d3
  PYTHONPATH=/tmp/old python tests/models/golden/make_golden.py

Each case is the old flat-field spelling; ``tests/models/test_mixers.py`` builds the
same model from a mixer config with the same seed and checks that the weights (a
per-leaf checksum) and the logits match. The file is kept so the provenance of
``golden.npz`` is readable; it does not run on the current tree.
"""

import pathlib

import jax
import numpy as np
from flax import nnx

from jaxmem.models import EncoderDecoderConfig, SDNCEncoderDecoder, TransformerConfig, TransformerLM

TINY = dict(d_model=24, n_layers=2, n_heads=3, d_ff=40, max_len=16)
CASES = {
    "softmax": {},
    "softmax_conv": dict(short_conv=3),
    "softmax_bf16": dict(dtype="bfloat16"),
    "softmax_io": dict(input_dim=5, output_dim=4, positions="sinusoidal"),
    "softmax_untied_nopos": dict(tie_embeddings=False, positions="none", n_layers=3),
    "sdnc": dict(memory="sdnc"),
    "hybrid_all": dict(write_gate=True, erase=True, link_reads=True),
    "hybrid_write": dict(write_gate=True),
    "hybrid_erase": dict(erase=True),
    "hybrid_links": dict(link_reads=True),
    "hebb": dict(memory="assoc", assoc_rule="hebb", chunk_size=4),
    "hebb_elu1": dict(memory="assoc", assoc_rule="hebb", feature_map="elu1", chunk_size=4),
    "delta": dict(memory="assoc", assoc_rule="delta", chunk_size=4),
    "delta_raw": dict(memory="assoc", assoc_rule="delta", key_norm=False, chunk_size=4, assoc_mode="recurrent"),
    "oja": dict(memory="assoc", assoc_rule="oja", chunk_size=4),
    "decay": dict(memory="assoc", assoc_rule="decay", chunk_size=4, assoc_mode="parallel"),
    "gated_delta": dict(memory="assoc", assoc_rule="gated_delta", chunk_size=4),
    "gated_delta_conv": dict(memory="assoc", assoc_rule="gated_delta", short_conv=4, chunk_size=8,
                             assoc_precision="default"),
}


def checksums(model):
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  return np.array(sorted(float(np.abs(np.asarray(x, np.float64)).sum()) for x in leaves))


def main():
  out = {}
  rng = np.random.RandomState(0)
  tokens = rng.randint(0, 256, size=(2, 11)).astype(np.int32)
  inputs = rng.randn(2, 11, 5).astype(np.float32)
  out["tokens"], out["inputs"] = tokens, inputs
  for name, kw in CASES.items():
    cfg = TransformerConfig(**{**TINY, **kw})
    model = TransformerLM(cfg, rngs=nnx.Rngs(3))
    x = inputs if cfg.input_dim else tokens
    out[f"{name}/logits"] = np.asarray(model(x))[..., ::4]  # every 4th logit: keeps the file small
    out[f"{name}/params"] = checksums(model)
  ed_cfg = EncoderDecoderConfig(decoder=TransformerConfig(**TINY, memory="sdnc"))
  ed = SDNCEncoderDecoder(ed_cfg, rngs=nnx.Rngs(3))
  out["encdec_sdnc/logits"] = np.asarray(ed(tokens[:, :7], tokens))[..., ::4]
  out["encdec_sdnc/params"] = checksums(ed)
  path = pathlib.Path(__file__).with_name("golden.npz")
  np.savez_compressed(path, **out)
  print(f"wrote {path} ({path.stat().st_size} bytes, {len(CASES) + 1} models)")


if __name__ == "__main__":
  main()
