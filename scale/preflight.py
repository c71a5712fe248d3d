"""Checks a run passes before any heavy work (no model, env or engine exists yet), each failure one `error:`
line naming the flag (or file) and what it allows. Every flag that reaches a library call is checked here.

- `validate_config(cfg)`: the numbers of the config (RULES and ENV_RULES: flag, allowed range), the task
  types, the device; every algorithm here is GRPO-based, so a group needs at least 2 rollouts for its
  baseline; the learning rate must fit AdamW's float32 step size.
- `check_model(name, flag)` / `check_model_dir(path, flag)`: a model folder is loadable (config, tokenizer,
  complete weights); a run checkpoint (it has checksums.sha256 or trainer_state.pt) must verify
  (scale/checkpoint.verify), a plain save_pretrained folder is accepted as unverified.
- `check_inputs(cfg)`: the settings that fit together only in pairs, the data (train split, validation panel)
  and the model exist; returns the tasks. `check_world(cfg, world)`: what depends on the ranks.
- `validate_eval_args(args)`, `check_split(cfg, split)`: evaluate.py's numbers and split.
- `check_native(config, what)`: a model that needs its own code (trust_remote_code) is one error line.
The output folder for the run's life (`open_run`, `lock_run`, `prepare_output_dir`) is scale/run_folder.py.
"""

import json
import math
import re
import tempfile
from pathlib import Path

import torch

import envs
from embedded.tiny import cache_dir
from embedded.warmstart import RECIPES, TINY
from environments import external
from environments.alfworld import OFFICIAL_SPLITS, TASK_TYPES
from environments.alfworld_games import SPLITS as GENERATED_SPLITS
from scale.checkpoint import CHECKSUMS, intact_hint, verify
from scale.run_folder import lock_run, open_run, prepare_output_dir  # noqa: F401  (their old home)
# AdamW's first step moves a weight by lr / (1 - beta1) = 10·lr (beta1 = 0.9, torch's default, used here), a
# scalar of the weights' dtype (float32): from lr ≈ 3.4e37 on it overflows (a RuntimeError in the optimizer)
LR_MAX = 1e37
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def int_at_least(lo: int):
    return (lambda v: isinstance(v, int) and v >= lo), f"an integer >= {lo}"


def real_in(lo: float, hi: float = math.inf, open_lo: bool = False, why: str = ""):
    ok = (lambda v: math.isfinite(v) and (v > lo if open_lo else v >= lo) and v <= hi)
    return ok, (f"a finite number {'>' if open_lo else '>='} {lo:g}"
                + (f" and <= {hi:g}" if hi < math.inf else "")
                + (f" ({why})" if why else ""))


