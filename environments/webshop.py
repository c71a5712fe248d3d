"""WebShop behind the shared env API: the config, the adapter over either shop backend, the tasks, the expert.

Two backends, one adapter. `WebShopEnv` drives any object with the surface of WebShop's
`web_agent_site.envs.web_agent_text_env.WebAgentTextEnv` (text mode, princeton-nlp/WebShop):
`reset(session=idx) -> (obs, None)`, `step(action) -> (obs, reward, done, None)`, `get_available_actions()`,
`state['url']`, `session`, `server.user_sessions[session]` and `server.goals`. It reads the page type from the
URL and the keywords, results page, item and selected options from the session, exactly as one would with the
official env.
- backend "embedded": `webshop_engine.EmbeddedTextEnv`, a pure-Python reimplementation of WebAgentTextEnv +
  SimServer (text mode) over the seeded catalogue of webshop_catalog.py, with the reward of webshop_reward.py.
- backend "official": the real WebAgentTextEnv imported from $WEBSHOP_ROOT (a princeton-nlp/WebShop checkout
  with its data, search index and spaCy model).

verl-agent conventions (agent_system/environments/env_package/webshop and env_manager.py in
langfengQ/verl-agent): the agent sees the page text after the instruction, each part quoted, joined by
' [SEP] ' (the raw text is in info['raw_observation']); admissible = ['search[<your query>]' if there is a
search bar] + ['click[x]' for each clickable]; reward 10.0 iff done and the raw reward == 1.0; score = raw
reward; won = raw reward == 1.0; 15 steps; goals 0..499 are "eval", 500.. "train". The prompt is
`envs.build_prompt("webshop", ...)`.

The signature: `envs.webshop_signature`, its fields read from the URL and the session (`read_state`).

Deviations (numbered; reward deviations are listed in webshop_reward.py, catalogue ones in
webshop_catalog.py):
1. The done page's hidden block is reconstructed (webshop_engine.py).
2. After done, further steps are no-ops that return the final page (verl-agent's env would auto-reset).
3. The expert (`oracle_actions(task, cfg)`, `WebShopConfig.plan`) needs the embedded catalogue of the run's
   config; it runs in-process, not in a planner subprocess.
"""
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

import envs
from envs import EpisodeConfig, PlanResult, Signature, StepResult, Task
from environments.webshop_catalog import Shop, build_shop
from environments.webshop_engine import SUB_PAGES, EmbeddedTextEnv, page_name


@dataclass
class WebShopConfig(EpisodeConfig):
    """WebShop environment (embedded shop or the official checkout)."""
    # Shop
    backend: Literal["embedded", "official"] = "embedded"
    """'embedded': the built-in seeded shop (pure Python); 'official': WebAgentTextEnv from
    --webshop.webshop-root"""
    num_products: int = 1000
    """products in the embedded catalogue (WebShop's small set has 1,000)"""
    catalog_seed: int = 0
    """seed of the embedded catalogue (products, options, prices)"""
    goal_seed: int = 233
    """seed of the goals' price bounds and of the goal shuffle (upstream shuffles with random.seed(233))"""
    num_eval_goals: int = 500
    """goals 0..num_eval_goals-1 form the 'eval' split, the rest 'train' (verl-agent: 500)"""
    webshop_root: str = field(default_factory=lambda: os.environ.get("WEBSHOP_ROOT", ""))
    """official backend: path of a princeton-nlp/WebShop checkout with data (default: $WEBSHOP_ROOT)"""
    human_goals: bool = False
    """official backend: use the human-written goals instead of the synthetic ones (verl-agent: False)"""
    max_steps: int = 15
    """steps per episode (verl-agent: 15); the episode ends, unbought, with info['truncated'] when reached"""

    def load_tasks(self, split: str) -> list[Task]:
        """'eval' = goals 0..num_eval_goals-1, 'train' = the rest (verl-agent's split),
        in goal-index order."""
        assert split in ('train', 'eval'), f"WebShop splits are 'train' and 'eval', not {split!r}"
        n = num_goals(self)
        idx = range(min(self.num_eval_goals, n)) if split == 'eval' else range(self.num_eval_goals, n)
        return [Task(f'webshop/{i:05d}', 'webshop', 'webshop', str(i)) for i in idx]

    def make_env(self) -> "WebShopEnv":
        return WebShopEnv(self)

    def plan(self, task: Task, actions: list[str], timeout_s: float) -> PlanResult:
        """The oracle's actions from the state after replaying `actions`, in this config's shop
        (deviation 3)."""
        return plan(task, actions, timeout_s, self)


# ------------------------------------------------------------------------------------------- official backend

