"""The run's configuration: --algo's table (ALGOS), the Config tree tyro turns into flags (each module's own
config nested in it), the presets, and `resolve`, which turns --algo, the preset and the flags into the
concrete settings a run uses before anything runs (the matcher, context, L_SD form and λ: printed in the
banner and written to the `resolved` block of config.json). Only the entry points (smrc.py, evaluate.py) know
the whole Config.

Every default --algo decides, λ included, is one row of ALGOS; a flag overrides each entry.
"""

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

import tyro

from configs.config_file import check_settings, fill_dataclass, read_settings
from environments.alfworld import AlfworldConfig
from environments.external import ExternalConfig
from environments.textworld import TextWorldConfig
from environments.webshop import WebShopConfig
from grpo import TIS_CAP, GRPOConfig
from models import SamplingConfig
from rollout import RolloutConfig
from router import RouterConfig
from teacher import TeacherConfig

# names --router.matcher and --router.context no longer list, so that a command line or a run's config.json
# that holds one still runs: mapped to today's name here only (parse_config, resolve), never a flag's choice
MATCHER_ALIASES = {"all": "with-reference", "every": "every-turn"}
CONTEXT_ALIASES = {"fullpath": "trajectory", "full": "smrc"}


BUILT_IN_ENVS = ("alfworld", "webshop", "textworld")  # else --env names package.module:Class (external)


class AlgoDefaults(NamedTuple):
    matcher: str         # --router.matcher: which turns are distilled
    context: str         # --router.context: what the teacher sees besides the student's prompt
    sd_loss: str         # --grpo.sd-loss: the form of L_SD (grpo.py)
    sd_coef: float       # --grpo.sd-coef: λ, the form's anchor
    tiny: float | None   # λ under --preset tiny (None: the anchor's)
    learn: float | None  # λ under --preset learn (None: the anchor's)


# --algo's table: what each algorithm sets where no flag does. λ's columns: the anchor's for the form (SDAR's
# code for its three forms; 0.01 for reverse KL, where the anchors that add self-distillation to GRPO sit),
# then each preset's for the reverse-KL methods: tiny by the project's rule (analysis/lambda_pilot.py: SD
# gradient 0.1 × GRPO's; bench/results/tiny_pilot: 0.017 → 0.02), learn where the SD gradient equals GRPO's
# (docs/results.md, "The λ of the learn preset": 0.229 → 0.2).
ALGOS = {  # matcher            context       L_SD form     λ      tiny    learn
    "grpo": AlgoDefaults("none", "trajectory", "reverse-kl", 0.01, 0.02, 0.2),
    "fullpath-sd": AlgoDefaults("with-reference", "trajectory", "reverse-kl", 0.01, 0.02, 0.2),
    "smrc-sd": AlgoDefaults("structured", "smrc", "reverse-kl", 0.01, 0.02, 0.2),
    "skill-sd": AlgoDefaults("every-turn", "skill", "skill-sd", 0.001, None, None),  # ρ·k3 (SDAR's code)
    "sdar": AlgoDefaults("every-turn", "skill", "sdar", 0.01, None, None),           # σ(5·sg(Δ))-gated
    "grpo-opsd": AlgoDefaults("every-turn", "skill", "grpo-opsd", 0.01, None, None),  # the gate fixed at 0.5
}


def default_sd_coef(algo: str, sd_loss: str, preset: str) -> float:
    """λ where --grpo.sd-coef is not given: the preset's, else the anchor's, from the row of --algo, or of the
    algorithm whose form --grpo.sd-loss names when it overrides the row's."""
    row = ALGOS[algo]
    if row.sd_loss != sd_loss:
        row = next(r for r in ALGOS.values() if r.sd_loss == sd_loss)
    by_preset = getattr(row, preset, None) if preset in ("tiny", "learn") else None
    return row.sd_coef if by_preset is None else by_preset


@dataclass
class DistConfig:
    """torchrun's settings (scale/distributed.py takes them as plain values)."""
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """under torchrun: ddp (full model per rank) or fsdp (parameters, gradients, optimizer state and the KL
    reference sharded, for models that do not fit one device)"""
    timeout_s: float = 1800.0
    """under torchrun: the longest a collective waits for the other ranks (a stalled or dead rank) before the
    run ends with one line naming the rank and phase; cover the slowest rank's rollout of a step"""


