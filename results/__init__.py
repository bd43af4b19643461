"""The study of GRPO vs REINFORCE without a baseline (results/README.md): one subpackage per study, each folder with
its scripts, its runs and its tables; stats.py, paired.py, plot.py and spectrum.py serve several. Run the scripts as
modules from the repository root, e.g. `python -m results.tiny60s.horizon --help`."""
