"""The token-mixer registry: ``name -> (ConfigCls, ModuleCls)``.

A token mixer is the part of a Transformer block that moves information across time
(attention, an sDNC read, an associative memory, ...). Each one is a frozen config dataclass
subclassing :class:`MixerConfig` and an NNX module built as
``ModuleCls(cfg, *, d_model, n_heads, n_layers, dtype, rngs)`` that maps ``[B, T, d_model]``
to ``[B, T, d_model]`` causally. Registering both under one name (:func:`register`) is all
the body needs: :class:`jaxmem.models.transformer.TransformerConfig` takes any registered
config, or a per-layer tuple of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from flax import nnx

REGISTRY: dict[str, tuple[type, type]] = {}


@dataclasses.dataclass(frozen=True)
class MixerConfig:
  """Base of every mixer config. Subclasses declare ``name`` as
  ``dataclasses.field(default="<name>", init=False)``, so it is part of the config's dict
  form (what config files and saved ``config.json`` hold) but never an argument."""

  def to_dict(self) -> dict:
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

  def state_floats(self, *, d_model: int, n_heads: int, seq_len: int) -> int:
    """Floats of memory one layer of this mixer holds per sequence after ``seq_len`` tokens (the size of its
    decoding state): ``2·T·d_model`` for softmax attention's KV cache, ``H·d_k·d_v`` for a matrix memory."""
    raise NotImplementedError(f"{type(self).__name__} does not report its state size (state_floats).")

  @classmethod
  def examples(cls) -> tuple:
    """Configs that between them build every parameter and branch of the mixer (the default one unless a
    subclass lists more): what ``tests/models/test_mixer_contract.py`` checks."""
    return (cls(),)

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> "MixerConfig":
    """``{"name": "assoc", "rule": "delta", ...}`` -> ``AssocConfig(rule="delta", ...)``."""
    if isinstance(values, MixerConfig):
      return values
    if not isinstance(values, Mapping) or "name" not in values:
      raise ValueError(f"a mixer config must be a mapping with a 'name' (one of {names()}), got {values!r}.")
    values = dict(values)
    name = values.pop("name")
    config_cls = lookup(name)[0]
    fields = {f.name for f in dataclasses.fields(config_cls) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
      raise ValueError(f"unknown field(s) {unknown} for mixer {name!r}; valid: {sorted(fields)}.")
    return config_cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


class Mixer(nnx.Module):
  """Base of every token mixer module: ``Mixer(cfg, *, d_model, n_heads, n_layers, dtype, rngs)``.

  The contract (checked for every registered name by ``tests/models/test_mixer_contract.py``):

  * ``__call__(x_BTD) -> y_BTD``, causal (output ``t`` depends on inputs ``≤ t`` only), the dtype of ``x``; and
    ``__call__(x_BTD, segment_ids)`` for packed sequences (``[B, T]`` integers, :mod:`jaxmem.kernels.segments`):
    each document's outputs are the ones it gets alone;
  * every parameter carries logical axes (:func:`jaxmem.sharding.with_axes` / :func:`jaxmem.sharding.param`),
    from which its mesh layout and its weight decay (:func:`jaxmem.sharding.decays`) derive;
  * its per-head kernel runs through :func:`jaxmem.sharding.map_heads`, so that under a mesh each device
    computes its own batch rows and heads (a :class:`~jaxmem.models.mixers.qkv.QKVMixer` gets this from its
    base class; ``tests/train/test_sharding.py`` checks it);
  * its config's :meth:`MixerConfig.state_floats` is the size of what :meth:`init_state` holds;
  * decoding, where a mixer has it: :meth:`init_state` and :meth:`step`, with ``step`` applied token by token
    equal to ``__call__`` on the sequence; and, where it has a faster sequence form that starts from a state
    (prefill), :meth:`scan`, with ``scan`` over a prefix then over the rest equal to ``__call__`` on the whole,
    and ``scan(state, x, lengths)`` on right-padded rows returning each row's state after its own tokens.
  """

  def init_state(self, batch_size: int, max_len: int) -> Any:
    """The decoding state before the first token, for sequences of up to ``max_len`` tokens (a pytree)."""
    raise NotImplementedError(f"{type(self).__name__} has no token-by-token decoding (init_state / step).")

  def step(self, state: Any, x_BD) -> tuple:
    """One token: ``(state, x_t [B, d_model]) -> (state, y_t [B, d_model])`` (state first, as every kernel's
    ``step`` and ``lax.scan``'s body)."""
    raise NotImplementedError(f"{type(self).__name__} has no token-by-token decoding (init_state / step).")

  def scan(self, state: Any, x_BTD, lengths=None) -> tuple:
    """The sequence form from a given state: ``(state, x [B, T, d_model]) -> (state after the last token,
    y [B, T, d_model])``, equal to :meth:`step` over the tokens (a prompt's prefill, a chunk of a stream).

    ``lengths [B]`` (integers in ``[0, T]``, or None: all ``T``): right-padded rows, as prompts of different
    lengths are prefilled in one call: row ``b`` reads its first ``lengths[b]`` tokens and the state returned
    for it is the one after them (the padding writes nothing; its outputs are unspecified)."""
    raise NotImplementedError(f"{type(self).__name__} has no sequence form from a state (scan).")

  @classmethod
  def decodes(cls) -> bool:
    """Whether this mixer implements :meth:`init_state` and :meth:`step`."""
    return cls.step is not Mixer.step

  @classmethod
  def scans(cls) -> bool:
    """Whether this mixer implements :meth:`scan`."""
    return cls.scan is not Mixer.scan


def register(name: str, config_cls: type, module_cls: type) -> None:
  """Adds a mixer; its config's ``name`` default must equal ``name``."""
  if name in REGISTRY:
    raise ValueError(f"mixer {name!r} registered twice.")
  if not (isinstance(config_cls, type) and issubclass(config_cls, MixerConfig)):
    raise ValueError(f"mixer {name!r}: the config class must subclass MixerConfig, got {config_cls!r}.")
  if config_cls().name != name:
    raise ValueError(f"mixer {name!r}: {config_cls.__name__}.name is {config_cls().name!r}.")
  REGISTRY[name] = (config_cls, module_cls)


def names() -> list:
  return sorted(REGISTRY)


def lookup(name: str) -> tuple[type, type]:
  if name not in REGISTRY:
    raise ValueError(f"unknown mixer {name!r}; registered: {names()}.")
  return REGISTRY[name]


def default_dict(name: str) -> dict:
  """The dict form of mixer ``name``'s default config (used to switch mixers from the CLI)."""
  return lookup(name)[0]().to_dict()


def build(cfg: MixerConfig, *, d_model: int, n_heads: int, n_layers: int, dtype: str, rngs):
  """The module for ``cfg`` (looked up by ``cfg.name``)."""
  if not isinstance(cfg, MixerConfig):
    raise ValueError(f"expected a mixer config (one of {names()}), got {cfg!r}.")
  return lookup(cfg.name)[1](cfg, d_model=d_model, n_heads=n_heads, n_layers=n_layers, dtype=dtype, rngs=rngs)
