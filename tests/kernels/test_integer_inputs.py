"""Integer arrays in a kernel's float arguments raise a ValueError naming the argument (instead of
computing in, or rounding the output back to, an integer dtype)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmem.checks import check_floating
from jaxmem.kernels import assoc, matrix_state, slots, ssd
from jaxmem.kernels.attention import softmax_attention
from jaxmem.kernels.sdnc import sdnc_attention, sdnc_hybrid_attention
from jaxmem.kernels.topk_memory import topk_memory_read

B, T, H, D = 1, 2, 1, 2
N = 3  # slots


def _z(*shape):
  return jnp.zeros(shape, jnp.float32)


def _slot_state():
  return slots.init(B, N, D, D)


# kernel -> (call, float arguments with valid shapes, the float arguments to corrupt)
KERNELS = {
    "softmax_attention": (
        softmax_attention, lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D)), "q k v"),
    "assoc.associative_memory": (
        lambda **a: assoc.associative_memory(**a, rule="hebb"),
        lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D), initial_state=_z(B, H, D, D)),
        "q k v initial_state"),
    "assoc.step": (
        lambda **a: assoc.step(**a, rule="hebb"),
        lambda: dict(state=_z(B, H, D, D), q_t=_z(B, H, D), k_t=_z(B, H, D), v_t=_z(B, H, D)),
        "state q_t k_t v_t"),
    "matrix_state.matrix_state": (
        lambda **a: matrix_state.matrix_state(**a, rho=0.5, mix=jnp.full((H, 3), 1 / 3)),
        lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D), d=_z(B, T, H, D),
                     initial_state=_z(B, H, D, D)),
        "q k v d initial_state"),
    "matrix_state.step": (
        lambda **a: matrix_state.step(**a, rho_t=0.5, mix_t=jnp.full((H, 3), 1 / 3)),
        lambda: dict(state=_z(B, H, D, D), q_t=_z(B, H, D), k_t=_z(B, H, D), v_t=_z(B, H, D),
                     d_t=_z(B, H, D)),
        "state q_t k_t v_t d_t"),
    "sdnc_attention": (
        sdnc_attention, lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D)), "q k v"),
    "sdnc_hybrid_attention": (
        sdnc_hybrid_attention, lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D)), "q k v"),
    "topk_memory_read": (
        topk_memory_read, lambda: dict(q=_z(B, T, H, D), k=_z(B, T, H, D), v=_z(B, T, H, D)), "q k v"),
    "slots.slot_memory": (
        lambda **a: slots.slot_memory(**a, ids_BT=jnp.zeros((B, T), jnp.int32), n_slots=N, top_k=1),
        lambda: dict(queries_BTD=_z(B, T, D), keys_BTD=_z(B, T, D), values_BTV=_z(B, T, D)),
        "queries_BTD keys_BTD values_BTV"),
    "slots.read": (
        lambda **a: slots.read(_slot_state(), **a, top_k=1), lambda: dict(query_BD=_z(B, D)), "query_BD"),
    "slots.write": (
        lambda **a: slots.write(_slot_state(), **a, id_B=jnp.zeros((B,), jnp.int32)),
        lambda: dict(key_BD=_z(B, D), value_BV=_z(B, D)), "key_BD value_BV"),
    "slots.step": (
        lambda **a: slots.step(_slot_state(), **a, id_B=jnp.zeros((B,), jnp.int32), top_k=1),
        lambda: dict(query_BD=_z(B, D), key_BD=_z(B, D), value_BV=_z(B, D)), "query_BD key_BD value_BV"),
    "slots.pointer_logits": (
        lambda **a: slots.pointer_logits(**a, ids_BN=jnp.zeros((B, N), jnp.int32), vocab_size=4),
        lambda: dict(weights_BN=_z(B, N)), "weights_BN"),
    "ssd.ssd": (
        ssd.ssd,
        lambda: dict(x=_z(B, T, H, D), dt=_z(B, T, H), A=_z(H), B=_z(B, T, H, D), C=_z(B, T, H, D), D=_z(H),
                     initial_state=_z(B, H, D, D)),
        "x dt A B C D initial_state"),
    "ssd.step": (
        ssd.step,
        lambda: dict(state=_z(B, H, D, D), x_t=_z(B, H, D), dt_t=_z(B, H), A=_z(H), B_t=_z(B, H, D),
                     C_t=_z(B, H, D), D=_z(H)),
        "state x_t dt_t A B_t C_t D"),
}
CASES = [(kernel, arg) for kernel, (_, _, args) in KERNELS.items() for arg in args.split()]


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_float_arguments_are_accepted(kernel):
  call, make, _ = KERNELS[kernel]
  call(**make())


@pytest.mark.parametrize("kernel, arg", CASES)
def test_an_integer_float_argument_raises_naming_it(kernel, arg):
  call, make, _ = KERNELS[kernel]
  args = make()
  args[arg] = args[arg].astype(jnp.int32)
  with pytest.raises(ValueError, match=rf"`{arg}` must be floating, got dtype int32"):
    call(**args)


def test_softmax_attention_on_integers_raises_instead_of_truncating():
  """The reported symptom: int q/k/v gave [0, 0] where the float result is [0, 0.5]."""
  q = k = np.ones((1, 2, 1, 1), np.int32)
  v = np.arange(2, dtype=np.int32).reshape(1, 2, 1, 1)
  np.testing.assert_allclose(softmax_attention(q.astype(np.float32), k.astype(np.float32),
                                               v.astype(np.float32))[0, :, 0, 0], [0.0, 0.5])
  with pytest.raises(ValueError, match=r"`q` must be floating, got dtype int32"):
    softmax_attention(q, k, v)


def test_check_floating_reads_dtypes_under_jit():
  @jax.jit
  def f(x, y):
    check_floating(x=x, y=y)
    return x + y

  np.testing.assert_array_equal(f(jnp.ones(2, jnp.bfloat16), jnp.ones(2, jnp.float32)), [2.0, 2.0])
  with pytest.raises(ValueError, match=r"`y` must be floating, got dtype int32"):
    f(jnp.ones(2), jnp.ones(2, jnp.int32))
  check_floating(a=None, b=1.0, c=np.ones(1, np.float64))
  with pytest.raises(ValueError, match=r"`b` must be floating, got dtype bool"):
    check_floating(b=np.ones(1, bool))
