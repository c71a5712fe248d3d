"""`smrc.py --config FILE`: a YAML or JSON file of settings under the command-line flags; a run's own
config.json goes back in to the same resolved config; every bad file is one error line before anything is
written; every file in configs/ resolves and passes the preflight with no GPU and no download.

Run: pytest tests/test_config_file.py -q
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import parse_config
from scale.checkpoint import record_config

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("quick_agent")  # build it on every core first (conftest)


def _fields(cfg) -> dict:
    d = json.loads(json.dumps(dataclasses.asdict(cfg)))
    d.pop("config")  # the file it came from
    return d


def test_a_file_sits_between_the_preset_and_the_flags(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("# a comment\npreset: tiny\nalgo: fullpath-sd\ngrpo:\n  lr: 1e-5\n  sd_coef: 0.3\n"
                 "rollout:\n  group_size: 4\n  sampling:\n    temperature: 0.7\n")
    cfg = parse_config(["--config", str(f), "--rollout.group-size", "5"])
    assert (cfg.preset, cfg.model) == ("tiny", "tiny-agent-quick")  # the file's preset gave the defaults
    assert (cfg.algo, cfg.grpo.lr, cfg.grpo.sd_coef) == ("fullpath-sd", 1e-5, 0.3)  # 1e-5 is a float
    assert (cfg.rollout.group_size, cfg.rollout.sampling.temperature) == (5, 0.7)  # the flag wins
    assert cfg.router.matcher == "with-reference" and cfg.config == str(f)  # resolved; the file recorded
    plain = parse_config(["--preset", "tiny", "--algo", "fullpath-sd", "--grpo.lr", "1e-5", "--grpo.sd-coef",
                          "0.3", "--rollout.group-size", "5", "--rollout.sampling.temperature", "0.7"])
    assert _fields(cfg) == _fields(plain)  # the same run as the flags alone


def test_a_runs_config_json_goes_back_in_to_the_same_resolved_config(tmp_path):
    cfg = parse_config(["--preset", "learn", "--algo", "smrc-sd", "--teacher.oracle", "0.99", "--seed", "3",
                        "--router.matcher", "all", "--output-dir", str(tmp_path / "run")])
    (tmp_path / "run").mkdir()
    record_config(tmp_path / "run", cfg, None, {"model": "tiny-agent", "path": "x", "sha256": {}})
    again = parse_config(["--config", str(tmp_path / "run" / "config.json")])
    assert _fields(again) == _fields(cfg) and again.resolved() == cfg.resolved()


BAD = {
    "unknown.yaml": ("grpo:\n  lrr: 1e-6\n", "grpo.lrr is not a setting; did you mean grpo.lr?"),
    "kind.yaml": ("grpo:\n  lr: fast\n", "grpo.lr is 'fast', which is not float"),
    "choice.yaml": ("algo: smrc\n", "algo is 'smrc', which is not one of grpo, fullpath-sd, smrc-sd"),
    "nested.yaml": ("rollout: 8\n", "rollout is 8; it holds settings"),
    "list.yaml": ("- 1\n- 2\n", "holds a list, not a mapping of settings"),
    "broken.yaml": ("grpo: [1\n", "not valid YAML"),
    "broken.json": ("{\"algo\": ", "not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_file_is_one_error_line_naming_file_and_key(tmp_path, name):
    text, said = BAD[name]
    (tmp_path / name).write_text(text)
    with pytest.raises(SystemExit, match=f"^error: --config {tmp_path / name}: ") as e:
        parse_config(["--config", str(tmp_path / name)])
    assert said in str(e.value) and "\n" not in str(e.value)


def _smrc(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "smrc.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_missing_file_or_a_bad_value_stops_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    proc = _smrc("--config", str(tmp_path / "nowhere.yaml"), "--output-dir", str(out))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1] == \
        f"error: --config {tmp_path / 'nowhere.yaml'}: no such file"
    (tmp_path / "lr.yaml").write_text("preset: tiny\ngrpo:\n  lr: -1.0\n")
    proc = _smrc("--config", str(tmp_path / "lr.yaml"), "--output-dir", str(out))
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("error: --grpo.lr -1.0 is out of range")  # a flag's rule
    assert not out.exists()


CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_configs_hold_every_paper_row():
    names = {p.relative_to(ROOT / "configs").as_posix() for p in CONFIGS}
    for env in ("alfworld", "webshop"):
        for algo in ("grpo", "fullpath_sd", "smrc_sd", "skill_sd", "sdar"):
            assert f"{env}/{algo}_qwen3_1.7b.yaml" in names
        assert {f"{env}/fullpath_sd_qwen2.5_3b.yaml", f"{env}/smrc_sd_qwen2.5_3b.yaml"} <= names
    assert len([n for n in names if n.startswith("alfworld/ablations/")]) >= 6


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(ROOT / "configs").as_posix())
def test_every_config_resolves_and_passes_the_preflight_offline(path):
    """No GPU, no download: the settings' kinds, choices and ranges only."""
    from scale.preflight import validate_config
    cfg = parse_config(["--config", str(path)])
    validate_config(cfg)
    assert cfg.config == str(path) and cfg.model.startswith("Qwen/") and cfg.env in path.parts


@pytest.mark.skipif(not os.environ.get("ALFWORLD_DATA"), reason="needs the official ALFWorld sample "
                    "(ALFWORLD_DATA)")
def test_a_paper_config_runs_a_step_with_the_tiny_model_and_cpu_overrides(tmp_path):
    out = tmp_path / "run"
    proc = _smrc("--config", str(ROOT / "configs" / "alfworld" / "smrc_sd_qwen3_1.7b.yaml"),
                 "--model", "tiny-agent-quick", "--rollout.engine", "hf", "--teacher.backend", "hf",
                 "--device", "cpu", "--steps", "1", "--eval-every", "0", "--rollout.tasks-per-step", "2",
                 "--rollout.group-size", "2", "--alfworld.max-steps", "3",
                 "--rollout.sampling.max-new-tokens", "24", "--output-dir", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"].endswith("smrc_sd_qwen3_1.7b.yaml") and saved["alfworld"]["source"] == "official"
    assert saved["rollout"]["max_prompt_tokens"] == 2048 and saved["model"] == "tiny-agent-quick"
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]


@pytest.mark.parametrize("cuda, vllm, flags, engine, why", [
    (True, True, [], "vllm", "CUDA and vllm are present"),
    (True, False, [], "hf", "vllm is not installed"),
    (False, True, [], "hf", "no CUDA device"),
    (True, True, ["--preset", "tiny"], "hf", "restricted decoding"),
    (True, True, ["--rollout.engine", "hf"], "hf", "")])  # given: no why; the teacher follows it
def test_engine_auto_picks_vllm_where_it_runs_and_says_why(monkeypatch, cuda, vllm, flags, engine, why):
    """--rollout.engine / --teacher.backend auto (the defaults): vLLM with CUDA, vllm importable and free
    decoding, else the transformers engine; the banner's text says why; π_old is recomputed under vLLM."""
    import importlib.util
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (object() if vllm else None)
                        if name == "vllm" else real_find(name, *a))
    cfg = parse_config(flags)
    assert (cfg.rollout.engine, cfg.teacher.backend) == (engine, "hf")  # the teacher: the trainer's path
    assert cfg.engines().startswith(f"{engine}, teacher hf") and why in cfg.engines()
    assert cfg.grpo.old_logprobs == ("recompute" if engine == "vllm" else "sampler")
