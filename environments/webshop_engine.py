"""The embedded WebShop engine: WebShop's `WebAgentTextEnv` (text mode) + `SimServer` in pure Python.

`EmbeddedTextEnv` has the surface of `web_agent_site.envs.web_agent_text_env.WebAgentTextEnv` in the
princeton-nlp/WebShop repository (`reset(session=idx)`, `step(action)`, `get_available_actions()`,
`state['url']`, `session`, `server.user_sessions`, `server.goals`) over the seeded catalogue of
webshop_catalog.py, with the reward of webshop_reward.py. Page strings, clickables, transitions and
invalid-action behaviour follow the upstream templates and `SimServer.receive`: `search[...]` works from any
page, option clicks change the session but not the text, `Next >` is always shown, click arguments are
lowercased, anything else is a no-op with reward 0. tests/test_webshop_official.py runs the real
WebAgentTextEnv (its templates and BeautifulSoup text conversion) over this catalogue and compares every page,
clickable list, URL and reward with this engine.

Deviation (numbered as in webshop.py): 1. The done page's hidden block is rendered from upstream's
done_page.html with what `SimServer.done` passes (code, attributes, goal and reward details are None).
"""
import json
import re
from collections import defaultdict

from environments.webshop_catalog import Shop
from environments.webshop_reward import get_reward

BASE_URL = 'http://127.0.0.1:3000'
SUB_PAGES = ('Description', 'Features', 'Reviews', 'Attributes')
_ACTION_RE = re.compile(r'(.+)\[(.+)\]')


def split_command(action: str) -> tuple[str, str | None]:
    """WebShop's engine.parse_action: 'name[arg]' -> (name, arg), anything else -> (action, None)."""
    m = _ACTION_RE.match(action)
    return (action, None) if m is None else (m.group(1), m.group(2))


def _tojson(options: dict) -> str:
    """Flask's `tojson` filter: sorted keys, HTML-unsafe characters escaped."""
    s = json.dumps(options, sort_keys=True)
    return s.replace('<', '\\u003c').replace('>', '\\u003e').replace('&', '\\u0026').replace("'", '\\u0027')


class _Server:
    """The SimServer state the adapter reads: goals and per-session dicts."""

    def __init__(self, shop: Shop):
        self.goals = shop.goals
        self.user_sessions: dict[str, dict] = {}


