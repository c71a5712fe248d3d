"""Multi-turn rollouts, the one replay of a fixed action list through an env, and the rollout archive.

Every turn's prompt is rebuilt from the task, the last `history_length` (observation, action) pairs of the episode's
memory, the current observation and the admissible actions (verl-agent's step-independent multi-turn format), so the
context stays flat over 50 turns. The prompt is always the ordinary one: privileged text exists only in the teacher
(smrc.py steps 3-5).

Env time overlaps model time: the episodes are split in two halves that alternate, so while the env workers step one
half, the engine generates for the other (`collect_rollouts`). An over-long prompt falls back to the no-history
prompt, then ends the episode; a response cut by max_new_tokens is kept and counted. Nothing is dropped silently.

`replay(env, task, actions)` plays a fixed action list (a planner's solution, a student's prefix) into the same
`Episode` / `Turn` records, so references, audits and warm-start demonstrations see exactly the states, history keys
and prompts a rollout would. The archive (`archive_rows`, `write_archive`, `read_archive`, `trim_logs`) is the
gzip JSONL of every trained turn that the audits read (output_dir/rollouts.jsonl.gz).
"""

import gzip
import json
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

import envs
import router
from models import action_trie, chat_ids


@dataclass
class Turn:
    """One turn-sample: what the policy saw and did, the env's answer, and the state it acted in."""
    task: envs.Task
    group: int
    traj_id: str
    index: int
    user_text: str            # the ordinary prompt (no privileged text, ever)
    prompt_ids: list[int]
    response_ids: list[int]
    sample_logprobs: list[float]
    response: str
    action: str               # the parsed (or fallback) action sent to the env
    valid: bool
    parse_reason: str
    observation: str          # observation shown at this turn
    signature: envs.Signature  # state before acting
    history_key: str          # history key before acting
    reward: float = 0.0       # env reward of this step
    allowed: list[list[int]] | None = None  # restricted decoding: the allowed token ids at each response position
    admissible: list[str] | None = None     # restricted decoding: the admissible commands the trie was built from


@dataclass
class Episode:
    task: envs.Task
    group: int
    traj_id: str
    slot: int
    goal: str = ""
    observation: str = ""
    admissible: list[str] = field(default_factory=list)
    signature: envs.Signature = ()
    history_key: str = ""
    memory: list[tuple[str, str]] = field(default_factory=list)  # (observation, action) of earlier turns
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    won: bool = False
    score: float = 0.0
    stop_reason: str = ""     # won | env_done | max_steps | prompt_too_long
    result: envs.StepResult | None = None  # the env's latest answer

    @property
    def ret(self) -> float:
        return sum(t.reward for t in self.turns)


def observe(ep: Episode, res: envs.StepResult, first: bool, action: str = "") -> None:
    """Take the env's answer (to reset if `first`, else to `action`) into the episode's state."""
    ep.history_key = envs.history_key("" if first else ep.history_key, action, res.observation)
    ep.observation, ep.admissible, ep.signature, ep.result = res.observation, res.admissible, res.signature, res
    ep.goal = res.goal if first else ep.goal
    ep.won, ep.score = res.won, res.score
    if res.done:
        ep.done = True
        ep.stop_reason = "won" if res.won else ("max_steps" if res.info.get("truncated") else "env_done")


def advance(ep: Episode, turn: Turn, res: envs.StepResult) -> None:
    """The env answered `turn`: its reward, the memory, the new state."""
    turn.reward = res.reward
    ep.memory.append((ep.observation, turn.action))
    observe(ep, res, first=False, action=turn.action)


def turn_prompt(ep: Episode, env_name: str, history_length: int, require_think: bool) -> str:
    """The ordinary user message of the episode's next turn."""
    return envs.build_prompt(env_name, ep.goal, ep.memory, len(ep.turns), ep.observation, ep.admissible,
                             history_length, require_think=require_think)


# ----------------------------------------------------------------------------------------------------------------------
# Rollouts


def _prompt(ep: Episode, cfg, tokenizer, counters: dict) -> tuple[str, list[int]] | None:
    """The turn's ordinary prompt; over the budget: the no-history prompt (counted), then None (episode ends)."""
    for h in (cfg.env_cfg.history_length, 0):
        text = turn_prompt(ep, cfg.env, h, cfg.env_cfg.require_think)
        ids = chat_ids(tokenizer, text)
        if len(ids) <= cfg.rollout.max_prompt_tokens:
            return text, ids
        counters["prompt_no_history"] += 1
    counters["prompt_too_long"] += 1
    return None


