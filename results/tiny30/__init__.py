"""Many seeds on tiny30 (results/README.md, tiny30): seeds.py (the runner), passk.py, their runs and tables."""