RULES = [  # (config field, (check, allowed)); {env} is the run's env section
    ("steps", int_at_least(1)),
    ("save_every", int_at_least(1)),
    ("keep_checkpoints", int_at_least(1)),
    ("archive_max_turns", int_at_least(0)),
    ("archive_token_turns", int_at_least(0)),
    ("eval_every", int_at_least(0)),
    ("eval_tasks", int_at_least(0)),
    ("eval_temperature", real_in(0)),
    ("router.archive_size", int_at_least(0)),
    ("rollout.tasks_per_step", int_at_least(1)),
    ("rollout.group_size", (int_at_least(2)[0], "an integer >= 2 (GRPO's baseline is the mean of a group)")),
    ("rollout.gen_batch_size", int_at_least(1)),
    ("rollout.max_prompt_tokens", int_at_least(1)),
    ("rollout.sampling.max_new_tokens", int_at_least(1)),
    ("rollout.sampling.temperature", real_in(0, open_lo=True)),
    ("rollout.sampling.top_p", real_in(0, 1, open_lo=True)),
    ("rollout.sampling.top_k", int_at_least(0)),
    ("rollout.vllm_gpu_memory", real_in(0, 1, open_lo=True)),
    ("grpo.lr", real_in(0, LR_MAX, why="AdamW's first step, 10·lr, fits float32")),
    ("grpo.weight_decay", real_in(0)),
    ("grpo.clip_ratio_low", real_in(0, 1)),
    ("grpo.clip_ratio_high", real_in(0)),
    ("grpo.clip_ratio_c", real_in(1)),
    ("grpo.kl_coef", real_in(0)),
    ("grpo.entropy_coef", (math.isfinite, "a finite number")),
    ("grpo.sd_coef", real_in(0)),  # None (the loss form's anchor value) passes
    ("grpo.sd_gate_beta", real_in(0)),
    ("grpo.max_grad_norm", real_in(0, open_lo=True)),
    ("grpo.mini_batch_size", int_at_least(1)),
    ("grpo.micro_batch_tokens", int_at_least(1)),
    ("grpo.ppo_epochs", int_at_least(1)),
    ("grpo.max_nonfinite_steps", int_at_least(1)),
    ("grpo.sd_is_cap", ((lambda v: v >= 1), "a number >= 1 (inf: untruncated)")),  # NaN fails
    ("teacher.oracle", real_in(0, 1)),
    ("teacher.max_prompt_tokens", int_at_least(1)),
    ("teacher.micro_batch_tokens", int_at_least(1)),
    ("{env}.max_steps", int_at_least(1)),
    ("{env}.history_length", int_at_least(0)),
    ("router.history_window", int_at_least(0)),  # after the env's history length (its default)
    ("{env}.invalid_action_penalty", (math.isfinite, "a finite number")),
    ("{env}.num_workers", (int_at_least(-1)[0], "an integer >= -1 (-1: one per core, 0: in-process)")),
    ("{env}.step_timeout_s", real_in(0, open_lo=True)),
    ("{env}.planner_timeout_s", real_in(0, open_lo=True)),
]
ENV_RULES = {  # the settings only one environment has
    "alfworld": [("alfworld.num_train_games", int_at_least(1)), ("alfworld.num_eval_games", int_at_least(1)),
                 ("alfworld.game_cache_size", int_at_least(1))],
    "webshop": [("webshop.num_products", int_at_least(1)), ("webshop.num_eval_goals", int_at_least(1))],
    "textworld": [("textworld.num_train_games", int_at_least(1)),
                  ("textworld.num_eval_games", int_at_least(1))],
    "external": [("external.num_train_tasks", int_at_least(1)), ("external.num_eval_tasks", int_at_least(1))],
}
EVAL_RULES = [  # evaluate.py eval's numbers (None: the checkpoint's value)
    ("k", int_at_least(1)),
    ("limit", int_at_least(0)),
    ("tasks_per_batch", int_at_least(1)),
    ("temperature", real_in(0)),
    ("max_new_tokens", int_at_least(1)),
    ("max_steps", int_at_least(1)),
]


def validate_config(cfg) -> None:
    env = cfg.env if cfg.env in ENV_RULES else "external"  # --env package.module:Class
    check_rules(cfg, [(name.format(env=env), rule) for name, rule in RULES + ENV_RULES[env]])
    if env == "external":
        external.load_class(cfg.env)  # it imports and has what the contract asks (one error line if not)
        external.check_kwargs(cfg.external.kwargs)
    if cfg.env == "alfworld":
        unknown = [t for t in cfg.alfworld.task_types if t not in TASK_TYPES]
        if unknown or not cfg.alfworld.task_types:
            raise SystemExit(f"error: --alfworld.task-types {' '.join(unknown) or '(none)'} is not a task "
                             f"type; allowed: one or more of {', '.join(TASK_TYPES)}")
    check_device(cfg.device)


