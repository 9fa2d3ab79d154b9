"""Mutation check: does the test suite notice when the core modules break?

For each target module, every single-point change ("mutant") of one kind below is made
to a copy of the source tree, and the tests that cover that module run against it:

    compare   <  <=  >  >=  ==  !=  is  in swapped for a neighbour (< -> <=, == -> !=, ...)
    operator  +  -  *  /  //  %  &  |  <<  >> swapped (+ -> -, * -> /, & -> |, ...)
    boolop    and <-> or
    not       `not x` -> `x`
    constant  a number n -> n + 1 (0 -> 1, 1 -> 2, 0.5 -> 1.5), True <-> False
    delete    a statement (assignment, call, raise, augmented assignment) -> pass
    return    `return x` -> `return None`

A mutant is killed when the tests fail (or run past the per-mutant timeout), and
survives when they pass. The worktree is never touched: the tree is copied once to a
temporary directory, each mutant overwrites the module there, and the original is put
back afterwards. Surviving mutants are printed, minus those listed in
scripts/mutation_equivalent.txt (mutants no test can observe, each with its reason).

    python scripts/mutation_check.py                       # every target module
    python scripts/mutation_check.py stopstrings auth      # some of them (names below)
    python scripts/mutation_check.py --every 3 sampling    # every third mutant only (a reduced run)
    python scripts/mutation_check.py --list sampling       # the mutants, without running tests
    python scripts/mutation_check.py --jobs 2 auth sampling  # two targets at a time, each in its own copy

Mutant ids (`module:line:col:kind:detail`) are stable while the source line is unchanged.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = ROOT / "scripts" / "mutation_equivalent.txt"
STOPPING = threading.Event()       # set when the run stops early: targets under way stop too

# name -> (module path, the tests that cover it: files or node ids; missing files are skipped)
SPEC = "tests/test_speculative.py::"
TARGETS = {
    "sampling": ("tinyloop/engine/sampling.py",
                 ["tests/test_sampling.py", "tests/test_spec_penalties.py",
                  SPEC + "test_greedy_with_penalties_stays_exact",
                  SPEC + "test_speculative_sampling_has_plain_samplings_distribution"]),
    "acceptance": ("tinyloop/engine/speculative/acceptance.py",
                   ["tests/test_acceptance.py", SPEC + "test_speculative_sampling_has_plain_samplings_distribution",
                    SPEC + "test_greedy_speculation_equals_plain_generation"]),
    "stopstrings": ("tinyloop/text/stopstrings.py", ["tests/test_stopstrings.py"]),
    "schema": ("asgi/schema.py", ["tests/test_schema.py", "tests/test_server_asgi.py"]),
    "auth": ("asgi/auth.py", ["tests/test_auth.py", "tests/test_server_asgi.py", "tests/test_faults.py",
                              "tests/test_security.py"]),
    "kvmodes": ("tinyloop/kv/modes.py", ["tests/test_kv_codecs.py", "tests/test_kvcache.py"]),
    "kvstore": ("tinyloop/backends/reference/kvstore.py", ["tests/test_kv_codecs.py", "tests/test_kvcache.py"]),
    "quant_blocks": ("tinyloop/convert/quant_blocks.py", ["tests/test_gguf_blocks.py", "tests/test_convert.py"]),
    "from_gguf": ("tinyloop/convert/from_gguf.py", ["tests/test_gguf_blocks.py", "tests/test_convert.py"]),
    "engine": ("tinyloop/engine/engine.py", ["tests/test_engine_admission.py", "tests/test_engine_seam.py"]),
}

COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                 ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
OPERATOR_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
                  ast.FloorDiv: ast.Div, ast.Mod: ast.FloorDiv, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd,
                  ast.LShift: ast.RShift, ast.RShift: ast.LShift, ast.Pow: ast.Mult}
DELETABLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Raise)


@dataclass(frozen=True)
class Mutant:
    module: str          # target name
    line: int
    col: int
    kind: str
    detail: str

    @property
    def id(self) -> str:
        return f"{self.module}:{self.line}:{self.col}:{self.kind}:{self.detail}"


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Expr nodes that are docstrings (never mutated: deleting one changes nothing)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
                    first.value.value, str):
                found.add(id(first))
    return found


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside a type annotation: never evaluated under
    `from __future__ import annotations`, so a mutant there is no change at all."""
    roots = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(inner) for root in roots for inner in ast.walk(root)}


def _is_log_call(node: ast.Expr) -> bool:
    """A statement like `log.info(...)`: deleting it is not a behaviour change the tests should pin."""
    call = node.value
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id in ("log", "logger"))