@dataclass
class LoraConfig:
    """--lora.*: adapters through peft (scale/lora.py does the rest). The defaults are verl's
    (verl/trainer/config/model/hf_model.yaml: lora_rank 0 = off, lora_alpha 16,
    target_modules all-linear; verl sets no dropout, so peft's default 0.0 applies)."""
    rank: int = 0
    """LoRA rank r of the adapters (0 = off: full fine-tuning; verl's lora_rank); needs peft
    (pip install -r requirements-lora.txt)"""
    alpha: float = 16.0
    """LoRA scaling α (the update is α/r · B·A; verl's lora_alpha 16)"""
    dropout: float = 0.0
    """dropout on the adapters' input (verl sets none: peft's lora_dropout default 0.0)"""
    target_modules: tuple[str, ...] = ("all-linear",)
    """module names (or name suffixes) that get adapters; all-linear = every linear layer but the LM head
    (verl's target_modules)"""
    save_merged: bool = False
    """also write output_dir/merged/ at each checkpoint: the weights merged into the base, loadable by
    from_pretrained"""


def check_lora(cfg: LoraConfig, strategy: str = "ddp") -> None:
    """Bad settings as one error line (before any model loads; a missing peft: when the adapters are added,
    so that the memory plan of a LoRA run needs no peft: scale/lora.py)."""
    if cfg.rank < 0:
        raise SystemExit(f"error: --lora.rank {cfg.rank} is not a rank: give a positive rank, or 0 for full "
                         f"fine-tuning")
    if cfg.rank == 0:
        default = LoraConfig()
        unused = [f"--lora.{k.replace('_', '-')}" for k, v in vars(cfg).items() if v != getattr(default, k)]
        if unused:
            raise SystemExit(f"error: {' '.join(unused)} without --lora.rank R > 0 would be ignored: give "
                             f"the rank, or drop them")
        return
    if not cfg.alpha > 0 or not 0.0 <= cfg.dropout < 1.0 or not cfg.target_modules:
        raise SystemExit(f"error: --lora.alpha {cfg.alpha} / --lora.dropout {cfg.dropout} / "
                         f"--lora.target-modules {list(cfg.target_modules)}: give alpha > 0, "
                         f"0 <= dropout < 1 and at least one target module")
    if strategy == "fsdp":
        raise SystemExit("error: --lora.rank with --dist.strategy fsdp is not supported: the adapters are "
                         "small, use --dist.strategy ddp")