def check_inputs(cfg) -> tuple[list[envs.Task], list[envs.Task]]:
    """Before anything is written or loaded: the settings fit together, the data (train split; the validation
    panel with --eval-every) and the model exist. Each failure is one `error:` line. Returns (train tasks,
    panel)."""
    if cfg.rollout.action_space == "admissible" and ("vllm" in (cfg.rollout.engine, cfg.teacher.backend)
                                                     or cfg.env_cfg.require_think):
        raise SystemExit("error: --rollout.action-space admissible needs --rollout.engine hf "
                         "--teacher.backend hf and require_think False (the response is exactly one "
                         "`<action>...</action>`)")
    if cfg.router.matcher == "every-turn" and cfg.router.context != "skill":
        raise SystemExit(f"error: --router.matcher every-turn distils turns without a reference, which "
                         f"--router.context {cfg.router.context} needs; use --router.context skill or "
                         f"--router.matcher with-reference")
    if cfg.teacher.oracle > 0 and cfg.router.matcher in ("every-turn", "none"):
        raise SystemExit(f"error: --teacher.oracle needs a reference candidate on every distilled turn, "
                         f"which --router.matcher {cfg.router.matcher} does not give; use a matcher with "
                         f"references (structured, with-reference, history, ...), e.g. --algo smrc-sd or "
                         f"--algo fullpath-sd")
    if cfg.model not in (TINY, *RECIPES):  # the embedded models are built on first use (setup)
        check_model(cfg.model, "--model")
    elif not writable(cache_dir()):
        raise SystemExit(f"error: --model {cfg.model} is built under SMRC_CACHE={cache_dir()}, which is not "
                         f"a writable folder; point SMRC_CACHE at one")
    try:  # missing data: one clear message, not a traceback from deep inside
        train = envs.load_tasks(cfg.env_cfg, "train")
        panel = envs.load_tasks(cfg.env_cfg, "eval") if cfg.eval_every else []
    except envs.DataError as e:
        raise SystemExit(f"error: {e}") from None
    except OSError as e:  # generated games written to an unwritable cache, say
        raise SystemExit(f"error: the {cfg.env} tasks could not be prepared ({e.filename or ''}: "
                         f"{e.strerror or e}); if that is a cache, point --alfworld.cache-dir or SMRC_CACHE "
                         f"at a writable folder") from None
    if not train:
        raise SystemExit(f"error: the {cfg.env} train split has no task under these settings (game counts, "
                         f"task types, eval goals); nothing to train on")
    if isinstance(cfg.env_cfg, external.ExternalConfig):
        external.check(cfg.env_cfg)  # its first reset answers as the contract says
    return train, envs.stratified_subset(panel, cfg.eval_tasks, cfg.seed)


def writable(folder: Path) -> bool:
    """Whether `folder` exists (or can be made) and takes a new file."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder):
            return True
    except OSError:
        return False


def check_world(cfg, world) -> None:
    """The settings that depend on torchrun's process group."""
    on_vllm = (cfg.rollout.engine, cfg.teacher.backend) == ("vllm", "vllm")
    if world.enabled and cfg.dist.strategy == "fsdp" and not on_vllm:
        raise SystemExit("error: --dist.strategy fsdp needs --rollout.engine vllm --teacher.backend vllm: "
                         "under FSDP every forward is a collective, and per-rank generation lengths differ")


def validate_eval_args(args) -> None:
    """evaluate.py eval's numbers and device, before anything is loaded."""
    check_rules(args, EVAL_RULES)
    check_device(args.device)


def check_rules(obj, rules: list) -> None:
    for name, (ok, allowed) in rules:
        value = obj
        for part in name.split("."):
            value = getattr(value, part)
        if value is None:  # a field left to --algo, to its form's default or to the checkpoint
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise SystemExit(f"error: --{name.replace('_', '-')} {value!r} is out of range; "
                             f"allowed: {allowed}")