def official_text_env(cfg: WebShopConfig):
    """The real WebAgentTextEnv from cfg.webshop_root, text mode, synthetic goals unless cfg.human_goals."""
    root = cfg.webshop_root
    hint = ("point WEBSHOP_ROOT (or --webshop.webshop-root) at a princeton-nlp/WebShop checkout with its "
            "data/, search_engine/indexes and spaCy model, or use the built-in shop with "
            "--webshop.backend embedded")
    if not root:
        raise envs.DataError(f"--webshop.backend official needs a WebShop checkout: {hint}")
    if not os.path.isdir(os.path.join(root, 'web_agent_site')):
        raise envs.DataError(f"WEBSHOP_ROOT={root!r} has no web_agent_site/ package: {hint}")
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        from web_agent_site.envs.web_agent_text_env import WebAgentTextEnv
    except ImportError as e:
        raise envs.DataError(f"importing WebAgentTextEnv from WEBSHOP_ROOT={root!r} "
                             f"failed ({e}): {hint}") from e
    env = WebAgentTextEnv(observation_mode='text', num_products=None, human_goals=cfg.human_goals)
    if not hasattr(env, 'server') and hasattr(env, 'initialize'):  # verl-agent's vendored copy builds lazily
        env.initialize()
    return env


def make_text_env(cfg: WebShopConfig):
    if cfg.backend == 'official':
        return official_text_env(cfg)
    assert cfg.backend == 'embedded', f"unknown WebShop backend {cfg.backend!r}"
    return EmbeddedTextEnv(build_shop(cfg.num_products, cfg.catalog_seed, cfg.goal_seed))


# ---------------------------------------------------------------------------------------------- adapter

def read_state(text_env) -> dict:
    """Page type, keywords, results page, item and options of the current session (official surface only)."""
    url = text_env.state['url']
    sess = text_env.server.user_sessions[text_env.session]
    name = page_name(url)
    if name == 'item_sub_page':
        sub = next(s for s in reversed(url.split('/')) if s in SUB_PAGES)
        page = f'sub:{sub.lower()}'
    else:
        page = {'': 'search', 'search_results': 'results', 'item_page': 'item', 'done': 'done'}[name]
    return {'page': page, 'keywords': tuple(sess.get('keywords') or ()), 'results_page': sess.get('page'),
            'item': sess.get('asin'), 'options': tuple(sorted((sess.get('options') or {}).items()))}


def signature(task_id: str, state: dict) -> Signature:
    """The state's `envs.webshop_signature`."""
    return envs.webshop_signature(task_id, **state)


def format_observation(raw: str, goal: str) -> str:
    """verl-agent's format_obs: the parts after the instruction, each quoted; the raw text if it has none."""
    parts = raw.split(' [SEP] ')
    if goal not in parts:
        return raw
    return ' [SEP] '.join(f"'{p}'" for p in parts[parts.index(goal) + 1:])


def admissible_actions(available: dict) -> list[str]:
    """verl-agent's format_avail_actions."""
    return (['search[<your query>]'] if available['has_search_bar'] else []) + \
        [f'click[{c}]' for c in available['clickables']]


class WebShopEnv:
    """The shared env API over either backend: reset(task) -> StepResult, step(action) -> StepResult,
    close()."""

    def __init__(self, cfg: WebShopConfig, text_env=None):
        self.cfg = cfg
        self.text_env = text_env if text_env is not None else make_text_env(cfg)
        self.task: Task | None = None
        self.goal = ''
        self.steps = 0
        self.last: StepResult | None = None

    def reset(self, task: Task) -> StepResult:
        self.task, self.steps = task, 0
        raw, _ = self.text_env.reset(session=int(task.source))
        parts = raw.split(' [SEP] ')
        assert parts[1] == 'Instruction:', f"unexpected WebShop start page for {task.task_id}: {raw[:200]}"
        self.goal = parts[2]  # verl-agent's extract_task
        return self._result(raw, 0.0, False, {})

    def step(self, action: str) -> StepResult:
        assert self.last is not None, "call reset(task) first"
        if self.last.done:  # deviation 2
            return dataclasses.replace(self.last, reward=0.0, info={**self.last.info, 'after_done': True})
        raw, raw_reward, bought, _ = self.text_env.step(action)
        self.steps += 1
        extra = {}
        if bought:
            extra['verbose_info'] = dict(
                self.text_env.server.user_sessions[self.text_env.session]['verbose_info'])
        elif self.steps >= self.cfg.max_steps:
            extra['truncated'] = True
        return self._result(raw, float(raw_reward) if bought else 0.0, bought, extra)

    def _result(self, raw: str, score: float, bought: bool, extra: dict) -> StepResult:
        won = bought and score == 1.0
        done = bought or self.steps >= self.cfg.max_steps
        available = self.text_env.get_available_actions()
        state = read_state(self.text_env)
        info = {'raw_observation': raw, 'available_actions': available, 'url': self.text_env.state['url'],
                'step': self.steps, 'task_score': score, 'won': won, **extra}
        self.last = StepResult(observation=format_observation(raw, self.goal),
                               admissible=admissible_actions(available), reward=10.0 if won else 0.0,
                               done=done, won=won, score=score, goal=self.goal,
                               signature=signature(self.task.task_id, state), info=info)
        return self.last

    def close(self) -> None:
        close = getattr(self.text_env, 'close', None)
        if close is not None:
            close()


