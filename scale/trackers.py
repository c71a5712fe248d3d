"""Experiment trackers (`--log-with wandb tensorboard mlflow`, any subset): every row of metrics.jsonl,
validation rows included, also goes to each tracker under the same names and step, and the resolved config
is the tracker run's config. Rank 0 only (the trainer builds them there). metrics.jsonl stays the record.

- Offline by default, each tracker writing into the run folder: wandb in offline mode unless WANDB_MODE
  says otherwise (`OUT/wandb/`; `wandb sync` uploads it later; project WANDB_PROJECT, default smrc-sd),
  TensorBoard event files in `OUT/tensorboard/`, MLflow in a SQLite store `OUT/mlflow.db` unless
  MLFLOW_TRACKING_URI names another (experiment MLFLOW_EXPERIMENT_NAME, default smrc-sd). MLflow allows
  no @ in a name: eval/avg@4 is eval/avg_at_4 there (`mlflow_name`); every other name is the same.
- `--resume` continues the same tracker runs: their ids are kept in `OUT/trackers.json`.
- At the end of a run (`close(view=...)`), wandb and MLflow also get the run viewer's page (`evaluate.py
  view`, analysis/view.py: OUT/view.html) as an artifact (wandb: type `run-view`; MLflow: the run's
  view.html, stored in OUT/mlartifacts/ with the default store); TensorBoard shows no HTML page and gets
  none. A view that cannot be written is one line, and the run ends as it would.
- A tracker that cannot start (not installed, a bad setting) is one `error:` line before training starts;
  one that fails mid-run is reported once and dropped, and training goes on.
"""
import json
import math
import os
import re
import uuid
from pathlib import Path

TRACKERS = ("wandb", "tensorboard", "mlflow")
IDS = "trackers.json"  # the tracker runs' ids, so a resume logs to the same runs


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _numbers(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))
            and not isinstance(v, bool)}


def mlflow_name(key: str) -> str:
    """A metric's name as MLflow allows it (no @: eval/avg@4 is eval/avg_at_4 there); others keep theirs."""
    return re.sub(r"[^\w\-. :/]", "_", key.replace("@", "_at_"))


class _Wandb:
    def __init__(self, out: Path, config: dict | None, run_id: str):
        import wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "smrc-sd"), name=out.name, id=run_id,
                              dir=str(out), mode=os.environ.get("WANDB_MODE", "offline"), resume="allow",
                              config=config)

    def log(self, step: int, values: dict) -> None:
        self.run.log(values, step=step)

    def close(self, view: Path | None = None) -> None:
        if view is not None:
            import wandb
            artifact = wandb.Artifact(f"view-{self.run.id}", type="run-view",
                                      description="evaluate.py view: the run turn by turn (open view.html)")
            artifact.add_file(str(view), name="view.html")
            self.run.log_artifact(artifact)
        self.run.finish()


class _TensorBoard:
    def __init__(self, out: Path, config: dict | None, run_id: str, start: int = 0):
        from torch.utils.tensorboard import SummaryWriter
        # a resume drops the events logged after its checkpoint, as trim_logs moves those rows aside
        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=start + 1 if start else None)
        if config is not None:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=1) + "\n```")

    def log(self, step: int, values: dict) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _MLflow:
    def __init__(self, out: Path, config: dict | None, run_id: str):
        import mlflow
        # offline by default: a SQLite store in the run folder (MLflow's file store cannot hold both
        # router/matched_turns and router/matched_turns/group: a metric name is a path there)
        uri = os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{(out / 'mlflow.db').resolve()}")
        self.client = mlflow.MlflowClient(uri)
        if run_id:
            self.run_id = run_id
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "smrc-sd")
            experiment = self.client.get_experiment_by_name(name)
            local = None if "MLFLOW_TRACKING_URI" in os.environ else (out / "mlartifacts").resolve().as_uri()
            eid = experiment.experiment_id if experiment else self.client.create_experiment(
                name, artifact_location=local)  # the default store: artifacts in the run folder, not ./mlruns
            self.run_id = self.client.create_run(eid, run_name=out.name).info.run_id
        if config is not None:
            for k, v in _flat(config).items():
                self.client.log_param(self.run_id, k, json.dumps(v) if not isinstance(v, str) else v)

    def log(self, step: int, values: dict) -> None:
        import mlflow.entities as me
        ms = [me.Metric(mlflow_name(k), v, 0, step) for k, v in values.items()
              if math.isfinite(v)]  # MLflow stores no inf
        self.client.log_batch(self.run_id, metrics=ms)

    def close(self, view: Path | None = None) -> None:
        if view is not None:
            self.client.log_artifact(self.run_id, str(view))
        self.client.set_terminated(self.run_id)


class Trackers:
    """The trackers of one run folder: `log(row)` sends a metrics.jsonl row to each; `close()` at the end.
    `config`: the resolved config (None: a resume or an evaluation, which keep the run's). `start`: the step
    a resume starts after (TensorBoard drops later events)."""

    def __init__(self, names: tuple[str, ...], out: Path, config: dict | None = None, start: int = 0):
        self.active, self.out = {}, out
        path = out / IDS
        ids = json.loads(path.read_text()) if path.exists() else {}
        for name in names:
            run_id = ids.get(name) or (uuid.uuid4().hex[:12] if name == "wandb" else "")
            try:
                if name == "wandb":
                    self.active[name] = _Wandb(out, config, run_id)
                elif name == "tensorboard":
                    self.active[name] = _TensorBoard(out, config, run_id, start)
                else:
                    self.active[name] = _MLflow(out, config, run_id)
            except Exception as e:  # ImportError, a bad setting, a refused connection: before any training
                first = (str(e).splitlines() or [type(e).__name__])[0]
                raise SystemExit(f"error: --log-with {name}: the tracker did not start ({type(e).__name__}: "
                                 f"{first}); pip install -r requirements-tracking.txt, or leave it out"
                                 ) from None
            tracker = self.active[name]
            ids[name] = tracker.run.id if name == "wandb" else getattr(tracker, "run_id", "")
        if names:
            path.write_text(json.dumps(ids) + "\n")

    def log(self, row: dict | None) -> None:
        if not row:
            return
        values = _numbers(row)
        for name, tracker in list(self.active.items()):
            try:
                tracker.log(int(row["step"]), values)
            except Exception as e:  # metrics.jsonl has the row; the run goes on without this tracker
                print(f"[trackers] {name} failed at step {row['step']} ({type(e).__name__}: {e}); no more "
                      f"rows go to {name}, metrics.jsonl stays the record", flush=True)
                self.active.pop(name)

    def close(self, view=None) -> None:
        """Close each tracker; `view` (the end of a run: the viewer's `write_view`, given by smrc.py): wandb
        and MLflow also log the run's HTML view first."""
        takes_view = [name for name in self.active if name in ("wandb", "mlflow")]
        page = self._view(view) if view is not None and takes_view else None
        for name, tracker in self.active.items():
            try:
                tracker.close(page) if name in takes_view else tracker.close()
            except Exception as e:
                print(f"[trackers] {name} did not close cleanly ({type(e).__name__}: {e})", flush=True)
        self.active = {}

    def _view(self, write_view) -> Path | None:
        """The run folder's view.html, written now (analysis/view.py); None, said in one line, if it fails."""
        try:
            return write_view(self.out)
        except (Exception, SystemExit) as e:
            print(f"[trackers] the run view was not written for the trackers ({type(e).__name__}: {e})",
                  flush=True)
            return None
