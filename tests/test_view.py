"""The run viewer (`evaluate.py view`, issue 65) and the quick start's before/after (`evaluate.py
before-after`, issue 68) on one real 2-step tiny run: the archive carries what the view needs, the page
renders its episodes in a real headless Chromium with no script error, a filter in the address changes what
is shown, an archive of version 1 still renders with the reasons, and the before/after prints both rows on
both labelled splits.

Run: pytest tests/test_view.py -q   (52 s on 2 quiet cores, 4 min on busy ones, most of it the 2-step run;
the Chromium tests skip without chromium)
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
pytest.importorskip("alfworld", reason="the training loop runs on the real ALFWorld engine")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (Debian: apt-get install "
                                                             "chromium; .ci/run installs it)")
TWO_STEPS = ["--preset", "tiny", "--rollout.tasks-per-step", "2", "--rollout.group-size", "2",
             "--alfworld.max-steps", "4", "--steps", "2"]


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    out = tmp_path_factory.mktemp("view") / "run"
    proc = subprocess.run([sys.executable, str(ROOT / "smrc.py"), *TWO_STEPS, "--output-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (out / "stdout.txt").write_text(proc.stdout)
    return out


def archive(run: Path) -> list[dict]:
    from scale.run_logs import read_archive
    return read_archive(run / "rollouts.jsonl.gz")


def view(*args: str) -> Path:
    from analysis.view import ViewArgs, write_view
    import tyro
    return write_view(tyro.cli(ViewArgs, args=list(args)))


def chromium(url: str, tmp_path: Path) -> tuple[str, str]:
    """The DOM after the page's scripts ran, and Chromium's log (console messages are `CONSOLE` lines)."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           f"--user-data-dir={tmp_path / 'chromium'}", "--virtual-time-budget=5000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, proc.stderr


def episodes_shown(dom: str) -> int:
    """The episode nodes the page's script rendered (the script's own text, kept in the DOM, left out)."""
    return len(re.findall(r'<details class="episode"', re.sub(r"<script.*?</script>", "", dom, flags=re.S)))


def test_the_archive_carries_what_the_view_needs(run2):
    """Version 2 rows: the response on every turn; tokens with both log-probs and the teacher's user message
    on the sampled distilled turns; on each unmatched turn the nearest reference state, which the structured
    matcher would have matched had no field differed."""
    import router
    rows = archive(run2)
    assert rows and all(r["v"] == 2 and r["response"] for r in rows)
    tokened = [r for r in rows if "tokens" in r]
    assert tokened and all(r["distilled"] for r in tokened)
    assert len(tokened) == min(32, sum(r["distilled"] for r in rows if r["step"] == 1)) + \
        min(32, sum(r["distilled"] for r in rows if r["step"] == 2))
    for r in tokened:
        assert len(r["tokens"]) == len(r["teacher_logprobs"]) == len(r["student_logprobs"]) > 0
        assert "".join(r["tokens"]).startswith(r["response"][:8])
        assert r["teacher_user_text"].startswith(router.TRAJECTORY_TEMPLATE.split("\n")[0])
        assert router.CANDIDATE_TEMPLATE.split("\n")[0] in r["teacher_user_text"]
    unmatched = [r for r in rows if not r["routed"]]
    assert unmatched and all("nearest" in r for r in unmatched) and not any("nearest" in r for r in rows
                                                                            if r["routed"])
    assert all(r["nearest"]["differ"] for r in unmatched if r["nearest"]["ref"] is not None)
    last = {}
    for r in rows:
        last[r["traj_id"]] = max(last.get(r["traj_id"], 0), r["turn"])
    assert all(("final_observation" in r) == (r["turn"] == last[r["traj_id"]]) for r in rows)


def test_nearest_state_counts_differing_fields_and_keeps_the_routers_order():
    from measure.unmatched import differing_fields, nearest_state
    from records import Step, Trajectory
    sig = (("location", "shelf 1"), ("holding", ()), ("opened", ()))
    def step(location, holding, opened):
        return Step((("location", location), ("holding", holding), ("opened", opened)), "", "", "act")
    a = Trajectory("t", "a", [step("desk 1", (), ()), step("shelf 1", ("pen",), ())], True)
    b = Trajectory("t", "b", [step("shelf 1", (), ("drawer",))], True)
    assert differing_fields(sig, (("location", "shelf 1"), ("extra", 1))) == ["holding", "opened", "extra"]
    near = nearest_state(sig, [a, b])  # one field differs at a[0], a[1] and b[0]: a's later position wins
    assert (near["ref"], near["position"], near["differ"]) == ("a", 1, ["holding"])
    assert nearest_state(sig, [b, a])["ref"] == "b"
    assert nearest_state(sig, [])["ref"] is None


@needs_chromium
def test_the_view_renders_every_episode_in_chromium_without_a_script_error(run2, tmp_path):
    rows = archive(run2)
    page = view("--run", str(run2))
    assert page == run2 / "view.html" and "http" not in re.sub(r"https?://www\.w3\.org", "", page.read_text())
    dom, log = chromium(page.as_uri(), tmp_path)
    assert episodes_shown(dom) == len({r["traj_id"] for r in rows})
    assert 'id="js-errors"' not in dom and "CONSOLE" not in log, log[-2000:]
    assert 'class="tok"' in dom  # the first episode with tokens is open: its response coloured by Δ
    assert 'id="curves"' in dom


