"""WebShop (environments/webshop*.py): the embedded engine's exact pages, transitions, reward, oracle,
signatures, prompt, official adapter.

What is pinned: golden transcripts of every page type for the default seeds (upstream WebShop's page strings),
the invalid-action and step-limit rules, the oracle on 100 eval goals, the planner working in the run's own
shop, signatures that see option clicks the text hides, verl-agent's prompt text. get_reward against
hand-computed values (and each documented deviation): test_webshop_reward.py. The adapter on a duck-typed
and on the real WebAgentTextEnv: test_webshop_official.py.

Run: .venv/bin/python -m pytest tests/test_webshop.py -q   (about 2 s on CPU)
"""
import dataclasses
import itertools

import pytest

import envs
import rollout
from envs import StepResult, Task
from environments import webshop, webshop_catalog, webshop_engine, webshop_reward

CFG = webshop.WebShopConfig()
INSTR = ("i would like hidden zipper throw pillow covers with machine wash with color: pink, and "
         "size: 20 x 20 inch, and price lower than 40.00 dollars")
HEAD = f"Instruction: [SEP] {INSTR} [SEP] Back to Search"
RESULTS_1 = (
    f"{HEAD} [SEP] Page 1 (Total results: 33) [SEP] Next > [SEP] "
    "B00CK2EQK2 [SEP] Juno Throw Pillow Covers Decorative Hidden Zipper [SEP] $11.67 [SEP] "
    "B0SVWYZZ6T [SEP] Velora Throw Pillow Covers Decorative Hidden Zipper [SEP] $11.8 [SEP] "
    "B0EPOHJ150 [SEP] Delmar Throw Pillow Covers Decorative Double Sided [SEP] $15.66 [SEP] "
    "B0M6PC5PNR [SEP] Velora Throw Pillow Covers Double Sided Decorative [SEP] $20.08 [SEP] "
    "B0KP4ZKGXK [SEP] Pinecrest Throw Pillow Covers Decorative Hidden Zipper [SEP] $13.11 [SEP] "
    "B0ITY0FAMV [SEP] Arbor Throw Pillow Covers Decorative Soft Velvet [SEP] $10.81 [SEP] "
    "B008VNISFI [SEP] Hestia Throw Pillow Covers Machine Wash Hidden Zipper [SEP] $17.87 [SEP] "
    "B08LJ09VKV [SEP] Pinecrest Throw Pillow Covers Decorative Soft Velvet [SEP] $24.49 [SEP] "
    "B0EN5X40QL [SEP] Arbor Throw Pillow Covers Decorative Hidden Zipper [SEP] $25.99 [SEP] "
    "B0H7PKE0SS [SEP] Marlowe Throw Pillow Covers Double Sided Decorative [SEP] $13.58")
RESULTS_2 = (
    f"{HEAD} [SEP] Page 2 (Total results: 33) [SEP] < Prev [SEP] Next > [SEP] "
    "B0KF4SRQNZ [SEP] Bexley Throw Pillow Covers Machine Wash Decorative [SEP] $34.4 [SEP] "
    "B0WUHBJWUN [SEP] Marlowe Throw Pillow Covers Double Sided Decorative [SEP] $17.3 to $21.08 [SEP] "
    "B0GGT3TI1Q [SEP] Bexley Throw Pillow Covers Double Sided Machine Wash [SEP] $24.67 to $31.26 [SEP] "
    "B0BWY029X1 [SEP] Yarrow Throw Pillow Covers Soft Velvet Decorative [SEP] $30.02 [SEP] "
    "B05GT9SH9V [SEP] Evenly Throw Pillow Covers Soft Velvet Hidden Zipper [SEP] $19.44 [SEP] "
    "B0AIHMF3MA [SEP] Obelle Throw Pillow Covers Soft Velvet Machine Wash [SEP] $30.2 [SEP] "
    "B0DPRMVGR5 [SEP] Obelle Throw Pillow Covers Double Sided Hidden Zipper [SEP] $20.45 [SEP] "
    "B09MIY4X4I [SEP] Umbra Throw Pillow Covers Hidden Zipper Soft Velvet [SEP] $34.13 [SEP] "
    "B0TSOURI5K [SEP] Umbra Throw Pillow Covers Soft Velvet Machine Wash [SEP] $27.66 [SEP] "
    "B0IZRF8S7K [SEP] Gallow Throw Pillow Covers Hidden Zipper Soft Velvet [SEP] $15.87")
