"""Text corpora as byte streams, and batching."""

from jaxmem.data.batches import KeyedBatches, RandomWindows, eval_windows, ngram_bpb
from jaxmem.data.corpora import (
    CORPORA,
    Corpus,
    CorpusNotFoundError,
    load_corpus,
    load_tiny_shakespeare,
    load_wikitext2,
    split_tiny_shakespeare,
)

__all__ = [
    "CORPORA", "Corpus", "CorpusNotFoundError", "KeyedBatches", "RandomWindows", "eval_windows",
    "load_corpus", "load_tiny_shakespeare", "load_wikitext2", "ngram_bpb",
    "split_tiny_shakespeare",
]
