"""The run's append-only logs, crash-safe: metrics.jsonl and the rollout archive rollouts.jsonl.gz (a gzip
JSONL of every trained turn, which the audits read).

- `archive_rows(step, episodes, audited, tokenizer, token_turns, context)`: a step's rows of the archive:
  every turn with its response, its routing decision and the audited matchers' matches the step made
  (router.audited_matches), an unmatched turn with its nearest reference state; on up to `token_turns`
  distilled turns, the response's tokens with their per-token teacher and student log-probs (`evaluate.py
  view` colours them by the difference) and the teacher's user message.
- Rows carry `v` (ARCHIVE_VERSION); an archive of version 1 (no `v`) has no response, tokens, nearest state
  or final observation, and `evaluate.py view` says so where it would show them.
- `write_archive(path, rows, cap)`: append rows up to `cap` turns in all (counted in rollouts.jsonl.count).
- `read_archive(path)` / `read_log(path)`: the complete rows; a torn last line or a truncated gzip stream is
  skipped and counted, never fatal.
- `trim_logs(out, step)`: on a (re)start at a checkpoint's step, rows logged after it move to *.after_step_N
  files, so nothing is logged twice and nothing is deleted.
"""

import gzip
import json
import os
import zlib
from pathlib import Path

import router
from measure.unmatched import nearest_state

ARCHIVE_VERSION = 2  # 2 adds response, parse_reason, distilled, advantage, final_observation, nearest
#                      (unmatched turns: measure/unmatched.py) and tokens (issue 65)


def _match_json(m) -> dict | None:
    """A records.Match as JSON: the reference, the position, its signature there, the candidate and the
    suffix (None: no match)."""
    if m is not None and m.ref is None:  # records.WITHOUT_REFERENCE (matcher every-turn)
        return {"ref": None, "position": None, "candidate": None, "ref_signature": None, "ref_suffix": []}
    return None if m is None else {"ref": m.ref.traj_id, "position": m.position, "candidate": m.candidate,
                                   "ref_signature": m.ref.steps[m.position].signature,
                                   "ref_suffix": [st.action for st in m.ref.steps[m.position:]]}


