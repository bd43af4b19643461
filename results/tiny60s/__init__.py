"""A horizon where learning finishes, from tiny60s (results/README.md, tiny60s): horizon.py, pick_lr.py, runs."""
