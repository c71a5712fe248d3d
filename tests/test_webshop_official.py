"""The WebShop adapter against the REAL `WebAgentTextEnv` of princeton-nlp/WebShop, differentially against the
embedded engine (environments/webshop_engine.py).

The real class is imported from a WebShop checkout (code only, no data) at $WEBSHOP_SRC (or $WEBSHOP_ROOT);
the test is skipped without one, or when flask, beautifulsoup4, gym or thefuzz are not importable (they are
not in requirements.txt: `pip install --target /tmp/ws flask beautifulsoup4 gym==0.26.2 thefuzz` and put
/tmp/ws on PYTHONPATH). Nothing from the checkout is copied into this repository: the test copies the
checkout's `web_agent_site/` into a temporary folder (its data paths are relative to the package) and writes
WebShop's three data files there from the embedded catalogue, in WebShop's raw scraped format.

What is real: WebAgentTextEnv, SimServer, SimBrowser, the Jinja templates, BeautifulSoup's html -> text
conversion, the action parser, load_products, and get_reward with the real thefuzz. What stands in for what
cannot be installed offline, each as small as possible:
- pyserini's LuceneSearcher (Java + a Lucene index): a searcher that returns the embedded shop's BM25
  ranking, so the result lists are the same by construction (search *ranking* is not compared, only the pages
  around it);
- spaCy's en_core_web_sm (loaded at import by engine/goal.py): a tagger that tags as NOUN exactly the tokens
  webshop_reward.title_nouns keeps (reward deviation 1), so title_score is comparable;
- torch (only used with get_image), cleantext and rank_bm25 (imported, unused by the text env) when missing;
- `web_agent_site.envs` is registered as a bare package so its __init__ (selenium, the HTML env) does not run.
After construction the server's goals and reward prices are replaced by the embedded shop's (upstream draws
them from the unseeded global RNG; test_webshop.py pins our goal synthesis separately).

Run:
WEBSHOP_SRC=/path/to/WebShop PYTHONPATH=/tmp/ws .venv/bin/python -m pytest tests/test_webshop_official.py -q
"""
import importlib
import importlib.util
import json
import os
import random
import shutil
import sys
import types

import pytest

import envs
from environments import webshop, webshop_catalog, webshop_engine, webshop_reward

CFG = webshop.WebShopConfig()
SRC = os.environ.get("WEBSHOP_SRC") or os.environ.get("WEBSHOP_ROOT", "")
needs_checkout = pytest.mark.skipif(
    not os.path.isfile(os.path.join(SRC, "web_agent_site", "envs", "web_agent_text_env.py")),
    reason="set WEBSHOP_SRC to a princeton-nlp/WebShop checkout to test against the real WebAgentTextEnv")


@pytest.fixture(scope="module")
def task0():
    return envs.load_tasks(CFG, "eval")[0]


# ---------------------------------------------------------------------------------------------- data files

def raw_item(p: dict) -> dict:
    """An embedded product in WebShop's scraped item format (what items_shuffle_1000.json holds)."""
    return {'asin': p['asin'], 'name': p['Title'], 'full_description': p['Description'],
            'small_description': list(p['BulletPoints']),
            'pricing': ' - '.join(f'${x}' for x in p['pricing']),
            'customization_options': {k: [{'value': v, 'image': None} for v in vs]
                                      for k, vs in p['options'].items()},
            'images': [f"https://example.invalid/{p['asin']}.jpg"], 'category': p['category'],
            'query': p['query'], 'product_category': p['product_category']}


def write_data(root: str, shop) -> None:
    data = os.path.join(root, 'data')
    os.makedirs(data)
    attrs = {p['asin']: {'attributes': p['Attributes'], 'instruction': p['instruction_text'],
                         'instruction_attributes': p['instruction_attributes']} for p in shop.products}
    for name, obj in [('items_shuffle_1000.json', [raw_item(p) for p in shop.products]),
                      ('items_ins_v2_1000.json', attrs), ('items_human_ins.json', {})]:
        with open(os.path.join(data, name), 'w') as f:
            json.dump(obj, f)


