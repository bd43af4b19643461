"""SmolLM2-135M-Instruct on arith, grpo vs reinforce, 3 seeds (results/README.md, smollm2_arith): one row per seed.

Reads FOLDER/<algo>_seed<k>.jsonl.gz (the gzipped metrics.jsonl of each run, written by the smollm2_arith part of
run_all.sh; FOLDER: --folder, smollm2_lr1e-5_B2_100steps/ here by default) and writes a markdown table (per seed,
then the mean and range over seeds) and a plot: train reward and entropy (10-step trailing mean, one thin line per
seed, the mean thick) and the greedy eval accuracy.

    python -m results.smollm2_arith.smollm2_seeds --md results/smollm2_arith/smollm2_lr1e-5_B2_100steps/seeds.md \
        --png results/smollm2_arith/smollm2_lr1e-5_B2_100steps/seeds.png
"""
import argparse
import glob
import os
import re
import statistics
import sys

from results.stats import moving_average, read_run, t_interval

HERE = os.path.dirname(os.path.abspath(__file__))

ALGOS = ("grpo", "reinforce")


def run_row(path):
    """The numbers of one run. First and last 10 steps for the train curves; evals by step."""
    config, train, evals = read_run(path)
    first = train[:10]
    last = train[-10:]
    mean = lambda xs, key: sum(x[key] for x in xs) / len(xs)  # noqa: E731
    return {"seed": config["seed"],
            "eval": {e["step"]: (e["acc_lenient"], e["acc_strict"]) for e in evals},
            "reward_first": mean(first, "reward_mean"), "reward_last": mean(last, "reward_mean"),
            "auc": mean(train, "reward_mean"),
            "entropy_first": mean(first, "entropy"), "entropy_last": mean(last, "entropy"),
            "kl_last": mean(last, "kl"), "all_correct": mean(train, "frac_all_correct"),
            "all_wrong": mean(train, "frac_all_wrong"), "len_first": mean(first, "completion_len"),
            "len_last": mean(last, "completion_len"), "step_min": sum(x["step_s"] for x in train) / 60,
            "reward": [x["reward_mean"] for x in train], "entropy": [x["entropy"] for x in train]}


def load(folder):
    runs = {}
    for algo in ALGOS:
        paths = sorted(glob.glob(os.path.join(folder, f"{algo}_seed*.jsonl.gz")),
                       key=lambda p: int(re.search(r"seed(\d+)", p).group(1)))
        runs[algo] = [run_row(p) for p in paths]
    if not any(runs.values()):
        sys.exit(f"error: no <algo>_seed<k>.jsonl.gz files in {folder}; run the smollm2_arith part of "
                 "results/run_all.sh first")
    return runs


