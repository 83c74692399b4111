"""Module-level compiled calls the model tests share.

Each is a function object created once, so ``nnx.jit`` compiles it once per model configuration
(the graphdef, which holds the config) and input shape, whichever test calls it; calls with other
parameter values or inputs of the same shapes reuse the program. An eager NNX call would instead
retrace the depth / time scans and dispatch every primitive on its own.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

forward = nnx.jit(lambda module, x: module(x))
forward2 = nnx.jit(lambda module, x, y: module(x, y))
logits_and_aux = nnx.jit(lambda model, x: model(x, return_aux=True))
embed_tokens = nnx.jit(lambda model, tokens: model.embed_tokens(tokens))
logits_from_embeddings = nnx.jit(lambda model, x: model.logits_from_embeddings(x))
read_out = nnx.jit(lambda model, h: model.read_out(h))


@nnx.jit
def decode(mixer, x_BTD):
  """A mixer's ``step`` over the tokens from its ``init_state``: ``(y [B, T, d_model], final state)``."""
  def body(state, x_BD):
    return mixer.step(state, x_BD)
  state, y = jax.lax.scan(body, mixer.init_state(x_BTD.shape[0], x_BTD.shape[1]), jnp.moveaxis(x_BTD, 1, 0))
  return jnp.moveaxis(y, 0, 1), state


@nnx.jit
def logit_jacobian(model, tokens_BT, w_V):
  """For a TransformerLM: ``J[b, t, c, s] = Σ_d |∂ (logits[b, t] · w) / ∂ x[c, s, d]|`` ``[B, T, B, T]``,
  ``x`` the input embeddings and ``w`` a random read-out of the logits: every position of every row from
  one compiled program (a reverse pass per output, vmapped)."""
  graphdef, state = nnx.split(model)
  x = model.embed_tokens(tokens_BT)
  f = lambda x: nnx.merge(graphdef, state, copy=True).logits_from_embeddings(x) @ w_V
  return jnp.abs(jax.jacrev(f)(x)).sum(-1)


def assert_causal(J_BTBT, name=""):
  """``J[b, t, c, s]`` (sensitivity of output ``(b, t)`` to input ``(c, s)``) is exactly zero unless
  ``c = b`` and ``s ≤ t`` (causal, and rows independent), and nonzero there (the check can see)."""
  J = np.asarray(J_BTBT)
  B, T = J.shape[:2]
  seen = np.eye(B, dtype=bool)[:, None, :, None] & np.tril(np.ones((T, T), bool))[None, :, None, :]
  leaks = np.argwhere((J != 0.0) & ~seen)
  assert leaks.size == 0, f"{name}: output (b, t) depends on input (c, s) at {leaks[:5].tolist()}"
  blind = np.argwhere((J == 0.0) & seen)
  assert blind.size == 0, f"{name}: no dependence on an earlier input at {blind[:5].tolist()}"


def program_text(module, *inputs) -> str:
  """The jaxpr of ``module(*inputs)`` as a function of its parameters (other state held constant).

  Two modules with one text run the same operations on the same operands: their outputs on equal
  parameters and inputs are bitwise equal by construction, not by a coincidence of rounding."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)
  return str(jax.make_jaxpr(lambda p, *xs: nnx.merge(graphdef, p, rest)(*xs))(params, *inputs))
