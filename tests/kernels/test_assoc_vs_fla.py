"""Cross-check against flash-linear-attention's PyTorch reference (only when `.[bench]` is installed)."""

import jax
import numpy as np
import pytest

from jaxmem.bench.assoc import load_fla_naive, random_inputs
from jaxmem.kernels.assoc import associative_memory


def test_chunked_delta_equals_fla_naive_chunkwise():
  naive = load_fla_naive()
  if naive is None:
    pytest.skip("fla-core / torch not installed (pip install -e '.[bench]')")
  import torch
  q, k, v, beta = random_inputs(2, 100, 3, 60)  # T not a multiple of the chunk, D not a power of two
  ours = associative_memory(q, k, v, beta, rule="delta", mode="chunked", chunk_size=32)
  t = lambda x: torch.from_numpy(np.asarray(x).transpose(0, 2, 1, 3).copy())
  tb = torch.from_numpy(np.asarray(beta).transpose(0, 2, 1).copy())
  # fla's naive recurrence scales q by d^-1/2; undo it for an equal comparison
  ref = naive.delta_rule_recurrence(t(q) * 60 ** 0.5, t(k), t(v), tb)
  ref = ref[0] if isinstance(ref, tuple) else ref
  np.testing.assert_allclose(np.asarray(ours).transpose(0, 2, 1, 3), ref.numpy(), rtol=1e-4, atol=1e-4)
  assert jax.numpy.isfinite(ours).all()
