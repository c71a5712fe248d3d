"""Small builders of records.Turn for the unit tests (the record the trainer passes from stage to stage)."""
import torch

import envs
from records import Step, Turn


class GradRecorder(torch.optim.SGD):
    """SGD at lr 0 (no weight moves) that keeps on each parameter the gradient of its last step
    (`p.last_grad`): grpo.update frees the gradients after every step."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.last_grad = None if p.grad is None else p.grad.detach().clone()
        return super().step(closure)


def turn(task_id: str, traj_id: str, index: int, step: Step, task_type: str = "t", **fields) -> Turn:
    """A turn of task `task_id` at position `index` of trajectory `traj_id`, in the state and with the action
    of `step`; `fields`: any other Turn field."""
    return Turn(envs.Task(task_id, task_type, "alfworld", ""), traj_id, index, step, **fields)


def sample(prompt_ids: list[int], response_ids: list[int], advantage: float, sample_logprobs: list[float],
           teacher_logprobs: list[float] | None = None, allowed: list | None = None) -> Turn:
    """A turn as the update sees it: its prompt, sampled response and learning signals."""
    return turn("t", "traj", 0, Step((), "", "", ""), prompt_ids=prompt_ids, response_ids=response_ids,
                advantage=advantage, sample_logprobs=sample_logprobs, teacher_logprobs=teacher_logprobs,
                allowed=allowed)


def teacher_requests(tokenizer,
                     requests: list[tuple[str, str, list[int]]]) -> tuple[list[list[int]], list[Turn]]:
    """(teacher prompt ids, turns) of (student user message, privileged text, response ids) triples, as
    teacher.teacher_signal hands them to teacher.score_turns (the privileged text goes before the message)."""
    from router import TeacherContext
    from teacher import teacher_prompt_ids
    prompts = [teacher_prompt_ids(tokenizer, TeacherContext((context,), ()), user_text)
               for user_text, context, _ in requests]
    turns = [turn("t", "traj", 0, Step((), "", "", ""), user_text=user_text, response_ids=response)
             for user_text, _, response in requests]
    return prompts, turns


def first_mini_batch_ratios(monkeypatch, grpo, run) -> list:
    """The PPO ratios π_θ/π_old on the response tokens of each micro-batch of the first mini-batch that
    `run()` (a grpo.update call) computes: grpo.loss_terms is wrapped to record them (the update itself is
    unchanged). Ratios of later mini-batches are left out: the first optimizer step ends the recording."""
    seen, done = [], []
    real_terms, real_step = grpo.loss_terms, grpo._guarded_step

    def terms(x, cfg, sd_scale=1.0):
        if not done:
            seen.append(torch.exp(x.logp - x.old_logp).detach()[x.old_logp != 0])  # real tokens (not padding)
        return real_terms(x, cfg, sd_scale)

    def step(*args, **kw):
        done.append(True)
        return real_step(*args, **kw)
    monkeypatch.setattr(grpo, "loss_terms", terms)
    monkeypatch.setattr(grpo, "_guarded_step", step)
    run()
    return seen
