"""SmolLM2-135M-Instruct on arith (results/README.md, smollm2_arith): its runs, smollm2_seeds.py, smollm2_passk.py."""
