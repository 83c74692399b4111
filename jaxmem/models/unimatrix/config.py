"""UniMatrixConfig: the UniMatrix family as presets of one config (penzai's thin variants).

Every option the paper's variants differ in is a field; ``None`` means "the variant's
preset" (:data:`PRESETS`) and is resolved at construction, so ``UniMatrixConfig(variant="rosa")``
has ``rosa == "bigram"`` and ``UniMatrixConfig(variant="rosa", rosa="automaton")`` swaps
the paper's released-code path (a learned embedding of ``x_{t−1}``, a bigram feature) for
RWKV-8's suffix-automaton prediction.

============== ========= ============ ========== ========= ======== ======== ===== =======
variant        updates   rosa         deep_emb   step_emb  spectral dense    slots pointer
============== ========= ============ ========== ========= ======== ======== ===== =======
core           outer     none         no         no        no       no       0     no
rosa           outer     bigram       no         no        no       no       0     no
discovery      hybrid    bigram       yes        yes       yes      no       0     no
dense_memory   outer     none         no         no        no       top-8    0     no
sparse_pointer outer     none         no         no        no       no       32    yes
============== ========= ============ ========== ========= ======== ======== ===== =======

(dense_memory is the paper's UniMatrix-Assoc; sparse_pointer also has a learned write gate,
``write_gate=True``.)
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from jaxmem.checks import check_config_ints
from jaxmem.kernels import matrix_state as ms
from jaxmem.kernels.precision import PRECISIONS
from jaxmem.kernels.slots import STRENGTH_UPDATES
from jaxmem.models.bodies import BodyConfig
from jaxmem.models.mixers.matrix_state import RETENTIONS, UPDATES
from jaxmem.models.remat import check_remat_policy

VARIANTS = ("core", "rosa", "discovery", "dense_memory", "sparse_pointer")
ROSA_SOURCES = ("none", "bigram", "automaton")
ROSA_MODULATIONS = ("rosa", "token")
SLOT_QUERIES = ("hidden", "prev_token")
SLOT_MERGES = ("cosine", "key_id")

_OFF = dict(updates="outer", rosa="none", deep_embed=False, step_embed=False, spectral_norm=False,
            dense_memory=False, n_slots=0, pointer=False, write_gate=False)
PRESETS = {
    "core": dict(_OFF),
    "rosa": dict(_OFF, rosa="bigram"),
    "discovery": dict(_OFF, updates="hybrid", rosa="bigram", deep_embed=True, step_embed=True,
                      spectral_norm=True),
    "dense_memory": dict(_OFF, dense_memory=True),
    "sparse_pointer": dict(_OFF, n_slots=32, pointer=True, write_gate=True),
}


@dataclasses.dataclass(frozen=True)
class UniMatrixConfig(BodyConfig):
  """Architecture of :class:`~jaxmem.models.unimatrix.UniMatrixLM`.

  Attributes:
    body: "unimatrix", the tag of this body in an LM config's ``model`` section (:mod:`jaxmem.models.bodies`;
      not an argument).
    variant: one of :data:`VARIANTS`; sets every ``None`` option below. ``"dense_memory"`` is the
      paper's UniMatrix-Assoc.
    vocab_size: token ids ``[0, vocab_size)`` (259 = 256 bytes + 3 specials at the paper's sizes).
    d_model: residual width (64).
    depth: applications of the one shared block per token (3; the paper's depth steps).
    n_heads: heads of the matrix state (4); must divide ``d_model``.
    state_dim: side ``S`` of each head's ``S × S`` state (16); at most ``d_model``.
    max_len: longest sequence; longer inputs raise ``ValueError``.
    d_ff: feed-forward hidden width; 0 means ``4 · d_model``.
    positions: "learned" (absolute, up to ``max_len``) or "none".
    tie_embeddings: read logits with the transposed input embedding.
    mode, chunk_size, precision: the matrix-state kernel's form (``auto``: the fastest forward
      with chunked derivatives, recurrent when ``spectral_norm``), chunk and matmul precision.
    updates: "outer" (Core) or "hybrid" (outer / diagonal / symmetric mix, Discovery).
    retention: the matrix state's retention gate ρ, "head" (one per head and token, every preset)
      or "channel" (one per head, token and state channel, the state's columns decaying
      separately: ``Linear(d_model → n_heads·state_dim, no bias)`` plus a bias per head, the size
      that matches the paper's Core and ROSA parameter counts; ``jaxmem/models/unimatrix/README.md``).
    rosa: "none", "bigram" (the paper's released code: a learned embedding of ``x_{t−1}``, a
      bigram feature, not RWKV-8's suffix automaton) or "automaton" (RWKV-8's ROSA: the token
      that followed the longest earlier match of the suffix).
    rosa_modulation: what the embedding's modulation ``e ⊙ (1 + tanh(M c))`` is conditioned on
      (with ``rosa != "none"``): "rosa" (``c = r``, the ROSA row ``E_rosa[src]``) or "token"
      (``c = E[x_t]``, the current token's own embedding); both add ``r`` and have the same
      parameters.
    deep_embed: after every depth step ``h ← h ⊙ (1 + σ(P · E_deep[x_t]))``.
    step_embed: a learned vector per depth step added before it.
    spectral_norm: spectral norm of every state ≤ 1 (recurrent form).
    dense_memory: an append-only key/value memory read top-``dense_top_k`` in each block
      (the ``dense_memory`` variant, the paper's UniMatrix-Assoc).
    dense_top_k: ``K`` of that read (8).
    n_slots: slots of the sparse slot memory (0: none; 32 in SparsePointer).
    pointer: pointer-logit fusion (the slot read's weights scattered onto their token ids).
    write_gate: a learned per-token write gate ``σ(w · h)`` on slot writes.
    slot_merge: what merges a write into a used slot: "cosine" (the paper: the key's cosine
      with the slot's key above ``slot_threshold``) or "key_id" (the slot last written with the
      same key token ``x_{t−1}``: distinct tokens never share a slot, however close their
      embeddings drift; :func:`jaxmem.kernels.slots.slot_memory`'s ``merge_ids_BT``).
    slot_write_threshold: with ``write_gate``, a token writes only where ``σ(w · h) >
      slot_write_threshold`` (then with weight and strength ``σ(w · h)``; elsewhere the slot
      kernel's "no write" branch: nothing written, gradient 0). 0 (the default; the paper is
      silent) writes every token, a soft gate; 0.5 makes it a hard learned choice.
    slot_top_k, slot_threshold, slot_temperature: the slot read's ``K`` (4), the merge
      cosine (0.85), the read's ``τ`` in ``softmax(τ · score)`` (8).
    slot_query: "hidden" (a learned projection ``W_q LN(h_t)`` of the final state) or
      "prev_token" (``E[x_{t−1}]``, the slot keys' own space: a read is then the lookup
      "what followed the previous token before", an induction head by construction).
    slot_cos_scale: the cosine's weight in the slot score ``s · cos + log(strength)``; None is
      the paper's ``1 / √d_model`` (with which ``log(strength)`` dominates the score).
    slot_strength: a merged slot's strength, ``"gate"`` (the default: the last write's gate
      ``g``, so the read ranks slots by cosine) or ``"accumulate"`` (``s + g``: a slot written
      often outscores every slot written once, whatever the query: with the paper's score no
      query reaches a once-written slot, ``tests/kernels/test_slots.py``);
      :mod:`jaxmem.kernels.slots`, WRITE.
    act: Adaptive Computation Time over depth (Graves 2016; Universal Transformer,
      Dehghani et al. 2019): per position, halt once the summed halting probabilities
      reach ``act_threshold``; the output is the halting-weighted mix of the depth states.
    act_threshold: ``1 − ε`` of ACT (0.99).
    remat: recompute each depth step in the backward pass (``jax.checkpoint``).
    remat_policy: what ``remat`` may keep: "full" (only each step's input) or "dots" (also the
      projections' outputs); :mod:`jaxmem.models.remat`. Ignored with ``carry_state=True``.
    dropout: rate of dropout on the embedding and on every residual branch's output (mixer,
      dense memory, FFN, slot context); 0 (the default) builds none. Active in train mode
      (the training loop threads the RNG and evaluates in eval mode); ``model.eval()`` turns
      it off. The paper's SparsePointer recall reports 75.6% with 0.1 and 99.2% without.
    carry_state: **reproduces the paper's released-code bug, for studying it only**: the
      matrix state left at the end of depth step ``n`` (after the *last* token) initialises
      step ``n + 1``, so every position at step ≥ 2 sees the whole sequence. Off by
      default; the causality tests show it leaks and the default does not.
  """

  body: str = dataclasses.field(default="unimatrix", init=False)
  variant: str = "core"
  vocab_size: int = 259
  d_model: int = 64
  depth: int = 3
  n_heads: int = 4
  state_dim: int = 16
  max_len: int = 128
  d_ff: int = 0
  positions: str = "learned"
  tie_embeddings: bool = True
  mode: str = "auto"
  chunk_size: int = 64
  precision: str = "highest"
  updates: Optional[str] = None
  retention: str = "head"
  rosa: Optional[str] = None
  rosa_modulation: str = "rosa"
  deep_embed: Optional[bool] = None
  step_embed: Optional[bool] = None
  spectral_norm: Optional[bool] = None
  dense_memory: Optional[bool] = None
  dense_top_k: int = 8
  n_slots: Optional[int] = None
  pointer: Optional[bool] = None
  write_gate: Optional[bool] = None
  slot_top_k: int = 4
  slot_threshold: float = 0.85
  slot_temperature: float = 8.0
  slot_query: str = "hidden"
  slot_cos_scale: Optional[float] = None
  slot_merge: str = "cosine"
  slot_write_threshold: float = 0.0
  slot_strength: str = "gate"
  act: bool = False
  act_threshold: float = 0.99
  remat: bool = False
  remat_policy: str = "full"
  dropout: float = 0.0
  carry_state: bool = False

  def __post_init__(self):
    if self.variant == "assoc":
      raise ValueError('UniMatrixConfig.variant="assoc" was renamed to "dense_memory" (the paper\'s '
                       'UniMatrix-Assoc) so that "assoc" names only the associative-memory mixer.')
    if self.rosa == "prev_token":
      raise ValueError('UniMatrixConfig.rosa="prev_token" was renamed to "bigram" (a learned embedding of '
                       'x_{t−1}) so that "prev_token" names only slot_query="prev_token" (the slot read '
                       'queried with E[x_{t−1}]).')
    if self.variant not in VARIANTS:
      raise ValueError(f"UniMatrixConfig.variant must be one of {list(VARIANTS)}, got {self.variant!r}.")
    for name, value in PRESETS[self.variant].items():
      if getattr(self, name) is None:
        object.__setattr__(self, name, value)
    check_config_ints(self, ("vocab_size", "d_model", "depth", "n_heads", "state_dim", "max_len",
                             "chunk_size", "dense_top_k", "slot_top_k"))
    check_config_ints(self, ("d_ff", "n_slots"), allow_zero=True)
    if self.d_model % self.n_heads:
      raise ValueError(f"UniMatrixConfig.n_heads={self.n_heads} must divide d_model={self.d_model}.")
    if self.state_dim > self.d_model:
      raise ValueError(f"UniMatrixConfig.state_dim={self.state_dim} must be at most d_model={self.d_model} "
                       f"(each of the {self.n_heads} heads holds a state_dim × state_dim matrix).")
    check_remat_policy("UniMatrixConfig", self.remat_policy)
    if self.positions not in ("learned", "none"):
      raise ValueError(f"UniMatrixConfig.positions must be 'learned' or 'none', got {self.positions!r}.")
    if self.mode not in ms.MODES:
      raise ValueError(f"UniMatrixConfig.mode must be one of {list(ms.MODES)}, got {self.mode!r}.")
    if not isinstance(self.precision, str) or self.precision.lower() not in PRECISIONS:
      raise ValueError(f"UniMatrixConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}.")
    if self.updates not in UPDATES:
      raise ValueError(f"UniMatrixConfig.updates must be one of {list(UPDATES)}, got {self.updates!r}.")
    if self.rosa not in ROSA_SOURCES:
      raise ValueError(f"UniMatrixConfig.rosa must be one of {list(ROSA_SOURCES)}, got {self.rosa!r}.")
    if self.retention not in RETENTIONS:
      raise ValueError(f"UniMatrixConfig.retention must be one of {list(RETENTIONS)}, got {self.retention!r}.")
    if self.rosa_modulation not in ROSA_MODULATIONS:
      raise ValueError(f"UniMatrixConfig.rosa_modulation must be one of {list(ROSA_MODULATIONS)}, "
                       f"got {self.rosa_modulation!r}.")
    for name in ("tie_embeddings", "deep_embed", "step_embed", "spectral_norm", "dense_memory", "pointer",
                 "write_gate", "act", "remat", "carry_state"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"UniMatrixConfig.{name} must be a bool, got {getattr(self, name)!r}.")
    if self.spectral_norm and self.mode == "chunked":
      raise ValueError("UniMatrixConfig: spectral_norm=True has no chunked form (the rescaling is nonlinear "
                       "in the state); use mode='auto' or 'recurrent'.")
    def number(x):
      return isinstance(x, (int, float)) and not isinstance(x, bool)

    if self.slot_strength not in STRENGTH_UPDATES:
      raise ValueError(f"UniMatrixConfig.slot_strength must be one of {list(STRENGTH_UPDATES)}, "
                       f"got {self.slot_strength!r}.")
    if self.slot_merge not in SLOT_MERGES:
      raise ValueError(f"UniMatrixConfig.slot_merge must be one of {list(SLOT_MERGES)}, "
                       f"got {self.slot_merge!r}.")
    if self.slot_query not in SLOT_QUERIES:
      raise ValueError(f"UniMatrixConfig.slot_query must be one of {list(SLOT_QUERIES)}, "
                       f"got {self.slot_query!r}.")
    if self.slot_cos_scale is not None and not (number(self.slot_cos_scale)
                                                and 0 < self.slot_cos_scale < float("inf")):
      raise ValueError(f"UniMatrixConfig.slot_cos_scale must be None or finite and > 0, "
                       f"got {self.slot_cos_scale!r}.")
    if self.carry_state and self.act:
      raise ValueError("UniMatrixConfig: carry_state (the paper's leak, for study) is not available with "
                       "act=True.")
    if (self.pointer or self.write_gate) and not self.n_slots:
      raise ValueError(f"UniMatrixConfig: pointer={self.pointer} / write_gate={self.write_gate} need the "
                       f"slot memory (n_slots > 0), got n_slots={self.n_slots}.")
    if self.n_slots and self.slot_top_k > self.n_slots:
      raise ValueError(f"UniMatrixConfig.slot_top_k={self.slot_top_k} must be at most n_slots={self.n_slots}.")
    if not (number(self.slot_threshold) and -1.0 <= self.slot_threshold <= 1.0):
      raise ValueError(f"UniMatrixConfig.slot_threshold must be a cosine in [-1, 1], "
                       f"got {self.slot_threshold!r}.")
    if not (number(self.slot_write_threshold) and 0.0 <= self.slot_write_threshold < 1.0):
      raise ValueError(f"UniMatrixConfig.slot_write_threshold must be in [0, 1), "
                       f"got {self.slot_write_threshold!r}.")
    if self.slot_write_threshold and not self.write_gate:
      raise ValueError(f"UniMatrixConfig.slot_write_threshold={self.slot_write_threshold} needs "
                       f"write_gate=True.")
    if not (number(self.slot_temperature) and 0 < self.slot_temperature < float("inf")):
      raise ValueError(f"UniMatrixConfig.slot_temperature must be finite and > 0, "
                       f"got {self.slot_temperature!r}.")
    if not (number(self.dropout) and 0.0 <= self.dropout < 1.0):
      raise ValueError(f"UniMatrixConfig.dropout must be a rate in [0, 1), got {self.dropout!r}.")
    if not (number(self.act_threshold) and 0.0 < self.act_threshold <= 1.0):
      raise ValueError(f"UniMatrixConfig.act_threshold must be in (0, 1], got {self.act_threshold!r}.")

  @property
  def ffn_dim(self) -> int:
    return self.d_ff or 4 * self.d_model

  def options(self) -> dict:
    """The resolved preset fields (what distinguishes the variants)."""
    return {name: getattr(self, name) for name in _OFF}