class EmbeddedTextEnv:
    """WebAgentTextEnv(observation_mode='text') + SimServer over the embedded shop; same surface,
    same strings."""

    def __init__(self, shop: Shop):
        self.server = _Server(shop)
        self.shop = shop
        self.session: str | None = None
        self.current_url: str | None = None
        self.texts: list[str] = []                      # visible strings of the current page
        self.clickables: dict[str, tuple[str, str]] = {}  # lowercased text -> (kind, payload)
        self.has_search_bar = False

    @property
    def state(self) -> dict:
        return {'url': self.current_url, 'html': None, 'instruction_text': self._goal()['instruction_text']}

    @property
    def observation(self) -> str:
        return ' [SEP] '.join(self.texts)

    def get_available_actions(self) -> dict:
        return {'has_search_bar': self.has_search_bar, 'clickables': list(self.clickables)}

    def reset(self, session: int, instruction_text=None):
        self.session = str(session)
        if self.session not in self.server.user_sessions:
            self.server.user_sessions[self.session] = {'goal': self.server.goals[int(session)], 'done': False}
        self._index()
        return self.observation, None

    def step(self, action: str):
        name, arg = split_command(action)
        arg = arg.lower() if arg is not None else None
        reward, done = 0.0, False
        if name == 'search' and arg:
            self._search_results(arg.split(' '), 1)
        elif name == 'click' and arg in self.clickables and arg != 'search':
            reward, done = self._click(arg)
        return self.observation, reward, done, None

    # -- SimServer.receive
    def _sess(self) -> dict:
        return self.server.user_sessions[self.session]

    def _goal(self) -> dict:
        return self._sess()['goal']

    def _page_name(self) -> str:
        return page_name(self.current_url)

    def _click(self, arg: str) -> tuple[float, bool]:
        page = self._page_name()
        sess = self._sess()
        if arg == 'buy now':
            return self._done()
        if arg == 'back to search':
            self._index()
        elif arg == 'next >' and page == 'search_results':
            self._search_results(sess['keywords'], sess['page'] + 1)
        elif arg == '< prev' and page == 'search_results':
            self._search_results(sess['keywords'], sess['page'] - 1)
        elif arg == '< prev' and page == 'item_sub_page':
            self._item_page()
        elif arg == '< prev' and page == 'item_page':
            self._search_results(sess['keywords'], sess['page'])
        elif arg in [k.lower() for k in SUB_PAGES]:
            self._item_sub_page(arg)
        else:
            kind, payload = self.clickables[arg]
            if kind == 'link':
                sess['asin'] = payload
                sess['actions']['asin'] += 1
                sess['asins'].add(payload)
            elif kind == 'option':
                sess['options'][payload] = arg
                sess['actions']['options'] += 1
            self._item_page()
        return 0.0, False

    def _index(self) -> None:
        self._sess().update({'keywords': None, 'page': None, 'asin': None, 'asins': set(), 'options': {},
                             'actions': defaultdict(int)})
        self.current_url = f'{BASE_URL}/{self.session}'
        self.texts = ['WebShop', 'Instruction:', self._goal()['instruction_text'], 'Search']
        self.clickables = {'search': ('button', '')}
        self.has_search_bar = True

    def _search_results(self, keywords: list[str], page: int) -> None:
        sess = self._sess()
        sess.update({'page': page, 'keywords': keywords, 'asin': None, 'options': {}})
        sess['actions']['search'] += 1
        top = self.shop.search(keywords)
        products = top[(page - 1) * 10:page * 10]
        self.current_url = f"{BASE_URL}/search_results/{self.session}/{'+'.join(keywords)}/{page}"
        self.texts = (['Instruction:', self._goal()['instruction_text'], 'Back to Search',
                       f'Page {page} (Total results: {len(top)})']
                      + (['< Prev'] if page > 1 else []) + ['Next >'])
        self.clickables = {'back to search': ('button', '')}
        if page > 1:
            self.clickables['< prev'] = ('button', '')
        self.clickables['next >'] = ('button', '')
        for p in products:
            self.texts += [p['asin'], p['Title'], p['Price']]
            self.clickables[p['asin'].lower()] = ('link', p['asin'])
        self.has_search_bar = False

    def _header(self) -> list[str]:
        return ['Instruction:', self._goal()['instruction_text'], 'Back to Search', '< Prev']

    def _item_page(self) -> None:
        sess = self._sess()
        product = self.shop.by_asin[sess['asin']]
        kw = '+'.join(sess['keywords'])
        self.current_url = (f"{BASE_URL}/item_page/{self.session}/{sess['asin']}/{kw}/{sess['page']}/"
                            f"{json.dumps(sess['options'])}")
        self.texts = self._header()
        for name, values in product['options'].items():
            self.texts += [name] + values
        self.texts += [product['Title'], f"Price: {product['Price']}", f"Rating: {product['Rating']}",
                       'Description', 'Features', 'Reviews', 'Buy Now']
        self.clickables = {k: ('button', '') for k in ('back to search', '< prev', 'description', 'features',
                                                       'reviews', 'buy now')}
        for name, values in product['options'].items():
            # radio inputs keyed by value: a value shared by two options goes to the last one
            for v in values:
                self.clickables[v] = ('option', name)
        self.has_search_bar = False

    def _item_sub_page(self, arg: str) -> None:
        sess = self._sess()
        sub = next(k for k in SUB_PAGES if k.lower() == arg)
        sess['actions'][sub] += 1
        product = self.shop.by_asin[sess['asin']]
        self.current_url = (f"{BASE_URL}/item_sub_page/{self.session}/{sess['asin']}/"
                            f"{'+'.join(sess['keywords'])}/{sess['page']}/{sub}/{sess['options']}")
        content = {'Description': [product['Description']], 'Features': list(product['BulletPoints']),
                   'Reviews': [],
                   'Attributes': list(product['Attributes']) + [product['category'], product['query'],
                                                                product['product_category']]}[sub]
        self.texts = self._header() + content
        self.clickables = {'back to search': ('button', ''), '< prev': ('button', '')}
        self.has_search_bar = False

    def _done(self) -> tuple[float, bool]:
        sess = self._sess()
        sess['actions']['purchase'] += 1
        product = self.shop.by_asin[sess['asin']]
        reward, info = get_reward(product, sess['goal'], self.shop.prices[sess['asin']], sess['options'])
        sess.update({'verbose_info': info, 'done': True, 'reward': reward})
        self.current_url = f"{BASE_URL}/done/{self.session}/{sess['asin']}/{sess['options']}"
        # deviation 1: done_page.html as SimServer.done renders it
        # (goal / attrs / details not passed -> None / '')
        self.texts = ['Thank you for shopping with us!', 'Your code:', 'None',
                      '(Paste it in your MTurk interface.)', 'Purchased', 'asin', sess['asin'], 'options',
                      _tojson(sess['options']), 'attrs', 'None', 'category', 'None', 'query', 'None',
                      'product category', 'None', 'Target', 'asin', 'options', 'attrs', 'price upper',
                      'instuction text', 'category', 'product category', 'query', 'Goal', 'None', 'Reward',
                      'Your score (min 0.0, max 1.0)', str(reward), 'Reward Details', 'None']
        self.clickables = {}
        self.has_search_bar = False
        return reward, True


def page_name(url: str | None) -> str:
    """SimServer.get_page_name: the first of search_results, item_page, item_sub_page, done that occurs
    anywhere in the URL (keywords included, as upstream), else '' (the search page)."""
    return next((name for name in ('search_results', 'item_page', 'item_sub_page', 'done')
                 if name in (url or '')), '')
