"""vLLM sized from the run and the weight-sync check's line (scale/vllm_engine.py; issue 63 items 3-4),
without an engine: the sizes a run gives vLLM and when the line appears. The engine itself runs with them in
tests/test_vllm.py (its fixture, and a corrupted sync).

Run: pytest tests/test_vllm_sizing.py -q
"""
import pytest

import smrc
from scale import vllm_engine


def test_the_engine_is_sized_from_the_run():
    """max_model_len admits the longest prompt it is sent (the teacher's budget when vLLM scores the teacher)
    with its response and the one token teacher scoring asks for; max_num_seqs is a rank's rollout batch; the
    batched tokens are capped at the named cap."""
    cfg = smrc.parse_config(["--rollout.engine", "vllm", "--teacher.backend", "vllm",
                             "--rollout.tasks-per-step", "16", "--rollout.group-size", "8",
                             "--rollout.max-prompt-tokens", "2048"])
    limits = smrc.vllm_limits(cfg, 8)
    longest = cfg.teacher.max_prompt_tokens + cfg.rollout.sampling.max_new_tokens + 1
    assert limits == {"max_model_len": longest,
                      "max_num_seqs": 16, "max_num_batched_tokens": vllm_engine.MAX_BATCHED_TOKENS}
    cfg.teacher.backend = "hf"  # only the rollout's prompts reach vLLM
    assert smrc.vllm_limits(cfg, 3)["max_model_len"] == 2048 + cfg.rollout.sampling.max_new_tokens + 1
    assert smrc.vllm_limits(cfg, 3)["max_num_seqs"] == 43  # 128 episodes over 3 ranks, rounded up


@pytest.mark.parametrize("gap, level, says", [
    (1e-6, 2, None), (vllm_engine.SYNC_GAP_THRESHOLD, 2, None),
    (0.5, 2, "--rollout.vllm-sleep-level 1"), (0.5, 1, "--rollout.engine hf")])
def test_the_sync_line_appears_above_the_threshold_only(gap, level, says):
    line = vllm_engine.sync_warning(gap, 7, level)
    if says is None:
        assert line is None
    else:
        assert line.startswith("[weight sync] warning: step 7: actor/rollout_logprob_gap 0.5 nat > 0.2")
        assert says in line
        assert ("vLLM #29341" in line) == (level == 2) and ("sleep-level 1" in line) == (level == 2)
