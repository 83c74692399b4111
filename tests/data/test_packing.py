"""Packed documents (jaxmem.data.packing): rows cut from a seeded stream of whole documents, segment ids that
change exactly at document boundaries, the loss mask off where a target starts the next document, a pure
function of (seed, position) split over processes like RandomWindows; corpus documents split at blank lines /
article titles."""

import numpy as np
import pytest

from jaxmem.data.packing import PackedDocuments, split_documents

DOCS = [np.full(n, i + 1, np.int32) * 10 + np.arange(n) % 7 for i, n in enumerate([5, 13, 2, 9, 30, 4])]


def test_rows_follow_the_stream_ids_change_at_boundaries_and_the_mask_drops_document_starts():
  it = PackedDocuments(DOCS, seq_len=8, batch_size=3, seed=1)
  b = it.batch_at(0)
  assert {k: v.shape for k, v in b.items()} == {k: (3, 8) for k in ("inputs", "targets", "segment_ids", "mask")}
  stream, doc = it._epoch_stream(0)
  assert sorted(map(tuple, np.split(stream, np.flatnonzero(np.diff(doc)) + 1))) == sorted(map(tuple, DOCS))
  for r in range(3):
    window, owner = stream[r * 8:r * 8 + 9], doc[r * 8:r * 8 + 9]
    np.testing.assert_array_equal(b["inputs"][r], window[:-1])
    np.testing.assert_array_equal(b["targets"][r], window[1:])
    np.testing.assert_array_equal(np.diff(b["segment_ids"][r]) != 0, np.diff(owner[:-1]) != 0)
    assert b["segment_ids"][r, 0] == 1 and np.all(np.diff(b["segment_ids"][r]) >= 0)
    np.testing.assert_array_equal(b["mask"][r], owner[1:] == owner[:-1])  # 0 where the target starts a document


def test_a_pure_function_of_seed_and_position_split_over_processes_and_new_order_each_epoch():
  full = PackedDocuments(DOCS, seq_len=6, batch_size=4, seed=3)
  halves = [PackedDocuments(DOCS, seq_len=6, batch_size=4, seed=3, process_index=i, process_count=2)
            for i in range(2)]
  for position in (0, 5, 11):   # 10 rows per epoch: positions 5 and 11 cross into epochs 2 and 4
    want = full.batch_at(position)
    got = [h.batch_at(position) for h in halves]
    for k in want:
      np.testing.assert_array_equal(np.concatenate([g[k] for g in got]), want[k])
    again = PackedDocuments(DOCS, 6, 4, seed=3).batch_at(position)
    np.testing.assert_array_equal(again["inputs"], want["inputs"])
  assert full.rows_per_epoch == (sum(d.size for d in DOCS) - 1) // 6
  assert not np.array_equal(full._epoch_stream(0)[0], full._epoch_stream(1)[0])
  state = {"seed": 3, "position": 7}
  resumed = PackedDocuments(DOCS, 6, 4, seed=3)
  resumed.set_state(state)
  np.testing.assert_array_equal(next(resumed)["inputs"], full.batch_at(7)["inputs"])
  with pytest.raises(ValueError, match="seed 4"):
    resumed.set_state({"seed": 4, "position": 0})


def test_corpus_documents():
  text = b"First Citizen:\nSpeak.\n\nAll:\nSpeak, speak.\n\n\nFirst Citizen:\nYou are.\n"
  docs = split_documents(np.frombuffer(text, np.uint8), "tinyshakespeare")
  assert [bytes(d) for d in docs] == [b"First Citizen:\nSpeak.\n\n", b"All:\nSpeak, speak.\n\n\n",
                                      b"First Citizen:\nYou are.\n"]
  wiki = b" \n = Valkyria = \n text one \n = = Gameplay = = \n more \n = Tower = \n text two \n"
  docs = split_documents(np.frombuffer(wiki, np.uint8), "wikitext2")
  assert [bytes(d) for d in docs] == [b" \n", b" = Valkyria = \n text one \n = = Gameplay = = \n more \n",
                                      b" = Tower = \n text two \n"]
  with pytest.raises(ValueError, match="no document split for corpus 'enwik8'"):
    split_documents(np.zeros(3, np.uint8), "enwik8")


@pytest.mark.parametrize("kwargs,match", [
    (dict(documents=[]), "no non-empty document"),
    (dict(documents=[np.arange(3)]), "fewer than seq_len"),
    (dict(seq_len=0), "seq_len"),
    (dict(batch_size=3, process_count=2), "not divisible"),
])
def test_bad_arguments(kwargs, match):
  args = dict(documents=DOCS, seq_len=4, batch_size=2)
  with pytest.raises(ValueError, match=match):
    PackedDocuments(**{**args, **kwargs})
