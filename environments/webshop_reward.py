"""WebShop's purchase reward (web_agent_site/engine/goal.py::get_reward), reimplemented without spaCy or
thefuzz.

    r = (n_attr_match + n_option_match + [price <= price_upper])
        / (|goal attributes| + |goal options| + 1) * r_type

Products and goals are plain dicts with WebShop's own keys (`Title`, `BulletPoints`, `Description`,
`Attributes`, `query`, `product_category`, `name`; goals: `attributes`, `goal_options`, `price_upper`,
`query`, `product_category`, `name`), so the formula below reads like the upstream one.

Deviations from upstream (each is pinned by a test in tests/test_webshop.py; tests/test_webshop_official.py
compares this module with the real goal.py and thefuzz when a WebShop checkout is available):
1. title_score: upstream keeps the spaCy POS tags NOUN/PROPN of the goal and purchased product names. We have
   no spaCy model offline, so a token counts as a "noun" when it is alphabetic, at least 2 letters, and not a
   function word (`_FUNCTION_WORDS`). On Title-Cased product names spaCy tags most content words PROPN, so
   this is close; it is still a heuristic (adjectives such as "lightweight" count as nouns here).
2. token_set_ratio: a local port of thefuzz's token_set_ratio (thefuzz's default processing: drop characters
   128-255, non-alphanumerics to spaces, lowercase; ratio = Indel similarity 2*LCS/(len1+len2)*100, rounded
   like thefuzz). It is not the C implementation; the official test compares it with thefuzz.
Everything else follows upstream, including its option reward, which is easy to misread: for each goal option,
one match if any purchased option value (after normalize_color) has token_set_ratio > 85 with it. A synthetic
goal's options are a dict, and upstream passes its `.items()`, so each goal option is a (name, value) pair:
normalize_color on a pair returns a colour only when the name or the value *equals* one, and thefuzz compares
the value against the pair's text, i.e. the tokens of "name value" (so a purchased 'large' matches the goal
size 'x-large': its tokens are a subset). There is no exact matching for size and no fall-back on the product
text for options (that fall-back exists for attributes only); matches are counted per goal option, so r <= 1.
"""
import re

# web_agent_site/engine/normalize.py::COLOR_SET (order matters: the first substring hit wins).
COLOR_SET = [
    'alabaster', 'apricot', 'aqua', 'ash', 'asphalt', 'azure', 'banana', 'beige', 'black', 'blue', 'blush',
    'bordeaux', 'bronze', 'brown', 'burgundy', 'camel', 'camo', 'caramel', 'champagne', 'charcoal', 'cheetah',
    'chestnut', 'chocolate', 'christmas', 'coffee', 'cognac', 'copper', 'coral', 'cranberry', 'cream',
    'crystal', 'dark', 'denim', 'eggplant', 'elephant', 'espresso', 'fuchsia', 'gold', 'granite', 'grape',
    'graphite', 'grass', 'gray', 'green', 'grey', 'heather', 'indigo', 'ivory', 'ivy', 'khaki', 'lavender',
    'lemon', 'leopard', 'light', 'lilac', 'lime', 'magenta', 'maroon', 'mauve', 'merlot', 'midnight', 'mint',
    'mocha', 'multicolor', 'mushroom', 'mustard', 'natural', 'navy', 'nude', 'olive', 'orange', 'peach',
    'pewter', 'pink', 'plum', 'purple', 'rainbow', 'red', 'rose', 'royal', 'rust', 'sand', 'sapphire',
    'seashell', 'silver', 'skull', 'slate', 'steel', 'stone', 'stonewash', 'sunflower', 'tan', 'taupe',
    'teal', 'tiger', 'turquoise', 'violet', 'walnut', 'wheat', 'white', 'wine', 'yellow',
]
FUZZY_THRESHOLD = 85

# Deviation 1: words that spaCy would never tag NOUN/PROPN in a product name.
_FUNCTION_WORDS = frozenset("""
a an the and or of for with without to in on at by from into onto over under up down off out as is are be been
that this these those it its our your their his her my we you they he she them us not no nor so than too very
all any each every both few more most other some such only own same can will just also per via s t
""".split())


def normalize_color(color_string: str) -> str:
    """Upstream normalize_color: the first COLOR_SET entry that is a substring, else the string itself."""
    for norm_color in COLOR_SET:
        if norm_color in color_string:
            return norm_color
    return color_string


def _full_process(s) -> str:
    """thefuzz.utils.full_process(s, force_ascii=True): str(), drop chars 128-255,
    non-alphanumerics to spaces."""
    s = ''.join(c for c in str(s) if not 128 <= ord(c) <= 255)
    return ''.join(c if c.isalnum() else ' ' for c in s).lower().strip()


