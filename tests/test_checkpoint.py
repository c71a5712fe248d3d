"""Checkpoints and resume (scale/checkpoint.py, scale/preflight.py, scale/run_logs.trim_logs) on the embedded
tiny model, in process: checksums and a weights_only trainer state, nothing non-finite saved, rotation by step
number, a fresh run refusing a used folder, verified resume naming the bad file and the intact older
checkpoint, a full disk, log repair.

Run: pytest tests/test_checkpoint.py -q   (seconds)
"""
import copy
import dataclasses
import errno
import gzip
import json
import os
import random
import subprocess

import numpy as np
import pytest
import torch

import router
from scale import checkpoint as ck
from scale import run_logs
from scale.distributed import World
from scale.preflight import prepare_output_dir


@dataclasses.dataclass
class Cfg:  # what save_checkpoint reads of the run's config
    keep_checkpoints: int = 3


@pytest.fixture
def trainer(tiny):
    model, tok = tiny
    model = copy.deepcopy(model)  # the tests damage it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    return model, tok, optimizer, router.ReferenceBank(4)


def save(out, step, trainer, keep=3):
    model, tok, optimizer, bank = trainer
    return ck.save_checkpoint(out, step, model, tok, optimizer, bank, Cfg(keep), World())


def test_checksums_cover_every_file_and_trainer_state_loads_weights_only(trainer, tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = save(tmp_path, 1, trainer)
    draws = (random.random(), np.random.rand(), torch.rand(1).item())
    listed = {line.split("  ")[1] for line in (path / ck.CHECKSUMS).read_text().splitlines()}
    assert listed == {p.name for p in path.iterdir()} - {ck.CHECKSUMS}
    assert subprocess.run(["sha256sum", "--quiet", "-c", ck.CHECKSUMS], cwd=path).returncode == 0
    state = torch.load(path / "trainer_state.pt", weights_only=True)  # tensors and plain data only
    assert (isinstance(state["rng"]["python"], torch.Tensor)
            and isinstance(state["rng"]["numpy"], torch.Tensor))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    model, _, optimizer, bank = trainer
    assert ck.load_trainer_state(path, model, optimizer, bank) == 1
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == draws  # RNG states restored exactly
    assert ck.verify(path) is None and ck.resume_checkpoint(tmp_path) == path


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_nonfinite_values_are_never_saved(trainer, tmp_path, where):
    save(tmp_path, 1, trainer)
    model, _, optimizer, _ = trainer
    with torch.no_grad():
        if where == "weights":
            next(model.parameters())[0] = float("nan")
        else:
            next(iter(optimizer.state.values()))["exp_avg_sq"].fill_(float("inf"))
    with pytest.raises(SystemExit, match=f"non-finite values in {where}") as e:
        save(tmp_path, 2, trainer)
    assert "step_000001" in str(e.value) and "\n" not in str(e.value)
    assert [p.name for p in tmp_path.iterdir() if "step" in p.name] == ["step_000001"]  # nothing half-written
    assert ck.latest_checkpoint(tmp_path).name == "step_000001"


def test_rotation_orders_by_step_number_and_never_deletes_the_newest(trainer, tmp_path):
    for step in (2, 4, 8):  # an earlier run's checkpoints (a programmatic save into a used folder)
        (tmp_path / f"step_{step:06d}").mkdir()
    save(tmp_path, 1, trainer, keep=3)
    assert (ck.latest_checkpoint(tmp_path).name == "step_000001"
            and ck.verify(tmp_path / "step_000001") is None)
    assert len(ck.checkpoints(tmp_path)) == 4  # no newer checkpoint deleted for an older one
    (tmp_path / "step_999999").mkdir()  # by name, step_1000000 sorts before step_999999
    save(tmp_path, 1_000_000, trainer, keep=2)
    assert [p.name for p in ck.checkpoints(tmp_path)] == ["step_999999", "step_1000000"]
    assert ck.latest_checkpoint(tmp_path).is_dir()


def test_fresh_run_into_a_used_folder_is_refused_and_keeps_its_checkpoints(tmp_path):
    for step in (2, 4, 8):
        (tmp_path / f"step_{step:06d}").mkdir()
    (tmp_path / "latest").write_text("step_000008")
    with pytest.raises(SystemExit, match="--resume .*new --output-dir") as e:
        prepare_output_dir(tmp_path, fresh=True)
    assert "step_000002, step_000004, step_000008" in str(e.value)
    prepare_output_dir(tmp_path, fresh=False)  # --resume takes it
    assert [p.name for p in ck.checkpoints(tmp_path)] == ["step_000002", "step_000004", "step_000008"]


def test_output_dir_that_is_a_file_or_unwritable_is_one_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit, match="error: --output-dir .*/f is a file"):
        prepare_output_dir(tmp_path / "f", fresh=True)
    with pytest.raises(SystemExit, match="error: --output-dir .*/f/run is not writable"):
        prepare_output_dir(tmp_path / "f" / "run", fresh=True)
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    if os.access(ro, os.W_OK):  # root writes anywhere: sysfs takes no new file, even from root
        ro = "/sys/kernel"
    with pytest.raises(SystemExit, match="is not writable"):
        prepare_output_dir(type(tmp_path)(ro), fresh=False)


