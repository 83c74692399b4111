"""Pure memory kernels: no Flax, no globals, no Python loops over time.

* :mod:`~jaxmem.kernels.ahat` — average hard attention (argmax set, ties averaged) and its
  soft limit ``softmax(β·q·k)``: the attention of exact constructions.
* :mod:`~jaxmem.kernels.attention` — softmax attention (write-once memory, fast form).
* :mod:`~jaxmem.kernels.sdnc` — the same memory run literally as a stateless DNC.
* :mod:`~jaxmem.kernels.dnc` — the full DNC memory access (Graves et al. 2016).
* :mod:`~jaxmem.kernels.assoc` — associative matrix memories (Hebb, delta, Oja, decay,
  gated delta) in recurrent, parallel and chunked forms.
* :mod:`~jaxmem.kernels.matrix_state` — UniMatrix's gated matrix state (outer / diagonal /
  symmetric updates, spectral normalisation), recurrent and chunked (on the ``decay`` rule).
* :mod:`~jaxmem.kernels.slots` — the sparse slot memory (merge / fill / evict, top-K read,
  pointer logits) as a scan over tokens.
* :mod:`~jaxmem.kernels.rosa` — RWKV-8's ROSA next-token predictor (longest earlier suffix
  match), vectorised in JAX and as an online suffix automaton.
* :mod:`~jaxmem.kernels.topk_memory` — a dense append-only memory read by top-K cosine attention.
* :mod:`~jaxmem.kernels.segsum` — segment sums of log-decays (decay masks without
  subtracting cumulative sums).
* :mod:`~jaxmem.kernels.precision` — matmul precision, and its CPU emulation of bf16 / TF32
  platforms.

Inference has one shape for every memory that has one: ``state = <module>.init(...)``, then
``state, out = <module>.step(state, ...)`` per token (``assoc.init`` / ``assoc.step``,
``dnc.init`` / ``dnc.step`` / ``dnc.scan``). The DNC's are exported here under their older,
unambiguous names ``dnc_init`` / ``dnc_step`` / ``dnc_scan`` (aliases of the same functions).
"""

from jaxmem.kernels import (
    ahat,
    assoc,
    attention,
    dnc,
    matrix_state,
    precision,
    rosa,
    sdnc,
    segsum,
    slots,
    topk_memory,
)
from jaxmem.kernels.ahat import ahat_attention, soft_attention
from jaxmem.kernels.assoc import associative_memory
from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.dnc import DNCInterface, DNCState, dnc_init, dnc_scan, dnc_step, parse_interface
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_cross_attention

__all__ = [
    "DNCInterface", "DNCState", "ahat", "ahat_attention", "assoc", "associative_memory", "attention",
    "dnc", "dnc_init", "dnc_scan", "dnc_step", "matrix_state", "parse_interface", "precision", "rosa", "sdnc",
    "sdnc_attention", "sdnc_cross_attention", "segsum", "slots", "soft_attention", "softmax_attention",
    "topk_memory",
]