ITEM = (f"{HEAD} [SEP] < Prev [SEP] color [SEP] green [SEP] pink [SEP] size [SEP] 18 x 18 inch [SEP] "
        "20 x 20 inch [SEP] Juno Throw Pillow Covers Decorative Hidden Zipper [SEP] Price: $11.67 [SEP] "
        "Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
DESCRIPTION = (f"{HEAD} [SEP] < Prev [SEP] This throw pillow covers from Juno is decorative and hidden "
               "zipper. It is also machine wash. A thoughtful gift for friends and family.")
FEATURES = (f"{HEAD} [SEP] < Prev [SEP] Decorative [SEP] Hidden zipper [SEP] Machine wash [SEP] "
            "A thoughtful gift for friends and family.")
REVIEWS = f"{HEAD} [SEP] < Prev"
DONE = ('Thank you for shopping with us! [SEP] Your code: [SEP] None [SEP] '
        '(Paste it in your MTurk interface.) [SEP] Purchased [SEP] asin [SEP] B00CK2EQK2 [SEP] options [SEP] '
        '{"color": "pink", "size": "20 x 20 inch"} [SEP] attrs [SEP] None [SEP] category [SEP] None [SEP] '
        'query [SEP] None [SEP] product category [SEP] None [SEP] Target [SEP] asin [SEP] options [SEP] '
        'attrs [SEP] price upper [SEP] instuction text [SEP] category [SEP] product category [SEP] '
        'query [SEP] Goal [SEP] None [SEP] Reward [SEP] Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP] '
        'Reward Details [SEP] None')
ITEM_ACTIONS = ['click[back to search]', 'click[< prev]', 'click[description]', 'click[features]',
                'click[reviews]', 'click[buy now]', 'click[green]', 'click[pink]', 'click[18 x 18 inch]',
                'click[20 x 20 inch]']


@pytest.fixture
def env():
    e = webshop.WebShopEnv(CFG)
    yield e
    e.close()


@pytest.fixture(scope="module")
def task0():
    return envs.load_tasks(CFG, "eval")[0]


def _field(res: StepResult, name: str):
    return dict(res.signature)[name]


# ------------------------------------------------------------------------------------------- catalogue, goals

def test_catalogue_and_goal_counts_are_pinned_and_deterministic():
    shop = webshop_catalog.build_products(1000, 0)
    assert len(shop) == 1000 and len({p['asin'] for p in shop}) == 1000
    assert len({p['category'] for p in shop}) == 5 and len({p['query'] for p in shop}) == 30
    assert webshop_catalog.build_products(1000, 0) == shop
    assert webshop_catalog.build_products(1000, 1) != shop
    assert len(envs.load_tasks(CFG, "eval")) == 500 and len(envs.load_tasks(CFG, "train")) == 4789
    tasks = envs.load_tasks(CFG, "eval")
    assert tasks[7] == Task("webshop/00007", "webshop", "webshop", "7")
    assert envs.load_tasks(CFG, "train")[0].source == "500"


def test_goals_follow_get_synthetic_goals():
    s = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed)
    per_product = {}
    for g in s.goals:
        p = s.by_asin[g['asin']]
        assert sorted(g['goal_options']) == list(g['goal_options']) == sorted(p['options'])
        bound = [x for x in webshop_catalog.PRICE_RANGE if x > s.prices[g['asin']]][:4]
        # the larger of two distinct draws is never the smallest candidate
        assert g['price_upper'] in bound[1:]
        opts = ', and '.join(f'{k}: {v}' for k, v in g['goal_options'].items())
        assert g['instruction_text'] == (p['instruction_text'] + (f' with {opts}' if opts else '')
                                         + f", and price lower than {g['price_upper']:.2f} dollars")
        assert set(g['attributes']) <= set(p['Attributes']) and g['name'] == p['Title']
        per_product[g['asin']] = per_product.get(g['asin'], 0) + 1
    for asin, n in per_product.items():  # one goal per option combination
        assert n == len(list(itertools.product(*s.by_asin[asin]['options'].values())))


