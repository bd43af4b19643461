"""The learning rate of each algorithm for the tiny60s horizon runs, by the rule fixed before the sweep's first run
finished, from the sweep's files results/tiny60s/tiny60s_lr<lr>_B16_500steps_passk/<algo>_seed<k>.jsonl.gz:

  a rate is out if on any seed the mean train reward of steps 451-500 is below that of steps 1-50 (a collapse);
  of the rest, the rate with the highest train reward over steps 401-500, averaged over seeds 0-2, is the algorithm's.

Train reward only: the held-out questions play no part in the choice. An algorithm whose 9 runs are not all there
gets no rate yet.

    python -m results.tiny60s.pick_lr --md results/tiny60s/lr_sweep.md --json results/tiny60s/lr.json
"""
import argparse
import json
import os

from results.stats import lr_name, read_run

HERE = os.path.dirname(os.path.abspath(__file__))

LRS = [1e-4, 3e-4, 1e-3]
SEEDS = [0, 1, 2]
ALGOS = ["grpo", "reinforce"]


def numbers(path):
    """Mean train reward of steps 1-50, 401-500 and 451-500, and KL over the last 20 steps, of one 500-step run."""
    _, train, _ = read_run(path)
    r = [x["reward_mean"] for x in train]
    assert len(r) == 500, path
    return {"first50": sum(r[:50]) / 50, "last100": sum(r[400:]) / 100, "last50": sum(r[450:]) / 50,
            "kl": sum(x["kl"] for x in train[-20:]) / 20}


def pick(study, policy="tiny60s"):
    """{algo: {"rates": {lr: {seed: numbers}}, "out": [lr], "mean_last100": {lr: mean}, "chosen": lr or None}}."""
    out = {}
    for algo in ALGOS:
        rates = {}
        for lr in LRS:
            folder = os.path.join(study, f"{policy}_lr{lr_name(lr)}_B16_500steps_passk")
            for seed in SEEDS:
                path = os.path.join(folder, f"{algo}_seed{seed}.jsonl.gz")
                if os.path.exists(path):
                    rates.setdefault(lr_name(lr), {})[seed] = numbers(path)
        done = all(len(rates.get(lr_name(lr), {})) == len(SEEDS) for lr in LRS)
        collapsed = [lr for lr, by_seed in rates.items() if any(x["last50"] < x["first50"] for x in by_seed.values())]
        means = {lr: sum(x["last100"] for x in by_seed.values()) / len(by_seed) for lr, by_seed in rates.items()}
        kept = {lr: m for lr, m in means.items() if lr not in collapsed}
        out[algo] = {"rates": rates, "out": collapsed, "mean_last100": means,
                     "chosen": max(kept, key=kept.get) if done and kept else None}
    return out


def table(choice):
    lines = ["| algo | lr | seeds | train reward, steps 1-50 → 451-500, per seed | collapse | train reward, steps "
             "401-500, per seed | mean over seeds | KL, last 20 steps, per seed | chosen |",
             "|---|---|---|---|---|---|---|---|---|"]
    for algo, c in choice.items():
        for lr, by_seed in c["rates"].items():
            seeds = sorted(by_seed)
            cells = [algo, lr, ", ".join(map(str, seeds)),
                     "; ".join(f"{by_seed[s]['first50']:.3f} → {by_seed[s]['last50']:.3f}" for s in seeds),
                     "yes" if lr in c["out"] else "no", ", ".join(f"{by_seed[s]['last100']:.3f}" for s in seeds),
                     f"{c['mean_last100'][lr]:.3f}", ", ".join(f"{by_seed[s]['kl']:.3f}" for s in seeds),
                     "**yes**" if c["chosen"] == lr else ""]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", default=HERE, help="the folder of the sweep's settings (default: this one)")
    p.add_argument("--md", default=None)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    choice = pick(a.study)
    lines = ["Learning-rate sweep for the tiny60s horizon runs: 500 steps, 16 questions x 8 answers per step, seeds "
             "0-2. Rule (fixed before the first run finished): a rate is out if on any seed the train reward of "
             "steps 451-500 is below that of steps 1-50; of the rest, the highest train reward over steps 401-500, "
             "averaged over the seeds, wins.", ""] + table(choice) + [""]
    lines += [f"Chosen: {algo} {c['chosen'] or 'not yet (sweep incomplete)'}" for algo, c in choice.items()]
    text = "\n".join(lines)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({algo: {"chosen": c["chosen"], "out": c["out"], "mean_last100": c["mean_last100"]}
                       for algo, c in choice.items()}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