def _sites(tree: ast.AST):
    """(node, kind, detail, apply) for every mutation site; apply(node) mutates in place and
    returns an undo function."""
    docstrings = _docstring_nodes(tree)
    annotations = _annotation_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in annotations:
            continue
        if isinstance(node, ast.Compare):
            for index, op in enumerate(node.ops):
                if type(op) in COMPARE_SWAPS:
                    new = COMPARE_SWAPS[type(op)]
                    yield node, "compare", f"{type(op).__name__}->{new.__name__}#{index}", \
                        _setter(node.ops, index, new())
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in OPERATOR_SWAPS:
            new = OPERATOR_SWAPS[type(node.op)]
            yield node, "operator", f"{type(node.op).__name__}->{new.__name__}", _attr_setter(node, "op", new())
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            yield node, "boolop", f"{type(node.op).__name__}->{new.__name__}", _attr_setter(node, "op", new())
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not", "drop-not", _replace_unary(node)
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            value = node.value
            new = (not value) if isinstance(value, bool) else value + 1
            yield node, "constant", f"{value!r}->{new!r}", _attr_setter(node, "value", new)
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            yield node, "return", "None", _attr_setter(node, "value", ast.Constant(None))
    for parent in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if not isinstance(block, list):
                continue
            for index, stmt in enumerate(block):
                if not isinstance(stmt, DELETABLE) or id(stmt) in docstrings:
                    continue
                if isinstance(stmt, ast.Expr) and _is_log_call(stmt):
                    continue
                yield stmt, "delete", type(stmt).__name__, _setter(block, index, ast.Pass())


def _setter(container: list, index: int, new):
    def apply():
        old = container[index]
        container[index] = ast.copy_location(new, old) if isinstance(new, ast.AST) and hasattr(old, "lineno") \
            else new
        return lambda: container.__setitem__(index, old)
    return apply


def _attr_setter(node, name, new):
    def apply():
        old = getattr(node, name)
        setattr(node, name, new)
        return lambda: setattr(node, name, old)
    return apply


def _replace_unary(node: ast.UnaryOp):
    # `not x` -> `x`: turn the UnaryOp into a unary plus-free identity by wrapping in a
    # call to bool(), which keeps the expression's truth value minus the negation
    def apply():
        old_op, old_operand = node.op, node.operand
        node.op = ast.UAdd()
        node.operand = ast.Call(ast.Name("bool", ast.Load()), [old_operand], [])
        # +bool(x) is an int with x's truth value: the negation is gone

        def undo():
            node.op, node.operand = old_op, old_operand
        return undo
    return apply


def mutants_of(name: str) -> list[tuple[Mutant, str]]:
    """Every mutant of a target as (mutant, mutated source), in source order."""
    path = ROOT / TARGETS[name][0]
    source = path.read_text()
    tree = ast.parse(source)
    original = ast.unparse(tree)
    found = []
    seen_sources = set()
    for node, kind, detail, apply in list(_sites(tree)):
        undo = apply()
        try:
            mutated = ast.unparse(ast.fix_missing_locations(tree))
        finally:
            undo()
        if mutated == original or mutated in seen_sources:
            continue
        seen_sources.add(mutated)
        found.append((Mutant(name, node.lineno, node.col_offset, kind, detail), mutated))
    found.sort(key=lambda item: (item[0].line, item[0].col, item[0].kind, item[0].detail))
    return found


def load_equivalent() -> dict[str, str]:
    """scripts/mutation_equivalent.txt: `mutant id  # reason` per line (ids hold "#0": split on " #")."""
    listed = {}
    if EQUIVALENT_FILE.exists():
        for line in EQUIVALENT_FILE.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                mutant_id, _, reason = line.partition(" #")
                listed[mutant_id.strip()] = reason.strip()
    return listed