def _lcs_len(a: str, b: str) -> int:
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def ratio(a: str, b: str) -> float:
    """Indel similarity in [0, 100] (thefuzz.fuzz.ratio without rounding)."""
    if not a and not b:
        return 100.0
    return 200.0 * _lcs_len(a, b) / (len(a) + len(b))


def token_set_ratio(s1: str, s2: str) -> int:
    """thefuzz.fuzz.token_set_ratio (deviation 2): compare the shared tokens against each side's leftovers."""
    t1, t2 = set(_full_process(s1).split()), set(_full_process(s2).split())
    if not t1 or not t2:
        return 0
    sect, d12, d21 = t1 & t2, t1 - t2, t2 - t1
    if sect and (not d12 or not d21):
        return 100
    sorted_sect = ' '.join(sorted(sect))
    combined_12 = (sorted_sect + ' ' + ' '.join(sorted(d12))).strip()
    combined_21 = (sorted_sect + ' ' + ' '.join(sorted(d21))).strip()
    scores = [ratio(combined_12, combined_21)]
    if sorted_sect:
        scores += [ratio(sorted_sect, combined_12), ratio(sorted_sect, combined_21)]
    return int(round(max(scores)))


def title_nouns(name: str) -> list[str]:
    """Deviation 1: the 'nouns' of a product name, lowercased, in order."""
    return [t for t in re.findall(r'[a-z]+', name.lower()) if len(t) >= 2 and t not in _FUNCTION_WORDS]


def get_type_reward(purchased_product: dict, goal: dict) -> dict:
    """Same category? query match, >= 2 shared category levels, or title-noun overlap;
    see the r_type ladder."""
    query_match = purchased_product['query'] == goal['query']
    purchased_cat = {x.strip() for x in purchased_product['product_category'].split('›')}
    goal_cat = {x.strip() for x in goal['product_category'].split('›')}
    category_match = len(purchased_cat & goal_cat) >= 2
    purchased_type = title_nouns(purchased_product['name'])
    desired_type = title_nouns(goal['name'])
    n_intersect = len(set(purchased_type) & set(desired_type))
    title_score = 0.2 if len(desired_type) == 0 else n_intersect / len(desired_type)
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match,
                title_score=title_score)


def _in_product_text(text: str, product: dict) -> bool:
    return (text in product['Title'].lower() or text in ' '.join(product['BulletPoints']).lower()
            or text in product['Description'].lower())


def get_attribute_reward(purchased_product: dict, goal: dict) -> tuple[float, int]:
    """Each goal attribute matches a product attribute (token_set_ratio > 85) or appears in the product
    text."""
    n_matches = 0
    for g_attr in goal['attributes']:
        if any(token_set_ratio(p_attr, g_attr) > FUZZY_THRESHOLD
               for p_attr in purchased_product['Attributes']):
            n_matches += 1
        elif _in_product_text(g_attr, purchased_product):
            n_matches += 1
    return n_matches / len(goal['attributes']), n_matches


def normalize_goal_option(option):
    """normalize_color on a goal option: a value string (substring test) or a (name, value) pair
    (equality test)."""
    if isinstance(option, str):
        return normalize_color(option)
    return next((c for c in COLOR_SET if c in option), option)


def get_option_reward(purchased_options: list[str], goal_options: list) -> tuple:
    """Per goal option: matched when some purchased value has token_set_ratio > 85 with it
    (see the docstring)."""
    purchased = [normalize_color(o) for o in purchased_options]
    goal_opts = [normalize_goal_option(o) for o in goal_options]
    n_matches = sum(any(token_set_ratio(p, g) > FUZZY_THRESHOLD for p in purchased) for g in goal_opts)
    r_option = n_matches / len(goal_opts) if goal_opts else None
    return r_option, n_matches


def get_reward(purchased_product: dict, goal: dict, price: float, options: dict) -> tuple[float, dict]:
    """(reward in [0, 1], verbose_info) for buying `purchased_product` at `price` with `options` selected."""
    r_type = get_type_reward(purchased_product, goal)
    r_price = (price <= goal['price_upper']) if goal['price_upper'] > 0 else None
    r_att, n_attr = get_attribute_reward(purchased_product, goal)
    goal_options = goal['goal_options']
    goal_options = list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)
    r_option, n_option = get_option_reward(list(options.values()), goal_options)
    denom = len(goal['attributes']) + len(goal_options) + 1
    reward = (n_attr + n_option + bool(r_price)) / denom * r_type['r_type']
    info = {'r_type': r_type['r_type'], 'r_att': r_att, 'w_att': len(goal['attributes']) / denom,
            'query_match': r_type['query_match'], 'category_match': r_type['category_match'],
            'title_score': r_type['title_score']}
    if r_option is not None:
        info['r_option'] = r_option
        info['w_option'] = len(goal_options) / denom
    if r_price is not None:
        info['r_price'] = r_price
        info['w_price'] = 1 / denom
    return reward, info
