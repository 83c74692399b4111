"""A few jitted Adam steps on one fixed LM batch: what the "it trains" tests share."""

import jax
import optax
from flax import nnx

from jaxmem.train.losses import lm_loss


def adam_steps(model, tokens, *, lr: float, steps: int):
  """Trains ``model`` on ``tokens [B, T]`` (next-token loss) for ``steps`` Adam steps.

  Returns (losses, the first step's gradients, graphdef, final params)."""
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  graphdef, params = nnx.split(model)
  tx = optax.adam(lr)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    loss, grads = jax.value_and_grad(lambda p: lm_loss(nnx.merge(graphdef, p), batch)[0])(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, loss, grads

  losses, first = [], None
  for i in range(steps):
    params, opt, loss, grads = step(params, opt)
    losses.append(float(loss))
    if i == 0:
      first = grads
  return losses, first, graphdef, params
