"""scripts/mutation_check.py makes the single-point changes it promises, and none where a
change cannot matter (docstrings, annotations, log calls)."""
import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import mutation_check  # noqa: E402

SOURCE = '''
"""Module docstring."""
from __future__ import annotations


def f(x: int | None, y) -> list[int] | None:
    """Docstring."""
    log.info("x is %s", x)
    if x < 3 and not y:
        x += 1
        raise ValueError("no")
    return [x * 2]
'''


def mutated_sources():
    tree = ast.parse(SOURCE)
    out = {}
    for node, kind, detail, apply in list(mutation_check._sites(tree)):
        undo = apply()
        out[(kind, detail)] = ast.unparse(ast.fix_missing_locations(tree))
        undo()
    assert ast.unparse(tree) == ast.unparse(ast.parse(SOURCE))          # every change was undone
    return out


def test_each_kind_of_change_and_nothing_else():
    found = mutated_sources()
    assert set(found) == {
        ("compare", "Lt->LtE#0"), ("boolop", "And->Or"), ("not", "drop-not"), ("constant", "3->4"),
        ("constant", "1->2"), ("constant", "2->3"), ("operator", "Add->Sub"), ("operator", "Mult->Div"),
        ("delete", "AugAssign"), ("delete", "Raise"), ("return", "None")}
    assert "if x <= 3 and (not y)" in found[("compare", "Lt->LtE#0")]
    assert "x -= 1" in found[("operator", "Add->Sub")]
    assert "return None" in found[("return", "None")]
    assert "raise" not in found[("delete", "Raise")]
    assert "+bool(y)" in found[("not", "drop-not")]
    assert all("int | None" in source for source in found.values())     # annotations untouched
    assert all("log.info" in source for source in found.values())


def test_every_target_exists_and_has_mutants():
    for name, (module, tests) in mutation_check.TARGETS.items():
        assert (mutation_check.ROOT / module).is_file(), module
        assert tests and mutation_check.mutants_of(name), name


def test_equivalent_entries_name_known_targets_and_give_a_reason():
    for mutant_id, reason in mutation_check.load_equivalent().items():
        assert mutant_id.split(":")[0] in mutation_check.TARGETS and len(reason) > 20, mutant_id
        known = {m.id for m, _ in mutation_check.mutants_of(mutant_id.split(":")[0])}
        assert mutant_id in known, f"{mutant_id} is not a current mutant (its line changed?)"


def test_jobs_check_targets_side_by_side_each_in_its_own_tree(monkeypatch, capsys):
    """--jobs 2: the second target finishes first (the first waits for it, which one at a time
    would never see: the wait times out and fails the run), each target has a tree of its own,
    and the output keeps the targets' order."""
    import threading
    auth_done, trees = threading.Event(), {}

    def fake_check(name, tree, every, timeout, equivalent, log, tests):
        trees[name] = tree
        assert (tree / "copied").exists()
        if name == "stopstrings" and not auth_done.wait(timeout=30):
            raise RuntimeError("the targets did not run side by side")
        log(f"  checked {name}")
        if name == "auth":
            auth_done.set()
        return {"module": mutation_check.TARGETS[name][0], "mutants": 1, "killed": 1, "survived": [],
                "equivalent": []}
    monkeypatch.setattr(mutation_check, "copy_tree", lambda tree: (tree / "copied").write_text(""))
    monkeypatch.setattr(mutation_check, "check_module", fake_check)
    assert mutation_check.main(["--jobs", "2", "stopstrings", "auth"]) == 0
    out = capsys.readouterr().out
    assert trees["stopstrings"] != trees["auth"]
    order = [out.index(text) for text in ("stopstrings (", "  checked stopstrings", "auth (", "  checked auth")]
    assert order == sorted(order), out


def test_jobs_must_be_positive():
    import pytest
    with pytest.raises(SystemExit) as stopped:
        mutation_check.main(["--jobs", "0", "auth"])
    assert stopped.value.code == 2


def test_a_failing_target_stops_the_run(monkeypatch):
    """A target whose tests fail on the unmutated tree stops the run there: the targets after
    it never start (with one job, as before --jobs existed)."""
    import pytest
    started = []

    def fake_check(name, tree, every, timeout, equivalent, log, tests):
        started.append(name)
        raise RuntimeError(f"{name}: the tests fail on the unmutated tree")
    monkeypatch.setattr(mutation_check, "copy_tree", lambda tree: None)
    monkeypatch.setattr(mutation_check, "check_module", fake_check)
    try:
        with pytest.raises(RuntimeError, match="stopstrings"):
            mutation_check.main(["stopstrings", "auth", "quant_blocks"])
    finally:
        mutation_check.STOPPING.clear()
    assert started == ["stopstrings"]
