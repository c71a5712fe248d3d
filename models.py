"""Models behind one small interface: loading, chat ids, token log-probs, and the transformers generation
engine.

- `load_model(path)` loads any causal LM through `AutoModelForCausalLM.from_pretrained` (a hub id or a
  directory; the embedded names `tiny` / `tiny-agent` are resolved to their directories by `embedded/` at the
  caller).
- `chat_ids` is the token ids of one user message with the generation prompt (every turn is one user message).
- `collate` / `token_logprobs` / `micro_batches`: the [left-padded prompt | right-padded response] batch, the
  log-prob of every response token, and length-aware packing. `token_logprobs` runs the lm_head and the
  float32 log-softmax over chunks of response tokens (bounded memory).
- `score` / `score_rows`: the trainer's one scoring path (collate, allowed ids, `precision`, token_logprobs;
  the loop over micro-batches): the update and π_old (grpo.py) and the hf teacher (teacher.py) all score
  through it, so a difference of their log-probs carries no difference of engine, precision or code.
- Restricted decoding (tries of allowed responses) lives in restricted.py.
- `HFEngine.generate` samples responses for a batch of chat-templated prompts with transformers' `generate`
  and returns, per response, the token ids and the sampling log-probs log softmax(logits / T) of each sampled
  token (the same quantity `token_logprobs` computes in training, so the PPO ratio starts at 1), computed on
  the device while sampling (no (B, R, V) logits are kept). On CUDA it generates under the update's bf16
  autocast. A vLLM engine with the same interface lives in `scale/vllm_engine.py`.

Deviations / simplifications:
1. With top-p / top-k < 1 the reported log-probs are those of the temperature-scaled full distribution (as
   verl recomputes them), not of the truncated sampling distribution.
"""

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from restricted import (DeterminedStop, TrieLogitsProcessor, action_trie, allowed_ids,  # noqa: F401
                        allowed_per_position, chunk_mask, forced_path, walk)


def resolve_device(name: str = "auto") -> torch.device:
    """auto = CUDA when available, else CPU; anything else is a torch device name (cpu, cuda, cuda:N)."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def load_model(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) through the ordinary `from_pretrained` path. Errors name the model and what to
    do."""
    hf_logging.disable_progress_bar()  # one bar per weight file is noise in a training log
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise SystemExit(_load_error(path, e)) from e
    return model.to(device), tokenizer


def load_tokenizer(path: str):
    """The tokenizer of a model (pad = eos where it has none), with load_model's error message."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise SystemExit(_load_error(path, e)) from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_error(path: str, e: Exception) -> str:
    return (f"Could not load model '{path}': {e}\nGive a local directory with a Hugging Face model, a hub id "
            f"on a machine that can download it, or `--model tiny` for the embedded CPU model.")


def chat_ids(tokenizer, user_text: str) -> list[int]:
    """Token ids of one user message with the generation prompt appended (every turn is one user message)."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": user_text}], add_generation_prompt=True,
                                        tokenize=True, enable_thinking=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


@dataclass
class Batch:
    """[left-padded prompt | right-padded response]: every response starts at column P, so the logits of the
    last R+1 positions predict exactly the R response tokens (the prefix/response boundary is the same for any
    prompt length)."""
    input_ids: torch.Tensor       # (B, P+R)
    attention_mask: torch.Tensor  # (B, P+R)
    position_ids: torch.Tensor    # (B, P+R)
    response_ids: torch.Tensor    # (B, R)
    response_mask: torch.Tensor   # (B, R) 1 on sampled tokens
    token_rows: torch.Tensor      # (N,) row of each sampled token, row-major (as response_mask.nonzero())
    token_cols: torch.Tensor      # (N,) its response position
    positions: list               # the same N (row, position) pairs on the host: no device read needed

    def to(self, device):
        return Batch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids,
                                              self.response_ids, self.response_mask, self.token_rows,
                                              self.token_cols)), self.positions)


