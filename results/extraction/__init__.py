"""Answer extraction, grpo.py against lm-evaluation-harness (results/README.md): compare.py and agreement.md."""
