"""Public test kit: simulated clusters, nemeses, history recorders and checkers."""
