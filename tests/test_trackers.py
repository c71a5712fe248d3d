"""`--log-with wandb tensorboard mlflow`, offline, with the real libraries: every metrics.jsonl row reaches
each tracker under the same names and step, read back with each library's own reader (wandb: its record
schema, wandb_internal_pb2); a resume continues the same tracker runs; `evaluate.py eval --log-with` adds its
row to them; a tracker that cannot start is one error line before training, one that fails mid-run is
dropped.

Run: pytest tests/test_trackers.py -q
"""
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb", reason="pip install -r requirements-tracking.txt")
pytest.importorskip("tensorboard", reason="pip install -r requirements-tracking.txt")
mlflow = pytest.importorskip("mlflow", reason="pip install -r requirements-tracking.txt")

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)
RUN = ["--preset", "tiny", "--save-every", "1", "--rollout.tasks-per-step", "2", "--rollout.group-size", "2",
       "--alfworld.max-steps", "4", "--eval-every", "2", "--eval-tasks", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def _cli(script: str, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env=env or ENV)


def _rows(out: Path) -> dict[int, dict]:
    """metrics.jsonl as {step: every number of the step's rows} (training and validation rows merged)."""
    rows: dict[int, dict] = {}
    for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()):
        rows.setdefault(r["step"], {}).update({k: v for k, v in r.items() if k != "step"
                                              and isinstance(v, (int, float)) and not isinstance(v, bool)})
    return rows


def _wandb_history(path: Path) -> dict[int, dict]:
    """The history records of an offline .wandb file (W&B's block log of wandb_internal_pb2.Record)."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", {}
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if left < 7 or (length, kind) == (0, 0):  # the rest of a block is padding
            pos += left
            continue
        buf = (b"" if kind in (1, 2) else buf) + data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                out.setdefault(record.history.step.num, {}).update(items)
    return out


def _tensorboard(out: Path) -> dict[int, dict]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got: dict[int, dict] = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            got.setdefault(e.step, {})[tag] = e.value
    return got


def _same(a: float, b: float, rel: float = 0.0) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=0)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    out = tmp_path_factory.mktemp("tracked")
    proc = _cli("smrc.py", *RUN, "--steps", "2", "--log-with", "tensorboard", "wandb", "mlflow",
                "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_every_row_reaches_every_tracker_under_its_name_and_step(tracked):
    rows, ids = _rows(tracked), json.loads((tracked / "trackers.json").read_text())
    assert sorted(rows) == [1, 2] and "val/success_rate" in rows[2]
    (run_file,) = tracked.glob(f"wandb/offline-run-*-{ids['wandb']}/run-{ids['wandb']}.wandb")
    history, board = _wandb_history(run_file), _tensorboard(tracked)
    client = mlflow.MlflowClient(f"sqlite:///{tracked / 'mlflow.db'}")
    for step, row in rows.items():
        for key, value in row.items():
            assert _same(float(history[step][key]), value), (step, key)
            assert _same(board[step][key], value, rel=1e-6), (step, key)  # TensorBoard stores float32
            if math.isfinite(value):  # MLflow keeps no inf
                logged = {m.step: m.value for m in client.get_metric_history(ids["mlflow"], key)}
                assert _same(logged[step], value), (step, key)
    params = client.get_run(ids["mlflow"]).data.params  # the resolved config as the run's parameters
    assert params["algo"] == "smrc-sd" and params["resolved.sd_coef"] == "0.02"  # the tiny preset's


def test_a_resume_and_an_evaluation_continue_the_same_tracker_runs(tracked):
    ids = (tracked / "trackers.json").read_text()
    proc = _cli("smrc.py", *RUN, "--steps", "3", "--log-with", "tensorboard", "wandb", "mlflow", "--resume",
                "--output-dir", str(tracked))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tracked / "trackers.json").read_text() == ids
    ids = json.loads(ids)
    assert len(list(tracked.glob(f"wandb/offline-run-*-{ids['wandb']}"))) == 2  # the same run id, resumed
    assert 3 in _tensorboard(tracked)
    proc = _cli("evaluate.py", "eval", "--checkpoint", str(tracked / "step_000003"), "--split", "eval",
                "--k", "1", "--limit", "2", "--log-with", "mlflow", "--output", str(tracked / "eval"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{tracked / 'mlflow.db'}")
    avg = json.loads((tracked / "eval.json").read_text())["rows"][0]["metrics"]["avg@1"]
    logged = client.get_metric_history(ids["mlflow"], "eval/avg_at_1")  # MLflow allows no @ in a name
    assert [(m.step, m.value) for m in logged] == [(3, avg)]
    assert [m.step for m in client.get_metric_history(ids["mlflow"], "rollout/success_rate")] == [1, 2, 3]


def test_a_tracker_that_cannot_start_is_one_line_before_training(tmp_path):
    env = {**ENV, "MLFLOW_TRACKING_URI": "nosuchscheme://x"}
    proc = _cli("smrc.py", *RUN, "--steps", "1", "--log-with", "mlflow", "--output-dir", str(tmp_path / "r"),
                env=env)
    assert proc.returncode != 0 and not (tmp_path / "r" / "metrics.jsonl").exists()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --log-with mlflow: the tracker did not start")


def test_a_tracker_failing_mid_run_is_reported_once_and_dropped(tmp_path, capsys):
    from scale.trackers import Trackers

    class Broken:
        calls = 0

        def log(self, step, values):
            Broken.calls += 1
            raise ConnectionError("the server went away")

    class Kept:
        def __init__(self):
            self.seen = []

        def log(self, step, values):
            self.seen.append((step, values))

    t = Trackers((), tmp_path)
    kept = Kept()
    t.active = {"wandb": Broken(), "tensorboard": kept}
    for step in (1, 2):
        t.log({"step": step, "a": 1.0, "flag": True, "name": "x"})
    out = capsys.readouterr().out
    assert Broken.calls == 1 and out.count("[trackers] wandb failed at step 1") == 1
    assert kept.seen == [(1, {"a": 1.0}), (2, {"a": 1.0})]  # numbers only, every row
