"""WebShop's reward (environments/webshop_reward.py): get_reward on the goal product against hand-computed
values (attributes, options, price), on wrong products (the category, query and title rules), each documented
deviation, and a wrong option bought in the env costing one option's share.

Run: .venv/bin/python -m pytest tests/test_webshop_reward.py -q
"""
import pytest

from environments import webshop_catalog, webshop_reward
from test_webshop import CFG, env, task0  # noqa: F401 (the fixtures, by name)


# ---------------------------------------------------------------------------------------------- reward

SHOE = {'asin': 'B000TEST01', 'query': "men's running shoes", 'product_category': 'Clothing › Men › Shoes',
        'name': "Acme Men's Running Shoes Lightweight Breathable",
        'Title': "Acme Men's Running Shoes Lightweight Breathable",
        'BulletPoints': ['Rubber sole', 'Lace up'], 'Description': 'Great shoes.',
        'Attributes': ['lightweight', 'breathable', 'rubber sole']}
GOAL = {'asin': 'B000TEST01', 'query': "men's running shoes", 'product_category': 'Clothing › Men › Shoes',
        'name': SHOE['Title'], 'attributes': ['lightweight', 'rubber sole'],
        'goal_options': {'color': 'navy blue', 'size': '10'}, 'price_upper': 50.0}
RIGHT = {'color': 'navy blue', 'size': '10'}


@pytest.mark.parametrize("product,price,options,expected", [
    (SHOE, 39.99, RIGHT, 1.0),                                      # 2 attrs + 2 options + price = 5/5
    (SHOE, 39.99, {'color': 'navy blue', 'size': '9'}, 0.8),        # size is exact-matched: 4/5
    (SHOE, 39.99, {'color': 'grey', 'size': '10'}, 0.8),            # grey vs blue: 4/5
    (SHOE, 39.99, {'color': 'royal blue', 'size': '10'}, 1.0),      # normalize_color: both are 'blue'
    (SHOE, 39.99, {}, 0.6),                                         # nothing chosen: 3/5
    (SHOE, 60.0, RIGHT, 0.8),                                       # over price: 4/5
])
def test_reward_of_the_goal_product(product, price, options, expected):
    reward, _ = webshop_reward.get_reward(product, GOAL, price, options)
    assert reward == pytest.approx(expected)


def test_reward_of_wrong_products():
    walking = {**SHOE, 'query': "women's walking shoes", 'product_category': 'Clothing › Women › Shoes',
               'name': "Zed Women's Walking Shoes Slip On", 'Title': "Zed Women's Walking Shoes Slip On",
               'BulletPoints': ['Memory foam insole'], 'Description': 'Comfortable walking shoes.',
               'Attributes': ['slip on', 'memory foam']}
    # same 2 of 3 category levels -> r_type 1; only the price matches: 1/5
    reward, info = webshop_reward.get_reward(walking, GOAL, 30.0, {})
    assert reward == pytest.approx(0.2)
    assert info['title_score'] == pytest.approx(1 / 6) and info['category_match'] and not info['query_match']
    # no shared category level, title_score 1/6 in [0.1, 0.2]: r_type 0.5 -> 1/5 * 0.5
    rack = {**walking, 'query': 'shoe rack', 'product_category': 'Home › Storage',
            'name': 'Garden Shoes Rack', 'Title': 'Garden Shoes Rack'}
    assert webshop_reward.get_reward(rack, GOAL, 30.0, {})[0] == pytest.approx(0.1)
    # nothing shared at all: title_score 0 -> r_type 0
    tea = {**rack, 'name': 'Green Tea Bags', 'Title': 'Green Tea Bags', 'product_category': 'Grocery › Tea'}
    reward, info = webshop_reward.get_reward(tea, GOAL, 5.0, {})
    assert (reward, info['r_type']) == (0.0, 0.0)
    assert set(info) == {'r_type', 'r_att', 'w_att', 'query_match', 'category_match', 'title_score',
                         'r_option', 'w_option', 'r_price', 'w_price'}


def test_reward_deviations_are_as_documented():
    # 1. title nouns: alphabetic tokens of >= 2 letters that are not function words
    assert (webshop_reward.title_nouns("Men's Running Shoes for the Gym, 2 Pack")
            == ['men', 'running', 'shoes', 'gym', 'pack'])
    # 2. token_set_ratio as thefuzz computes it (hand-computed Indel ratios, rounded)
    assert webshop_reward.token_set_ratio('pack of 2', 'pack of 3') == 89  # 2*8/(9+9) = 88.9
    assert webshop_reward.token_set_ratio('Rubber Sole!', 'sole rubber') == 100
    assert webshop_reward.token_set_ratio('blue', 'grey') == 25              # LCS 'e': 2*1/8
    assert webshop_reward.token_set_ratio('', 'x') == 0
    # not a deviation: options are matched per goal option, so extra purchased options never push r above 1
    no_options = {**GOAL, 'goal_options': {}}
    black = {**SHOE, 'Title': SHOE['Title'] + ' Black'}
    assert webshop_reward.get_reward(black, no_options, 39.99, {'color': 'black'})[0] == 1.0


def test_wrong_option_in_the_env_costs_one_option_share(env, task0):
    goal = webshop_catalog.build_shop(CFG.num_products, CFG.catalog_seed, CFG.goal_seed).goals[0]
    assert len(goal['attributes']) == 2 and len(goal['goal_options']) == 2
    env.reset(task0)
    for action in ["search[throw pillow covers]", "click[b00ck2eqk2]", "click[green]", "click[20 x 20 inch]"]:
        env.step(action)
    res = env.step("click[buy now]")
    assert res.score == pytest.approx(4 / 5) and (res.reward, res.won, res.done) == (0.0, False, True)