def archive_rows(step: int, episodes: list, audited: dict[str, list], tokenizer=None, token_turns: int = 0,
                 context: str = "") -> list[dict]:
    """Every turn of the step's episodes (rollout.Episode) with its task, response, action, signature, history
    key, routing decision (turn.match), the audited matchers' matches `audited` (router.audited_matches; {}:
    the run keeps no archive, so no rows), reward and the episode's success; the last turn of an episode also
    the observation it ended on; an unmatched turn its nearest reference state (measure/unmatched.py). Up to
    `token_turns` distilled turns (spread evenly over them) also keep their tokens (`tokenizer`) with the
    teacher's and the student's log-prob of each and the teacher's user message (`context`: the
    teacher-context variant): `token_columns`."""
    if not audited:
        return []
    pairs = [(ep, t) for ep in episodes for t in ep.turns]
    rows = [{"v": ARCHIVE_VERSION, "step": step, "task_id": t.task.task_id, "task_type": t.task.task_type,
             "source": t.task.source, "traj_id": t.traj_id, "turn": t.index,
             "observation": t.step.observation, "response": t.response, "action": t.step.action,
             "valid": t.valid, "parse_reason": t.parse_reason,
             "signature": t.step.signature, "history_key": t.step.history_key,
             "routed": t.match is not None, "match": _match_json(t.match),
             "structured": _match_json(audited["structured"][i]),
             "history_match": _match_json(audited["history"][i]),
             "observation_match": _match_json(audited["observation"][i]),
             "observation_key": t.step.observation_key, "distilled": t.teacher_logprobs is not None,
             "advantage": t.advantage, "reward": t.reward, "episode_won": ep.won, "episode_return": ep.ret,
             **({"final_observation": ep.observation} if t is ep.turns[-1] else {})}
            for i, (ep, t) in enumerate(pairs)]
    refs = audited.get("references")  # the router's references of each turn: why no match, on unmatched ones
    for i, (_, t) in enumerate(pairs) if refs is not None else ():
        if t.match is None:
            rows[i]["nearest"] = nearest_state(t.step.signature, refs[i])
    distilled = [i for i, (_, t) in enumerate(pairs) if t.teacher_logprobs is not None]
    if tokenizer is not None and token_turns > 0:
        picked = distilled if len(distilled) <= token_turns else \
            [distilled[k * len(distilled) // token_turns] for k in range(token_turns)]
        for i in picked:
            rows[i].update(token_columns(pairs[i][1], tokenizer, context))
    return rows


def token_columns(turn, tokenizer, context: str) -> dict:
    """A distilled turn's response tokens (each decoded alone) with log π_T (the teacher: turn.
    teacher_logprobs) and log π_θ of each: the sampling policy's log-probs (turn.sample_logprobs), the same
    numbers the teacher stage's KL and the SD loss's sampled term use for the student on the rollout's
    weights; and the teacher's user message, privileged blocks around the student's prompt (as teacher.py
    builds it)."""
    m = turn.match
    skills = router.skill_text(turn.task.env, turn.task.task_type) if "skills" in router.context_blocks(
        context) else ""
    return {"tokens": [tokenizer.decode([i]) for i in turn.response_ids],
            "teacher_logprobs": [round(x, 4) for x in turn.teacher_logprobs],
            "student_logprobs": [round(x, 4) for x in turn.sample_logprobs],
            "teacher_user_text": router.teacher_context(context, m.ref, m, turn.step.signature,
                                                        skills).around(turn.user_text)}


def write_archive(path: Path, rows: list[dict], cap: int) -> int:
    """Append to the gzip JSONL archive; past `cap` turns, returns how many were not written (logged,
    not lost)."""
    count = path.with_suffix(".count")
    n_before = int(count.read_text()) if count.exists() else 0
    room = max(0, cap - n_before)
    if room and rows:
        with gzip.open(path, "at") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows[:room])
        count.write_text(str(n_before + min(room, len(rows))))
    return max(0, len(rows) - room)


def read_archive(path: Path) -> list[dict]:
    rows, dropped = read_log(path)
    dropped = lost_rows(path, len(rows), dropped)
    if dropped:
        print(f"[archive] {path}: {dropped} partial rows skipped (a write cut short)", flush=True)
    return [json.loads(line) for _, line in rows]


def read_log(path: Path) -> tuple[list[tuple[int, bytes]], int]:
    """The complete rows (step, line) of a JSONL log (gzip when it ends in .gz) and how many partial ones it
    holds: a last line cut by a kill or a full disk during the append, an unparsable line, a truncated gzip
    stream."""
    data, cut = path.read_bytes(), False
    if path.suffix == ".gz":
        data, cut = _gunzip_prefix(data)
    *lines, tail = data.split(b"\n")  # tail: b"" when the file ends with a newline, else a torn last line
    rows, dropped = [], int(bool(tail.strip()))
    for line in (ln for ln in lines if ln.strip()):
        try:
            rows.append((int(json.loads(line)["step"]), line))
        except (ValueError, KeyError, TypeError):
            dropped += 1
    return rows, max(dropped, int(cut))  # a cut stream lost at least one row


def lost_rows(path: Path, complete: int, dropped: int) -> int:
    """Rows a damaged archive lost: a cut gzip member holds many rows, so a cut is counted against the rows
    write_archive recorded in rollouts.jsonl.count (at least `dropped`, the partial rows read_log saw)."""
    count = path.with_suffix(".count")
    if not dropped or path.suffix != ".gz" or not count.is_file():
        return dropped
    try:
        return max(dropped, int(count.read_text()) - complete)
    except ValueError:  # a count file cut short itself
        return dropped


def _gunzip_prefix(data: bytes, chunk: int = 1 << 20) -> tuple[bytes, bool]:
    """All a multi-member gzip stream (one member per append) decompresses to, up to where it was cut or
    damaged, and whether it was. Fed in chunks, so the leftover input copied at each member's end stays
    small."""
    out, member, fed, pending, i = [], zlib.decompressobj(wbits=31), False, b"", 0
    while pending or i < len(data):
        if not pending:
            pending, i = data[i:i + chunk], i + chunk
        try:
            out.append(member.decompress(pending))
        except zlib.error:  # damaged: keep what came out before it
            return b"".join(out), True
        fed, pending = True, b""
        if member.eof:  # the next append's member starts in what is left
            member, fed, pending = zlib.decompressobj(wbits=31), False, member.unused_data
    return b"".join(out), fed  # a member fed but not finished: the stream was cut


def trim_logs(out: Path, last_step: int) -> None:
    """A run (re)starting at `last_step` owns every logged step after it: rows of metrics.jsonl and of the
    rollout archive logged after the checkpoint (a run killed between two saves, or an earlier run in the same
    folder) move to *.after_step_N files (never overwriting an earlier one), so nothing is logged twice and
    nothing is deleted. Partial rows (a torn last line, a truncated gzip stream) are dropped and counted;
    every complete row is kept."""
    for name in ("metrics.jsonl", "rollouts.jsonl.gz"):
        path = out / name
        if not path.exists():
            continue
        rows, dropped = read_log(path)
        dropped = lost_rows(path, len(rows), dropped)
        keep = [ln for step, ln in rows if step <= last_step]
        if name.endswith(".gz"):  # what write_archive counts against archive_max_turns
            (out / "rollouts.jsonl.count").write_text(str(len(keep)))
        if len(keep) == len(rows) and not dropped:
            continue
        if len(keep) < len(rows):
            aside = _free(out, name, last_step)
            _write_rows(aside, [ln for step, ln in rows if step > last_step])
            print(f"[resume] {len(rows) - len(keep)} rows of {name} after step {last_step} moved to {aside}",
                  flush=True)
        _write_rows(path, keep)
        if dropped:
            print(f"[resume] {name}: {dropped} partial rows dropped (a write cut short); {len(rows)} "
                  f"complete rows kept", flush=True)


def _free(out: Path, name: str, step: int) -> Path:
    """out/metrics.after_step_N.jsonl, or .after_step_N.2.jsonl, .3, ... when taken by an earlier resume."""
    n, path = 1, out / name.replace(".jsonl", f".after_step_{step}.jsonl")
    while path.exists():
        n += 1
        path = out / name.replace(".jsonl", f".after_step_{step}.{n}.jsonl")
    return path


def _write_rows(path: Path, rows: list[bytes]) -> None:
    """Write (gzip for .gz) to a temporary file, then rename: a kill during the repair loses nothing."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with (gzip.open if path.suffix == ".gz" else open)(tmp, "wb") as f:
            f.writelines(ln + b"\n" for ln in rows)
    except OSError:  # a full disk: the original stays as it was, the partial copy goes
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
