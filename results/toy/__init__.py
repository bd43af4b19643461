"""The toy task, 10 seeds (results/README.md, toy): toy_seeds.py and its runs."""
