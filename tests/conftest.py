import os
import pathlib


def _compilation_cache_dir() -> str:
  """JAX's persistent compilation cache for the test session, its subprocesses and notebook kernels:
  ``$JAXMEM_TEST_COMPILATION_CACHE`` (``0`` turns it off), else ``<user cache>/jaxmem/jax_compilation_cache``.
  Programs compiled once (by either xdist worker, a subprocess or a kernel) are read back by the others,
  and by later runs."""
  value = os.environ.get("JAXMEM_TEST_COMPILATION_CACHE")
  if value == "0":
    return ""
  if value:
    return value
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "jaxmem", "jax_compilation_cache")


# The cache's size is bounded here, once per session (prune_compilation_cache), not by JAX's
# jax_compilation_cache_max_size: with that limit set, every write lists and reads the whole cache
# directory under a lock shared by all processes (quadratic in the number of programs, and the workers
# wait on each other).
CACHE_MAX_BYTES = 2 ** 30       # pruned at the start of a session when above this ...
CACHE_PRUNED_BYTES = 2 ** 29    # ... to this, the least recently used entries first

# set before jax is imported here, and inherited by every subprocess and notebook kernel the tests start
if _compilation_cache_dir():
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _compilation_cache_dir()
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)

# XLA's CPU backend set for compile time, not run time: the suite's time is mostly compilation. LLVM at
# optimisation level 0, and fusions emitted by XLA's classic elemental emitter instead of its MLIR fusion
# emitters (which compile several times slower, on more threads); the HLO programs (passes, fusion decisions,
# layouts) stay the same, execution is slower, which the few execution-heavy tests pay. A flag already in
# XLA_FLAGS is left as set; JAXMEM_TEST_XLA_OPTIMIZE=1 keeps XLA's defaults (the code users run). Numerically
# it is another CPU: the tolerances are argued for any machine.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
if os.environ.get("JAXMEM_TEST_XLA_OPTIMIZE") != "1":
  for _flag in TEST_XLA_FLAGS:
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
      os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
if _compilation_cache_dir():   # in case jax was imported before this file (the env is read at import)
  jax.config.update("jax_compilation_cache_dir", _compilation_cache_dir())
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_compilation_cache_max_size", -1)

REPO = pathlib.Path(__file__).resolve().parent.parent


def prune_compilation_cache(path: str, max_bytes: int = CACHE_MAX_BYTES, to_bytes: int = CACHE_PRUNED_BYTES,
                            ) -> int:
  """Deletes the least recently used entries (by the later of their access and modification times) of the
  cache directory ``path`` when it holds more than ``max_bytes``, down to ``to_bytes``; returns the number
  deleted. A deleted program is compiled again when a test needs it."""
  try:
    stats = [(e.path, e.stat()) for e in os.scandir(path) if e.is_file()]
    entries = [(max(st.st_atime, st.st_mtime), st.st_size, name) for name, st in stats]
  except FileNotFoundError:
    return 0
  total = sum(size for _, size, _ in entries)
  if total <= max_bytes:
    return 0
  deleted = 0
  for _, size, name in sorted(entries):
    if total <= to_bytes:
      break
    try:
      os.remove(name)
    except FileNotFoundError:
      pass
    total -= size
    deleted += 1
  return deleted


# The modules that take longest, longest first (`pytest --compile-report N` prints the modules by time): they
# run first (pytest_collection_modifyitems; under xdist with --no-loadscope-reorder, as the Makefile runs it),
# and the many short modules fill in behind them, so that neither worker is left with a long module at the end
# while the other waits.
LONGEST_MODULES = (
    "tests/models/test_unimatrix.py",
    "tests/train/test_sharding.py",
    "tests/kernels/test_assoc.py",
    "tests/kernels/test_assoc_numerics.py",
    "tests/models/test_mixer_contract.py",
    "tests/test_cli.py",
    "tests/models/test_assoc_model.py",
    "tests/test_decode.py",
    "tests/train/test_multiprocess.py",
    "tests/models/test_unimatrix_decode.py",
    "tests/experiments/unimatrix/test_experiments.py",
    "tests/ops/test_ops.py",
)