def test_stale_temporary_folders_are_removed_on_start(tmp_path):
    (tmp_path / ".tmp_step_000003").mkdir()
    (tmp_path / ".tmp_step_000003" / "model.safetensors").write_bytes(b"partial")
    (tmp_path / "latest.tmp").write_text("step_0")
    prepare_output_dir(tmp_path, fresh=True)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbled", "missing"])
def test_resume_names_the_bad_file_and_the_intact_older_checkpoint(trainer, tmp_path, damage):
    save(tmp_path, 1, trainer)
    path = save(tmp_path, 2, trainer)
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    if damage == "missing":
        weights.unlink()
    else:  # garbled: one byte of tensor data flipped, the header intact (it loads without complaint)
        weights.write_bytes({"empty": b"", "truncated": data[:len(data) // 2],
                             "garbled": data[:-100] + bytes([data[-100] ^ 1]) + data[-99:]}[damage])
    with pytest.raises(SystemExit) as e:
        ck.resume_checkpoint(tmp_path)
    msg = str(e.value)
    assert msg.startswith("error:") and "\n" not in msg and str(weights) in msg
    assert f"--resume-from {tmp_path / 'step_000001'}" in msg
    assert ck.resume_checkpoint(tmp_path, str(tmp_path / "step_000001")) == tmp_path / "step_000001"
    assert ck.resume_checkpoint(tmp_path, "step_000001") == tmp_path / "step_000001"


def test_resume_from_an_older_checkpoint_sets_newer_ones_aside(tmp_path):
    for step in (1, 2, 3):
        (tmp_path / f"step_{step:06d}").mkdir()
    ck.set_aside_newer(tmp_path, 1)
    (tmp_path / "step_000002").mkdir()
    ck.set_aside_newer(tmp_path, 1)  # a second resume from step 1: the first one's set-aside stays
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_000001", "step_000002.after_step_1", "step_000002.after_step_1.2", "step_000003.after_step_1"]


def test_disk_full_names_the_path_and_keeps_the_previous_latest(trainer, tmp_path, monkeypatch):
    save(tmp_path, 1, trainer)
    real_save = torch.save

    def full_disk(obj, f):
        real_save(obj, f)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as e:
        save(tmp_path, 2, trainer)
    msg = str(e.value)
    assert "no space left" in msg and str(tmp_path / ".tmp_step_000002") in msg and "\n" not in msg
    assert not (tmp_path / ".tmp_step_000002").exists() and not (tmp_path / "step_000002").exists()
    assert ck.latest_checkpoint(tmp_path).name == "step_000001"


def test_a_really_full_disk(trainer, tmp_path):
    """The same on a 7 MB tmpfs (one 5 MB checkpoint fits, two do not);
    skipped where mounting is not allowed."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        save(disk, 1, trainer)
        with pytest.raises(SystemExit, match="no space left on device while writing .*tmp_step_000002") as e:
            save(disk, 2, trainer)
        assert "\n" not in str(e.value)
        assert sorted(p.name for p in disk.iterdir()) == ["latest", "step_000001"]
        assert ck.resume_checkpoint(disk).name == "step_000001"
    finally:
        subprocess.run(["umount", str(disk)])


# ------------------------------------------------------------------------------------------------------------
# Log repair on resume


def _rows(steps):
    return [json.dumps({"step": s, "x": i}) for i, s in enumerate(steps)]


def test_torn_metrics_line_is_dropped_counted_and_complete_rows_kept(tmp_path, capsys):
    rows = _rows([1, 2, 3])
    (tmp_path / "metrics.jsonl").write_text("\n".join(rows) + "\n" + rows[0][:9])  # a kill mid-append
    run_logs.trim_logs(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == rows[:2]
    assert (tmp_path / "metrics.after_step_2.jsonl").read_text().splitlines() == rows[2:]
    assert "1 partial rows dropped" in capsys.readouterr().out


def test_truncated_archive_keeps_every_complete_row(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl.gz"
    for step in (1, 2, 3):  # one gzip member per append, as write_archive does
        assert run_logs.write_archive(path, [json.loads(r) for r in _rows([step] * 50)], 10**6) == 0
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 40])  # the last append cut short
    run_logs.trim_logs(tmp_path, 3)
    kept = run_logs.read_archive(path)
    assert [r["step"] for r in kept[:100]] == [1] * 50 + [2] * 50 and {r["step"] for r in kept} <= {1, 2, 3}
    assert 100 <= len(kept) < 150 and (tmp_path / "rollouts.jsonl.count").read_text() == str(len(kept))
    assert "partial rows dropped" in capsys.readouterr().out
    with gzip.open(path, "rt") as f:  # a well-formed gzip again: an append after it reads back
        assert len(f.read().splitlines()) == len(kept)


def test_resuming_twice_from_one_step_keeps_both_set_aside_files(tmp_path):
    first, second = _rows([1, 2, 3]), _rows([1, 2, 3, 4])
    (tmp_path / "metrics.jsonl").write_text("\n".join(first) + "\n")
    run_logs.trim_logs(tmp_path, 1)
    # the first resume's attempt, killed again
    (tmp_path / "metrics.jsonl").write_text("\n".join(second) + "\n")
    run_logs.trim_logs(tmp_path, 1)
    assert (tmp_path / "metrics.after_step_1.jsonl").read_text().splitlines() == first[1:]
    assert (tmp_path / "metrics.after_step_1.2.jsonl").read_text().splitlines() == second[1:]
    assert not list(tmp_path.glob("*.tmp"))
