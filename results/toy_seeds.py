"""GRPO vs REINFORCE on a toy task, many seeds, identical settings.

Task: every question ('what is i?') has the answer 7. A tiny GPT-2 (2 layers, width 32, built from a
config with a character-level tokenizer, random weights) says 7 now and then by chance, so the reward
starts small but non-zero. For each seed (which sets the model's initial weights, the data order and
the sampling), both algorithms run with the same flags. Reported: steps until the 5-step moving
average of the train reward first reaches the threshold, and the mean reward over the last 10 steps.
Usage: python results/toy_seeds.py --seeds 0 1 2 3 4 5 6 7 8 9 --steps 100 --lr 3e-3
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import grpo  # noqa: E402
from test_grpo import make_tiny_model, write_data  # noqa: E402


def steps_to(rewards, threshold, window=5):
    for i in range(window, len(rewards) + 1):
        if sum(rewards[i - window:i]) / window >= threshold:
            return i
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threshold", type=float, default=0.5)
    p.add_argument("--out", default=os.path.join(HERE, "toy"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    rows = [{"question": f"what is {i}?", "answer": "#### 7"} for i in range(64)]
    data = write_data(os.path.join(tmp, "data"), rows, rows[:16])
    summary, t0 = {"grpo": [], "reinforce": []}, time.time()
    for seed in a.seeds:
        model = make_tiny_model(os.path.join(tmp, f"model{seed}"), seed=seed)
        for algo in ("grpo", "reinforce"):
            run = os.path.join(tmp, f"{algo}{seed}")
            grpo.train(grpo.get_args([
                "--model", model, "--dataset", data, "--algo", algo, "--G", "8", "--batch-prompts", "4",
                "--steps", str(a.steps), "--max-new-tokens", "3", "--micro-batch", "32", "--lr", str(a.lr),
                "--beta", "0.04", "--eval-every", "0", "--eval-n", "16", "--seed", str(seed), "--out", run]))
            dest = os.path.join(a.out, f"{algo}_seed{seed}.jsonl")
            shutil.copy(os.path.join(run, "metrics.jsonl"), dest)
            rewards = [x["reward_mean"] for x in map(json.loads, open(dest)) if x["type"] == "train"]
            summary[algo].append({"seed": seed, "steps_to_threshold": steps_to(rewards, a.threshold),
                                  "final_reward": sum(rewards[-10:]) / 10})
    lines = [f"Toy task (answer is always 7), tiny GPT-2, G=8, B=4, lr {a.lr}, beta 0.04, {a.steps} steps, "
             f"{len(a.seeds)} seeds; threshold: 5-step mean train reward >= {a.threshold}. "
             f"Wall time {time.time() - t0:.0f} s.", "",
             "| algo | steps to threshold, mean ± std (runs that reached it) | final reward (last 10 steps), mean ± std |",
             "|---|---|---|"]
    for algo, runs in summary.items():
        reached = [r["steps_to_threshold"] for r in runs if r["steps_to_threshold"] is not None]
        finals = [r["final_reward"] for r in runs]
        steps_txt = (f"{statistics.mean(reached):.1f} ± {statistics.stdev(reached) if len(reached) > 1 else 0:.1f} "
                     f"({len(reached)}/{len(runs)})") if reached else f"never (0/{len(runs)})"
        lines.append(f"| {algo} | {steps_txt} | {statistics.mean(finals):.3f} ± {statistics.stdev(finals):.3f} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
