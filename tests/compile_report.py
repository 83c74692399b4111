"""pytest plugin: how much of each test's time is JAX compilation (``--compile-report N``).

A listener on JAX's public monitoring events (tracing to a jaxpr, lowering to MLIR, the XLA
backend compile) records their time spans; the union of the spans inside a test's setup, call
and teardown is its compile time (nested traces are not counted twice). Workers attach it to
their reports, so under pytest-xdist the controller prints one table: the N slowest tests with
their wall time, compile time, compile share and number of XLA compilations, then the modules by total
time; ``--compile-report-json PATH`` also writes every test's row. Subprocesses a test starts are not seen.
"""

from __future__ import annotations

import pytest

_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_spans: list = []   # (start, end, is a backend compile) of every compile event in this process
_rows: dict = {}    # nodeid -> [wall s, compile s, XLA compilations], summed over setup / call / teardown


def _listener(event: str, start: float, end: float, **_) -> None:
  if event in _EVENTS:
    _spans.append((start, end, event == _EVENTS[-1]))


def _union(spans: list) -> float:
  total, cur_s, cur_e = 0.0, None, None
  for s, e in sorted(spans):
    if cur_e is None or s > cur_e:
      if cur_e is not None:
        total += cur_e - cur_s
      cur_s, cur_e = s, e
    else:
      cur_e = max(cur_e, e)
  return total + (0.0 if cur_e is None else cur_e - cur_s)


def _module(nodeid: str) -> str:
  return nodeid.split("::")[0]


def pytest_addoption(parser):
  parser.addoption("--compile-report", type=int, default=0, metavar="N",
                   help="print the N slowest tests with the share of their time spent compiling JAX programs")
  parser.addoption("--compile-report-json", default=None, metavar="PATH",
                   help="with --compile-report: write every test's wall s, compile s and compilations to PATH")


def pytest_configure(config):
  if config.getoption("--compile-report"):
    import jax.monitoring
    jax.monitoring.register_event_time_span_listener(_listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  outcome = yield
  if not item.config.getoption("--compile-report"):
    return
  start, stop = call.start, call.stop
  inside = [(max(s, start), min(e, stop)) for s, e, _ in _spans if e > start and s < stop]
  n_compiles = sum(b for s, e, b in _spans if start <= e <= stop)
  _spans[:] = [x for x in _spans if x[1] > stop]
  props = outcome.get_result().user_properties
  props.append(("compile_s", _union(inside)))
  props.append(("xla_compiles", n_compiles))


def pytest_runtest_logreport(report):
  """On the controller (or the only process): every phase's report, the workers' included."""
  props = dict(report.user_properties)
  if "compile_s" in props:
    row = _rows.setdefault(report.nodeid, [0.0, 0.0, 0])
    row[0] += report.duration
    row[1] += props["compile_s"]
    row[2] += props.get("xla_compiles", 0)


def pytest_terminal_summary(terminalreporter, config):
  n = config.getoption("--compile-report")
  rows = _rows
  if not n or not rows:
    return
  tr = terminalreporter
  total = sum(r[0] for r in rows.values())
  comp = sum(r[1] for r in rows.values())
  tr.section(f"JAX compile time: {comp:.0f} s of {total:.0f} s test time ({comp / max(total, 1e-9):.0%})")
  tr.write_line(f"{'wall s':>8} {'compile s':>9} {'share':>6} {'XLA comp.':>9}  test")
  for nodeid, (wall, c, k) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:n]:
    tr.write_line(f"{wall:8.1f} {c:9.1f} {c / max(wall, 1e-9):6.0%} {k:9d}  {nodeid}")
  modules: dict = {}
  for nodeid, (wall, c, k) in rows.items():
    m = modules.setdefault(_module(nodeid), [0.0, 0.0, 0, 0])
    m[0], m[1], m[2], m[3] = m[0] + wall, m[1] + c, m[2] + k, m[3] + 1
  tr.write_line("")
  tr.write_line(f"{'wall s':>8} {'compile s':>9} {'share':>6} {'XLA comp.':>9} {'tests':>5}  module")
  for mod, (wall, c, k, t) in sorted(modules.items(), key=lambda kv: -kv[1][0])[:n]:
    tr.write_line(f"{wall:8.1f} {c:9.1f} {c / max(wall, 1e-9):6.0%} {k:9d} {t:5d}  {mod}")
  path = config.getoption("--compile-report-json")
  if path:
    import json
    with open(path, "w") as f:
      json.dump({nodeid: {"wall_s": w, "compile_s": c, "xla_compiles": k}
                 for nodeid, (w, c, k) in rows.items()}, f, indent=1)
