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


def time_interleaved(fns: dict, repeats: int = 5, warmup: int = 1) -> dict:
  """Median wall seconds of each synchronous host call of ``fns`` (name -> call), after ``warmup`` calls of
  each, the calls taking turns (``a, b, a, b, ...``): load from other jobs on a shared machine then falls on
  every call alike, so their ratio is steadier than from back-to-back runs."""
  for fn in fns.values():
    for _ in range(warmup):
      fn()
  times: dict = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      t0 = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(t) for name, t in times.items()}
