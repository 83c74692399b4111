"""Synthetic tasks: pure, jit-able generators keyed by a PRNG key.

* :mod:`~jaxmem.tasks.algorithmic` — NTM copy, DeepMind repeat copy, associative recall,
  priority sort (``TaskBatch`` of ``[B, T, C]`` arrays with a ``[B, T]`` mask), and the
  masked sigmoid cross-entropy / bit error rate used with them.
* :mod:`~jaxmem.tasks.babi` — procedural bAbI-style stories (tasks 1, 2, 7), a loader for
  a local copy of the real bAbI files, and word-id encoding.
* :mod:`~jaxmem.tasks.mqar` — Zoology's multi-query associative recall
  (``jaxmem.tasks.mqar.mqar``), its multi-hop extension and resumable streams of both
  (:func:`~jaxmem.tasks.mqar.mqar_stream`, :func:`~jaxmem.tasks.mqar.multihop_stream`).

``jaxmem.tasks.mqar`` is the module (the generator function of the same name is not
re-exported here, so the name means one thing).
"""

from jaxmem.tasks import algorithmic, babi, mqar
from jaxmem.tasks.algorithmic import (
    TaskBatch,
    associative_recall,
    copy_task,
    priority_sort,
    repeat_copy,
)
from jaxmem.tasks.babi import (
    BabiExample,
    EncodedBabi,
    Vocabulary,
    encode_examples,
    generate_babi,
    load_babi,
    parse_babi,
    tokenize,
)
from jaxmem.tasks.mqar import MQARBatch, mqar_stream, multihop_recall, multihop_stream

__all__ = [
    "BabiExample", "EncodedBabi", "MQARBatch", "TaskBatch", "Vocabulary", "algorithmic",
    "associative_recall", "babi", "copy_task", "encode_examples", "generate_babi",
    "load_babi", "mqar", "mqar_stream", "multihop_recall",
    "multihop_stream", "parse_babi", "priority_sort", "repeat_copy", "tokenize",
]

# UniMatrix paper benchmarks (jaxmem.tasks.unimatrix) and the RULER subset (jaxmem.tasks.ruler;
# its generate / score / encode are reached through the module, so the names mean one thing).
from jaxmem.tasks import ruler, unimatrix  # noqa: E402
from jaxmem.tasks.ruler import RULER_TASKS, RulerBatch, RulerExample, ruler_batch  # noqa: E402
from jaxmem.tasks.unimatrix import (  # noqa: E402
    RECALL_VOCAB,
    THREE_TOKEN_TASKS,
    THREE_TOKEN_VOCAB,
    RecallBatch,
    ThreeTokenBatch,
    ThreeTokenExample,
    decode_recall,
    decode_three_token,
    lookup_table,
    recall_batch,
    recall_stream,
    three_token_batch,
    three_token_stream,
    three_token_target,
)

__all__ += [
    "RECALL_VOCAB", "RULER_TASKS", "RecallBatch", "RulerBatch", "RulerExample", "THREE_TOKEN_TASKS",
    "THREE_TOKEN_VOCAB", "ThreeTokenBatch", "ThreeTokenExample", "decode_recall", "decode_three_token",
    "lookup_table", "recall_batch", "recall_stream", "ruler", "ruler_batch", "three_token_batch",
    "three_token_stream", "three_token_target", "unimatrix",
]