def test_wrong_option_values_match_only_in_three_upstream_quirks():
    """Within a product, a value other than the goal's almost never matches a goal option under WebShop's
    option reward (goal options as (name, value) pairs, token_set_ratio > 85, see webshop_reward). The
    exceptions in this catalogue are upstream's own fuzziness and the real reward agrees: 'large' for the goal
    size 'x-large' (a token subset) and the rugs' '3 x 5 ft' / '5 x 7 ft' (ratio 86). Option values never
    occur in the product text (catalogue deviation 1)."""
    s = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed)
    quirks = set()
    for p in s.products:
        text = ' '.join([p['Title'], p['Description']] + p['BulletPoints']).lower()
        values = [v for vs in p['options'].values() for v in vs]
        assert len(values) == len(set(values))
        assert not any(ch.isdigit() for ch in text)
        assert all(webshop_reward.normalize_color(v) not in text for v in values)
        for name, vs in p['options'].items():
            for v in vs:
                assert webshop_reward.get_option_reward([v], [(name, v)])[1] == 1
                quirks |= {(name, v, w) for w in values if w != v
                           and webshop_reward.get_option_reward([w], [(name, v)])[1]}
    assert quirks == {('size', 'x-large', 'large'), ('size', '3 x 5 ft', '5 x 7 ft'),
                      ('size', '5 x 7 ft', '3 x 5 ft')}
    assert webshop_reward.token_set_ratio('5 x 7 ft', ('size', '3 x 5 ft')) == 86


def test_bm25_ranks_matching_products_first_and_caps_at_50():
    s = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed)
    hits = s.search("men's running shoes".split(' '))
    assert len(hits) == 50 and all(h['query'] == "men's running shoes" for h in hits[:20])
    assert s.search(['the', 'and']) == []


def test_special_search_prefixes_are_webshops():
    """get_top_n_product_from_keywords' '<q> query' / '<c> category' lists (uncapped), '<r>' 50 random
    (catalogue deviation 4), '<a>' nothing (deviation 5: upstream's text env crashes there)."""
    s = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed)
    shoes = s.search(['<q>', "men's", 'running', 'shoes'])
    assert shoes == [p for p in s.products if p['query'] == "men's running shoes"] and len(shoes) > 0
    beauty = s.search(['<c>', 'beauty', 'ignored'])
    assert len(beauty) > 50 and {p['category'] for p in beauty} == {'beauty'}
    assert len(s.search(['<r>'])) == 50 and s.search(['<a>', 'vegan']) == [] and s.search(['<c>']) == []
    assert webshop_catalog.tokenize("Men's Shoes, a Glass") == ['men', 'shoe', 'glass']


# ------------------------------------------------------------------------------------------ golden transcript

def test_golden_transcript_of_every_page(env, task0):
    res = env.reset(task0)
    assert res.info['raw_observation'] == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"
    assert res.observation == "'Search'" and res.goal == INSTR
    assert res.admissible == ['search[<your query>]', 'click[search]']
    script = [("search[throw pillow covers]", RESULTS_1), ("click[next >]", RESULTS_2),
              ("click[< prev]", RESULTS_1), ("click[b00ck2eqk2]", ITEM), ("click[description]", DESCRIPTION),
              ("click[< prev]", ITEM), ("click[features]", FEATURES), ("click[< prev]", ITEM),
              ("click[reviews]", REVIEWS), ("click[< prev]", ITEM), ("click[green]", ITEM),
              ("click[pink]", ITEM), ("click[20 x 20 inch]", ITEM)]
    for action, page in script:
        res = env.step(action)
        assert res.info['raw_observation'] == page, action
        assert (res.reward, res.done, res.score) == (0.0, False, 0.0)
    assert res.admissible == ITEM_ACTIONS
    assert res.observation == "'" + ITEM.split(f"{INSTR} [SEP] ")[1].replace(" [SEP] ", "' [SEP] '") + "'"
    res = env.step("click[buy now]")
    assert res.info['raw_observation'] == DONE and res.observation == DONE
    assert (res.reward, res.done, res.won, res.score, res.admissible) == (10.0, True, True, 1.0, [])
    assert res.info['verbose_info'] == {'r_type': 1.0, 'r_att': 1.0, 'w_att': 0.4, 'query_match': True,
                                        'category_match': True, 'title_score': 1.0, 'r_option': 1.0,
                                        'w_option': 0.4, 'r_price': True, 'w_price': 0.2}


