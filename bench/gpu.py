"""GPU benchmark that needs no download: GRPO and SMRC-SD steps of a real-size model on real-size games, in
one run.

A randomly initialised model of a named architecture (Qwen3-1.7B by default, Qwen2.5-3B, or the embedded tiny
one for CPU) over the embedded tiny tokenizer's ids, trained through the project's own loop
(`smrc.train_step`: rollout, reference bank, router, teacher, GRPO update) on generated ALFWorld games with
real-size rooms. The random policy never wins, so SMRC-SD's reference bank is seeded with the planner's
solutions before the clock starts (planning is not timed); GRPO runs without references. Printed per algorithm
(the first step dropped when there are more):

- time per phase: generate, env (time the trainer waited on the env workers), teacher, reference (KL) forward,
  update (which includes the reference forward), step; tokens/s; peak memory (CUDA: max_memory_allocated; CPU:
  the peak RSS of this process);
- passes per trained token over one step: forward / backward tokens of each phase divided by the tokens the
  update trains on (prompt + response of every turn-sample). Generation forwards each prompt once and each
  sampled token but the last; the teacher runs on matched turns only, over a longer (privileged) prompt; with
  gradient checkpointing the update's backward also recomputes every layer once (printed as `recompute`);
- the SMRC-SD / GRPO step-time ratio, measured in this run.

    python bench/gpu.py  # Qwen3-1.7B architecture, 16 episodes x 5 turns x 192 tokens
    python bench/gpu.py --arch qwen2.5-3b --steps 3
    python bench/gpu.py --decode-profile --steps 0  # ms per decode step only (batch 16, 1000-token prompts)
    python bench/gpu.py --arch tiny --device cpu --tasks 2 --group 2 --turns 2 --new-tokens 8 \
        --room small  # CPU

On a GPU node without internet, `../shared/tools/gpu_site.sh` packs the pure-Python packages it needs (the
ALFWorld engine, tyro) into `.gpu-site/` for PYTHONPATH.
"""

import argparse
import contextlib
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import candidate_gain  # noqa: E402
import grpo  # noqa: E402
import router  # noqa: E402
import rollout  # noqa: E402
import smrc  # noqa: E402
import teacher  # noqa: E402
from config import resolve  # noqa: E402
from embedded import tiny  # noqa: E402
from environments.alfworld import AlfworldConfig  # noqa: E402
from environments.pool import EnvPool  # noqa: E402
from models import HFEngine, SamplingConfig  # noqa: E402
from scale.distributed import init_distributed  # noqa: E402
from scale import memory_plan  # noqa: E402
from scale.lifecycle import Lifecycle  # noqa: E402
from scale.memory import peak_bytes, reset_peak  # noqa: E402

ROPE = {"rope_type": "default", "rope_theta": 1e6}
ARCHS = {  # the public config.json values of each model; vocab 151936 (the models' embedding size)
    "qwen3-1.7b": lambda tok: Qwen3Config(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_parameters=ROPE, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None),
    "qwen2.5-3b": lambda tok: Qwen2Config(
        vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
        num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_parameters=ROPE, tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, bos_token_id=None),
    "tiny": None,  # the embedded tiny model's architecture (embedded/tiny.py), its own vocabulary
}
PHASES = ("generate", "teacher", "reference", "update")


def build_model(arch: str, tok, device: torch.device, seed: int):
    """A randomly initialised model of `arch` in float32 (the trainer's master weights), built on `device`."""
    if arch == "tiny":
        return tiny.new_model(tok, layers=2, hidden=128, seed=seed).to(device)
    torch.manual_seed(seed)
    with device:
        model = AutoModelForCausalLM.from_config(ARCHS[arch](tok), dtype=torch.float32)
    (model.generation_config.eos_token_id,
     model.generation_config.pad_token_id) = tok.eos_token_id, tok.pad_token_id
    return model