@dataclass
class Config:
    config: str = ""
    """a YAML or JSON file of settings (any field below, nested as in a run's config.json: `grpo: {lr:
    1.0e-6}`; configs/ holds one per paper row); applied after --preset, and the other flags override it"""
    preset: Literal["none", "tiny", "learn"] = "none"
    """named preset applied before the config file and the other flags; tiny = CPU smoke run of
    tiny-agent-quick on small generated games; learn = the CPU mini-reproduction of bench/learn.py"""
    env: str = "alfworld"
    """alfworld | webshop | textworld, or package.module:Class: an environment of your own (envs.py, the
    contract; docs/environments.md), set with --external.*"""
    algo: Literal["grpo", "fullpath-sd", "smrc-sd", "skill-sd", "sdar", "grpo-opsd"] = "smrc-sd"
    """training algorithm (sets the router's matcher, the teacher context and the form of L_SD: ALGOS)"""
    model: str = "Qwen/Qwen3-1.7B"
    """Hugging Face model id or local directory; 'tiny' / 'tiny-agent' = the embedded CPU models
    (embedded/)"""
    seed: int = 0
    """seed of everything (task sampling, generation, routing control)"""
    steps: int = 150
    """training steps"""
    output_dir: str = "runs/smrc"
    """run directory: config.json, metrics.jsonl, checkpoints step_XXXXXX/"""
    save_every: int = 10
    """checkpoint every N steps (and always at the end)"""
    keep_checkpoints: int = 3
    """checkpoints kept (oldest deleted first)"""
    preempt_grace_s: float = 30.0
    """after SIGTERM or SIGINT the run stops at the end of the step in flight, and saves a checkpoint there if
    the save fits this many seconds from the signal (a scheduler's SIGTERM -> SIGKILL window: Slurm's and
    Kubernetes' default 30 s; scale/preempt.py)"""
    resume: bool = False
    """continue from the latest checkpoint in output_dir (without it, a folder holding checkpoints is
    refused)"""
    resume_from: str = ""
    """continue from this checkpoint instead (a folder, or a step_XXXXXX name in output_dir); implies
    --resume"""
    eval_every: int = 0
    """validate every N steps (and at the last) on a fixed panel, logged to metrics.jsonl, best weights kept
    in output_dir/best/ (0 = never: the CPU default; the anchors validate every 5)"""
    eval_tasks: int = 128
    """validation panel: this many tasks of the eval split, type-stratified, seeded by --seed (anchors:
    128)"""
    eval_temperature: float = 0.4
    """validation sampling temperature (verl-agent and SDAR: 0.4)"""
    log_with: tuple[Literal["wandb", "tensorboard", "mlflow"], ...] = ()
    """experiment trackers that also get every metrics row and the resolved config, offline into the run
    folder by default (scale/trackers.py; pip install -r requirements-tracking.txt)"""
    archive_max_turns: int = 1_000_000
    """turns written to output_dir/rollouts.jsonl.gz for the audits (evaluate.py audit); past it, turns are
    counted, not written (0 = no archive)"""
    archive_token_turns: int = 32
    """distilled turns per step and rank whose response tokens keep their teacher and student log-probs in
    the archive, spread evenly over them (`evaluate.py view` colours the tokens; 0 = none)"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    accept_new_initial_weights: bool = False
    """on --resume: anchor the KL term to --model's weights as they are now even when their sha256 differs
    from config.json's record of the run's start (recorded in config.resumes.jsonl); else one error line"""
    memory_check: bool = True
    """on CUDA, before anything loads: refuse to start (one error line) when the memory plan's peak
    (`python bench/memory_plan.py`) exceeds the GPU; --no-memory-check starts anyway"""
    alfworld: AlfworldConfig = field(default_factory=lambda: AlfworldConfig(source="official"))
    webshop: WebShopConfig = field(default_factory=WebShopConfig)
    textworld: TextWorldConfig = field(default_factory=TextWorldConfig)
    external: ExternalConfig = field(default_factory=ExternalConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # --lora.rank R > 0: adapters (scale/lora.py)

    @property
    def env_cfg(self):
        if self.env in BUILT_IN_ENVS:
            return getattr(self, self.env)
        self.external.spec = self.env  # an environment of your own: its package.module:Class
        return self.external

    def resolved(self) -> dict:
        """What --algo, the preset and the flags resolved to (`resolve`): the banner's and config.json's
        `resolved` block."""
        return {"matcher": self.router.matcher, "context": self.router.context, "sd_loss": self.grpo.sd_loss,
                "sd_coef": self.grpo.sd_coef, "teacher_oracle": self.teacher.oracle}

    def engines(self) -> str:
        """The banner's engines, and why where --rollout.engine / --teacher.backend auto chose them."""
        why = getattr(self, "_engine_why", "")  # set by `resolve` (not a flag)
        return f"{self.rollout.engine}, teacher {self.teacher.backend}" + (f" (auto: {why})" if why else "")


def resolve(cfg: Config) -> Config:
    """The run's concrete settings, decided once before anything runs: a copy of `cfg` in which the router's
    matcher, context and history window and the L_SD form and λ are filled in from --algo (ALGOS), the preset
    and the form's anchor wherever no flag set them (module docstring). Nothing after this reads --algo or the
    preset again."""
    cfg = copy.deepcopy(cfg)
    row = ALGOS[cfg.algo]
    matcher, context, form = row.matcher, row.context, row.sd_loss
    given = cfg.router.context
    cfg.router.context = CONTEXT_ALIASES.get(given, given) or context  # a saved config.json's old name
    if cfg.router.matcher is None:  # the skill baselines given a trajectory context route as FullPath-SD
        skill_algo_on_a_trajectory = matcher == "every-turn" and cfg.router.context != "skill"
        cfg.router.matcher = "with-reference" if skill_algo_on_a_trajectory else matcher
    cfg.router.matcher = MATCHER_ALIASES.get(cfg.router.matcher, cfg.router.matcher)
    if cfg.router.history_window is None:  # h of the history matcher: the prompt's
        cfg.router.history_window = cfg.env_cfg.history_length
    if cfg.rollout.engine == "auto":
        cfg.rollout.engine, cfg._engine_why = auto_engine(cfg)  # the why: for the banner (not a flag)
    if cfg.teacher.backend == "auto":  # the trainer's path (bench/results/teacher_scale), but FSDP needs vLLM
        cfg.teacher.backend = "vllm" if cfg.rollout.engine == "vllm" and cfg.dist.strategy == "fsdp" else "hf"
    if cfg.grpo.old_logprobs == "auto":
        cfg.grpo.old_logprobs = "recompute" if cfg.rollout.engine == "vllm" else "sampler"
    if cfg.grpo.tis_cap is None:  # truncated IS on by default under vLLM, as TRL's vLLM correction
        cfg.grpo.tis_cap = TIS_CAP if cfg.rollout.engine == "vllm" else 0.0
    check_lora(cfg.lora, cfg.dist.strategy)  # a bad --lora.* (or no peft) is one error line
    cfg.grpo.sd_loss = cfg.grpo.sd_loss or form
    if cfg.grpo.sd_coef is None:
        cfg.grpo.sd_coef = default_sd_coef(cfg.algo, cfg.grpo.sd_loss, cfg.preset)
    return cfg


