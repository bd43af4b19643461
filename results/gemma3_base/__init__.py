"""Gemma 3 270M, a base model (results/README.md, gemma3_base): base_model.py and its runs."""