def copy_tree(destination: Path) -> None:
    """The sources and tests, no venv, no caches, no git."""
    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".pytest_cache", "NOTE-*")
    for entry in ("tinyloop", "asgi", "tests", "scripts", "deploy", "cuda", "pyproject.toml", "README.md"):
        source = ROOT / entry
        if source.is_dir():
            shutil.copytree(source, destination / entry, ignore=ignore)
        elif source.exists():
            shutil.copy2(source, destination / entry)


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[str, float]:
    """'killed' (tests failed), 'timeout' (counts as killed) or 'survived'; and seconds taken."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header",
               "-o", "addopts=-m 'not slow and not deploy'", *tests]
    started = time.monotonic()
    try:
        result = subprocess.run(command, cwd=tree, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started
    seconds = time.monotonic() - started
    # Any failure counts: failed tests (1), or a mutant that breaks collection or a conftest
    # import (2, 4). The unmutated run must pass first, so a broken setup cannot pass as kills.
    return ("survived" if result.returncode == 0 else "killed"), seconds


def check_module(name: str, tree: Path, every: int, timeout: float, equivalent: dict, log,
                 test_paths: list[str] | None = None) -> dict:
    module_path = TARGETS[name][0]
    test_paths = test_paths or TARGETS[name][1]
    tests = [t for t in test_paths if (tree / t.split("::")[0]).exists()]
    target = tree / module_path
    original = target.read_text()
    status, baseline = run_tests(tree, tests, timeout=3600)
    if status != "survived":
        raise RuntimeError(f"{name}: the tests fail on the unmutated tree")
    per_mutant_timeout = max(timeout, 3 * baseline)
    mutants = mutants_of(name)[::every]
    results = {"module": module_path, "tests": tests, "mutants": len(mutants), "killed": 0,
               "survived": [], "equivalent": [], "baseline_s": round(baseline, 1)}
    try:
        for number, (mutant, source) in enumerate(mutants, 1):
            if STOPPING.is_set():
                raise RuntimeError(f"{name}: stopped (another target failed, or Ctrl-C)")
            target.write_text(source)
            status, seconds = run_tests(tree, tests, per_mutant_timeout)
            if status == "survived":
                bucket = "equivalent" if mutant.id in equivalent else "survived"
                results[bucket].append(mutant.id)
            else:
                results["killed"] += 1
            log(f"  [{number}/{len(mutants)}] {status:8s} {seconds:5.1f}s {mutant.id}")
    finally:
        target.write_text(original)
    return results


def check_target(name: str, args, equivalent: dict, live: bool) -> tuple[list[str], dict]:
    """One target in a copy of its own (targets run side by side never share a mutated tree);
    its log lines printed as they come (live) or kept to be printed in the targets' order."""
    if STOPPING.is_set():
        raise RuntimeError(f"{name}: not started (another target failed, or Ctrl-C)")
    lines: list[str] = []
    log = (lambda line: print(line, flush=True)) if live else lines.append
    log(f"{name} ({TARGETS[name][0]})")
    try:
        with tempfile.TemporaryDirectory(prefix=f"tinyloop-mutation-{name}-") as scratch:
            tree = Path(scratch)
            copy_tree(tree)
            return lines, check_module(name, tree, args.every, args.timeout, equivalent, log, args.tests)
    except BaseException:
        STOPPING.set()                  # before this worker takes the next target
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="targets: " + ", ".join(TARGETS))
    parser.add_argument("targets", nargs="*", help="target names (default: all)")
    parser.add_argument("--every", type=int, default=1, help="run every N-th mutant only (a reduced run)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds per mutant at least (3x the unmutated run if longer); a timeout is a kill")
    parser.add_argument("--tests", nargs="+", help="run these tests instead of the target's own (a quick look)")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--jobs", type=int, default=1,
                        help="targets checked at once, each in its own copy of the tree (default 1); "
                             "the output keeps the targets' order")
    parser.add_argument("--fail-on-survivors", action="store_true",
                        help="exit 1 if a mutant survives that scripts/mutation_equivalent.txt does not list")
    args = parser.parse_args(argv)
    names = args.targets or list(TARGETS)
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.list:
        for name in names:
            for mutant, _ in mutants_of(name)[::args.every]:
                print(mutant.id)
        return 0
    equivalent = load_equivalent()
    report = {}
    # each target's tests are subprocesses: the threads only wait on them. A target that
    # fails (or Ctrl-C) stops the run: targets not begun are cancelled, and the ones under
    # way stop before their next mutant.
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        checks = {name: pool.submit(check_target, name, args, equivalent, args.jobs == 1) for name in names}
        for name in names:
            lines, report[name] = checks[name].result()
            for line in lines:
                print(line, flush=True)
    except BaseException:
        STOPPING.set()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    print("\nmodule          mutants  killed  survived  equivalent")
    for name, r in report.items():
        print(f"{name:15s} {r['mutants']:7d} {r['killed']:7d} {len(r['survived']):9d} {len(r['equivalent']):11d}")
    for name, r in report.items():
        for mutant_id in r["survived"]:
            print(f"SURVIVED {mutant_id}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    survivors = sum(len(r["survived"]) for r in report.values())
    return 1 if args.fail_on_survivors and survivors else 0


if __name__ == "__main__":
    sys.exit(main())
