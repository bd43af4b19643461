"""GRPO vs REINFORCE on a toy task, many seeds, identical settings.

Task: every question ('what is i?') has the answer 7. A tiny GPT-2 (2 layers, width 32, built from a
config with a character-level tokenizer, random weights) says 7 now and then by chance, so the reward
starts small but non-zero. For each seed (which sets the model's initial weights, the data order and
the sampling), both algorithms run with the same flags. Reported: steps until the 5-step moving
average of the train reward first reaches each threshold, and the mean reward over the last 10 steps.
The runs and the tables go to --out, by default the setting's folder here: toy_lr<lr>_B4_<steps>steps/.
Usage: python -m results.toy.toy_seeds --seeds 0 1 2 3 4 5 6 7 8 9 --steps 100 --lr 3e-3
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import grpo
from results.stats import lr_name
from testing_utils import make_tiny_model, write_data

HERE = os.path.dirname(os.path.abspath(__file__))


def steps_to(rewards, threshold, window=5):
    for i in range(window, len(rewards) + 1):
        if sum(rewards[i - window:i]) / window >= threshold:
            return i
    return None


def mean_std(xs, fmt=".1f"):
    return f"{statistics.mean(xs):{fmt}} ± {statistics.stdev(xs) if len(xs) > 1 else 0:{fmt}}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.5, 0.8])
    p.add_argument("--out", default=None, help="default: toy_lr<lr>_B4_<steps>steps/ here")
    p.add_argument("--summarize-only", action="store_true", help="rebuild the table from the metrics files in --out")
    a = p.parse_args()
    a.out = a.out or os.path.join(HERE, f"toy_lr{lr_name(a.lr)}_B4_{a.steps}steps")
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    rows = [{"question": f"what is {i}?", "answer": "#### 7"} for i in range(64)]
    data = write_data(os.path.join(tmp, "data"), rows, rows[:16])
    t0 = time.time()
    if not a.summarize_only:
        for seed in a.seeds:
            model = make_tiny_model(os.path.join(tmp, f"model{seed}"), seed=seed)
            for algo in ("grpo", "reinforce"):
                run = os.path.join(tmp, f"{algo}{seed}")
                grpo.train(grpo.get_args([
                    "--model", model, "--dataset", data, "--algo", algo, "--G", "8", "--batch-prompts", "4",
                    "--steps", str(a.steps), "--max-new-tokens", "3", "--micro-batch", "32", "--lr", str(a.lr),
                    "--beta", "0.04", "--eval-every", "0", "--eval-n", "16", "--seed", str(seed), "--dtype", "float32",
                    "--out", run]))
                shutil.copy(os.path.join(run, "metrics.jsonl"), os.path.join(a.out, f"{algo}_seed{seed}.jsonl"))
    summary = {"grpo": [], "reinforce": []}
    spread = {}
    for algo in summary:
        curves = []
        for seed in a.seeds:
            path = os.path.join(a.out, f"{algo}_seed{seed}.jsonl")
            rewards = [x["reward_mean"] for x in map(json.loads, open(path)) if x["type"] == "train"]
            windows = [rewards[max(0, i - 4):i + 1] for i in range(len(rewards))]  # 5 steps, fewer at the start
            curves.append([sum(w) / len(w) for w in windows])
            summary[algo].append({"seed": seed, "final_reward": sum(rewards[-10:]) / 10,
                                  **{f"steps_to_{t}": steps_to(rewards, t) for t in a.thresholds}})
        # seed-to-seed spread of the learning curve: std over seeds of the 5-step mean reward, averaged over steps
        half = len(curves[0]) // 2
        spread[algo] = [statistics.mean(statistics.stdev(c[i] for c in curves) for i in rng) for rng in
                        (range(half), range(half, len(curves[0])))]
    lines = [f"Toy task (answer is always 7), tiny GPT-2, G=8, B=4, lr {a.lr}, beta 0.04, {a.steps} steps, "
             f"{len(a.seeds)} seeds. Steps to T: first step at which the 5-step mean train reward reaches T, "
             f"mean ± std over the seeds that reached it. Spread: std over seeds of the 5-step mean reward, "
             f"averaged over the steps of each half of the run.", "",
             "| algo | " + " | ".join(f"steps to {t}" for t in a.thresholds)
             + " | final reward (last 10 steps) | spread, first half | spread, second half |",
             "|---|" + "---|" * (len(a.thresholds) + 3)]
    for algo, runs in summary.items():
        cells = []
        for t in a.thresholds:
            reached = [r[f"steps_to_{t}"] for r in runs if r[f"steps_to_{t}"] is not None]
            cells.append(f"{mean_std(reached)} ({len(reached)}/{len(runs)})" if reached else f"never (0/{len(runs)})")
        cells.append(mean_std([r["final_reward"] for r in runs], ".3f"))
        cells += [f"{x:.3f}" for x in spread[algo]]
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    if not a.summarize_only:
        lines.append(f"\nWall time for all runs: {time.time() - t0:.0f} s.")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