class Meter:
    """Forward/backward token counts per phase (model hooks) and the reference forward's seconds."""

    def __init__(self, device: torch.device):
        self.device, self.phase = device, "other"
        self.fwd = dict.fromkeys(PHASES + ("other",), 0)
        self.bwd = dict.fromkeys(PHASES + ("other",), 0)
        self.calls = dict.fromkeys(PHASES + ("other",), 0)
        self.ref_s, self.trained_tokens, self._t0 = 0.0, 0, 0.0

    def count(self, phase: str):
        def hook(module, args, kwargs):
            ids, mask = kwargs.get("input_ids"), kwargs.get("attention_mask")
            n = ids.shape[1]
            # a device tensor, read after the step: a .item() here would sync every decode step
            real = mask[:, -n:].sum() if mask is not None and mask.dim() == 2 else ids.numel()
            name = phase or self.phase
            self.fwd[name] += real
            self.calls[name] += 1
            self.bwd[name] += real if torch.is_grad_enabled() else 0
        return hook

    def ref_start(self, module, args, kwargs):
        self._sync()
        self._t0 = time.perf_counter()

    def ref_end(self, module, args, kwargs, output):
        self._sync()
        self.ref_s += time.perf_counter() - self._t0

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def labelled(self):
        """The project's phase functions, wrapped to set the phase while they run (restored on exit)."""
        targets = [(rollout, "collect_rollouts", "generate"), (teacher, "teacher_signal", "teacher"),
                   (grpo, "update", "update")]
        saved = [(mod, name, getattr(mod, name)) for mod, name, _ in targets]

        def wrap(fn, phase):
            def run(*args, **kwargs):
                self.phase = phase
                if phase == "update":  # the samples the update trains on: prompt + response tokens
                    self.trained_tokens += sum(len(s.prompt_ids) + len(s.response_ids) for s in args[2])
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.phase = "other"
            return run
        for (mod, name, phase), (_, _, fn) in zip(targets, saved):
            setattr(mod, name, wrap(fn, phase))
        try:
            yield self
        finally:
            for mod, name, fn in saved:
                setattr(mod, name, fn)


def run_config(args, algo: str, out: Path) -> smrc.Config:
    """The run's Config: every train game is played every step
    (their planner solutions are made before timing)."""
    env = AlfworldConfig(source="generated", room_size=args.room, num_train_games=args.tasks,
                         num_eval_games=1, max_steps=args.turns, require_think=False,
                         num_workers=args.workers)
    return resolve(smrc.Config(
        env="alfworld", algo=algo, model=args.arch, seed=args.seed, steps=10**6, save_every=10**6,
        output_dir=str(out / algo), archive_max_turns=0, device=args.device, alfworld=env,
        rollout=rollout.RolloutConfig(tasks_per_step=args.tasks, group_size=args.group,
                                      gen_batch_size=args.gen_batch, max_prompt_tokens=args.max_prompt_tokens,
                                      sampling=SamplingConfig(max_new_tokens=args.new_tokens,
                                                              static_cache=args.static_cache)),
        grpo=grpo.GRPOConfig(micro_batch_tokens=args.micro_batch_tokens,
                             grad_checkpointing=args.grad_checkpointing),
        teacher=teacher.TeacherConfig(micro_batch_tokens=args.micro_batch_tokens)))


