"""Environments behind the `envs.py` contract: ALFWorld (alfworld.py, alfworld_games.py, planner.py), WebShop
(webshop.py adapter and config, webshop_engine.py, webshop_catalog.py, webshop_reward.py), TextWorld's own
games (textworld.py), one of yours (external.py: `--env package.module:Class`) and the env worker pool
(pool.py)."""