# ---------------------------------------------------------------------------------------------- stand-ins

def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def searcher_module(shop) -> dict:
    """pyserini.search.lucene with a LuceneSearcher that answers with the embedded shop's ranking."""
    class Doc:
        def __init__(self, asin):
            self.asin = asin

        def raw(self):
            return json.dumps({'id': self.asin})

    class LuceneSearcher:
        def __init__(self, index_dir):
            self.index_dir = index_dir

        def search(self, query, k=10):
            return [types.SimpleNamespace(docid=p['asin']) for p in shop.search(query.split(' '))[:k]]

        def doc(self, docid):
            return Doc(docid)

    lucene = _module('pyserini.search.lucene', LuceneSearcher=LuceneSearcher)
    return {'pyserini': _module('pyserini'), 'pyserini.search': _module('pyserini.search'),
            'pyserini.search.lucene': lucene}


def spacy_module() -> types.ModuleType:
    """spacy.load(name) -> a 'pipeline' whose tokens are webshop_reward.title_nouns(text), all tagged NOUN."""
    def nlp(text):
        return [types.SimpleNamespace(text=w, pos_='NOUN') for w in webshop_reward.title_nouns(text)]
    return _module('spacy', load=lambda name: nlp)


def stand_ins(shop, pkg_dir: str) -> dict:
    mods = {**searcher_module(shop), 'spacy': spacy_module(),
            'web_agent_site.envs': _module('web_agent_site.envs', __path__=[os.path.join(pkg_dir, 'envs')])}
    if 'torch' not in sys.modules:
        mods['torch'] = _module('torch', load=None, zeros=None, manual_seed=lambda s: None)
    for name in ('cleantext', 'rank_bm25'):
        try:
            importlib.import_module(name)
        except ImportError:
            mods[name] = _module(name, BM25Okapi=None)
    return mods


# ---------------------------------------------------------------------------------------------- the real env