def setup_run(args, cfg: smrc.Config, tok, world, pool: EnvPool) -> tuple[Lifecycle, smrc.Setup]:
    """smrc.setup's pieces around a model built in memory (nothing to load), on a fresh run's Lifecycle;
    SMRC-SD's bank gets the planner's solutions of every train game."""
    model = build_model(args.arch, tok, world.device, args.seed)
    ref_model = (copy.deepcopy(model).eval().requires_grad_(False).to(grpo.ref_dtype(cfg.grpo, world.device))
                 if cfg.grpo.kl_coef > 0 else None)
    if grpo.grad_checkpointing_on(cfg.grpo, model):
        model.gradient_checkpointing_enable()
    life = Lifecycle(cfg, world, pool, (cfg.env_cfg.load_tasks("train"), []), ckpt=None)
    s = smrc.Setup(train_tasks=life.train_tasks, model=model, tokenizer=tok,
                   ref_model=ref_model, optimizer=torch.optim.AdamW(model.parameters(), lr=cfg.grpo.lr,
                                                                    weight_decay=cfg.grpo.weight_decay),
                   bank=router.ReferenceBank(cfg.router.archive_size),
                   engine=HFEngine(model, tok, cfg.rollout.sampling, cfg.rollout.gen_batch_size,
                                   bf16=cfg.grpo.bf16),
                   teacher=candidate_gain.resolved(cfg.teacher, sum(p.numel() for p in model.parameters())))
    if cfg.algo != "grpo":  # the random policy never wins: the planner's solutions are the references
        for ref in smrc.planner_references(cfg, s, s.train_tasks):
            s.bank.add_planner(ref)
    return life, s


def run_algo(args, algo: str, tok, world, pool: EnvPool, out: Path) -> dict:
    """`args.steps` training steps of `algo`: the metrics rows smrc.py logs,
    plus this benchmark's counts per step."""
    cfg = run_config(args, algo, out)
    Path(cfg.output_dir).mkdir(parents=True)
    reset_peak(world.device)
    life, s = setup_run(args, cfg, tok, world, pool)
    meter = Meter(world.device)
    hooks = [s.model.register_forward_pre_hook(meter.count(None), with_kwargs=True)]
    if s.ref_model is not None:
        hooks += [s.ref_model.register_forward_pre_hook(meter.count("reference"), with_kwargs=True),
                  s.ref_model.register_forward_pre_hook(meter.ref_start, with_kwargs=True),
                  s.ref_model.register_forward_hook(meter.ref_end, with_kwargs=True)]
    steps = []
    with meter.labelled():
        for step in range(args.steps):
            before = copy.deepcopy((meter.fwd, meter.bwd, meter.calls, meter.ref_s, meter.trained_tokens))
            smrc.train_step(cfg, life, s, step)
            steps.append({"fwd": {k: int(v - before[0][k]) for k, v in meter.fwd.items()},
                          "bwd": {k: int(v - before[1][k]) for k, v in meter.bwd.items()},
                          "calls": {k: v - before[2][k] for k, v in meter.calls.items()},
                          "ref_s": meter.ref_s - before[3],
                          "trained_tokens": meter.trained_tokens - before[4]})
    for h in hooks:
        h.remove()
    if s.replay_env is not None:
        s.replay_env.close()
    rows = [json.loads(line) for line in (Path(cfg.output_dir) / "metrics.jsonl").read_text().splitlines()]
    # each phase resets the peak
    phase_peaks = [v for r in rows for k, v in r.items() if k.startswith("mem/")]
    gpu_gib = (torch.cuda.get_device_properties(world.device).total_memory / 2**30
               if world.device.type == "cuda" else 0.0)
    result = {"rows": rows, "steps": steps,
              "peak_mem_gib": max([peak_bytes(world.device) / 2**30, *phase_peaks]),
              "mem_vs_plan": {ph: (max(r.get(f"mem/{ph}_peak_gb", 0.0) for r in rows), sum(parts.values()))
                              for ph, parts in memory_plan.plan(cfg, memory_plan.arch_of(
                                  s.model.config.to_dict(), args.arch), world.device.type == "cuda",
                                  gpu_gib)["phases"].items()},
              "grad_checkpointing": grpo.grad_checkpointing_on(cfg.grpo, s.model),
              "params": sum(p.numel() for p in s.model.parameters())}
    del s
    if world.device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def summarise(result: dict) -> dict:
    """Means over the timed steps (the first dropped when there are more) and the passes of the last step."""
    timed = list(zip(result["rows"], result["steps"]))
    timed = timed[1:] if len(timed) > 1 else timed

    def mean(get):
        return sum(get(r, c) for r, c in timed) / len(timed)
    times = {"generate": mean(lambda r, c: r["time/generate_s"]), "env": mean(lambda r, c: r["time/env_s"]),
             "teacher": mean(lambda r, c: r["sd/teacher_time_s"]), "reference": mean(lambda r, c: c["ref_s"]),
             "update": mean(lambda r, c: r["time/update_s"]), "step": mean(lambda r, c: r["time/step_s"])}
    last = result["steps"][-1]
    n = max(last["trained_tokens"], 1)
    passes = {p: (last["fwd"][p] / n, last["bwd"][p] / n) for p in PHASES}
    gen_calls = mean(lambda r, c: c["calls"]["generate"])
    return {"times": times, "passes": passes, "tokens_per_s": mean(lambda r, c: r["time/tokens_per_s"]),
            "ms_per_generate_forward": 1000 * times["generate"] / max(gen_calls, 1),
            "distilled_turns": mean(lambda r, c: r["sd/distilled_turns"]),
            "trained_tokens": last["trained_tokens"], "turns": mean(lambda r, c: r["rollout/turns"]),
            "peak_mem_gib": result["peak_mem_gib"], "grad_checkpointing": result["grad_checkpointing"],
            "mem_vs_plan": result["mem_vs_plan"]}


