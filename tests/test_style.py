"""The house rules a reader relies on, checked on every Python file of the project (tests included): lines of
at most 110 characters, files of at most 450 lines.

Run: pytest tests/test_style.py -q
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_COLUMNS, MAX_LINES = 110, 450
SKIP = {".venv", ".git", ".gpu-site", "runs", "__pycache__", "node_modules"}


def project_files() -> list[Path]:
    """Every .py file under the repository root, outside virtual environments, run folders and caches."""
    return sorted(p for p in ROOT.rglob("*.py")
                  if not SKIP.intersection(p.relative_to(ROOT).parts[:-1])
                  and not any(part.startswith(".") for part in p.relative_to(ROOT).parts[:-1]))


def test_the_walk_finds_the_project():
    names = {p.relative_to(ROOT).as_posix() for p in project_files()}
    assert {"smrc.py", "grpo.py", "tests/test_style.py", "bench/learn.py", "scale/memory.py"} <= names
    assert not any(n.startswith(".venv/") for n in names)


def test_every_line_fits_in_110_characters():
    """Counted in characters (λ, ‖ and → are one each), not bytes."""
    long = [f"{p.relative_to(ROOT)}:{n}: {len(line)} characters"
            for p in project_files() for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if len(line) > MAX_COLUMNS]
    assert not long, f"{len(long)} lines over {MAX_COLUMNS} characters:\n" + "\n".join(long[:40])


def test_every_file_fits_in_450_lines():
    big = [f"{p.relative_to(ROOT)}: {n} lines" for p in project_files()
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not big, "\n".join(big)