@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(WebAgentTextEnv class, goal module) imported from a temporary copy of the checkout,
    over our catalogue."""
    for dep in ('flask', 'bs4', 'gym', 'thefuzz'):
        pytest.importorskip(dep)
    shop = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed)
    root = str(tmp_path_factory.mktemp('webshop'))
    shutil.copytree(os.path.join(SRC, 'web_agent_site'), os.path.join(root, 'web_agent_site'))
    write_data(root, shop)
    mods = stand_ins(shop, os.path.join(root, 'web_agent_site'))
    saved = {name: sys.modules.get(name) for name in mods}
    rng_state = random.getstate()
    sys.modules.update(mods)
    sys.path.insert(0, root)
    try:
        text_env_cls = importlib.import_module('web_agent_site.envs.web_agent_text_env').WebAgentTextEnv
        goal_module = importlib.import_module('web_agent_site.engine.goal')
        cfg = webshop.WebShopConfig(backend='official', webshop_root=root)
        yield types.SimpleNamespace(cls=text_env_cls, goal=goal_module, shop=shop,
                                    make=lambda: _real_text_env(cfg, shop))
    finally:
        sys.path.remove(root)
        for name in [m for m in sys.modules if m == 'web_agent_site' or m.startswith('web_agent_site.')]:
            del sys.modules[name]
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
        random.setstate(rng_state)


def _real_text_env(cfg, shop):
    """The adapter's own import path (official_text_env), then the embedded shop's goals and prices."""
    text_env = webshop.official_text_env(cfg)
    assert type(text_env).__module__ == 'web_agent_site.envs.web_agent_text_env'
    assert len(text_env.server.all_products) == len(shop.products)
    text_env.server.goals = shop.goals
    text_env.server.product_prices = dict(shop.prices)
    return text_env


def _fields(res):
    return {'raw': res.info['raw_observation'], 'observation': res.observation, 'admissible': res.admissible,
            'signature': res.signature, 'url': res.info['url'], 'reward': res.reward, 'done': res.done,
            'won': res.won, 'score': pytest.approx(res.score), 'goal': res.goal,
            'verbose_info': res.info.get('verbose_info')}


def _assert_same(real_res, emb_res, where):
    got, want = _fields(real_res), _fields(emb_res)
    for key in want:
        assert got[key] == want[key], \
            f"{where}: {key} differs\nreal:     {got[key]!r}\nembedded: {want[key]!r}"


INVALID = ['foo', '', 'search[]', 'click[]', 'click[search]', 'click[nothing here]', 'click[b0notthere]',
           'search[<your query>]', 'Search[pillow]', 'click[buy now', 'click [back to search]']


def _next_action(rng, res, words, shop):
    """A random walk that visits every page type: clicks, searches (plain and WebShop's <q>/<c> forms),
    invalid actions, mixed-case arguments, occasional purchases."""
    r = rng.random()
    if r < 0.08:
        return rng.choice(INVALID)
    clicks = [a for a in res.admissible if a.startswith('click[')
              and a not in ('click[buy now]', 'click[search]')]
    if r < 0.2 or not clicks:
        return f"search[{' '.join(rng.sample(words, rng.randint(1, min(4, len(words)))))}]"
    if r < 0.23:
        p = rng.choice(shop.products)
        return rng.choice([f"search[<q> {p['query']}]", f"search[<c> {p['category']}]"])
    if 'click[buy now]' in res.admissible and r > 0.95:
        return 'click[buy now]'
    action = rng.choice(clicks)
    return action.upper() if rng.random() < 0.05 else action


@needs_checkout
def test_random_walks_see_the_same_pages_as_the_real_env(real):
    """20 tasks x 30 steps: every observation, admissible list, URL, signature,
    reward and verbose_info equal."""
    cfg = webshop.WebShopConfig(max_steps=30)
    rng = random.Random(0)
    real_env, emb_env = webshop.WebShopEnv(cfg, text_env=real.make()), webshop.WebShopEnv(cfg)
    pages, bought = set(), 0
    for task in envs.load_tasks(cfg, 'eval')[::50] + envs.load_tasks(cfg, 'train')[::480]:
        words = [w for w in real.shop.goals[int(task.source)]['instruction_text'].split() if w.isalpha()]
        res_r, res_e = real_env.reset(task), emb_env.reset(task)
        _assert_same(res_r, res_e, f'{task.task_id} reset')
        trail = []
        while not res_e.done:
            action = _next_action(rng, res_e, words, real.shop)
            trail.append(action)
            res_r, res_e = real_env.step(action), emb_env.step(action)
            _assert_same(res_r, res_e, f'{task.task_id} after {trail}')
            pages.add(dict(res_e.signature)['page'])
        bought += 'verbose_info' in res_e.info
    assert pages >= {'search', 'results', 'item', 'sub:description', 'sub:features', 'sub:reviews', 'done'}
    assert bought >= 3


@needs_checkout
def test_expert_purchases_win_on_the_real_env(real):
    """The oracle's path (embedded catalogue) wins on the real env too, with the same reward breakdown."""
    real_env, emb_env = webshop.WebShopEnv(CFG, text_env=real.make()), webshop.WebShopEnv(CFG)
    for task in envs.load_tasks(CFG, 'eval')[::25]:
        res_r, res_e = real_env.reset(task), emb_env.reset(task)
        for action in webshop.oracle_actions(task, CFG):
            res_r, res_e = real_env.step(action), emb_env.step(action)
            _assert_same(res_r, res_e, f'{task.task_id} {action}')
        assert res_r.won and res_r.reward == 10.0 and res_r.info['verbose_info']['r_option'] == 1.0


@needs_checkout
def test_reward_equals_the_real_get_reward(real):
    """webshop_reward.get_reward == goal.get_reward (real thefuzz; spaCy stand-in, reward deviation 1) on 300
    purchases: the goal's product with random options, a product of the same query, and any product."""
    rng = random.Random(1)
    items = real.make().server.product_item_dict
    for goal in rng.sample(real.shop.goals, 100):
        same_query = [p for p in real.shop.products if p['query'] == goal['query']]
        for product in (real.shop.by_asin[goal['asin']], rng.choice(same_query),
                        rng.choice(real.shop.products)):
            options = {k: rng.choice(vs) for k, vs in product['options'].items() if rng.random() < 0.8}
            price = real.shop.prices[product['asin']]
            want = webshop_reward.get_reward(product, goal, price, options)
            got = real.goal.get_reward(items[product['asin']], goal, price=price, options=options,
                                       verbose=True)
            assert got[0] == pytest.approx(want[0]) and got[1] == want[1], \
                (goal['asin'], product['asin'], options)


OPTION_CASES = [  # (goal options, purchased options, r_option): upstream's quirks,
                  # see webshop_reward's docstring
    ({'color': 'navy blue'}, {'color': 'royal blue'}, 1.0),  # purchase side 'blue' is a token of
                                                             # "color navy blue"
    ({'color': 'dark blue'}, {'color': 'dark grey'}, 1.0),   # 'dark grey' -> 'dark', a token of
                                                             # "color dark blue"
    ({'color': 'grey'}, {'color': 'dark grey'}, 0.0),        # goal ('color', 'grey') -> 'grey' vs 'dark'
    ({'size': '10.5'}, {'size': '10'}, 1.0),                 # {10} is a subset of {size, 10, 5}:
                                                             # no exact size match
    ({'size': '10'}, {'size': '10.5'}, 0.0),
    ({'size': 's', 'color': 'red'}, {'color': 'red'}, 0.5),  # counted per goal option
    ({'color': 'red'}, {'color': 'red', 'size': 'red'}, 1.0),
    ({'color': 'blue'}, {'color': 'red'}, 0.0),             # 'red' is in the description:
                                                            # no text fall-back here
]
SHOE = {'Title': 'Trail Shoe', 'name': 'Trail Shoe', 'BulletPoints': ['Grip'], 'Description': 'A red shoe.',
        'Attributes': ['grip'], 'query': 'shoe', 'product_category': 'a › b'}


def _option_goal(goal_options):
    return {**SHOE, 'attributes': ['grip'], 'goal_options': goal_options, 'price_upper': 100.0}


@pytest.mark.parametrize("goal_options,bought,r_option", OPTION_CASES)
def test_option_reward_reads_goal_options_as_name_value_pairs(goal_options, bought, r_option):
    info = webshop_reward.get_reward(SHOE, _option_goal(goal_options), 10.0, bought)[1]
    assert info['r_option'] == r_option


@needs_checkout
def test_option_quirks_equal_the_real_get_reward(real):
    for goal_options, bought, _ in OPTION_CASES:
        want = webshop_reward.get_reward(SHOE, _option_goal(goal_options), 10.0, bought)
        got = real.goal.get_reward(SHOE, _option_goal(goal_options), price=10.0, options=bought, verbose=True)
        assert got[0] == pytest.approx(want[0]) and got[1] == want[1], (goal_options, bought)


def test_token_set_ratio_equals_thefuzz():
    fuzz = pytest.importorskip('thefuzz.fuzz')
    rng = random.Random(2)
    words = ['navy', 'blue', 'size', '10', '10.5', 'x', 'Large', 'x-large', 'fl', 'oz', 'pack', 'of', '2',
             '3', 'caf\u00e9', 'na\u00efve\u2019s', 'snake_case', '', '  ', '!!']
    pairs = [(' '.join(rng.choices(words, k=rng.randint(0, 4))),
              ' '.join(rng.choices(words, k=rng.randint(0, 4))))
             for _ in range(800)] + [('blue', ('color', 'navy blue')), ('10', ('size', '10.5'))]
    for a, b in pairs:
        assert webshop_reward.token_set_ratio(a, b) == fuzz.token_set_ratio(a, b), (a, b)


# ------------------------------------------------------------------------------------------ a duck-typed fake

class FakeWebAgentTextEnv:
    """Only the surface of web_agent_site's WebAgentTextEnv that the adapter may use;
    the embedded engine behind."""

    def __init__(self, observation_mode='html', num_products=None, human_goals=None, **kwargs):
        assert observation_mode == 'text' and human_goals is False
        self._engine = webshop_engine.EmbeddedTextEnv(webshop_catalog.build_shop(1000, 0, 233))
        self.server = type('SimServer', (), {})()
        self.server.goals = self._engine.server.goals
        self.server.user_sessions = self._engine.server.user_sessions
        self.session = None

    @property
    def state(self):
        return {'url': self._engine.state['url'], 'html': '<html/>', 'instruction_text': 'unused'}

    def reset(self, session=None, instruction_text=None):
        self.session = str(session)
        return self._engine.reset(session)

    def step(self, action):
        return self._engine.step(action)

    def get_available_actions(self):
        return self._engine.get_available_actions()


def _episode(env, task, actions):
    return [env.reset(task)] + [env.step(a) for a in actions]


def test_adapter_on_the_fake_matches_the_embedded_backend(task0):
    actions = ["search[throw pillow covers]", "click[b00ck2eqk2]", "click[pink]", "click[features]",
               "click[< prev]", "click[20 x 20 inch]", "click[buy now]"]
    fake = _episode(webshop.WebShopEnv(CFG, text_env=FakeWebAgentTextEnv('text', human_goals=False)), task0,
                    actions)
    real = _episode(webshop.WebShopEnv(CFG), task0, actions)
    assert [(r.observation, r.admissible, r.signature, r.reward, r.done, r.score) for r in fake] == \
        [(r.observation, r.admissible, r.signature, r.reward, r.done, r.score) for r in real]
    assert fake[-1].won


def test_official_backend_imports_webagenttextenv_from_webshop_root(tmp_path, task0):
    pkg = tmp_path / "web_agent_site" / "envs"
    pkg.mkdir(parents=True)
    (tmp_path / "web_agent_site" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "web_agent_text_env.py").write_text(
        "from test_webshop_official import FakeWebAgentTextEnv as WebAgentTextEnv\n")
    cfg = webshop.WebShopConfig(backend="official", webshop_root=str(tmp_path))
    sys.path.insert(0, str(__import__('pathlib').Path(__file__).parent))
    # the real one
    cached = {m: sys.modules.pop(m) for m in list(sys.modules) if m.startswith("web_agent_site")}
    try:
        assert len(envs.load_tasks(cfg, "eval")) == 500 and len(envs.load_tasks(cfg, "train")) == 4789
        env = webshop.WebShopEnv(cfg)
        assert type(env.text_env).__name__ == "FakeWebAgentTextEnv"
        res = _episode(env, task0, webshop.oracle_actions(task0, CFG))[-1]
        assert res.won and res.reward == 10.0
        with pytest.raises(RuntimeError, match="embedded catalogue"):
            webshop.oracle_actions(task0, cfg)
    finally:
        for name in [m for m in sys.modules if m.startswith("web_agent_site")]:
            del sys.modules[name]
        sys.modules.update(cached)
        sys.path.remove(str(tmp_path))


def test_official_backend_without_a_checkout_says_what_to_do(tmp_path):
    with pytest.raises(RuntimeError, match="WEBSHOP_ROOT.*--webshop.backend embedded"):
        webshop.WebShopEnv(webshop.WebShopConfig(backend="official", webshop_root=""))
    with pytest.raises(RuntimeError, match="no web_agent_site"):
        webshop.WebShopEnv(webshop.WebShopConfig(backend="official", webshop_root=str(tmp_path)))
