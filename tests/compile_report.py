"""pytest plugin: how much of each test's time is JAX compilation (``--compile-report N``).

A listener on JAX's public monitoring events (tracing to a jaxpr, lowering to MLIR, the XLA
backend compile) records their time spans; the union of the spans inside a test's setup, call
and teardown is its compile time (nested traces are not counted twice). Workers attach it to
their reports, so under pytest-xdist the controller prints one table: the N slowest tests with
their wall time, compile time and compile share. Subprocesses a test starts are not seen.
"""

from __future__ import annotations

import pytest

_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
_spans: list = []   # (start, end) of every compile event in this process
_rows: dict = {}    # nodeid -> [wall s, compile s], summed over setup / call / teardown


def _listener(event: str, start: float, end: float, **_) -> None:
  if event in _EVENTS:
    _spans.append((start, end))


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


def pytest_addoption(parser):
  parser.addoption("--compile-report", type=int, default=0, metavar="N",
                   help="print the N slowest tests with the share of their time spent compiling JAX programs")


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
  inside = [(max(s, start), min(e, stop)) for s, e in _spans if e > start and s < stop]
  _spans[:] = [(s, e) for s, e in _spans if e > stop]
  outcome.get_result().user_properties.append(("compile_s", _union(inside)))


def pytest_runtest_logreport(report):
  """On the controller (or the only process): every phase's report, the workers' included."""
  compile_s = [v for k, v in report.user_properties if k == "compile_s"]
  if compile_s:
    row = _rows.setdefault(report.nodeid, [0.0, 0.0])
    row[0] += report.duration
    row[1] += compile_s[-1]


def pytest_terminal_summary(terminalreporter, config):
  n = config.getoption("--compile-report")
  rows = _rows
  if not n or not rows:
    return
  tr = terminalreporter
  total = sum(r[0] for r in rows.values())
  comp = sum(r[1] for r in rows.values())
  tr.section(f"JAX compile time: {comp:.0f} s of {total:.0f} s test time ({comp / max(total, 1e-9):.0%})")
  tr.write_line(f"{'wall s':>8} {'compile s':>9} {'share':>6}  test")
  for nodeid, (wall, c) in sorted(rows.items(), key=lambda kv: -kv[1][0])[:n]:
    tr.write_line(f"{wall:8.1f} {c:9.1f} {c / max(wall, 1e-9):6.0%}  {nodeid}")
