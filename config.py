"""The run's configuration: --algo's table (ALGOS), the Config tree tyro turns into flags, the presets, and what
the flags resolve to (`Config.resolved`: the matcher, context, L_SD form and λ a run actually uses, printed in the
banner and written to config.json).

λ (`Config.sd_coef`): --grpo.sd-coef when given; else the preset's λ (PRESET_SD_COEF) for the reverse-kl forms
(FullPath-SD, SMRC-SD); else the form's anchor value (grpo.SD_COEF). A preset's λ is a choice for the reverse-KL
methods on its scale: the skill-text forms (skill-sd, sdar, grpo-opsd) keep their anchors' λ under every preset.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import tyro

from environments.alfworld import AlfworldConfig
from environments.webshop import WebShopConfig
from grpo import SD_COEF, GRPOConfig
from models import SamplingConfig
from router import RouterConfig
from scale.checkpoint import fill_dataclass
from scale.distributed import DistConfig
from teacher import TeacherConfig

ALGOS = {  # --algo → (matcher, teacher context, L_SD form) unless --router.matcher/--router.context/--grpo.sd-loss say
    "grpo": ("none", "fullpath", "reverse-kl"),
    "fullpath-sd": ("all", "fullpath", "reverse-kl"),
    "smrc-sd": ("structured", "full", "reverse-kl"),
    "skill-sd": ("every", "skill", "skill-sd"),     # Skill-SD as SDAR's repository codes it: ρ·k3, λ = 0.001
    "sdar": ("every", "skill", "sdar"),             # SDAR: σ(5·sg(Δ))-gated likelihood, λ = 0.01
    "grpo-opsd": ("every", "skill", "grpo-opsd"),   # GRPO+OPSD: the same with the gate fixed at 0.5
}


@dataclass
class RolloutConfig:
    engine: Literal["hf", "vllm"] = "hf"
    """generation engine: transformers generate (hf) or vLLM (vllm)"""
    tasks_per_step: int = 16
    """task groups per step (verl-agent: 16)"""
    group_size: int = 8
    """rollouts per task; GRPO statistics are per group (verl-agent: 8)"""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_prompt_tokens: int = 4096
    """student prompt budget; an over-long prompt falls back to the no-history prompt, then ends the episode (counted)"""
    gen_batch_size: int = 64
    """prompts per generate call (hf engine)"""
    action_space: Literal["free", "admissible"] = "free"
    """free: the model writes its response (the paper); admissible: token-level decoding restricted to
    `<action>{one admissible command}</action>` (a prefix trie, the same mask in sampling, teacher and update): a
    CPU-scale choice for tiny models, hf engine and require_think=False only"""
    vllm_gpu_memory: float = 0.5
    """vllm engine: share of GPU memory for weights + KV cache (it sleeps during the update)"""


@dataclass
class Config:
    preset: Literal["none", "tiny", "learn"] = "none"
    """named preset applied before the other flags; tiny = CPU smoke run of tiny-agent-quick on small generated
    games; learn = the CPU mini-reproduction of bench/learn.py"""
    env: Literal["alfworld", "webshop"] = "alfworld"
    """environment"""
    algo: Literal["grpo", "fullpath-sd", "smrc-sd", "skill-sd", "sdar", "grpo-opsd"] = "smrc-sd"
    """training algorithm (sets the router's matcher, the teacher context and the form of L_SD: ALGOS)"""
    model: str = "Qwen/Qwen3-1.7B"
    """Hugging Face model id or local directory; 'tiny' / 'tiny-agent' = the embedded CPU models (embedded/)"""
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
    resume: bool = False
    """continue from the latest checkpoint in output_dir (without it, a folder holding checkpoints is refused)"""
    resume_from: str = ""
    """continue from this checkpoint instead (a folder, or a step_XXXXXX name in output_dir); implies --resume"""
    eval_every: int = 0
    """validate every N steps (and at the last) on a fixed panel, logged to metrics.jsonl, best weights kept in
    output_dir/best/ (0 = never: the CPU default; the anchors validate every 5)"""
    eval_tasks: int = 128
    """validation panel: this many tasks of the eval split, type-stratified, seeded by --seed (anchors: 128)"""
    eval_temperature: float = 0.4
    """validation sampling temperature (verl-agent and SDAR: 0.4)"""
    archive_max_turns: int = 1_000_000
    """turns written to output_dir/rollouts.jsonl.gz for the audits (evaluate.py audit); past it, turns are counted,
    not written (0 = no archive)"""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N"""
    alfworld: AlfworldConfig = field(default_factory=lambda: AlfworldConfig(source="official"))
    webshop: WebShopConfig = field(default_factory=WebShopConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    dist: DistConfig = field(default_factory=DistConfig)

    @property
    def matcher(self) -> str:  # the skill baselines given a trajectory context (--router.context) route as FullPath-SD
        default = ALGOS[self.algo][0]
        return self.router.matcher or ("all" if default == "every" and self.context != "skill" else default)

    @property
    def context(self) -> str:
        return self.router.context or ALGOS[self.algo][1]

    @property
    def history_window(self) -> int:  # h of the history matcher: the prompt's by default
        return self.env_cfg.history_length if self.router.history_window is None else self.router.history_window

    @property
    def sd_loss(self) -> str:
        return self.grpo.sd_loss or ALGOS[self.algo][2]

    @property
    def sd_coef(self) -> float:  # λ applied (module docstring): flag, else the preset's (reverse-kl only), else anchor
        if self.grpo.sd_coef is not None:
            return self.grpo.sd_coef
        preset = PRESET_SD_COEF.get(self.preset) if self.sd_loss == "reverse-kl" else None
        return SD_COEF[self.sd_loss] if preset is None else preset

    @property
    def env_cfg(self):
        return self.alfworld if self.env == "alfworld" else self.webshop

    def resolved(self) -> dict:
        """What --algo, the preset and the flags resolve to (the banner's and config.json's `resolved` block)."""
        return {"matcher": self.matcher, "context": self.context, "sd_loss": self.sd_loss, "sd_coef": self.sd_coef,
                "teacher_oracle": self.teacher.oracle}


PRESET_SD_COEF = {"tiny": 0.1, "learn": 0.3}  # each preset's λ of the reverse-kl forms (not of the skill-text forms)


def tiny_preset() -> Config:
    """Runs end to end on 2 CPU cores in a few minutes: `tiny-agent-quick` (the embedded tiny model after a short
    behaviour-cloning warm start, embedded/warmstart.py) on small generated games, decoding restricted to the
    admissible commands. The planner's solutions also seed the reference bank (router deviation 4), so the
    distillation path does real work from the first step. λ = 0.1 for the reverse-kl forms only (PRESET_SD_COEF)."""
    return Config(
        preset="tiny", model="tiny-agent-quick", steps=10, output_dir="runs/tiny", save_every=5,
        alfworld=AlfworldConfig(source="generated", room_size="small", num_train_games=8, num_eval_games=6,
                                max_steps=20, require_think=False),
        webshop=WebShopConfig(max_steps=8, require_think=False),
        rollout=RolloutConfig(tasks_per_step=4, group_size=4, gen_batch_size=64, action_space="admissible",
                              sampling=SamplingConfig(max_new_tokens=24)),
        grpo=GRPOConfig(lr=1e-4, mini_batch_size=1024, micro_batch_tokens=8192),  # λ: PRESET_SD_COEF
        router=RouterConfig(seed_with_planner=True),
    )


def learn_preset() -> Config:
    """The CPU mini-reproduction (bench/learn.py): `tiny-agent` on small generated games (20-step limit: the expert
    needs at most 18 there), decoding restricted to the admissible commands, references = the policy's own successes
    only (as in the paper), no KL anchor, 4 tasks x 8 rollouts per step. λ = 0.3 for the reverse-kl forms only
    (PRESET_SD_COEF): `--preset learn --algo sdar` runs SDAR at its anchor 0.01."""
    return Config(
        preset="learn", model="tiny-agent", steps=20, output_dir="runs/learn", save_every=10,
        alfworld=AlfworldConfig(source="generated", room_size="small", num_train_games=320, num_eval_games=200,
                                max_steps=20, require_think=False),
        rollout=RolloutConfig(tasks_per_step=4, group_size=8, gen_batch_size=64, action_space="admissible",
                              sampling=SamplingConfig(max_new_tokens=24)),
        grpo=GRPOConfig(lr=2e-4, kl_coef=0.0, mini_batch_size=128, micro_batch_tokens=8192),  # λ: PRESET_SD_COEF
    )


PRESETS = {"none": Config, "tiny": tiny_preset, "learn": learn_preset}


def parse_config(argv: list[str], description: str | None = None) -> Config:
    """`--preset NAME` picks the defaults; every other flag overrides them (tyro shows all fields in --help, under
    `description`)."""
    name = "none"
    for i, a in enumerate(argv):
        if a == "--preset" and i + 1 < len(argv):
            name = argv[i + 1]
        elif a.startswith("--preset="):
            name = a.split("=", 1)[1]
    if name not in PRESETS:
        raise SystemExit(f"unknown --preset {name!r}; choose from {sorted(PRESETS)}")
    return tyro.cli(Config, default=PRESETS[name](), args=argv, description=description or __doc__)


def config_from_run(path: Path | None, preset: str) -> Config:
    """The Config of a checkpoint (its smrc_config.json) or run directory (config.json); else the preset's. A
    file that is not a config (garbage, a value of the wrong kind) is one error line naming it."""
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
    return cfg

