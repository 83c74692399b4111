"""``jaxmem bench dnc``: DNC training-step throughput vs the PyTorch ``dnc`` package.

Standard size (issue 3): N=64 slots, W=32, R=4 read heads, batch 16, T=64, one-layer
LSTM controller with 128 units, input/output width 8; a full training step (forward,
backward, Adam update) on each side, timed back to back in one process. Also reports the
reverse-pass memory of the link-matrix path with and without ``jax.checkpoint`` on the
scan step (XLA's compiled temp-buffer size).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxmem.bench.timing import time_call, time_host
from jaxmem.models.dnc import DNC, DNCConfig
from jaxmem.results import markdown_table


def _our_step(cfg: DNCConfig, B: int, T: int):
  model = DNC(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  tx = optax.adam(1e-4)
  opt = tx.init(params)
  x = jax.random.normal(jax.random.key(0), (B, T, cfg.input_dim))
  y = (jax.random.uniform(jax.random.key(1), (B, T, cfg.output_dim)) > 0.5).astype(jnp.float32)

  def loss(params):
    logits = nnx.merge(graphdef, params)(x)
    return optax.sigmoid_binary_cross_entropy(logits, y).mean()

  @jax.jit
  def step(params, opt):
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, value

  return step, (params, opt)


def _temp_bytes(cfg: DNCConfig, B: int, T: int, compiled: tuple | None = None) -> float:
  """XLA's temp-buffer bytes of the training step; ``compiled``: that step's ``(step, args)`` if already
  built (its compiled program is reused)."""
  step, args = compiled or _our_step(cfg, B, T)
  try:
    stats = step.lower(*args).compile().memory_analysis()
    return float(stats.temp_size_in_bytes)
  except Exception:  # noqa: BLE001 - not every backend reports memory
    return float("nan")


def _torch_step_timer(B, T, N, W, R, hidden, width, repeats):
  try:
    import torch
    from dnc import DNC as TorchDNC
  except ImportError:
    return None
  torch.manual_seed(0)
  torch.set_num_threads(max(1, torch.get_num_threads()))
  net = TorchDNC(input_size=width, hidden_size=hidden, rnn_type="lstm", num_layers=1,
                 num_hidden_layers=1, nr_cells=N, cell_size=W, read_heads=R, batch_first=True,
                 gpu_id=-1)
  opt = torch.optim.Adam(net.parameters(), lr=1e-4)
  x = torch.randn(B, T, width)
  y = (torch.rand(B, T, width) > 0.5).float()
  loss_fn = torch.nn.BCEWithLogitsLoss()

  def step():
    opt.zero_grad()
    out, _ = net(x, (None, None, None), reset_experience=True, pass_through_memory=True)
    loss = loss_fn(out, y)
    loss.backward()
    opt.step()

  return lambda: time_host(step, repeats)


# the quick run's sizes (slots, word, batch, length); the rest are the standard size's
QUICK_SIZES = dict(N=16, W=8, B=4, T=16)


def bench_dnc(quick: bool = False, repeats: int = 5) -> str:
  N, W, R, B, T, hidden, width = 64, 32, 4, 16, 64, 128, 8
  if quick:
    N, W, B, T = (QUICK_SIZES[k] for k in ("N", "W", "B", "T"))
  cfg = DNCConfig(input_dim=width, output_dim=width, memory_size=N, word_size=W, num_reads=R,
                  hidden_size=hidden, controller="lstm", remat=True)
  step, args = _our_step(cfg, B, T)
  ours = time_call(lambda p, o: step(p, o)[2], *args, repeats=repeats)
  timer = _torch_step_timer(B, T, N, W, R, hidden, width, repeats)
  theirs = timer() if timer else float("nan")
  rows = [["jaxmem DNC (jit, remat)", f"{ours * 1e3:.1f}", f"{B / ours:.1f}", "1.00×"]]
  if timer:
    rows.append(["PyTorch `dnc` 1.1.0 (CPU)", f"{theirs * 1e3:.1f}", f"{B / theirs:.1f}",
                 f"{theirs / ours:.2f}× slower" if theirs > ours else f"{ours / theirs:.2f}× faster"])
  else:
    rows.append(["PyTorch `dnc`", "n/a", "n/a", "install: pip install -e '.[bench]'"])
  mem_remat = _temp_bytes(cfg, B, T, compiled=(step, args))
  mem_plain = _temp_bytes(dataclasses.replace(cfg, remat=False), B, T)
  link_per_step = B * N * N * 4
  out = (f"### dnc: training step, N={N}, W={W}, R={R}, batch {B}, T={T}, LSTM {hidden}, "
         f"{jax.devices()[0].platform}\n\n"
         + markdown_table(["implementation", "ms / step", "sequences / s", "vs jaxmem"], rows)
         + f"\n\nSpeed-up of jaxmem over PyTorch dnc: **{theirs / ours:.2f}×** (target ≥ 3×).\n\n"
         + markdown_table(
             ["reverse-pass memory", "bytes"],
             [["link matrix, one step (B·N²·4)", f"{link_per_step:,}"],
              ["link matrix, all T steps if stored", f"{link_per_step * T:,}"],
              ["XLA temp buffers, jax.checkpoint on the step", f"{mem_remat:,.0f}"],
              ["XLA temp buffers, no checkpoint", f"{mem_plain:,.0f}"]])
         + "\n\nWith `jax.checkpoint` the scan saves only its carry per step (memory, usage, link, "
           "precedence, weights, controller state) and recomputes each step's intermediates "
           "(content weights, sorted usage, outer products) in the backward pass.\n")
  return out
