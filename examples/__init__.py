"""Worked examples of grpo.py's task of one's own; run each as a module from the repository root."""