def report(args, device: torch.device, results: dict, workers: int) -> dict:
    summary = {a: summarise(r) for a, r in results.items()}
    params = next(iter(results.values()))["params"]
    print(f"\n{args.arch} ({params / 1e6:.1f}M parameters) on {device} | {args.tasks} tasks x {args.group} "
          f"rollouts, {workers} env workers, "
          f"<= {args.turns} turns, {args.new_tokens} new tokens | {args.steps} steps each "
          f"(means over {max(args.steps - 1, 1)})")
    print(f"{'algo':<9}" + "".join(f"{k + ' s':>12}" for k in next(iter(summary.values()))["times"])
          + f"{'tok/s':>10}{'ms/gen fwd':>12}{'peak GiB':>10}{'distilled':>10}")
    for a, s in summary.items():
        print(f"{a:<9}" + "".join(f"{v:12.2f}" for v in s["times"].values()) + f"{s['tokens_per_s']:10.0f}"
              f"{s['ms_per_generate_forward']:12.1f}{s['peak_mem_gib']:10.2f}{s['distilled_turns']:10.1f}")
    print("\npasses per trained token over one step (forward / backward), trained tokens = prompt + response "
          "of every turn-sample")
    for a, s in summary.items():
        cells = "  ".join(f"{p} {f:.2f}/{b:.2f}" for p, (f, b) in s["passes"].items())
        total_f, total_b = (sum(v[i] for v in s["passes"].values()) for i in (0, 1))
        extra = f" (+{total_b:.2f} recompute: gradient checkpointing)" if s["grad_checkpointing"] else ""
        print(f"{a:<9} {cells}  | total {total_f:.2f} forward + {total_b:.2f} backward{extra} "
              f"[{s['trained_tokens']} tokens]")
    print("\npeak memory per phase, GiB: measured (mem/*, the steps' largest) beside the plan "
          "(scale/memory_plan.py, steady state)")
    for a, s in summary.items():
        print(f"{a:<9} " + "  ".join(f"{ph} {got:.2f} / plan {want:.2f}"
                                     for ph, (got, want) in s["mem_vs_plan"].items()))
    if "grpo" in summary and "smrc-sd" in summary:
        ratio = summary["smrc-sd"]["times"]["step"] / summary["grpo"]["times"]["step"]
        print(f"\nstep time ratio smrc-sd/grpo = {ratio:.3f}")
    return summary