def collate(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> Batch:
    P, R = max(len(p) for p in prompts), max(len(r) for r in responses)
    input_ids = torch.full((len(prompts), P + R), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros((len(prompts), R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        input_ids[i, P - len(p):P + len(r)] = torch.tensor(p + r)
        attention_mask[i, P - len(p):P + len(r)] = 1
        response_mask[i, :len(r)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    positions = [[i, t] for i, r in enumerate(responses) for t in range(len(r))]
    rows, cols = (torch.tensor(x, dtype=torch.long) for x in zip(*positions)) if positions else (
        torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    return Batch(input_ids, attention_mask, position_ids, input_ids[:, P:], response_mask, rows, cols,
                 positions)


LOGPROB_CHUNK_TOKENS = 512
"""response tokens per lm_head + log-softmax chunk: only one chunk's float32 (tokens, V) tensors exist at a
time (at V = 151,936 a few of 0.3 GiB each, whatever the micro-batch holds)"""


def token_logprobs(model, batch: Batch, temperature: float = 1.0, with_entropy: bool = False,
                   allowed: list[list[list[int]] | None] | None = None,
                   chunk_tokens: int = LOGPROB_CHUNK_TOKENS):
    """log π(y_t | prefix) of every response token (B, R), and optionally the entropy of each position (B, R);
    0 at padding. `allowed` (restricted decoding): per row, the allowed token ids at each response position,
    or None for a free row; the distribution is then renormalised over the allowed tokens, exactly as it was
    sampled.

    Bounded memory: the model body gives the final hidden states of the response columns, then the lm_head and
    the float32 log-softmax run on `chunk_tokens` response tokens at a time; with autograd on, each chunk is
    recomputed in backward (activation checkpointing), so neither pass holds more than one chunk's (tokens,
    V)."""
    R = batch.response_ids.shape[1]
    rows, cols, positions = batch.token_rows, batch.token_cols, batch.positions  # the N real response tokens
    source, head = _response_states(model, batch, R)                          # (B, R, H) or (B, R, V) logits
    source, targets = source[rows, cols], batch.response_ids[rows, cols]      # (N, ·), (N,): no host sync
    V = source.shape[-1] if head is None else head.weight.shape[0]
    logps, entropies = [], []
    for i in range(0, len(positions), chunk_tokens):
        chunk = slice(i, i + chunk_tokens)
        keep = chunk_mask(allowed, positions[chunk], V, source.device) if allowed is not None else None
        args = (head, source[chunk], targets[chunk], keep, temperature, with_entropy)
        if torch.is_grad_enabled() and source.requires_grad:  # recompute the chunk in backward
            lp, ent = torch.utils.checkpoint.checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(*args)
        logps.append(lp)
        entropies.append(ent)
    zeros = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=rows.device)   # (B, R)
    logp = zeros.index_put((rows, cols), torch.cat(logps)) if logps else zeros
    entropy = None
    if with_entropy:
        entropy = zeros.index_put((rows, cols), torch.cat(entropies)) if entropies else zeros
    return logp, entropy


def _response_states(model, batch: Batch, R: int):
    """(B, R, H) final hidden states at the columns that predict the R response tokens (column P-1+t predicts
    y_t) and the lm_head that turns them into logits, from the model's own forward (through a DDP wrapper): a
    hook keeps the lm_head's input and lets the head itself run on one column only. A model without a separate
    head (or under FSDP2, whose head weight is sharded outside the forward) gives its (B, R, V) logits and
    head None."""
    head = getattr(getattr(model, "module", model), "get_output_embeddings", lambda: None)()
    if head is None or hasattr(model, "unshard"):
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, logits_to_keep=R + 1, use_cache=False)
        return out.logits[:, :-1], None
    kept = []

    def keep_input(module, args):
        kept.append(args[0])                   # (B, R+1, H)
        return (args[0][:, -1:],) + args[1:]  # the head runs on the last column only; the chunks do the rest

    handle = head.register_forward_pre_hook(keep_input)
    try:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids,
              logits_to_keep=R + 1, use_cache=False)
    finally:
        handle.remove()
    return kept[0][:, :-1], head


def _chunk_logprobs(head, source, targets, keep, temperature: float, with_entropy: bool):
    """Log-probs (n,) of `targets` and entropies (n,) (or None) of n positions from their hidden states (or
    logits)."""
    logits = (head(source) if head is not None else source).float()                    # (n, V)
    if temperature != 1.0:  # (no copy at T = 1: each (n, V) temporary counts)
        logits = logits / temperature
    if keep is not None:
        logits = logits.masked_fill(~keep, float("-inf"))                              # (n, V) restricted
    logp_all = torch.log_softmax(logits, dim=-1)                                       # (n, V)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)                      # (n,)
    if not with_entropy:
        return logp, None
    finite = logp_all if keep is None else logp_all.masked_fill(~keep, 0.0)            # 0·log 0 = 0 if masked
    return logp, -(logp_all.exp() * finite).sum(-1)


def precision(device: torch.device, bf16: bool):
    """The context the trainer's forwards run in (the update, π_old, the hf teacher): bfloat16 autocast on
    CUDA with `bf16` (GRPOConfig.bf16), float32 elsewhere."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" else nullcontext()


def score(model, prompts: list[list[int]], responses: list[list[int]], pad_id: int, temperature: float = 1.0,
          allowed: list | None = None, bf16: bool = True, with_entropy: bool = False):
    """One scoring micro-batch, the trainer's one numeric path: collate, the rows' allowed ids (None when
    every row is free), `precision`, `token_logprobs`. Returns (batch, logp (B, R), entropy (B, R) or None),
    on the model's device."""
    device = next(model.parameters()).device
    batch = collate(prompts, responses, pad_id).to(device)
    allowed = allowed if allowed is not None and any(a is not None for a in allowed) else None
    with precision(device, bf16):
        logp, entropy = token_logprobs(model, batch, temperature, with_entropy=with_entropy, allowed=allowed)
    return batch, logp, entropy


def score_rows(model, prompts: list[list[int]], responses: list[list[int]], chunks, pad_id: int,
               temperature: float = 1.0, allowed: list | None = None, bf16: bool = True) -> list[list[float]]:
    """The scoring loop: each chunk of indices (`micro_batches`) through `score`, each row sliced to its
    response's length; log-probs per response, in input order."""
    out: list[list[float]] = [[] for _ in prompts]
    for idx in chunks:
        rows = [allowed[i] for i in idx] if allowed is not None else None
        _, logp, _ = score(model, [prompts[i] for i in idx], [responses[i] for i in idx], pad_id, temperature,
                           rows, bf16)
        for row, i in enumerate(idx):
            out[i] = logp[row, :len(responses[i])].float().cpu().tolist()
    return out


def micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Length-aware packing: sort by length, then fill each micro-batch while count × max_len ≤ budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    chunks, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * lengths[i] > token_budget:
            chunks.append(cur)
            cur = []
        cur.append(i)
    return chunks + [cur] if cur else chunks


class LogprobRecorder:
    """A transformers logits processor placed after every processor of ours (the trie mask): it keeps log
    softmax( scores / T) of the current step on the device, (B, V), and at the next step gathers it at the
    token that was sampled (the last column of `input_ids`); `logprobs` gathers the last step. Only (B,) per
    step is kept. transformers applies its temperature / top-k / top-p warpers after our processors, so these
    are the log-probs of the temperature-scaled (masked) distribution, what `token_logprobs` computes in
    training."""

    def __init__(self, temperature: float):
        self.temperature, self.step_logp, self.taken = temperature, None, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1])
        self.step_logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)  # (B, V)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        if self.step_logp is not None:
            self.taken.append(self.step_logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))  # (B,)
            self.step_logp = None

    def logprobs(self, sequences: torch.Tensor) -> torch.Tensor:
        """(B, R) log-probs of the R generated tokens, the last columns of `sequences`."""
        self._take(sequences[:, -1])
        return torch.stack(self.taken, dim=1)