@needs_chromium
def test_a_filter_in_the_address_changes_what_is_shown(run2, tmp_path):
    rows = archive(run2)
    page = view("--run", str(run2), "--output", str(tmp_path / "v.html"))
    step1 = len({r["traj_id"] for r in rows if r["step"] == 1})
    matched = len({r["traj_id"] for r in rows if r["routed"]})
    dom1, _ = chromium(page.as_uri() + "#step=1", tmp_path)
    dom2, _ = chromium(page.as_uri() + "#matched=no", tmp_path)
    assert episodes_shown(dom1) == step1 < len({r["traj_id"] for r in rows})
    assert episodes_shown(dom2) == len({r["traj_id"] for r in rows}) - matched
    assert f'<b id="shown">{step1}</b>' in dom1


@needs_chromium
def test_an_archive_of_version_1_renders_and_says_what_it_lacks(run2, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    shutil.copy(run2 / "metrics.jsonl", old)
    v2 = ("v", "response", "parse_reason", "distilled", "advantage", "final_observation", "nearest", "tokens",
          "teacher_logprobs", "student_logprobs", "teacher_user_text")
    with gzip.open(old / "rollouts.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({k: v for k, v in r.items() if k not in v2}) + "\n" for r in archive(run2))
    dom, log = chromium(view("--run", str(old)).as_uri(), tmp_path)
    assert episodes_shown(dom) > 0 and "CONSOLE" not in log, log[-2000:]
    assert "this archive is version 1" in dom  # the open episode's panels say why they are empty
    assert "no config.json" not in dom and "not recorded" in dom  # settings the folder lacks say so


def test_steps_tasks_and_limit_bound_the_view(run2, tmp_path):
    from analysis.view import ViewArgs, view_data
    rows = archive(run2)
    first_type = rows[0]["task_type"]
    assert {e["step"] for e in view_data(run2, ViewArgs(steps=(2,)))["episodes"]} == {2}
    kept = view_data(run2, ViewArgs(tasks=(first_type,)))["episodes"]
    assert {e["task_type"] for e in kept} == {first_type}
    assert len(view_data(run2, ViewArgs(limit=1))["episodes"]) == 1
    one = view("--run", str(run2), "--limit", "1", "--output", str(tmp_path / "one.html")).stat().st_size
    assert one < view("--run", str(run2), "--output", str(tmp_path / "all.html")).stat().st_size
    with pytest.raises(SystemExit, match=r"error: --steps \[9\] --tasks \[\] keep none .* steps: 1-2"):
        view_data(run2, ViewArgs(steps=(9,)))
    with pytest.raises(SystemExit, match="error: --run .* not a run folder"):
        view("--run", str(tmp_path))


def test_the_end_of_a_run_and_its_before_after_show_both_rows_on_both_labelled_splits(run2, capsys):
    """The run's last line names the before-after command; that command prints the warm start and the trained
    checkpoint, on the training games and the held-out games, each rate with its counts."""
    import evaluate
    last = (run2 / "stdout.txt").read_text().strip().splitlines()[-1]
    from scale.lifecycle import TINY_MINUTES
    assert f"python evaluate.py before-after --run {run2}; " in last and f"about {TINY_MINUTES} min" in last
    assert f"python evaluate.py view --run {run2}" in last
    evaluate.main(["before-after", "--run", str(run2), "--k", "2", "--limit", "1"])
    out = capsys.readouterr().out
    table = out[out.index("Before / after training"):]
    assert "training games: avg@2" in table and "held-out games: avg@2" in table
    warm = next(line for line in table.splitlines() if line.startswith("| warm start (tiny-agent-quick)"))
    trained = next(line for line in table.splitlines() if line.startswith("| trained ("))
    for line in (warm, trained):
        assert len(re.findall(r"\d\.\d{3} \(\d+/2 episodes\)", line)) == 2, line
        assert len(re.findall(r"\d\.\d{3} \(\d+/1 games\)", line)) == 2, line
    assert "step_000002" in trained and "The tiny preset trains on its 8 training games" in table
    assert (run2 / "before_after.md").read_text().startswith("Before / after training")


def test_wandb_gets_the_view_as_an_artifact_at_the_end(run2, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="pip install -r requirements-tracking.txt")
    from scale.trackers import Trackers
    out = tmp_path / "run"
    shutil.copytree(run2, out, ignore=shutil.ignore_patterns("step_*", "view.html", "wandb"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = Trackers(("wandb",), out)
    from analysis.view import run_view
    trackers.close(view=run_view)
    wandb.teardown()  # the offline service writes the run file out
    assert (out / "view.html").is_file()
    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    data = run_file.read_bytes()
    assert b"run-view" in data and b"view.html" in data


def test_mlflow_gets_the_view_as_an_artifact_in_the_run_folder(run2, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow", reason="pip install -r requirements-tracking.txt")
    from analysis.view import run_view
    from scale.trackers import Trackers
    out = tmp_path / "run"
    shutil.copytree(run2, out, ignore=shutil.ignore_patterns("step_*", "view.html", "wandb", "mlflow.db"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # the default store keeps its artifacts in the run folder, not ./mlruns
    trackers = Trackers(("mlflow",), out)
    run_id = trackers.active["mlflow"].run_id
    trackers.close(view=run_view)
    client = mlflow.MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    assert [a.path for a in client.list_artifacts(run_id)] == ["view.html"]
    (stored,) = (out / "mlartifacts").rglob("view.html")
    assert stored.read_bytes() == (out / "view.html").read_bytes() and not (tmp_path / "mlruns").exists()