def table(runs):
    steps = sorted({s for rs in runs.values() for r in rs for s in r["eval"]})
    head = ("| algo | seed | " + " | ".join(f"eval lenient (strict), step {s}" for s in steps)
            + " | train reward, first 10 → last 10 steps | mean train reward (AUC) | entropy, first 10 → last 10 "
            "| KL, last 10 | all-correct / all-wrong groups | answer tokens, first 10 → last 10 "
            "| step time, sum, min |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    cell = lambda r, s: "-" if s not in r["eval"] else "%.3f (%.3f)" % r["eval"][s]  # noqa: E731
    for algo, rs in runs.items():
        for r in rs:
            lines.append(f"| {algo} | {r['seed']} | " + " | ".join(cell(r, s) for s in steps)
                         + f" | {r['reward_first']:.3f} → {r['reward_last']:.3f} | {r['auc']:.3f} "
                         f"| {r['entropy_first']:.3f} → {r['entropy_last']:.3f} | {r['kl_last']:.3f} "
                         f"| {r['all_correct']:.3f} / {r['all_wrong']:.3f}"
                         f" | {r['len_first']:.1f} → {r['len_last']:.1f} | {r['step_min']:.0f} |")
    lines += ["", "Mean over seeds [min, max]:", "",
              "| algo | seeds | " + " | ".join(f"lenient, step {s}" for s in steps) + " | "
              + " | ".join(f"strict, step {s}" for s in steps) + " | train reward, last 10 | AUC | entropy, last 10 |",
              "|" + "---|" * (5 + 2 * len(steps))]
    span = lambda xs: f"{statistics.mean(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"  # noqa: E731
    for algo, rs in runs.items():
        if not rs:
            continue
        evals = [span([r["eval"][s][k] for r in rs if s in r["eval"]]) if any(s in r["eval"] for r in rs) else "-"
                 for k in (0, 1) for s in steps]
        lines.append(f"| {algo} | {len(rs)} | " + " | ".join(evals) + f" | {span([r['reward_last'] for r in rs])}"
                     f" | {span([r['auc'] for r in rs])} | {span([r['entropy_last'] for r in rs])} |")
    lines += ["", "Paired by seed (same questions, same starting policy), reinforce minus grpo:", "",
              "| seed | Δ lenient, last eval | Δ AUC | Δ train reward, last 10 | Δ entropy, last 10 |",
              "|---|---|---|---|---|"]
    grpo = {r["seed"]: r for r in runs["grpo"]}
    diffs = []
    for r in runs["reinforce"]:
        g = grpo.get(r["seed"])
        if g is not None:
            last = max(set(r["eval"]) & set(g["eval"]))
            diffs.append([r["eval"][last][0] - g["eval"][last][0], r["auc"] - g["auc"],
                          r["reward_last"] - g["reward_last"], r["entropy_last"] - g["entropy_last"]])
            lines.append(f"| {r['seed']} | {diffs[-1][0]:+.3f} (step {last}) | " + " | ".join(
                f"{x:+.3f}" for x in diffs[-1][1:]) + " |")
    if len(diffs) >= 2:  # the verdict rule's interval over seeds (stats.py); with 3 seeds a sign-flip p is >= 0.25
        cells = [t_interval([d[i] for d in diffs]) for i in range(4)]
        lines.append("| mean [95% t-interval] | " + " | ".join(
            f"{statistics.mean(d[i] for d in diffs):+.3f} [{lo:+.3f}, {hi:+.3f}]" for i, (lo, hi) in enumerate(cells))
            + " |")
    return "\n".join(lines) + "\n"


def plot(runs, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (ax_r, ax_e, ax_a) = plt.subplots(1, 3, figsize=(15, 3.8))
    for algo, color in zip(runs, ("C0", "C1")):
        rs = runs[algo]
        if not rs:
            continue
        for ax, key in ((ax_r, "reward"), (ax_e, "entropy")):
            curves = [moving_average(r[key]) for r in rs]
            for c in curves:
                ax.plot(np.arange(10, 10 + len(c)), c, color=color, alpha=0.35, lw=0.8)
            n = min(len(c) for c in curves)
            ax.plot(np.arange(10, 10 + n), np.mean([c[:n] for c in curves], 0), color=color, lw=2,
                    label=f"{algo} (n={len(rs)})")
        for r in rs:
            steps = sorted(r["eval"])
            ax_a.plot(steps, [r["eval"][s][0] for s in steps], color=color, marker="o", alpha=0.7,
                      label=f"{algo}, lenient" if r is rs[0] else None)
            ax_a.plot(steps, [r["eval"][s][1] for s in steps], color=color, marker="x", ls="--", alpha=0.7,
                      label=f"{algo}, strict (#### line)" if r is rs[0] else None)
    ax_r.set(title="train reward (10-step mean)", xlabel="step", ylim=(0, 1))
    ax_e.set(title="entropy, nats/token (10-step mean)", xlabel="step")
    ax_a.set(title="greedy eval accuracy, 200 held-out", xlabel="step", ylim=(0, 1))
    for ax in (ax_r, ax_e, ax_a):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, arith, G=8, B=2, lr 1e-5, thin: one seed, thick: mean", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--folder", default=os.path.join(HERE, "smollm2_lr1e-5_B2_100steps"))
    p.add_argument("--md", required=True)
    p.add_argument("--png", required=True)
    a = p.parse_args()
    runs = load(a.folder)
    with open(a.md, "w") as f:
        f.write(table(runs))
    plot(runs, a.png)
    print(open(a.md).read())


if __name__ == "__main__":
    main()
