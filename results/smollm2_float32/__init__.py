"""SmolLM2-135M-Instruct on arith in float32 (results/README.md, smollm2_float32): run.py, report.py and its runs."""
