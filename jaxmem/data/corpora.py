"""Byte-level text corpora with train / validation / test splits.

Where a corpus is looked for, in order (the first hit wins):

1. an explicit ``path`` (a file, or a folder holding it);
2. ``$JAXMEM_DATA_DIR``;
3. the user cache, ``$XDG_CACHE_HOME/jaxmem`` or ``~/.cache/jaxmem``;
4. tensorflow-datasets (``tfds.data_source``), when installed and already prepared;
5. (Tiny Shakespeare only, unless ``download=False`` or ``JAXMEM_NO_DOWNLOAD=1``) its
   canonical source, downloaded into the cache and verified by sha256.

(WikiText-2 raw replaces 4 and 5 with the Hugging Face ``datasets`` package.)

A corpus that is nowhere raises :class:`CorpusNotFoundError`, which lists every place
looked and how to get the data.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import tempfile
import urllib.request
from typing import Callable, Optional

import numpy as np

TINY_SHAKESPEARE_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TINY_SHAKESPEARE_BYTES = 1_115_394

SPLITS = ("train", "validation", "test")
_ALIASES = {
    "tinyshakespeare": "tinyshakespeare",
    "tiny_shakespeare": "tinyshakespeare",
    "wikitext2": "wikitext2",
    "wikitext-2": "wikitext2",
    "wikitext-2-raw": "wikitext2",
    "wikitext2_raw": "wikitext2",
}
CORPORA = ("tinyshakespeare", "wikitext2")


class CorpusNotFoundError(FileNotFoundError):
  """A corpus was not found anywhere jaxmem looks; the message says where and how to fix."""


@dataclasses.dataclass(frozen=True)
class Corpus:
  """A byte corpus: ``splits[name]`` is a ``uint8`` array, ``source`` says where it came from."""

  name: str
  splits: dict
  source: str

  def __getitem__(self, split: str) -> np.ndarray:
    if split not in self.splits:
      raise ValueError(f"`split` must be one of {list(self.splits)}, got {split!r}.")
    return self.splits[split]


def cache_dir() -> pathlib.Path:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "jaxmem"


def split_tiny_shakespeare(data: bytes) -> dict:
  """The tensorflow-datasets split: first 90% train, then half of the rest each.

  Same arithmetic as tfds' ``tiny_shakespeare`` builder (``i = int(len * 0.9)``, then
  ``int(len(rest) * 0.5)``). tfds splits the decoded text; the corpus is ASCII, so
  splitting bytes is identical: 1,003,854 / 55,770 / 55,770 bytes.
  """
  i = int(len(data) * 0.9)
  train, rest = data[:i], data[i:]
  j = int(len(rest) * 0.5)
  return {"train": train, "validation": rest[:j], "test": rest[j:]}


def _as_uint8(splits: dict) -> dict:
  return {k: np.frombuffer(bytes(v), dtype=np.uint8) for k, v in splits.items()}


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


def _candidate_dirs(path: Optional[str]) -> list:
  """(label, folder-or-file) pairs in lookup order."""
  out = []
  if path is not None:
    out.append(("path", pathlib.Path(path).expanduser()))
  env = os.environ.get("JAXMEM_DATA_DIR")
  if env:
    out.append(("$JAXMEM_DATA_DIR", pathlib.Path(env).expanduser()))
  out.append(("cache", cache_dir()))
  return out


def _first_file(root: pathlib.Path, relatives: list) -> Optional[pathlib.Path]:
  if root.is_file():
    return root
  for rel in relatives:
    p = root / rel
    if p.is_file():
      return p
  return None


def _download_tiny_shakespeare(dest: pathlib.Path, timeout: float, opener: Callable) -> bytes:
  with opener(TINY_SHAKESPEARE_URL, timeout=timeout) as response:
    data = response.read()
  digest = _sha256(data)
  if digest != TINY_SHAKESPEARE_SHA256:
    raise ValueError(
        f"downloaded Tiny Shakespeare has sha256 {digest} ({len(data)} bytes), expected "
        f"{TINY_SHAKESPEARE_SHA256} ({TINY_SHAKESPEARE_BYTES} bytes); not saved."
    )
  dest.parent.mkdir(parents=True, exist_ok=True)
  # Write atomically so a killed download never leaves a truncated corpus in the cache.
  with tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as f:
    f.write(data)
  os.replace(f.name, dest)
  return data


def _download_allowed(download: Optional[bool]) -> bool:
  if download is not None:
    return download
  return os.environ.get("JAXMEM_NO_DOWNLOAD", "") in ("", "0")


def load_tiny_shakespeare(
    path: Optional[str] = None,
    *,
    download: Optional[bool] = None,
    timeout: float = 20.0,
    _opener: Callable = urllib.request.urlopen,
) -> Corpus:
  """Tiny Shakespeare (Karpathy's char-rnn ``input.txt``) with the tfds 90/5/5 split."""
  looked = []
  rels = ["tinyshakespeare/input.txt", "tiny_shakespeare/input.txt", "input.txt"]
  for label, root in _candidate_dirs(path):
    hit = _first_file(root, rels)
    if hit is not None:
      data = hit.read_bytes()
      return Corpus("tinyshakespeare", _as_uint8(split_tiny_shakespeare(data)), str(hit))
    looked.append(f"{label}: {root} (tried {', '.join(rels)})")

  try:
    import tensorflow_datasets as tfds  # optional: the `data` extra
  except ImportError:
    looked.append("tensorflow-datasets: not installed (pip install 'jaxmem[data]')")
  else:
    try:
      splits = {}
      for split in SPLITS:
        source = tfds.data_source("tiny_shakespeare", split=split, download=False)
        text = source[0]["text"]
        splits[split] = text.encode() if isinstance(text, str) else bytes(text)
      return Corpus("tinyshakespeare", _as_uint8(splits), "tensorflow-datasets tiny_shakespeare")
    except Exception as e:  # noqa: BLE001 - tfds raises many kinds; report, don't crash
      looked.append(f"tensorflow-datasets: tiny_shakespeare not prepared ({type(e).__name__}: {e})")

  dest = cache_dir() / "tinyshakespeare" / "input.txt"
  if _download_allowed(download):
    try:
      data = _download_tiny_shakespeare(dest, timeout, _opener)
      return Corpus("tinyshakespeare", _as_uint8(split_tiny_shakespeare(data)), str(dest))
    except ValueError as e:  # checksum mismatch: say so, never use the bytes
      looked.append(f"download: {e}")
    except OSError as e:
      looked.append(f"download from {TINY_SHAKESPEARE_URL}: failed ({e})")
  else:
    looked.append("download: disabled (download=False or JAXMEM_NO_DOWNLOAD=1)")

  raise CorpusNotFoundError(
      "Tiny Shakespeare not found. Looked in:\n  - " + "\n  - ".join(looked) +
      f"\nFix: put input.txt ({TINY_SHAKESPEARE_BYTES} bytes, sha256 "
      f"{TINY_SHAKESPEARE_SHA256[:12]}...) at $JAXMEM_DATA_DIR/tinyshakespeare/input.txt "
      f"or {dest}; it is {TINY_SHAKESPEARE_URL}."
  )


def load_wikitext2(path: Optional[str] = None) -> Corpus:
  """WikiText-2 raw (Merity et al. 2016) from ``wiki.{train,valid,test}.raw``.

  Looked for in ``path``, ``$JAXMEM_DATA_DIR`` and the cache (each folder itself or its
  ``wikitext-2-raw/`` subfolder), then via the Hugging Face ``datasets`` package
  (``wikitext``, ``wikitext-2-raw-v1``) when it is installed.
  """
  names = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}
  looked = []
  for label, root in _candidate_dirs(path):
    for folder in (root, root / "wikitext-2-raw", root / "wikitext2"):
      files = {k: folder / v for k, v in names.items()}
      if all(f.is_file() for f in files.values()):
        splits = {k: f.read_bytes() for k, f in files.items()}
        return Corpus("wikitext2", _as_uint8(splits), str(folder))
    looked.append(f"{label}: {root} and {root / 'wikitext-2-raw'} (wiki.{{train,valid,test}}.raw)")
  try:
    import datasets as hf_datasets  # optional
  except ImportError:
    looked.append("Hugging Face datasets: not installed")
  else:
    try:
      ds = hf_datasets.load_dataset("wikitext", "wikitext-2-raw-v1")
      hf_names = {"train": "train", "validation": "validation", "test": "test"}
      splits = {k: "".join(ds[v]["text"]).encode("utf-8") for k, v in hf_names.items()}
      return Corpus("wikitext2", _as_uint8(splits), "Hugging Face datasets wikitext-2-raw-v1")
    except Exception as e:  # noqa: BLE001
      looked.append(f"Hugging Face datasets: failed ({type(e).__name__}: {e})")
  raise CorpusNotFoundError(
      "WikiText-2 raw not found. Looked in:\n  - " + "\n  - ".join(looked) +
      "\nFix: put wiki.train.raw, wiki.valid.raw and wiki.test.raw (from the "
      "wikitext-2-raw-v1 archive) in $JAXMEM_DATA_DIR/wikitext-2-raw/, or "
      "pip install datasets."
  )


def load_corpus(name: str, path: Optional[str] = None, **kwargs) -> Corpus:
  """Loads a corpus by name: ``tinyshakespeare`` or ``wikitext2`` (aliases accepted)."""
  key = _ALIASES.get(str(name).lower())
  if key is None:
    raise ValueError(f"`corpus` must be one of {list(CORPORA)}, got {name!r}.")
  if key == "tinyshakespeare":
    return load_tiny_shakespeare(path, **kwargs)
  return load_wikitext2(path)