def pytest_collection_modifyitems(session, config, items):
  rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))   # stable: the rest as collected


def pytest_sessionstart(session):
  if _compilation_cache_dir() and not hasattr(session.config, "workerinput"):   # the controller, once
    prune_compilation_cache(_compilation_cache_dir())


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Frees each test module's compiled programs when it ends (``jax.clear_caches``). A worker process runs
  hundreds of modules, and every executable XLA:CPU keeps holds a few memory mappings: past the kernel's
  ``vm.max_map_count`` (65,530 by default) the next compilation crashes the worker (a segfault or an abort
  inside XLA). Programs shared between modules come back from the persistent compilation cache."""
  yield
  jax.clear_caches()

pytest_plugins = ["tests.compile_report"]


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


class CompileCounter:
  """Counts the XLA programs a block compiles or reads back from the persistent compilation cache
  (this file turns it on for the session), each once: JAX 0.10 reports a cache hit both as a hit and
  as a backend compile, so a compile event right after a hit is not counted again."""

  COMPILED = "/jax/core/compile/backend_compile_duration"
  CACHE_HIT = "/jax/compilation_cache/cache_hits"

  def __enter__(self):
    self.n, self._after_hit = 0, False
    jax.monitoring.register_event_duration_secs_listener(self._compiled)
    jax.monitoring.register_event_listener(self._hit)
    return self

  def _compiled(self, event, duration, **_):
    if event == self.COMPILED:
      self.n += not self._after_hit
      self._after_hit = False

  def _hit(self, event, **_):
    if event == self.CACHE_HIT:
      self.n += 1
      self._after_hit = True

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._compiled)
    jax.monitoring.unregister_event_listener(self._hit)


def subprocess_env(**extra) -> dict:
  """This process's environment for a child (same compilation cache, same test XLA flags: extra
  ``XLA_FLAGS`` are added to this session's, not put in their place)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
  extra = {k: str(v) for k, v in extra.items()}
  if "XLA_FLAGS" in extra:
    extra["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + extra["XLA_FLAGS"]).strip()
  env.update(extra)
  return env


def wait_until_paused(procs, timeout: float = 300) -> list:
  """Reads each process's output (text pipes) until it says it paused (``JAXMEM_TEST_PAUSE_AT_STEP``: the
  training loop stops dead after that step with its checkpoints committed); returns what each printed. A
  process that ends first fails the test; a watchdog kills them all after ``timeout`` s."""
  import threading
  watchdog = threading.Timer(timeout, lambda: [p.kill() for p in procs])
  watchdog.start()
  outs = []
  try:
    for p in procs:
      lines = []
      for line in p.stdout:
        lines.append(line)
        if line.startswith("jaxmem: paused at step"):
          break
      else:
        raise AssertionError("a run ended before its pause point:\n" + "".join(lines)[-3000:])
      outs.append("".join(lines))
  finally:
    watchdog.cancel()
  return outs


def forward(model, *args):
  """``model(*args)``, jitted once per model structure and argument shapes (an eager NNX call compiles op by
  op and retraces every scan): for tests that re-evaluate a trained model."""
  from jaxmem.train import apply_model
  return apply_model(_call_model, model, *args)


def _call_model(model, *args):
  return model(*args)


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


def reproduce_tiny(out, name: str, settings) -> tuple:
  """``jaxmem reproduce --quick --only name`` with ``settings``, checked to have run and written its report
  row and figure; returns ``(its status entry, REPORT.md's text)``."""
  from jaxmem.experiments.report import reproduce
  status = reproduce(out, quick=True, only=[name], progress=False, echo=lambda *a: None,
                     configs={name: settings})
  assert status[name]["status"] == "ok", status
  report = (out / "REPORT.md").read_text()
  assert f"| {name} | ok |" in report
  assert f"![{name}]({name}/{name}.png)" in report
  assert (out / name / f"{name}.png").stat().st_size > 0
  return status[name], report
