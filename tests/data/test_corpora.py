"""Corpora: split definitions, lookup order, download verification, clear errors."""

import hashlib
import io
import sys
import types

import numpy as np
import pytest

from jaxmem.data import (
  CorpusNotFoundError,
  corpora,
  load_corpus,
  load_tiny_shakespeare,
  load_wikitext2,
  ngram_bpb,
  split_tiny_shakespeare,
)


def test_split_rule_on_synthetic_bytes():
  data = bytes(range(256)) * 7 + b"xyz"  # 1795 bytes
  s = split_tiny_shakespeare(data)
  n = len(data)
  assert len(s["train"]) == int(n * 0.9)
  rest = n - int(n * 0.9)
  assert len(s["validation"]) == int(rest * 0.5)
  assert s["train"] + s["validation"] + s["test"] == data


def test_tiny_shakespeare_split_sizes_match_tfds(tiny_shakespeare_path):
  c = load_tiny_shakespeare(tiny_shakespeare_path, download=False)
  sizes = {k: len(v) for k, v in c.splits.items()}
  assert sizes == {"train": 1_003_854, "validation": 55_770, "test": 55_770}
  whole = open(tiny_shakespeare_path, "rb").read()
  assert hashlib.sha256(whole).hexdigest() == corpora.TINY_SHAKESPEARE_SHA256
  assert np.concatenate([c["train"], c["validation"], c["test"]]).tobytes() == whole


def test_ngram_calibration_points(tiny_shakespeare_path):
  """The published calibration: unigram 4.81, add-0.1 bigram 3.57 bpb on validation."""
  c = load_tiny_shakespeare(tiny_shakespeare_path, download=False)
  assert ngram_bpb(c["train"], c["validation"], 1) == pytest.approx(4.81, abs=0.005)
  assert ngram_bpb(c["train"], c["validation"], 2, alpha=0.1) == pytest.approx(3.57, abs=0.005)


def _write(path, data=b"To be, or not to be" * 20):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)
  return data


def test_lookup_order_explicit_then_env_then_cache(isolated_data_env, monkeypatch):
  tmp = isolated_data_env
  cache_file = tmp / "no_cache" / "jaxmem" / "tinyshakespeare" / "input.txt"
  _write(cache_file, b"c" * 100)
  assert load_tiny_shakespeare().source == str(cache_file)
  env_file = tmp / "no_data" / "tinyshakespeare" / "input.txt"
  _write(env_file, b"e" * 100)
  assert load_tiny_shakespeare().source == str(env_file)
  explicit = tmp / "mine.txt"
  _write(explicit, b"x" * 100)
  c = load_tiny_shakespeare(str(explicit))
  assert c.source == str(explicit) and set(c["train"].tolist()) == {ord("x")}


def test_missing_corpus_error_says_where_it_looked_and_the_fix(isolated_data_env):
  with pytest.raises(CorpusNotFoundError) as e:
    load_corpus("tinyshakespeare")
  msg = str(e.value)
  assert "$JAXMEM_DATA_DIR" in msg and "no_data" in msg and "cache" in msg
  assert "download: disabled" in msg and "Fix:" in msg


class _FakeResponse(io.BytesIO):
  def __enter__(self):
    return self

  def __exit__(self, *a):
    return False


def test_download_is_verified_by_checksum_and_cached(tiny_shakespeare_path, isolated_data_env):
  real = open(tiny_shakespeare_path, "rb").read()
  calls = []
  def opener(url, timeout):
    calls.append(url)
    return _FakeResponse(real)
  c = load_tiny_shakespeare(download=True, _opener=opener)
  assert calls == [corpora.TINY_SHAKESPEARE_URL]
  cached = isolated_data_env / "no_cache" / "jaxmem" / "tinyshakespeare" / "input.txt"
  assert c.source == str(cached) and cached.read_bytes() == real
  # second load comes from the cache, no network
  assert load_tiny_shakespeare(download=True, _opener=None).source == str(cached)


def test_download_with_wrong_checksum_is_rejected_and_not_saved(isolated_data_env):
  opener = lambda url, timeout: _FakeResponse(b"not shakespeare")
  with pytest.raises(CorpusNotFoundError, match="sha256"):
    load_tiny_shakespeare(download=True, _opener=opener)
  assert not (isolated_data_env / "no_cache" / "jaxmem" / "tinyshakespeare" / "input.txt").exists()


def test_network_failure_is_reported(isolated_data_env):
  def opener(url, timeout):
    raise OSError("network unreachable")
  with pytest.raises(CorpusNotFoundError, match="network unreachable"):
    load_tiny_shakespeare(download=True, _opener=opener)


def test_tensorflow_datasets_source_is_used_when_prepared(isolated_data_env, monkeypatch):
  texts = {"train": b"a" * 50, "validation": b"b" * 20, "test": b"c" * 20}
  fake = types.ModuleType("tensorflow_datasets")
  fake.data_source = lambda name, split, download: [{"text": texts[split]}]
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  c = load_tiny_shakespeare()
  assert "tensorflow-datasets" in c.source
  assert c["validation"].tobytes() == texts["validation"]


def test_wikitext2_from_local_raw_files(isolated_data_env):
  folder = isolated_data_env / "no_data" / "wikitext-2-raw"
  parts = {"train": b" = Valkyria = \n" * 30, "valid": b" = Tower = \n" * 5, "test": b" = R = \n" * 5}
  for k, v in parts.items():
    _write(folder / f"wiki.{k}.raw", v)
  c = load_corpus("wikitext-2")
  assert c["train"].tobytes() == parts["train"] and c["validation"].tobytes() == parts["valid"]


def test_wikitext2_missing_raises_with_fix(isolated_data_env, monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
  with pytest.raises(CorpusNotFoundError, match="wiki.train.raw"):
    load_wikitext2()


def test_unknown_corpus_and_split_raise_value_error(isolated_data_env):
  with pytest.raises(ValueError, match="`corpus` must be one of"):
    load_corpus("penn_treebank")
  _write(isolated_data_env / "no_data" / "tinyshakespeare" / "input.txt")
  with pytest.raises(ValueError, match="`split`"):
    load_corpus("tinyshakespeare")["dev"]