def collect_rollouts(engine, pool, tokenizer, tasks: list[envs.Task], cfg, tag: str,
                     show_progress: bool = True) -> tuple[list[Episode], dict]:
    """Play `group_size` episodes of every task. The episodes are split in two halves that alternate: while the env
    workers step one half, the model generates for the other, so env time overlaps model time."""
    G, max_steps = cfg.rollout.group_size, cfg.env_cfg.max_steps
    eps = [Episode(task, g, f"{tag}-{g}-{k}", slot=g * G + k) for g, task in enumerate(tasks) for k in range(G)]
    counters = dict(prompt_no_history=0, prompt_too_long=0, truncated_responses=0, gen_s=0.0, env_s=0.0)
    t0 = time.perf_counter()
    for ep, res in zip(eps, pool.reset([e.slot for e in eps], [e.task for e in eps])):
        observe(ep, res, first=True)
    counters["env_s"] += time.perf_counter() - t0
    halves, pending = [eps[0::2], eps[1::2]], None
    bar = tqdm(total=len(eps) * max_steps, desc=f"rollout {tag}", leave=False, disable=not show_progress)
    for it in range(2 * max_steps + 1):
        half = [e for e in halves[it % 2] if not e.done and len(e.turns) < max_steps]
        sent = _act(half, engine, tokenizer, cfg, counters)          # generate while `pending` is in the workers
        if pending is not None:
            t = time.perf_counter()
            for ep, turn, res in zip(*pending, pool.step_wait()):
                advance(ep, turn, res)
            counters["env_s"] += time.perf_counter() - t
            bar.update(len(pending[0]))
        pending = None
        if sent[0]:
            pool.step_async([ep.slot for ep in sent[0]], [t.action for t in sent[1]])
            pending = sent
    bar.close()
    for ep in eps:
        if not ep.done:
            ep.done, ep.stop_reason = True, "max_steps"
    return eps, counters


def _act(half: list[Episode], engine, tokenizer, cfg, counters: dict) -> tuple[list, list]:
    """Generate one turn for every episode of `half` and parse the actions: (episodes, turns)."""
    prompted = []
    for ep in half:
        p = _prompt(ep, cfg, tokenizer, counters)
        if p is None:
            ep.done, ep.stop_reason = True, "prompt_too_long"
        else:
            prompted.append((ep, *p))
    if not prompted:
        return [], []
    t = time.perf_counter()
    tries = None
    if cfg.rollout.action_space == "admissible":  # decoding restricted to `<action>{admissible}</action>`
        tries = [action_trie(tokenizer, [envs.action_response(a) for a in ep.admissible]) for ep, _, _ in prompted]
    gens = engine.generate([ids for _, _, ids in prompted], tries) if tries else \
        engine.generate([ids for _, _, ids in prompted])
    counters["gen_s"] += time.perf_counter() - t
    turns = []
    for (ep, text, ids), gen in zip(prompted, gens):
        parsed = envs.parse_action(gen.text, cfg.env, cfg.env_cfg.require_think)
        counters["truncated_responses"] += gen.truncated
        turns.append(Turn(task=ep.task, group=ep.group, traj_id=ep.traj_id, index=len(ep.turns), user_text=text,
                          prompt_ids=ids, response_ids=gen.response_ids, sample_logprobs=gen.logprobs,
                          response=gen.text, action=parsed.action, valid=parsed.valid, parse_reason=parsed.reason,
                          observation=ep.observation, signature=ep.signature, history_key=ep.history_key,
                          allowed=gen.allowed, admissible=list(ep.admissible) if tries else None))
        ep.turns.append(turns[-1])
    return [ep for ep, _, _ in prompted], turns


# ----------------------------------------------------------------------------------------------------------------------
# Replay: a fixed action list through an env


def replay(env, task: envs.Task, actions: list[str], episode: Episode | None = None,
           prompt: Callable[[Episode], str] | None = None) -> Episode:
    """Play `actions` from reset (or on from `episode`'s state) until the episode ends, one Turn per action taken,
    each with the state, history key and (if `prompt` is given) ordinary prompt it was taken in."""
    ep = episode or Episode(task, 0, f"replay-{task.task_id}", slot=-1)
    results = envs.replay(env, task, actions, start=ep.result)
    if episode is None:
        observe(ep, results[0], first=True)
    for action, res in zip(actions, results[1:]):
        turn = Turn(task=task, group=ep.group, traj_id=ep.traj_id, index=len(ep.turns),
                    user_text=prompt(ep) if prompt else "", prompt_ids=[], response_ids=[], sample_logprobs=[],
                    response="", action=action, valid=True, parse_reason="ok", observation=ep.observation,
                    signature=ep.signature, history_key=ep.history_key)
        ep.turns.append(turn)
        advance(ep, turn, res)
    return ep


def to_trajectory(ep: Episode, traj_id: str | None = None) -> router.Trajectory:
    steps = [router.Step(t.signature, t.history_key, t.observation, t.action) for t in ep.turns]
    return router.Trajectory(ep.task.task_id, traj_id or ep.traj_id, steps, success=ep.won,
                             final_observation=ep.observation)


