"""The repository stands alone: no file sends a reader outside it (to ../shared, which users do not have)."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_file_points_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    offenders = []
    for name in tracked:
        path = ROOT / name
        if path.suffix not in {".md", ".py", ".sh", ".toml", ".txt", ".cu", ".cuh", ".yaml", ".yml"} or not path.exists():
            continue
        if name != "tests/test_standalone_docs.py" and "../shared" in path.read_text(errors="replace"):
            offenders.append(name)
    assert offenders == [], offenders


def test_the_design_card_is_in_the_repository():
    design = ROOT / "docs" / "DESIGN.md"
    assert design.is_file() and "Exactness by construction" in design.read_text()
    for doc in ("README.md", "ARCHITECTURE.md"):
        assert "docs/DESIGN.md" in (ROOT / doc).read_text(), doc
