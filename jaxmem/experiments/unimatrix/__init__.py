"""Experiments of the UniMatrix paper (Liu Xiao 2026, ``docs/papers/unimatrix.md``), re-run with
jaxmem's causal implementation: ``unimatrix_recall`` (the associative-recall table and the slot
ablation), ``unimatrix_pointer_check`` (SparsePointer's recall row as a pass / fail check over
seeds), ``unimatrix_three_token`` (the corrected three-token benchmark), ``unimatrix_lm`` (bits per
byte at the paper's recipe and as matched-budget curves), ``unimatrix_ruler`` (a byte-level RULER
subset, string-match scored). Throughput is a benchmark, not an
experiment: ``jaxmem bench unimatrix`` (``jaxmem/bench/unimatrix.py``)."""
