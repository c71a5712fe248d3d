"""Measurement only: a step's readings, never what enters the loss or the weights (step_readings.py: the
loop's one call; candidate_share.py, candidate_gain.py; grpo.update's term_grads.py, its gradient norms per
term, and actor_stats.py, the actor/ metrics it logs)."""
