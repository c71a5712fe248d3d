"""The paper's analyses behind `evaluate.py audit / intervene / plot`: audits.py, intervention.py (its
states in intervention_states.py), plots.py, each with its argument dataclass."""
