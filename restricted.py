"""Restricted decoding (`--rollout.action-space admissible`, a CPU-scale option): the response is one of a
list of allowed responses (the turn's admissible commands). The allowed tokens at a response position are a
function of that list and of the response prefix, so sampling (models.HFEngine), the teacher and the update
(models.token_logprobs) apply the same mask, and the PPO ratio is exactly 1 on-policy.
"""

import torch


def action_trie(tokenizer, responses: list[str]) -> dict:
    """Prefix tree {token id: subtree} over the token ids of every allowed response, each followed by EOS."""
    root: dict = {}
    for text in responses:
        node = root
        for t in tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]:
            node = node.setdefault(t, {})
    return root


def allowed_ids(trie: dict, prefix: list[int]) -> list[int]:
    """Token ids the trie allows after `prefix` ([] once the prefix has left the trie or ended)."""
    node = trie
    for t in prefix:
        node = node.get(t)
        if node is None:
            return []
    return list(node)


def allowed_per_position(trie: dict, response_ids: list[int]) -> list[list[int]]:
    """The allowed ids at every position of a response sampled under `trie` (what the update and teacher
    reuse)."""
    return [allowed_ids(trie, response_ids[:t]) for t in range(len(response_ids))]


def chunk_mask(allowed: list[list[list[int]] | None], positions: list[list[int]], V: int,
                device) -> torch.Tensor:
    """(n, V) bool for the (row, position) pairs of one chunk, True where a token is allowed (free rows:
    all)."""
    keep = torch.ones(len(positions), V, dtype=torch.bool)
    for k, (b, t) in enumerate(positions):
        if allowed[b] is not None and t < len(allowed[b]):
            keep[k] = False
            keep[k, allowed[b][t]] = True
    return keep.to(device)


def forced_path(node: dict) -> tuple[list[int], dict]:
    """The tokens a trie node forces (its chain of single children) and the node where the chain ends: {} when
    the chain runs through EOS, i.e. the rest of the response is determined."""
    path = []
    while len(node) == 1:
        (token, node), = node.items()
        path.append(token)
    return path, node


def walk(node: dict, tokens: list[int]) -> dict:
    for t in tokens:
        node = node.get(t, {})
    return node


class DeterminedStop:
    """A transformers stopping criterion for restricted decoding: a row stops as soon as its trie allows only
    one way to finish (`forced_path` ends in {}); `stops[b]` is how many tokens row b sampled. The forced rest
    costs no decode step: its restricted log-probs are exactly 0 (one allowed token), as the update recomputes
    them."""

    def __init__(self, tries: list[dict], start: int):
        self.tries, self.start, self.stops = tries, start, [None] * len(tries)

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        done = torch.zeros(len(self.tries), dtype=torch.bool)
        for b, trie in enumerate(self.tries):
            if self.stops[b] is None and not forced_path(walk(trie, input_ids[b, self.start:].tolist()))[1]:
                self.stops[b] = input_ids.shape[1] - self.start
            done[b] = self.stops[b] is not None
        return done.to(input_ids.device)


class TrieLogitsProcessor:
    """A transformers logits processor: -inf outside each row's trie (`start` = the first response column)."""

    def __init__(self, tries: list[dict], start: int):
        self.tries, self.start = tries, start

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for b, trie in enumerate(self.tries):
            ids = allowed_ids(trie, input_ids[b, self.start:].tolist())
            keep[b, ids if ids else slice(None)] = True  # a row that has ended is padding: left free
        return scores.masked_fill(~keep, float("-inf"))