def auto_engine(cfg: Config) -> tuple[str, str]:
    """(engine, why) for --rollout.engine / --teacher.backend auto: vLLM where it helps and runs (CUDA, vllm
    importable, free decoding), else the transformers engine."""
    import importlib.util
    import torch
    if cfg.rollout.action_space == "admissible":
        return "hf", "restricted decoding (--rollout.action-space admissible) runs on the transformers engine"
    if cfg.device == "cpu" or not torch.cuda.is_available():
        return "hf", "no CUDA device"
    if importlib.util.find_spec("vllm") is None:
        return "hf", "vllm is not installed (pip install vllm)"
    return "vllm", "CUDA and vllm are present"


SMALL_MODEL_PARAMS = 100_000_000  # every "auto" a model's size decides: below it the measurements are on
# (their passes and buffers cost little there); from it on the update recomputes activations (SmolLM2-135M's
# update holds ~1.3 MB a token without, ~0.1 MB with) and the measurements are off unless asked for


def resolve_for_model(cfg: Config, n_params: int, device_type: str) -> Config:
    """A copy of `cfg` with every auto the model's size (`n_params`) and the device ("cuda", "cpu") decide
    filled in: --grpo.grad-checkpointing, --grpo.term-grad-norms and --teacher.candidate-gain by
    SMALL_MODEL_PARAMS, --grpo.ref-dtype (bfloat16 on CUDA with --grpo.bf16, else float32). smrc.setup calls
    it once the model is loaded, scale/memory_plan.py on the model's config.json; the components read the
    result only."""
    cfg, small = copy.deepcopy(cfg), n_params < SMALL_MODEL_PARAMS
    decide = lambda mode, on: mode if mode != "auto" else ("on" if on else "off")  # noqa: E731
    cfg.grpo.grad_checkpointing = decide(cfg.grpo.grad_checkpointing, not small)
    cfg.grpo.term_grad_norms = decide(cfg.grpo.term_grad_norms, small)
    cfg.teacher.candidate_gain = decide(cfg.teacher.candidate_gain, small)
    if cfg.grpo.ref_dtype == "auto":
        cfg.grpo.ref_dtype = "bfloat16" if cfg.grpo.bf16 and device_type == "cuda" else "float32"
    return cfg


def tiny_preset() -> Config:
    """Runs end to end on 2 CPU cores in a few minutes: `tiny-agent-quick` (the embedded tiny model after a
    short behaviour-cloning warm start, embedded/warmstart.py) on small generated games, decoding restricted
    to the admissible commands. The planner's solutions also seed the reference bank (router choice 4), so the
    distillation path does real work from the first step. λ: ALGOS' tiny column."""
    return Config(
        preset="tiny", model="tiny-agent-quick", steps=10, output_dir="runs/tiny", save_every=5,
        alfworld=AlfworldConfig(source="generated", room_size="small", num_train_games=8, num_eval_games=6,
                                max_steps=20, require_think=False),
        webshop=WebShopConfig(max_steps=8, require_think=False),
        textworld=TextWorldConfig(num_train_games=8, num_eval_games=6, max_steps=10, require_think=False),
        external=ExternalConfig(require_think=False),
        rollout=RolloutConfig(tasks_per_step=4, group_size=4, gen_batch_size=64, action_space="admissible",
                              sampling=SamplingConfig(max_new_tokens=24)),
        grpo=GRPOConfig(lr=1e-4, mini_batch_size=1024, micro_batch_tokens=8192),  # λ: ALGOS' tiny column
        router=RouterConfig(seed_with_planner=True),
    )