def test_results_clickables_follow_the_page(env, task0):
    env.reset(task0)
    res = env.step("search[throw pillow covers]")
    assert res.admissible[:3] == ['click[back to search]', 'click[next >]', 'click[b00ck2eqk2]']
    res = env.step("click[next >]")
    assert (res.admissible[:4]
            == ['click[back to search]', 'click[< prev]', 'click[next >]', 'click[b0kf4srqnz]'])
    for _ in range(3):
        res = env.step("click[next >]")  # 33 results: page 5 is empty but `Next >` is still there
    assert res.info['raw_observation'] == f"{HEAD} [SEP] Page 5 (Total results: 33) [SEP] < Prev [SEP] Next >"
    assert res.admissible == ['click[back to search]', 'click[< prev]', 'click[next >]']


# ---------------------------------------------------------------------------------------------- transitions

def test_invalid_actions_are_noops_with_zero_reward(env, task0):
    start = env.reset(task0)
    for action in ["click[buy now]", "click[search]", "search[]", "foo", "Search[pillow]",
                   "click[b00ck2eqk2]", "click[next >]", ""]:
        res = env.step(action)
        assert res.info['raw_observation'] == start.info['raw_observation'], action
        assert (res.reward, res.done, res.signature) == (0.0, False, start.signature)
    env.step("search[throw pillow covers]")
    item = env.step("click[b00ck2eqk2]")
    for action in ["click[next >]", "click[b0svwyzz6t]", "click[search]", "click[purple]", "click[pink"]:
        res = env.step(action)
        assert res.info['raw_observation'] == ITEM and res.signature == item.signature, action


def test_search_works_from_any_page_and_click_arguments_are_lowercased(env, task0):
    env.reset(task0)
    env.step("search[throw pillow covers]")
    res = env.step("click[B00CK2EQK2]")
    assert res.info['raw_observation'] == ITEM and _field(res, 'item') == 'B00CK2EQK2'
    env.step("click[description]")
    res = env.step("search[Throw Pillow Covers]")  # from a sub page, no search bar shown
    assert (res.info['raw_observation'] == RESULTS_1
            and _field(res, 'keywords') == ('throw', 'pillow', 'covers'))


def test_page_type_and_attributes_page_follow_simserver(env, task0):
    """get_page_name finds the page names anywhere in the URL, keywords included; the Attributes sub page
    (reachable upstream with show_attrs) lists the attributes, then category, query and product category."""
    base = webshop_engine.BASE_URL
    assert webshop_engine.page_name(f'{base}/item_page/0/B0X/search_results+x/1/{{}}') == 'search_results'
    assert webshop_engine.page_name(f'{base}/item_sub_page/0/B0X/done/1/Features/{{}}') == 'item_sub_page'
    assert webshop_engine.page_name(f'{base}/0') == '' and webshop_engine.page_name(None) == ''
    env.reset(task0)
    env.step("search[throw pillow covers]")
    env.step("click[b00ck2eqk2]")
    env.text_env._item_sub_page('attributes')
    p = env.text_env.shop.by_asin['B00CK2EQK2']
    assert env.text_env.texts[4:] == p['Attributes'] + [p['category'], p['query'], p['product_category']]


