"""Timing helpers for benchmarks: medians after compilation, results blocked on."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import jax


def time_call(fn: Callable, *args, repeats: int = 5, warmup: int = 1) -> float:
  """Median wall seconds of ``fn(*args)`` (results blocked on), after ``warmup`` calls."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def time_host(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> float:
  """Median wall seconds of a synchronous host call (a PyTorch peer), after ``warmup`` calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)