def check_device(name: str, flag: str = "--device") -> None:
    """auto, cpu, cuda or cuda:N, where a CUDA device must exist here."""
    m = re.fullmatch(r"cuda(?::(\d+))?", name)
    if name in ("auto", "cpu"):
        return
    if m is None:
        raise SystemExit(f"error: {flag} {name!r} is not a device; allowed: auto, cpu, cuda, cuda:N")
    if not torch.cuda.is_available():
        raise SystemExit(f"error: {flag} {name}: no CUDA device is available here (torch "
                         f"{torch.__version__}); use {flag} cpu, or {flag} auto (a GPU when there is one)")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise SystemExit(f"error: {flag} {name}: this machine has {torch.cuda.device_count()} CUDA devices "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")


def check_split(cfg, split: str, flag: str = "--split") -> None:
    """The split exists for the environment (and, for ALFWorld, its source of games)."""
    if cfg.env == "alfworld":
        allowed = GENERATED_SPLITS if cfg.alfworld.source == "generated" else (*OFFICIAL_SPLITS, "eval")
    else:  # WebShop, TextWorld and your own environment: train and eval
        allowed = ("train", "eval")
    if split not in allowed:
        where = f"{cfg.alfworld.source} ALFWorld games" if cfg.env == "alfworld" else f"--env {cfg.env}"
        raise SystemExit(f"error: {flag} {split!r} is not a split of {where}; allowed: {', '.join(allowed)}")


# ------------------------------------------------------------------------------------------------------------
# Models


def check_model(name: str, flag: str) -> None:
    """A local folder must hold a loadable model (`check_model_dir`); any other name a hub id found here."""
    if Path(name).is_dir():
        check_model_dir(Path(name), flag)
        return
    from transformers import AutoConfig
    try:
        AutoConfig.from_pretrained(name)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise SystemExit(custom_code(f"{flag} {name}", "")) from None
        raise SystemExit(f"error: {flag} {name} is neither a model folder nor a hub id found here "
                         f"({str(e).strip().splitlines()[0]})") from None
    except OSError as e:
        raise SystemExit(f"error: {flag} {name} is neither a model folder nor a hub id found here "
                         f"({str(e).strip().splitlines()[0]})") from None


def check_native(config: dict, what: str) -> None:
    """A model whose architecture transformers does not ship (config.json's `auto_map` names code in the
    folder or on the hub) is one error line: the trainer never runs a model's own code."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING:
        raise SystemExit(custom_code(what, f" (model_type {config.get('model_type')!r}, auto_map "
                                           f"{sorted(config['auto_map'])})"))


def custom_code(what: str, detail: str) -> str:
    return (f"error: {what} needs its own Python code to load{detail}, which transformers runs only with "
            f"trust_remote_code: code from the model's folder or repository would run with this run's "
            f"rights. The trainer never turns it on; use a model whose architecture transformers ships "
            f"(Qwen3, Llama, ...) or convert this one to it")


def check_model_dir(path: Path, flag: str) -> bool:
    """True for a run checkpoint (checksums.sha256 or trainer_state.pt in it), which must verify; False for a
    plain save_pretrained folder (unverified), which needs config.json, a tokenizer and complete weights. Each
    failure is one error line naming the flag and the file (and the newest intact checkpoint of the run)."""
    if (path / CHECKSUMS).exists() or (path / "trainer_state.pt").exists():
        problem = verify(path)
        if problem:
            hint = intact_hint(path.parent, f"use it with {flag}", skip=path)
            raise SystemExit(f"error: {flag} {path} fails verification: {problem}; {hint}")
        return True
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        said = (str(e).splitlines() or [type(e).__name__])[0]
        raise SystemExit(f"error: {flag} {path}: no readable config.json ({said})") from None
    check_native(config if isinstance(config, dict) else {}, f"{flag} {path}")
    if not any((path / t).is_file() for t in ("tokenizer.json", "tokenizer_config.json")):
        raise SystemExit(f"error: {flag} {path} holds no tokenizer (tokenizer.json or tokenizer_config.json)")
    if not any((path / w).is_file() for w in WEIGHT_FILES):
        raise SystemExit(f"error: {flag} {path} holds no weights (none of {', '.join(WEIGHT_FILES)})")
    from safetensors import safe_open
    for weights in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(weights, "pt"):  # reads the header, checks it against the file's size
                pass
        except Exception as e:  # safetensors' own error type for a damaged header or a truncated file
            raise SystemExit(f"error: {flag} {path}: {weights} is damaged or truncated "
                             f"({(str(e).splitlines() or [type(e).__name__])[0]})") from None
    return False