def test_navigation_keeps_or_clears_session_state(env, task0):
    env.reset(task0)
    env.step("search[throw pillow covers]")
    env.step("click[next >]")
    env.step("click[b0kf4srqnz]")
    res = env.step("click[< prev]")  # item -> the same results page
    assert (_field(res, 'page') == 'results' and _field(res, 'results_page') == 2
            and _field(res, 'item') is None)
    env.step("click[< prev]")
    env.step("click[b00ck2eqk2]")
    env.step("click[green]")
    env.step("click[pink]")  # one value per option name: the last click wins
    env.step("click[reviews]")
    res = env.step("click[< prev]")  # sub page -> the item, options kept
    assert _field(res, 'page') == 'item' and _field(res, 'options') == (('color', 'pink'),)
    res = env.step("click[back to search]")
    assert res.signature == (('task', task0.task_id), ('page', 'search'), ('keywords', ()),
                             ('results_page', None), ('item', None), ('options', ()))
    assert res.info['raw_observation'] == f"WebShop [SEP] Instruction: [SEP] {INSTR} [SEP] Search"


def test_step_limit_ends_the_episode_unbought(task0):
    env = webshop.WebShopEnv(webshop.WebShopConfig(max_steps=3))
    env.reset(task0)
    assert not env.step("foo").done and not env.step("search[pillow]").done
    res = env.step("click[back to search]")
    assert (res.done, res.won, res.reward, res.score, res.info['truncated']) == (True, False, 0.0, 0.0, True)
    after = env.step("search[pillow]")  # env deviation 2: a no-op after done
    assert after.done and after.info['after_done'] and after.observation == res.observation
    res = env.reset(task0)  # a reset starts over on the same goal
    assert not res.done and env.steps == 0 and _field(res, 'page') == 'search'


def test_default_step_limit_is_15(env, task0):
    env.reset(task0)
    results = [env.step("click[nothing]") for _ in range(15)]
    assert [r.done for r in results] == [False] * 14 + [True]


# ---------------------------------------------------------------------------------------------- signatures

def test_signature_sees_option_clicks_the_text_does_not(env, task0):
    env.reset(task0)
    env.step("search[throw pillow covers]")
    plain = env.step("click[b00ck2eqk2]")
    green = env.step("click[green]")
    pink = env.step("click[pink]")
    assert plain.observation == green.observation == pink.observation
    assert len({plain.signature, green.signature, pink.signature}) == 3
    assert _field(pink, 'options') == (('color', 'pink'),)
    assert ([name for name, _ in pink.signature]
            == ['task', 'page', 'keywords', 'results_page', 'item', 'options'])
    sub = env.step("click[features]")
    assert _field(sub, 'page') == 'sub:features'


# ---------------------------------------------------------------------------------------------- expert

def test_oracle_reaches_full_reward_on_100_eval_goals(env):
    tasks = envs.load_tasks(CFG, "eval")[::5]
    assert len(tasks) == 100
    for task in tasks:
        actions = webshop.oracle_actions(task, CFG)
        assert actions[0].startswith("search[") and actions[-1] == "click[buy now]" and len(actions) <= 15
        env.reset(task)
        for action in actions:
            res = env.step(action)
        assert res.won and res.score == 1.0 and res.reward == 10.0, task.task_id


def test_plan_continues_from_any_prefix(env, task0):
    full = webshop.plan(task0, [], 5.0, CFG)
    assert full.status == "ok" and full.actions == webshop.oracle_actions(task0, CFG)
    prefix = ["search[throw pillow covers]", "click[b00ck2eqk2]", "click[green]", "click[features]"]
    rest = webshop.plan(task0, prefix, 5.0, CFG)
    assert rest.status == "ok" and rest.actions == ["click[< prev]", "click[pink]", "click[20 x 20 inch]",
                                                    "click[buy now]"]
    env.reset(task0)
    for action in prefix + rest.actions:
        res = env.step(action)
    assert res.won
    elsewhere = webshop.plan(task0, ["search[office chair]", "click[back to search]"], 5.0, CFG)
    assert elsewhere.status == "ok" and elsewhere.actions == full.actions
    assert webshop.plan(task0, prefix + rest.actions, 5.0, CFG).actions == []  # already won
    # bought wrong
    assert webshop.plan(task0, prefix[:3] + ["click[buy now]"], 5.0, CFG).status == "unsolvable"
    tight = webshop.WebShopConfig(max_steps=6)
    assert webshop.plan(task0, ["foo"] * 3, 5.0, tight).status == "unsolvable"  # 5 steps needed, 3 left