def reference(env, task: envs.Task, actions: list[str]) -> router.Trajectory | None:
    """A planner solution replayed through an env without a step limit, so every position carries its real signature
    and history key; None unless it wins."""
    ep = replay(env, task, actions)
    return to_trajectory(ep, f"planner-{task.task_id}") if ep.won else None


# ----------------------------------------------------------------------------------------------------------------------
# Metrics


@dataclass
class TurnStats:
    valid: bool
    response_tokens: int
    parse_reason: str


@dataclass
class EpisodeStats:
    """What the metrics need of one episode, small enough to gather from every rank under torchrun."""
    ret: float
    won: bool
    score: float
    task_type: str
    turns: list[TurnStats]


def episode_stats(eps: list[Episode]) -> list[EpisodeStats]:
    return [EpisodeStats(ret=e.ret, won=e.won, score=e.score, task_type=e.task.task_type,
                         turns=[TurnStats(t.valid, len(t.response_ids), t.parse_reason) for t in e.turns])
            for e in eps]


def rollout_metrics(stats: list[EpisodeStats], counters: dict) -> dict:
    """Episode-level means over every episode of the step (all ranks), turn-level means over every turn."""
    turns = [t for s in stats for t in s.turns]
    m = {
        "rollout/reward": float(np.mean([s.ret for s in stats])),
        "rollout/success_rate": float(np.mean([s.won for s in stats])),
        "rollout/score": float(np.mean([s.score for s in stats])),
        "rollout/valid_action_ratio": float(np.mean([t.valid for t in turns])) if turns else float("nan"),
        "rollout/turns": float(np.mean([len(s.turns) for s in stats])),
        "rollout/response_tokens": float(np.mean([t.response_tokens for t in turns])) if turns else 0.0,
        **{f"rollout/{k}": float(counters[k]) for k in ("truncated_responses", "prompt_no_history", "prompt_too_long")},
    }
    for tt in sorted({s.task_type for s in stats}):
        m[f"rollout/success/{tt}"] = float(np.mean([s.won for s in stats if s.task_type == tt]))
    for reason in sorted({t.parse_reason for t in turns} - {"ok"}):
        m[f"rollout/invalid/{reason}"] = float(sum(t.parse_reason == reason for t in turns))
    return m


# ----------------------------------------------------------------------------------------------------------------------
# The rollout archive (output_dir/rollouts.jsonl.gz)


def _match_json(m) -> dict | None:
    """A router.Match as JSON: the reference, the position, its signature there, the candidate and the suffix."""
    if m is not None and m.ref is None:  # matcher `every` on a task without a reference
        return {"ref": None, "position": None, "candidate": None, "ref_signature": None, "ref_suffix": []}
    return None if m is None else {"ref": m.ref.traj_id, "position": m.position, "candidate": m.candidate,
                                   "ref_signature": m.ref.steps[m.position].signature,
                                   "ref_suffix": [st.action for st in m.ref.steps[m.position:]]}


def archive_rows(step: int, episodes: list[Episode], matches: list, structured: list,
                 history_matches: list) -> list[dict]:
    """Every turn with its task, student action, signature, history key, routing decision, both matchers' matches
    (so the matcher comparison runs on the same turns), reward and the episode's success."""
    turns = [(ep, t) for ep in episodes for t in ep.turns]
    return [{"step": step, "task_id": t.task.task_id, "task_type": t.task.task_type, "source": t.task.source,
             "traj_id": t.traj_id, "turn": t.index, "observation": t.observation, "action": t.action,
             "valid": t.valid, "signature": t.signature, "history_key": t.history_key,
             "routed": matches[i] is not None, "match": _match_json(matches[i]),
             "structured": _match_json(structured[i]), "history_match": _match_json(history_matches[i]),
             "reward": t.reward, "episode_won": ep.won, "episode_return": ep.ret} for i, (ep, t) in enumerate(turns)]


def write_archive(path: Path, rows: list[dict], cap: int) -> int:
    """Append to the gzip JSONL archive; past `cap` turns, returns how many were not written (logged, not lost)."""
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
    """The complete rows (step, line) of a JSONL log (gzip when it ends in .gz) and how many partial ones it holds: a
    last line cut by a kill or a full disk during the append, an unparsable line, a truncated gzip stream."""
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
    """All a multi-member gzip stream (one member per append) decompresses to, up to where it was cut or damaged, and
    whether it was. Fed in chunks, so the leftover input copied at each member's end stays small."""
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
    """A run (re)starting at `last_step` owns every logged step after it: rows of metrics.jsonl and of the rollout
    archive logged after the checkpoint (a run killed between two saves, or an earlier run in the same folder) move
    to *.after_step_N files (never overwriting an earlier one), so nothing is logged twice and nothing is deleted.
    Partial rows (a torn last line, a truncated gzip stream) are dropped and counted; every complete row is kept."""
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
            print(f"[resume] {name}: {dropped} partial rows dropped (a write cut short); {len(rows)} complete rows "
                  f"kept", flush=True)


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