def decode_profile(args, tok, device: torch.device) -> dict:
    """ms per decode step at batch `profile_batch` with prompts of `profile_prompt` random tokens: (time of N
    new tokens − time of 1) / (N − 1), each the least of `profile_repeats` timings after a warm-up at both
    lengths (a static cache compiles per shape).
    Variants: HFEngine (log-probs on the device) in float32 and under bf16 autocast (CUDA only: on CPU both
    are float32), HFEngine with the static cache (float32: models.generation_autocast), and a plain
    `model.generate` that keeps no logits."""
    model = build_model(args.arch, tok, device, args.seed).eval()
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(3, len(tok), (args.profile_prompt,), generator=g).tolist()
               for _ in range(args.profile_batch)]
    cuda = device.type == "cuda"

    def engine(bf16: bool, static: bool):
        def run(n):
            sampling = SamplingConfig(max_new_tokens=n, static_cache=static)
            HFEngine(model, tok, sampling, batch_size=len(prompts), bf16=bf16).generate(prompts)
        return run

    def plain(n):
        ids = torch.tensor(prompts, device=device)
        with (torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext(),
              torch.no_grad()):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                           max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id,
                           eos_token_id=tok.eos_token_id)

    def seconds(run, n):
        if cuda:
            torch.cuda.synchronize(device)
        t = time.perf_counter()
        run(n)
        if cuda:
            torch.cuda.synchronize(device)
        return time.perf_counter() - t
    variants = {"engine float32": engine(False, False), "engine bf16": engine(True, False),
                "engine static cache (float32)": engine(True, True), "plain generate (bf16 on CUDA)": plain}
    out, n = {}, args.profile_new
    for name, run in variants.items():
        run(n), run(1)  # warm-up at both shapes
        best = [min(seconds(run, k) for _ in range(args.profile_repeats)) for k in (n, 1)]  # least disturbed
        out[name] = 1000 * (best[0] - best[1]) / (n - 1)
    print(f"\ndecode profile: batch {len(prompts)}, {args.profile_prompt}-token prompts, "
          f"{n} new tokens, {device}")
    for name, ms in out.items():
        print(f"  {name:<32} {ms:8.1f} ms per decode step")
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=sorted(ARCHS), default="qwen3-1.7b")
    ap.add_argument("--algos", nargs="+", default=["grpo", "smrc-sd"], choices=list(smrc.ALGOS))
    ap.add_argument("--steps", type=int, default=2,
                    help="steps per algorithm (the first is not timed when > 1)")
    ap.add_argument("--tasks", type=int, default=4, help="task groups per step (= the number of train games)")
    ap.add_argument("--group", type=int, default=4, help="rollouts per task")
    ap.add_argument("--turns", type=int, default=5, help="episode step limit")
    ap.add_argument("--new-tokens", type=int, default=192, help="max new tokens per turn")
    ap.add_argument("--room", choices=["small", "medium", "real"], default="real", help="generated room size")
    ap.add_argument("--max-prompt-tokens", type=int, default=4096)
    ap.add_argument("--gen-batch", type=int, default=64)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--grad-checkpointing", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--static-cache", action="store_true", help="static KV cache (+ compiled decode on CUDA)")
    ap.add_argument("--workers", type=int, default=-1, help="env worker processes (-1: from the cores)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--decode-profile", action="store_true",
                    help="also time decode steps (the issue's setting)")
    ap.add_argument("--profile-batch", type=int, default=16)
    ap.add_argument("--profile-prompt", type=int, default=1000)
    ap.add_argument("--profile-new", type=int, default=64)
    ap.add_argument("--profile-repeats", type=int, default=3,
                    help="timings per variant and length (the least kept)")
    ap.add_argument("--json", default="", help="also write the summary here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    world = init_distributed(args.device)
    tok = AutoTokenizer.from_pretrained(tiny.model_dir())
    with tempfile.TemporaryDirectory() as tmp:
        # first: the workers fork before any model exists
        pool = EnvPool(run_config(args, "grpo", Path(tmp)).env_cfg, episodes=args.tasks * args.group)
        try:
            profile = decode_profile(args, tok, world.device) if args.decode_profile else None
            results = ({a: run_algo(args, a, tok, world, pool, Path(tmp)) for a in args.algos} if args.steps
                       else {})
        finally:
            pool.close()
    summary = report(args, world.device, results, pool.num_workers) if results else {}
    if profile is not None:
        summary["decode_ms_per_step"] = profile
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