# ------------------------------------------------------------------------------------------------------------
# Generation


@dataclass
class Generation:
    response_ids: list[int]
    logprobs: list[float]  # of each response token: log softmax(logits / T) (over the allowed tokens)
    text: str
    truncated: bool        # stopped by max_new_tokens rather than by EOS
    allowed: list[list[int]] | None = None  # restricted decoding: the allowed ids at each response position


@dataclass
class SamplingConfig:
    max_new_tokens: int = 512
    """maximum response tokens per turn; a response cut here is counted (rollout/truncated_responses)"""
    temperature: float = 1.0
    """sampling temperature (training log-probs use the same temperature); 0 = greedy (evaluation only; its
    log-probs are reported at T=1)"""
    top_p: float = 1.0
    """nucleus sampling threshold (1.0 = off)"""
    top_k: int = 0
    """top-k sampling (0 = off)"""
    static_cache: bool = False
    """hf engine: a static KV cache, with which transformers compiles the decode step (torch.compile) on CUDA
    to cut launch overhead; the first call of each batch shape compiles. It samples in float32 (see
    `generation_autocast`). Opt-in: its speed is not measured on a GPU yet"""


def generation_autocast(device: torch.device, bf16: bool, static_cache: bool):
    """The context sampling runs in: bfloat16 autocast on CUDA with `bf16`, except with a static KV cache.
    transformers' static cache stores a layer's keys and values in one dtype (the keys'), and under autocast
    Qwen3's normed keys come out float32 beside bfloat16 values, so bf16 + static cache fails on its first
    write; with a static cache, sampling stays float32."""
    return precision(device, bf16 and not static_cache)


