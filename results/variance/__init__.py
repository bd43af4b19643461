"""Gradient variance at a fixed policy (results/README.md, variance): grad_variance.py and its measurements."""
