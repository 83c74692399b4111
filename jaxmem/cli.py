"""The ``jaxmem`` command: ``train | eval | sample | reproduce | bench | compile`` — thin over the library."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="jaxmem", description=__doc__)
  sub = p.add_subparsers(dest="command", required=True)

  t = sub.add_parser("train", help="train a byte LM (any model body) from a config file; resumes from it",
                     epilog="Override any field with --config.section.field=value; "
                            "--config.model.body=unimatrix (or dnc, transformer) switches the model to that "
                            "body's defaults.")
  t.add_argument("--config", required=True,
                 help="config file, optionally with a variant: configs/lm_baseline.py:quick")
  t.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, config.json")
  t.add_argument("--stop_after", type=int, default=None,
                 help="stop after this many steps of this invocation (resume later)")
  t.add_argument("--no_progress", action="store_true", help="no progress bar")
  t.add_argument("--distributed", action="store_true",
                 help="call jax.distributed.initialize() first (multi-host; same as JAXMEM_DISTRIBUTED=1; "
                      "off TPU set JAXMEM_COORDINATOR=host:port, JAXMEM_NUM_PROCESSES, JAXMEM_PROCESS_ID)")

  e = sub.add_parser("eval", help="bits per byte of a trained LM on a split")
  e.add_argument("--workdir", required=True)
  e.add_argument("--split", default="validation", choices=["validation", "test", "train"])
  e.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")

  s = sub.add_parser("sample", help="sample text from a trained byte LM (jaxmem.generate)")
  s.add_argument("--workdir", required=True, help="a `jaxmem train` run")
  s.add_argument("--prompt", required=True, help="text; its UTF-8 bytes are the prompt")
  s.add_argument("-n", "--max_new_tokens", type=int, default=200,
                 help="bytes to generate (at most what a model's learned positions leave after the prompt)")
  s.add_argument("--temperature", type=float, default=1.0,
                 help="0: greedy; applied before --top-k and --top-p")
  s.add_argument("--top-k", "--top_k", dest="top_k", type=int, default=None)
  s.add_argument("--top-p", "--top_p", dest="top_p", type=float, default=None)
  s.add_argument("--seed", type=int, default=0)
  s.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")

  r = sub.add_parser("reproduce", help="run registered experiments and write REPORT.md",
                     epilog="Override an experiment's settings with --config.<experiment>.<field>=value.")
  r.add_argument("--quick", action="store_true", help="2-CPU-core sizes (minutes)")
  r.add_argument("--only", action="append", default=None,
                 help="experiment name (repeatable, or comma-separated)")
  r.add_argument("--out", default=None, help="output folder (default reports/quick or reports/full)")
  r.add_argument("--list", action="store_true", help="list experiments and exit")
  r.add_argument("--no_progress", action="store_true")

  b = sub.add_parser("bench", help="benchmarks, as ratios against baselines in the same run")
  b.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
  b.add_argument("--quick", action="store_true", help="smaller sizes")
  b.add_argument("--repeats", type=int, default=5)

  c = sub.add_parser("compile", help="compile a RASP program to an exact hard-attention transformer",
                     epilog="PROGRAM is lib:<name> (jaxmem.rasp.programs.PROGRAMS) or module:attr "
                            "(an SOp, or a function of max_seq_len returning one).")
  c.add_argument("program", help="lib:reverse, or my_module:my_program")
  c.add_argument("--max-seq-len", "--max_seq_len", dest="max_seq_len", type=int, required=True)
  c.add_argument("--vocab", default=None,
                 help="tokens: 'abc' (characters) or '1,2,3' (comma-separated; integers "
                      "parsed); default: the library program's vocab")
  c.add_argument("--out", default=None, help="write the weights as .npz (jaxmem.rasp.load reads it)")
  c.add_argument("--check", type=int, default=0, metavar="K",
                 help="compare compiled and interpreted outputs on K random inputs")
  c.add_argument("--seed", type=int, default=0)
  return p


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  parser = _parser()
  args, extra = parser.parse_known_args(argv)
  overrides = [a for a in extra if a.startswith("--config.")]
  stray = [a for a in extra if not a.startswith("--config.")]
  if stray or (overrides and args.command not in ("train", "reproduce")):
    parser.error(f"unrecognized arguments: {' '.join(stray or overrides)}")
  try:
    return _dispatch(args, overrides)
  except ValueError as e:
    print(f"jaxmem {args.command}: error: {e}", file=sys.stderr)
    return 2


def _dispatch(args, overrides) -> int:
  from jaxmem import distributed  # multi-host: tpu_scripts/launch.sh sets JAXMEM_DISTRIBUTED=1
  if getattr(args, "distributed", False) or distributed.requested():   # a bad JAXMEM_DISTRIBUTED: exit 2
    distributed.initialize(force=True)
  if args.command == "train":
    from jaxmem import config_files
    from jaxmem.data import CorpusNotFoundError
    from jaxmem.train import NonFiniteLossError, train_lm
    cfg = config_files.load_config(args.config)
    _check_lm_config(args.config, cfg)
    cfg = config_files.apply_overrides(cfg, overrides)
    try:
      res = train_lm(cfg, args.workdir, stop_after=args.stop_after, progress=not args.no_progress)
    except CorpusNotFoundError as e:
      print(f"jaxmem train: error: {e}", file=sys.stderr)
      return 2
    except NonFiniteLossError as e:
      print(f"jaxmem train: stopped: {e}", file=sys.stderr)
      return 3
    print(json.dumps({"step": res.step, **res.final_metrics}))
    return 0

  if args.command == "eval":
    from jaxmem.data import load_corpus
    from jaxmem.train import evaluate_bpb, load_trained_lm
    model, cfg, step = load_trained_lm(args.workdir, args.step)
    corpus = load_corpus(cfg.data.corpus, cfg.data.path)
    r = evaluate_bpb(model, corpus[args.split], cfg.data.seq_len, cfg.data.eval_batch_size)
    print(json.dumps({"step": step, "split": args.split, **r}))
    return 0

  if args.command == "sample":
    from jaxmem.decode import generate
    from jaxmem.train import load_trained_lm
    prompt = args.prompt.encode("utf-8")
    if not prompt:
      raise ValueError("`--prompt` must not be empty (its bytes start the sequence).")
    model, _, _ = load_trained_lm(args.workdir, args.step)
    n = args.max_new_tokens
    cfg = getattr(model, "cfg", None)
    if getattr(cfg, "positions", None) == "learned" and len(prompt) < cfg.max_len < len(prompt) + n:
      n = cfg.max_len - len(prompt)
      print(f"jaxmem sample: the model's learned positions end at {cfg.max_len}: {n} new bytes, not "
            f"{args.max_new_tokens}.", file=sys.stderr)
    out = generate(model, [list(prompt)], n, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    new = bytes(int(t) for t in out[0, len(prompt):])
    sys.stdout.write(args.prompt + new.decode("utf-8", errors="replace") + "\n")
    return 0

  if args.command == "reproduce":
    from jaxmem.experiments import load_all
    from jaxmem.experiments.report import reproduce
    if args.list:
      for name, exp in load_all().items():
        print(f"{name:24s} [{exp.paper}] configs/{exp.config}.py  {exp.description}")
      return 0
    only = [n for item in (args.only or []) for n in item.split(",") if n]
    out = args.out or ("reports/quick" if args.quick else "reports/full")
    status = reproduce(out, quick=args.quick, only=only or None, progress=not args.no_progress,
                       overrides=overrides)
    print(f"report: {out}/REPORT.md")
    return 1 if any(s["status"] == "failed" for s in status.values()) else 0

  if args.command == "compile":
    return _compile(args)

  if args.command == "bench":
    from jaxmem.bench import run_benches
    # each table is printed as soon as it is measured: a later failure or Ctrl-C keeps the earlier ones
    run_benches(args.names, quick=args.quick, repeats=args.repeats,
                emit=lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    print()
    return 0
  raise AssertionError(args.command)


LM_SECTIONS = {"model", "data", "train"}


def _check_lm_config(spec: str, cfg) -> None:
  """``jaxmem train`` takes an LM config (model, data, train); an experiment's settings file gets an error
  that says which command runs it."""
  if set(cfg.keys()) <= LM_SECTIONS:
    return
  from jaxmem import config_files
  from jaxmem.experiments import load_all
  stem = config_files.resolve_config_path(spec)[0].stem
  owners = [name for name, exp in load_all().items() if exp.config == stem]
  if owners:
    runs = " / ".join(f"`jaxmem reproduce --only {n}`" for n in owners)
    raise ValueError(f"{spec!r} holds the settings of the experiment {', '.join(owners)} (`jaxmem reproduce`), "
                     f"not a training run: run it with {runs} (overrides: --config.{owners[0]}.<field>=...). "
                     f"`jaxmem train` takes an LM config with sections model, data, train "
                     f"(configs/lm_baseline.py; --config.model.body picks the model).")
  raise ValueError(f"{spec!r} is not an LM config: sections {sorted(cfg.keys())}, expected "
                   f"{sorted(LM_SECTIONS)} (configs/lm_baseline.py).")


def _parse_vocab(text: str) -> list:
  if "," not in text:
    return list(text)
  out = []
  for tok in text.split(","):
    try:
      out.append(int(tok))
    except ValueError:
      out.append(tok)
  return out


def _compile(args) -> int:
  import importlib

  from jaxmem import rasp
  from jaxmem.rasp import conformance, programs
  spec = None
  if args.program.startswith("lib:"):
    name = args.program[4:]
    if name not in programs.PROGRAMS:
      raise ValueError(f"unknown library program {name!r}; one of {sorted(programs.PROGRAMS)}.")
    spec = programs.PROGRAMS[name]
    program = spec.build(args.max_seq_len)
  elif ":" in args.program:
    mod, attr = args.program.split(":", 1)
    try:
      obj = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"cannot load {args.program!r}: {e}") from e
    program = obj if isinstance(obj, rasp.RASPExpr) else obj(args.max_seq_len)
  else:
    raise ValueError(f"PROGRAM must be lib:<name> or module:attr, got {args.program!r}.")
  if args.vocab is not None:
    vocab = _parse_vocab(args.vocab)
  elif spec is not None:
    vocab = sorted(spec.vocab, key=repr)
  else:
    raise ValueError("--vocab is required for a program outside jaxmem.rasp.lib.")
  model = rasp.compile(program, vocab, args.max_seq_len)
  print(model.summary())
  print(f"layers {model.num_layers}  heads/layer {model.num_heads}  residual width "
        f"{model.residual_width}  params {model.num_params}  compile {model.compile_seconds:.2f} s")
  if args.check:
    if spec is not None and set(vocab) == set(spec.vocab):
      lengths, sample = spec.lengths(args.max_seq_len), spec.sample
      accepts = lambda x: spec.accepts(x, args.max_seq_len)  # noqa: E731
    else:
      lengths, sample, accepts = range(1, args.max_seq_len + 1), None, None
    if not lengths:
      raise ValueError(f"{args.program} accepts no input length <= {args.max_seq_len}.")
    inputs = conformance.inputs_for(vocab, lengths, exhaustive_len=0, n_random=args.check,
                                    seed=args.seed, sample=sample, accepts=accepts)
    c = conformance.check_model(model, program, inputs, name=args.program,
                                compile_s=model.compile_seconds)
    print(f"check: {c.inputs - c.wrong}/{c.inputs} random inputs agree with the interpreter "
          f"(max abs error {c.max_abs_err:.2e})")
    if c.wrong:
      print(f"first disagreement: {c.example}")
  if args.out:
    print(f"weights: {model.export(args.out)}")
  return 1 if args.check and c.wrong else 0


if __name__ == "__main__":
  sys.exit(main())