class HFEngine:
    """Batched sampling with transformers `generate` on the policy's own weights (nothing to sync). On CUDA
    with `bf16`, generation runs under the same bfloat16 autocast as the update (the float32 weights are cast
    once per call); the sampling log-probs are computed on the device while sampling (`LogprobRecorder`)."""

    def __init__(self, model, tokenizer, cfg: SamplingConfig, batch_size: int = 64, bf16: bool = True):
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.batch_size, self.bf16 = batch_size, bf16

    def sync_weights(self, model) -> None:
        """Nothing to copy: generation runs on the trainer's own module (interface parity with the vLLM
        engine)."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], tries: list[dict] | None = None) -> list[Generation]:
        """One response per prompt; with `tries` (one per prompt, `action_trie`), decoding is restricted to
        them."""
        out = []
        for i in range(0, len(prompts), self.batch_size):
            out += self._generate_batch(prompts[i:i + self.batch_size],
                                        tries[i:i + self.batch_size] if tries is not None else None)
        return out

    def _generate_batch(self, prompts: list[list[int]], tries: list[dict] | None) -> list[Generation]:
        """Free rows: sampled until EOS or max_new_tokens. Restricted rows: only the tokens where the trie
        leaves a choice are decoded; the tokens it forces (`forced_path`: the prefix joins the prompt, the
        rest once a row is determined, `DeterminedStop`) are appended with their restricted log-prob, exactly
        0."""
        tok, limit = self.tokenizer, self.cfg.max_new_tokens
        if tries is None:
            sampled = self._decode(prompts, None)
            ends = [ids.index(tok.eos_token_id) + 1 if tok.eos_token_id in ids else len(ids)
                    for ids, _ in sampled]
            responses = [(ids[:n], lp[:n]) for (ids, lp), n in zip(sampled, ends)]
        else:
            heads = [forced_path(t) for t in tries]                       # (forced prefix, node of a choice)
            open_rows = [i for i, (_, node) in enumerate(heads) if node]  # rows with something left to sample
            decoded = self._decode([prompts[i] + heads[i][0] for i in open_rows],
                                   [heads[i][1] for i in open_rows]) if open_rows else []
            sampled = dict(zip(open_rows, decoded))
            responses = []
            for i, (prefix, node) in enumerate(heads):
                ids, lp = sampled.get(i, ([], []))
                rest, left = forced_path(walk(node, ids))
                rest = [] if left else rest  # determined: the forced rest; else it ran out of max_new_tokens
                response = (prefix + ids + rest)[:limit]
                responses.append((response, ([0.0] * len(prefix) + lp + [0.0] * len(rest))[:limit]))
        return [Generation(response_ids=ids, logprobs=lp, text=tok.decode(ids, skip_special_tokens=True),
                           truncated=tok.eos_token_id not in ids,
                           allowed=allowed_per_position(tries[i], ids) if tries is not None else None)
                for i, (ids, lp) in enumerate(responses)]

    def _decode(self, prompts: list[list[int]],
                tries: list[dict] | None) -> list[tuple[list[int], list[float]]]:
        """(sampled ids, their log-probs) per prompt, left-padded into one `generate` call; with `tries`, each
        row's tokens up to where its trie determines the rest (DeterminedStop), or all max_new_tokens of
        them."""
        tok, cfg = self.tokenizer, self.cfg
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, p in enumerate(prompts):  # left padding, so every response starts at column `width`
            input_ids[i, width - len(p):] = torch.tensor(p)
            attention_mask[i, width - len(p):] = 1
        greedy = cfg.temperature == 0
        sampling = {} if greedy else dict(temperature=cfg.temperature, top_p=cfg.top_p,
                                          top_k=cfg.top_k or None)
        recorder = LogprobRecorder(cfg.temperature or 1.0)  # greedy: log-probs at T=1
        processors = ([TrieLogitsProcessor(tries, width)] if tries is not None else []) + [recorder]
        stop = DeterminedStop(tries, width) if tries is not None else None
        autocast = generation_autocast(device, self.bf16, cfg.static_cache)
        was_training = self.model.training
        self.model.eval()
        with autocast:
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                do_sample=not greedy, max_new_tokens=cfg.max_new_tokens, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                logits_processor=processors, stopping_criteria=[stop] if stop else None,
                cache_implementation="static" if cfg.static_cache else None, return_dict_in_generate=True,
                **sampling)
        self.model.train(was_training)
        token_logp = recorder.logprobs(out.sequences).cpu().tolist()                 # (B, R), from the device
        seqs = out.sequences[:, width:].cpu().tolist()                               # (B, R)
        ends = [len(s) if stop is None or stop.stops[b] is None else stop.stops[b]
                for b, s in enumerate(seqs)]
        return [(s[:n], lp[:n]) for s, lp, n in zip(seqs, token_logp, ends)]