_OFFICIAL_GOAL_COUNTS: dict[tuple[str, bool], int] = {}


def num_goals(cfg: WebShopConfig) -> int:
    # building the official env loads the whole catalogue: count once per process
    if cfg.backend == 'official':
        key = (cfg.webshop_root, cfg.human_goals)
        if key not in _OFFICIAL_GOAL_COUNTS:
            _OFFICIAL_GOAL_COUNTS[key] = len(official_text_env(cfg).server.goals)
        return _OFFICIAL_GOAL_COUNTS[key]
    return len(build_shop(cfg.num_products, cfg.catalog_seed, cfg.goal_seed).goals)


# ---------------------------------------------------------------------------------------------- expert

def _shop(cfg: WebShopConfig) -> Shop:
    if cfg.backend != 'embedded':
        raise RuntimeError("the WebShop oracle needs the embedded catalogue (--webshop.backend embedded)")
    return build_shop(cfg.num_products, cfg.catalog_seed, cfg.goal_seed)


def purchase_path(shop: Shop, goal: dict) -> list[str]:
    """Search with the goal's words (then its product's query, then its title) until the target is in the
    top 50, page to it, open it, click the goal's options, buy."""
    product = shop.by_asin[goal['asin']]
    for query in (goal['instruction_text'], product['instruction_text'], product['query'], product['Title']):
        keywords = query.lower().split(' ')
        hits = [p['asin'] for p in shop.search(keywords)]
        if goal['asin'] in hits:
            pos = hits.index(goal['asin'])
            options = [f"click[{goal['goal_options'][n]}]" for n in product['options']
                       if n in goal['goal_options']]
            return ([f'search[{query.lower()}]'] + ['click[next >]'] * (pos // 10)
                    + [f"click[{goal['asin'].lower()}]"]
                    + options + ['click[buy now]'])
    raise RuntimeError(f"target {goal['asin']} not found by any oracle query")


def oracle_actions(task: Task, cfg: WebShopConfig) -> list[str]:
    """The expert purchase path for a task from the start page, in the shop of `cfg`."""
    shop = _shop(cfg)
    return purchase_path(shop, shop.goals[int(task.source)])


def plan(task: Task, actions: list[str], timeout_s: float, cfg: WebShopConfig) -> PlanResult:
    """Replay `actions` from reset, then the oracle's actions from the state reached (deviation 3)."""
    t0 = time.perf_counter()
    try:
        shop = _shop(cfg)
        env = WebShopEnv(cfg)
        res = envs.replay(env, task, actions)[-1]
        if res.done:  # as the ALFWorld planner: nothing left to do after a win, nothing possible after a loss
            status, rest, message = (('ok', [], 'already won') if res.won
                                     else ('unsolvable', None, 'the episode ended'))
            return PlanResult(rest, status, time.perf_counter() - t0, message)
        goal = shop.goals[int(task.source)]
        state = read_state(env.text_env)
        if state['item'] == goal['asin'] and (state['page'] == 'item' or state['page'].startswith('sub:')):
            chosen = dict(state['options'])
            order = list(shop.by_asin[goal['asin']]['options'])
            rest = (['click[< prev]'] if state['page'] != 'item' else []) + \
                [f"click[{goal['goal_options'][n]}]" for n in order
                 if n in goal['goal_options'] and chosen.get(n) != goal['goal_options'][n]] + \
                ['click[buy now]']
        else:
            rest = purchase_path(shop, goal)
    except Exception as e:  # a plan failure must not take the trainer down; report it
        return PlanResult(None, 'error', time.perf_counter() - t0, f'{type(e).__name__}: {e}')
    seconds = time.perf_counter() - t0
    if seconds > timeout_s:
        return PlanResult(None, 'timeout', seconds, f'took {seconds:.2f}s > {timeout_s}s')
    if env.steps + len(rest) > cfg.max_steps:
        return PlanResult(None, 'unsolvable', seconds,
                          f'needs {len(rest)} more steps, {cfg.max_steps - env.steps} left')
    return PlanResult(rest, 'ok', seconds, '')
