"""Many small independent training runs at once: stacked parameters, one vmapped optax step.

For sweeps of tiny models (one run per size or seed) a Python loop over runs would compile and
dispatch each alone. Here the runs' parameters are stacked on a leading run axis ``R``
(:func:`stack`), each step samples one batch per run, ``vmap`` evaluates every run's loss on its
own batch, and the *sum* of the per-run losses is differentiated: run ``r``'s parameters only
reach its own loss, so each gets exactly its own gradient, and an elementwise optimiser (Adam,
SGD, ...) keeps the runs independent. ``n_steps`` steps are one jitted ``lax.scan``.

The pieces a caller supplies:

* ``loss_fn(params_r, consts_r, *batch_r) -> (loss, aux)`` for one run (scalar loss);
* ``consts``: per-run inputs that are not trained (masks, sizes), leading axis ``R``;
* ``sample_fn(key, *sample_args) -> batch``: a tuple of arrays with leading axis ``R``.

``loss_fn``, ``sample_fn`` and ``optimizer`` are static arguments of :func:`train` (jit caches on
them): build them once (e.g. with ``functools.partial``) and pass the same objects to every
call, or each call compiles anew.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import optax


def stack(trees: Sequence) -> object:
  """Stacks per-run pytrees of identical structure on a new leading run axis."""
  return jax.tree.map(lambda *x: jnp.stack(x), *trees)


def run_losses(loss_fn: Callable, params, consts, batch: Sequence):
  """``loss_fn`` of every run on its own slice: ``vmap(loss_fn)(params, consts, *batch)``; outputs
  gain a leading ``[R]`` axis (e.g. (loss ``[R]``, aux ``[R]``))."""
  return jax.vmap(loss_fn)(params, consts, *batch)


@functools.partial(jax.jit, static_argnames=("loss_fn", "sample_fn", "optimizer", "n_steps"))
def train(params, opt_state, consts, sample_args: tuple, key, *, loss_fn: Callable, sample_fn: Callable,
          optimizer: optax.GradientTransformation, n_steps: int):
  """``n_steps`` optimiser steps in one ``lax.scan``, each on a fresh batch ``sample_fn(k_i, *sample_args)``
  with ``k_i`` the ``i``-th of ``jax.random.split(key, n_steps)``.

  Returns (params, opt_state, per-run losses ``[n_steps, R]`` before each step's update).
  ``opt_state`` is ``optimizer.init(params)`` of the stacked params (or a previous call's).
  """

  def step(carry, k):
    p, s = carry
    batch = sample_fn(k, *sample_args)

    def total(p):
      loss_R, _ = run_losses(loss_fn, p, consts, batch)
      return jnp.sum(loss_R), loss_R

    (_, loss_R), g = jax.value_and_grad(total, has_aux=True)(p)
    upd, s = optimizer.update(g, s, p)
    return (optax.apply_updates(p, upd), s), loss_R

  (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), jax.random.split(key, n_steps))
  return params, opt_state, losses


__all__ = ["run_losses", "stack", "train"]
