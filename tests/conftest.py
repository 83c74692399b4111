import os
import pathlib

import jax
import pytest

jax.config.update("jax_numpy_rank_promotion", "raise")

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture
def tiny_shakespeare_path():
  """The real corpus (CI points $JAXMEM_DATA_DIR at ../shared/data); skip if absent."""
  from jaxmem.data import CorpusNotFoundError, load_tiny_shakespeare
  try:
    return load_tiny_shakespeare(download=False).source
  except CorpusNotFoundError:
    pytest.skip("Tiny Shakespeare not available: set JAXMEM_DATA_DIR (see README, Data)")


@pytest.fixture
def isolated_data_env(tmp_path, monkeypatch):
  """No corpus anywhere: empty data dir and cache, downloads off."""
  monkeypatch.setenv("JAXMEM_DATA_DIR", str(tmp_path / "no_data"))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "no_cache"))
  monkeypatch.setenv("JAXMEM_NO_DOWNLOAD", "1")
  return tmp_path


def subprocess_env(**extra) -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  env.update({k: str(v) for k, v in extra.items()})
  return env


def synthetic_text(n_bytes: int = 30_000, seed: int = 0) -> bytes:
  """Learnable byte text: words from a small vocabulary with a Markov flavour."""
  import numpy as np
  rng = np.random.default_rng(seed)
  words = [b"the", b"king", b"shall", b"speak", b"of", b"love", b"and", b"war", b"my", b"lord"]
  out, i = [], 0
  while sum(len(w) + 1 for w in out) < n_bytes:
    i = (i + int(rng.integers(1, 3))) % len(words)
    out.append(words[i])
  return (b" ".join(out) + b"\n")[:n_bytes]


@pytest.fixture
def synthetic_data_dir(tmp_path, monkeypatch):
  """$JAXMEM_DATA_DIR holding a small synthetic tinyshakespeare/input.txt."""
  root = tmp_path / "data"
  (root / "tinyshakespeare").mkdir(parents=True)
  (root / "tinyshakespeare" / "input.txt").write_bytes(synthetic_text())
  monkeypatch.setenv("JAXMEM_DATA_DIR", str(root))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
  monkeypatch.setenv("JAXMEM_NO_DOWNLOAD", "1")
  return root


# A tiny LM run: overrides on top of configs/lm_baseline.py:quick.
TINY_OVERRIDES = [
    "--config.model.d_model=16", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.d_ff=32", "--config.model.max_len=16", "--config.data.seq_len=16",
    "--config.data.batch_size=8", "--config.data.eval_batch_size=16",
    "--config.data.eval_max_windows=8", "--config.train.n_steps=8",
    "--config.train.warmup_steps=2", "--config.train.ckpt_every=4", "--config.train.eval_every=0",
    "--config.train.log_every=1", "--config.train.lr=0.01",
]


def tiny_lm_config(*extra):
  from jaxmem import config_files
  from jaxmem.train.lm import lm_config_from
  cfg = config_files.apply_overrides(config_files.load_config("lm_baseline:quick"),
                                   TINY_OVERRIDES + list(extra))
  return lm_config_from(cfg)