def learn_preset() -> Config:
    """The CPU mini-reproduction (bench/learn.py): `tiny-agent` on small generated games (20-step limit: the
    expert needs at most 18 there), decoding restricted to the admissible commands, references = the policy's
    own successes only (as in the paper), no KL anchor, 4 tasks x 8 rollouts per step. λ: ALGOS' learn column
    (`--preset learn --algo sdar` runs SDAR at its anchor 0.01)."""
    return Config(
        preset="learn", model="tiny-agent", steps=20, output_dir="runs/learn", save_every=10,
        alfworld=AlfworldConfig(source="generated", room_size="small", num_train_games=320,
                                num_eval_games=200, max_steps=20, require_think=False),
        rollout=RolloutConfig(tasks_per_step=4, group_size=8, gen_batch_size=64, action_space="admissible",
                              sampling=SamplingConfig(max_new_tokens=24)),
        grpo=GRPOConfig(lr=2e-4, kl_coef=0.0, mini_batch_size=128,
                        micro_batch_tokens=8192),  # λ: ALGOS' learn column
    )


PRESETS = {"none": Config, "tiny": tiny_preset, "learn": learn_preset}


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `--name V` or `--name=V` in argv (the last one given), else None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def parse_config(argv: list[str], description: str | None = None) -> Config:
    """The resolved config of a command line: `--preset NAME` picks the defaults, `--config FILE` (YAML or
    JSON, configs/config_file.py) overrides them, every other flag overrides both (tyro shows all fields in
    --help, under `description`), then `resolve` fills in what --algo decides. A file's own `preset` key
    picks the defaults when the command line has no --preset."""
    path = _flag(argv, "--config")
    settings = read_settings(path) if path else {}
    if settings:
        check_settings(Config, settings, path)
    name = _flag(argv, "--preset") or settings.get("preset", "none")
    if name not in PRESETS:
        raise SystemExit(f"unknown --preset {name!r}; choose from {sorted(PRESETS)}")
    defaults = PRESETS[name]()
    fill_dataclass(defaults, settings)  # kinds checked above: no unknown key, no ValueError
    argv = [_current_name(argv[i - 1] if i else "", a) for i, a in enumerate(argv)]
    return resolve(tyro.cli(Config, default=defaults, args=argv, description=description or __doc__))


def _current_name(before: str, arg: str) -> str:
    """`arg` with a retired matcher or context name (the alias maps) as today's, where it is the value of
    --router.matcher or --router.context (`before` is the argument before it)."""
    aliases = {"--router.matcher": MATCHER_ALIASES, "--router.context": CONTEXT_ALIASES}
    flag, eq, value = arg.partition("=")
    if eq and flag in aliases:
        return f"{flag}={aliases[flag].get(value, value)}"
    return aliases[before].get(arg, arg) if before in aliases else arg


def config_from_run(path: Path | None, preset: str) -> Config:
    """The resolved Config of a checkpoint (its smrc_config.json) or run directory (config.json); else the
    preset's. A file that is not a config (garbage, a value of the wrong kind) is one error line naming it."""
    cfg = PRESETS[preset]()
    for name in ("smrc_config.json", "config.json"):
        if path is not None and (path / name).exists():
            try:
                saved = json.loads((path / name).read_text())
                if not isinstance(saved, dict):
                    raise ValueError(f"a JSON {type(saved).__name__}, not an object")
                saved.pop("resolved", None)  # config.json's record of what the flags resolved to, not a field
                unknown = fill_dataclass(cfg, saved)
            except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
                said = (str(e).splitlines() or [type(e).__name__])[0]
                raise SystemExit(f"error: {path / name} is not a run config ({said}); restore it, or remove "
                                 f"it and give the settings with --preset and the flags") from None
            if unknown:
                print(f"[config] {path / name}: {len(unknown)} unknown keys ignored: {unknown}", flush=True)
            break
    return resolve(cfg)

