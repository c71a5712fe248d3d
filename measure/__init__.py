"""Measurement only: a step's readings, never what enters the loss or the weights (step_readings.py: the
loop's one call; candidate_share.py, candidate_gain.py; term_grads.py: grpo.update's)."""
