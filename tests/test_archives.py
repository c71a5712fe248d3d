"""The records behind the README: analysis/archives.py reads a record's packed files under their old paths,
and
the README's results table is what bench/learn.py's report computes from the v21 sweep's archive.

Run: pytest tests/test_archives.py -q
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis import archives  # noqa: E402

SWEEP = "bench/results/learn_sweep_v21"


def readme_table_lines(text: str) -> list[str]:
    """The README's results table: from its header row (`| row (`) to the last row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| row ("))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """The v21 report rebuilt from a copy of its archive alone (the same relative paths, in a scratch
    root)."""
    from bench import learn
    root = tmp_path_factory.mktemp("record")
    (root / SWEEP).mkdir(parents=True)
    shutil.copyfile(ROOT / f"{SWEEP}.tar.gz", root / f"{SWEEP}.tar.gz")
    settings = json.loads(archives.read_text(ROOT / SWEEP / "results.json"))["args"]
    cwd = Path.cwd()
    try:
        os.chdir(root)
        learn.main(learn.LearnArgs(**{**settings, "report_only": True}))
    finally:
        os.chdir(cwd)
    return root


def test_the_readme_table_is_the_sweep_record(regenerated):
    """Every line of the README's table equals bench.learn_report.readme_table of the report recomputed from
    the archive (each run's metrics and evaluation), and the report itself equals the committed one."""
    from bench.learn_report import readme_table
    summary = json.loads(archives.read_text(regenerated / SWEEP / "results.json"))
    assert readme_table_lines((ROOT / "README.md").read_text()) == readme_table(summary).splitlines()
    assert (regenerated / SWEEP / "results.md").read_text() == (ROOT / SWEEP / "results.md").read_text()
    assert summary == json.loads(archives.read_text(ROOT / SWEEP / "results.json"))


def test_a_changed_cell_is_caught():
    """The comparison above can fail: one digit changed in one row of the README's table is a different
    table."""
    table = readme_table_lines((ROOT / "README.md").read_text())
    changed = (ROOT / "README.md").read_text().replace(table[4], table[4].replace("0.", "9.", 1))
    assert readme_table_lines(changed) != table


def test_packed_files_are_read_under_their_old_paths(tmp_path):
    run = tmp_path / "results" / "sweep" / "grpo-seed0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "results" / "sweep" / "results.md").write_text("| table |\n")
    (tmp_path / "results" / "loose_a.json").write_text("{}")
    archive = tmp_path / "results" / "sweep.tar.gz"
    assert archives.pack(archive, [run]) == ["sweep/grpo-seed0/metrics.jsonl"]
    assert not run.exists() and archives.exists(run / "metrics.jsonl")
    assert archives.read_text(run / "metrics.jsonl") == '{"step": 1}\n'
    assert archives.listing(tmp_path / "results" / "sweep") == ["grpo-seed0/metrics.jsonl", "results.md"]
    assert not archives.exists(run / "config.json")
    first = archive.read_bytes()
    archives.write_text(run / "metrics.jsonl", '{"step": 1}\n')  # unchanged: the archive is not rewritten
    assert archive.read_bytes() == first
    archives.write_text(run / "metrics.jsonl", '{"step": 2}\n')  # a packed file stays packed
    assert not run.exists() and archives.read_text(run / "metrics.jsonl") == '{"step": 2}\n'
    with pytest.raises(SystemExit, match="an archive's name begins the paths it holds"):
        archives.pack(archive, [tmp_path / "results" / "loose_a.json"])
    archives.pack(tmp_path / "results" / "loose.tar.gz", [tmp_path / "results" / "loose_a.json"])
    assert archives.read_text(tmp_path / "results" / "loose_a.json") == "{}"


def test_an_archive_is_the_same_bytes_for_the_same_files(tmp_path):
    files = {"x/b.txt": b"2", "x/a.txt": b"1"}
    archives.write_archive(tmp_path / "x.tar.gz", files)
    archives.write_archive(tmp_path / "y.tar.gz", dict(reversed(files.items())))
    assert (tmp_path / "x.tar.gz").read_bytes() == (tmp_path / "y.tar.gz").read_bytes()
    listed = subprocess.run(["tar", "tzf", str(tmp_path / "x.tar.gz")], capture_output=True, text=True)
    assert listed.stdout.split() == ["x/a.txt", "x/b.txt"]  # plain tar reads it: `tar xzf` puts files back


def test_the_records_cited_by_the_code_and_tests_are_there():
    """The paths the project's modules and tests read (config.py's and scale/memory_plan.py's citations, the
    λ-pilot test's warm start, the memory-plan test's run) resolve, on disk or packed."""
    for path in ("bench/results/learn_sweep_v21/warm_start/model.safetensors",
                 "bench/results/memory_smollm2/config.json", "bench/results/gpu_h200/gpu.log",
                 "bench/results/smrc_sd_10steps_v8/metrics.jsonl",
                 "bench/results/learn_sweep_v21/eval/warm-start.json"):
        assert archives.exists(ROOT / path), path


def test_a_difference_read_from_the_archive_and_one_with_no_spread():
    """bench/sweep_runs.py --diff on the v21 record: a pair of rows as docs/results.md quotes it, and a row
    against itself (every seed differs by 0: SE 0, said, not divided by)."""
    from bench.sweep_runs import difference
    record = ROOT / "bench" / "results" / "learn_sweep_v21"
    assert difference(record, "smrc-sd-lam0.03", "grpo").startswith(
        "smrc-sd-lam0.03 − grpo, paired by seed: -0.0040 ± 0.0113 over 5 seeds; |mean| / SE 0.35 "
        "(printed 0.3)")
    assert difference(record, "grpo", "grpo") == ("grpo − grpo, paired by seed: +0.0000 on each of 5 seeds "
                                                  "(SE 0)")