def test_planner_plans_in_the_runs_shop_not_the_default_one():
    """--router.seed-with-planner on a non-default catalogue: the dispatcher passes the run's config to the
    planner, so the reference comes from the shop the student plays in (it used to fall back to
    WebShopConfig())."""
    other = webshop.WebShopConfig(catalog_seed=1)
    task = envs.load_tasks(other, "eval")[3]
    p = envs.plan(other, task, [])
    assert p.status == "ok" and p.actions == webshop.oracle_actions(task, other)
    assert p.actions != webshop.oracle_actions(task, CFG)
    env = envs.make_env(dataclasses.replace(other, max_steps=10**6))
    ref = rollout.reference(env, task, p.actions)
    assert ref is not None and ref.success and len(ref.steps) == len(p.actions)
    # the default shop's plan fails here
    assert not rollout.replay(env, task, webshop.oracle_actions(task, CFG)).won
    env.close()


# ---------------------------------------------------------------------------------------------- prompt

NO_HIS = ("\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment. \n"
          "Your task is to: {task_description}.\nYour current observation is: {current_observation}.\n"
          "Your admissible actions of the current situation are: \n[\n{available_actions}\n].\n\n"
          "Now it's your turn to take one action for the current step.\nYou should first reason step-by-step "
          "about the current situation, then think carefully which admissible action best advances the "
          "shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. \n"
          "Once you've finished your reasoning, you should choose an admissible action for current step and "
          "present it within <action> </action> tags.\n")
HIS = ("\nYou are an expert autonomous agent operating in the WebShop e\u2011commerce environment.\n"
       "Your task is to: {task_description}.\nPrior to this step, you have already taken {step_count} "
       "step(s). Below are the most recent {history_length} observations and the corresponding actions you "
       "took: {action_history}\nYou are now at step {current_step} and your current observation is: "
       "{current_observation}.\nYour admissible actions of the current situation are: "
       "\n[\n{available_actions}\n].\n\nNow it's your turn to take one action for the current step.\n"
       "You should first reason step-by-step about the current situation, then think carefully which "
       "admissible action best advances the shopping goal. This reasoning process MUST be enclosed within "
       "<think> </think> tags. \nOnce you've finished your reasoning, you should choose an admissible action "
       "for current step and present it within <action> </action> tags.\n")


def test_prompt_is_verl_agents_webshop_template():
    acts = ['search[<your query>]', 'click[search]']
    assert envs.build_prompt("webshop", "G", [], 0, "'Search'", acts, 2) == NO_HIS.format(
        task_description="G", current_observation="'Search'",
        available_actions="'search[<your query>]',\n'click[search]',")
    history = [("o1", "a1"), ("o2", "a2"), ("o3", "a3")]
    assert envs.build_prompt("webshop", "G", history, 3, "O", ["click[x]"], 2) == HIS.format(
        task_description="G", step_count=3, history_length=2, current_step=4, current_observation="O",
        action_history="[Observation 2: 'o2', Action 2: 'a2']\n[Observation 3: 'o3', Action 3: 'a3']",
        available_actions="'click[x]',")
    no_history = envs.build_prompt("webshop", "G", [], 0, "O", ["click[x]"], 2)
    assert envs.build_prompt("webshop", "G", history, 3, "O", ["click[x]"], 0) == no_history
    long_history = [("x" * 7000, "a")] * 2  # over 13,000 characters: verl-agent drops the history
    assert envs.build_prompt("webshop", "G", long_history, 2, "O", ["click[x]"], 2) == no_history
    no_think = envs.build_prompt("webshop", "G", [], 0, "O", [], 2, require_think=False)
    assert "<think>" not in no_think and no_think.endswith("<action> </action> tags.\n")

