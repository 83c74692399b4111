"""Packed training rows: documents concatenated into fixed-length rows with segment ids.

Training on whole documents without wasting compute on padding: the documents of a corpus, in a seeded order
that changes every epoch, are concatenated into one stream and cut into rows of ``seq_len + 1`` bytes; each row
carries ``segment_ids`` (``1, 2, ...`` for the documents, or the pieces of documents, it holds,
:mod:`jaxmem.kernels.segments`) so that a model given them reads nothing across a document boundary, and the
loss ``mask`` is 0 where the target is the first byte of the next document (it cannot be predicted from the
document before). A document longer than a row, or one cut by a row's end, continues in the next row of the
stream as a new segment (packing with truncation: its later piece is read without its beginning).

:class:`PackedDocuments` is a :class:`~jaxmem.data.batches.PositionedBatches`: the global batch at position
``p`` is a pure function of ``(seed, p)``, its state ``{seed, position}``, and process ``i`` of ``n`` takes rows
``[i·B/n, (i+1)·B/n)`` of it, as :class:`~jaxmem.data.batches.RandomWindows`.

Documents: :func:`split_documents` — Tiny Shakespeare at blank lines (its speeches), WikiText-2 at its article
titles (lines `` = Title = ``).
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from jaxmem.checks import check_positive_int
from jaxmem.data.batches import PositionedBatches, check_process_split

# a WikiText-2 article starts with its title line " = Title = " (sections are " = = Section = = ")
_WIKI_TITLE = re.compile(rb"^ = [^=].* = $", re.MULTILINE)


def split_documents(tokens: np.ndarray, corpus: str) -> list:
  """The documents of a byte stream: ``tinyshakespeare`` at blank lines (each document keeps its trailing
  newlines, so the documents concatenate back to the stream), ``wikitext2`` at article title lines."""
  data = np.asarray(tokens, np.uint8).tobytes()
  if corpus == "tinyshakespeare":
    cuts = [m.end() for m in re.finditer(rb"\n\n+", data)]
  elif corpus == "wikitext2":
    cuts = [m.start() for m in _WIKI_TITLE.finditer(data)]
    cuts = [c for c in cuts if c > 0]
  else:
    raise ValueError(f"no document split for corpus {corpus!r}; known: 'tinyshakespeare', 'wikitext2'.")
  bounds = [0] + cuts + [len(data)]
  docs = [np.frombuffer(data[a:b], np.uint8) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
  return docs


class PackedDocuments(PositionedBatches):
  """Rows of ``seq_len`` inputs packed from whole documents: ``{"inputs", "targets", "segment_ids", "mask"}``,
  each ``[batch_size / process_count, seq_len]`` (module docstring).

  Epoch ``e`` is the documents in the order of a permutation drawn from ``(seed, e)``, concatenated; it has
  ``⌊(N − 1) / seq_len⌋`` rows (``N`` bytes), row ``r`` its bytes ``[r·seq_len, (r + 1)·seq_len + 1)``; the
  global row ``g`` of the stream is row ``g mod rows`` of epoch ``g div rows``.
  """

  def __init__(self, documents: Sequence[np.ndarray], seq_len: int, batch_size: int, seed: int = 0, *,
               process_index: int = 0, process_count: int = 1):
    check_positive_int("seq_len", seq_len)
    check_process_split(batch_size, process_index, process_count)
    docs = [np.asarray(d).astype(np.int32).ravel() for d in documents]
    docs = [d for d in docs if d.size]
    if not docs:
      raise ValueError("`documents` holds no non-empty document.")
    total = sum(d.size for d in docs)
    if total < seq_len + 1:
      raise ValueError(f"the documents hold {total} tokens, fewer than seq_len + 1 = {seq_len + 1}.")
    self.documents, self.seq_len, self.batch_size = docs, seq_len, batch_size
    self.rows_per_epoch = (total - 1) // seq_len
    self.seed, self.process_index, self.process_count, self.position = int(seed), int(process_index), \
        int(process_count), 0
    self._epoch, self._stream, self._doc = None, None, None

  def set_state(self, state: dict) -> None:
    if int(state["seed"]) != self.seed:
      raise ValueError(f"iterator state has seed {state['seed']}, this iterator {self.seed}.")
    self.position = int(state["position"])

  def _epoch_stream(self, epoch: int) -> tuple:
    """``(tokens [N], document index [N])`` of an epoch (cached: consecutive batches share it)."""
    if self._epoch != epoch:
      order = np.random.default_rng([self.seed, epoch, 1]).permutation(len(self.documents))
      self._stream = np.concatenate([self.documents[i] for i in order])
      self._doc = np.repeat(np.arange(len(order)), [self.documents[i].size for i in order])
      self._epoch = epoch
    return self._stream, self._doc

  def batch_at(self, position: int) -> dict:
    local = self.batch_size // self.process_count
    first = position * self.batch_size + self.process_index * local
    L = self.seq_len
    rows_tok, rows_doc = [], []
    for g in range(first, first + local):
      stream, doc = self._epoch_stream(g // self.rows_per_epoch)
      start = (g % self.rows_per_epoch) * L
      rows_tok.append(stream[start:start + L + 1])
      rows_doc.append(doc[start:start + L + 1])
    tok, doc = np.stack(rows_tok), np.stack(rows_doc)
    # ids 1, 2, ... per row: a new id wherever the document changes
    changes = np.concatenate([np.zeros((local, 1), bool), doc[:, 1:] != doc[:, :-1]], axis=1)
    ids = (1 + np.cumsum(changes, axis=1)).astype(np.int32)
    return {"inputs": tok[:, :-1], "targets": tok[:, 1:], "segment_ids": ids[:, :-1],
            "mask": (ids[:, 1:] == ids[:, :-1]).astype(np.float32)}


__all__ = ["PackedDocuments", "split_documents"]
