"""scripts/gpu_check.sh runs only on a GPU; what the CPU can check of it is that its sanitizer
stage's test selection still names tests: each clause of SANITIZE_TESTS must select at least
one test of the files the stage runs (a renamed test or parameter would silently drop its
kernel from memcheck, racecheck, synccheck and initcheck)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "scripts" / "gpu_check.sh").read_text()


def sanitize_selection() -> tuple[list[list[str]], list[str]]:
    """(the clauses of SANITIZE_TESTS, each its words joined by `and`; the test files the stage runs)."""
    expression = re.search(r'SANITIZE_TESTS="(.*?)"', SCRIPT, re.S).group(1).replace("\\\n", " ")
    clauses = [[word.strip() for word in clause.strip().strip("()").split(" and ")]
               for clause in re.split(r"\)\s+or\s+\(|\s+or\s+", expression)]
    start = SCRIPT.index("for tool in memcheck")
    stage = SCRIPT[start:SCRIPT.index('"$SANITIZE_TESTS"', start)]
    files = sorted(set(re.findall(r"tests/test_\w+\.py", stage)))
    return clauses, files


def test_every_sanitizer_clause_selects_a_test():
    clauses, files = sanitize_selection()
    assert len(clauses) >= 15 and len(files) >= 8
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
                             "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True, text=True).stdout
    ids = [line for line in listed.splitlines() if "::" in line]
    assert ids
    empty = [" and ".join(c) for c in clauses if not any(all(word in node for word in c) for node in ids)]
    assert empty == []
