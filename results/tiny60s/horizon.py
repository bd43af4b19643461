"""A horizon where learning finishes: the pass@k spectrum along training, from results/tiny60s/<setting>/.

Each file <algo>_seed<k>.jsonl.gz there is one `results.tiny30.seeds run --eval-samples 64 --batch-prompts B
--steps S` run, with eval lines at steps 0, S/4, S/2, 3S/4 and S: pass@k for k = 1, 2, .., 64 from 64 answers per
question sampled at T = 1.0, maj@64 and greedy accuracy, on the 200 held-out questions of that seed. The step-0 evals
of all algorithms on a seed are the same draw (same policy, same sampler seed); this script checks that.

Tables: the train reward per quarter of the run and the paired differences between algorithms in each quarter
(does an early lead survive to the end?); pass@k, maj@64 and greedy accuracy at each eval; their paired differences
against the starting policy and between algorithms. CIs: 95% percentile bootstrap over seeds (stats.bootstrap_ci);
each seed has its own 200 questions, not resampled within a seed. Steps to 0.5 and 0.8 come from
`results.tiny30.seeds summarize` on the same setting.

Usage (settings are folders of --study, results/tiny60s by default):
    python -m results.tiny60s.horizon --setting grpo=tiny60s_lr1e-4_B16_1000steps_passk \
      reinforce=tiny60s_lr1e-4_B16_1000steps_passk negative=tiny60s_lr3e-4_B16_1000steps_passk --md OUT.md --png OUT.png
    python -m results.tiny60s.horizon --sweep --setting tiny30_lr3e-4_B16_500steps_passk \
      tiny30_lr1e-3_B16_500steps_passk
"""
import argparse
import json
import os

from results import paired
from results.stats import ALGOS, band, ci, fmt_steps, moving_average, read_run, sd_ratio, steps_to

HERE = os.path.dirname(os.path.abspath(__file__))

KS = [1, 2, 4, 8, 16, 32, 64]
COLS = ["pass@1", "pass@4", "pass@16", "pass@64", "maj@64", "acc_lenient"]
NAMES = {"acc_lenient": "greedy"}
PAIRS = [("reinforce", "grpo"), ("negative", "grpo"), ("negative", "reinforce")]


def load(specs, study=HERE):
    """{algo: {seed: (train lines, eval lines)}} from specs 'FOLDER' or 'algo=FOLDER' (as paired.py reads them), each
    algorithm with every seed it has; paired.load checks that each seed's step-0 evals are one draw."""
    return {a: dict(sorted(by_seed.items())) for a, by_seed in paired.load(specs, study).items()}


def starts(runs):
    """{seed: step-0 eval} over every seed of every algorithm (one draw per seed, as load checks)."""
    return {s: ev[0] for by_seed in runs.values() for s, (_, ev) in sorted(by_seed.items())}


def quarters(train, key="reward_mean"):
    """Mean of a train-line value (the reward by default) in each quarter of the run."""
    n = len(train) // 4
    return [sum(x[key] for x in train[i * n:(i + 1) * n]) / n for i in range(4)]


def rew(train):
    return [x["reward_mean"] for x in train]


def end_minus_start(by_seed, ks):
    """Per-seed rows of Δ pass@k, the last eval minus step 0, from one algorithm's {seed: (train, evals)}."""
    return [[ev[-1][f"pass@{k}"] - ev[0][f"pass@{k}"] for k in ks] for _, ev in by_seed.values()]


def summary(runs, S):
    """One row per algorithm, the numbers results/README.md puts in one table: steps to 0.8, the train reward of the
    first and last quarter and of the last 50 steps (with its sd over seeds), KL and entropy of the last 20 steps,
    and the spectrum at the last eval; mean [95% bootstrap CI] over seeds."""
    import statistics
    numbers = {algo: [paired.train_numbers(tr) for tr, _ in by_seed.values()] for algo, by_seed in runs.items()}
    cols = ["pass@1", "pass@16", "pass@64", "maj@64"]
    lines = ["The runs at a glance, mean [95% CI] over seeds (steps to 0.8: seeds that reached it, their mean [CI]):",
             "", f"| algo | seeds | steps to 0.8 | train reward, steps 1-{S // 4} | steps {3 * S // 4 + 1}-{S} | "
             f"last 50 steps (sd over seeds) | KL, last 20 steps | entropy, last 20 steps | "
             + " | ".join(f"{c}, step {S}" for c in cols) + " |", "|---" * 12 + "|"]
    start = starts(runs)
    lines.append(f"| start | {len(start)} | - | - | - | - | - | - | " + " | ".join(
        f"{sum(ev[c] for ev in start.values()) / len(start):.3f}" for c in cols) + " |")
    for algo, by_seed in runs.items():
        get = lambda key: [x[key] for x in numbers[algo]]  # noqa: E731
        last50 = [sum(rew(tr)[-50:]) / 50 for tr, _ in by_seed.values()]
        lines.append(f"| {algo} | {len(by_seed)} | {fmt_steps(get('steps to 0.8'))} | "
                     f"{ci(get('train reward, first quarter'))} | "
                     f"{ci(get('train reward, last quarter'))} | {ci(last50)} ({statistics.stdev(last50):.3f}) | "
                     f"{ci(get('KL, last 20 steps'))} | {ci(get('entropy, last 20 steps'))} | "
                     + " | ".join(ci([ev[-1][c] for _, ev in by_seed.values()]) for c in cols) + " |")
    return lines + [""]


def tables(runs):
    steps = [e["step"] for e in next(iter(next(iter(runs.values())).values()))[1]]
    S = steps[-1]
    lines = summary(runs, S) + [
        "Train reward per quarter of the run (mean over the quarter's steps), mean [95% CI] over seeds:", "",
        "| algo | " + " | ".join(f"steps {i * S // 4 + 1}-{(i + 1) * S // 4}" for i in range(4))
        + " | entropy, last 20 steps |", "|---|" + "---|" * 5]
    for algo, by_seed in runs.items():
        q = [quarters(tr) for tr, _ in by_seed.values()]
        ent = [sum(x["entropy"] for x in tr[-20:]) / 20 for tr, _ in by_seed.values()]
        lines.append(f"| {algo} | " + " | ".join(ci([x[i] for x in q]) for i in range(4)) + f" | {ci(ent)} |")
    lines += ["", "Paired by seed, train reward per quarter:", "",
              "| difference | " + " | ".join(f"Δ steps {i * S // 4 + 1}-{(i + 1) * S // 4}" for i in range(4))
              + " | seeds ahead in the last quarter |", "|---|" + "---|" * 5]
    for a, b in PAIRS:
        if a in runs and b in runs:
            d = [[x - y for x, y in zip(quarters(runs[a][s][0]), quarters(runs[b][s][0]))]
                 for s in paired.common(runs, a, b)]
            ahead = sum(x[3] > 0 for x in d)
            lines.append(f"| {a} - {b} | " + " | ".join(ci([x[i] for x in d], sign=True) for i in range(4))
                         + f" | {ahead}/{len(d)} |")
    spans = [f"steps {i * S // 4 + 1}-{(i + 1) * S // 4}" for i in range(4)]
    lines += ["", "Entropy (nats per sampled token) per quarter of the run, mean [95% CI] over seeds; paired "
              "differences below:", "", "| algo | " + " | ".join(spans) + " |", "|---|" + "---|" * 4]
    for algo, by_seed in runs.items():
        q = [quarters(tr, "entropy") for tr, _ in by_seed.values()]
        lines.append(f"| {algo} | " + " | ".join(ci([x[i] for x in q]) for i in range(4)) + " |")
    for a, b in PAIRS:
        if a in runs and b in runs:
            d = [[x - y for x, y in zip(quarters(runs[a][s][0], "entropy"), quarters(runs[b][s][0], "entropy"))]
                 for s in paired.common(runs, a, b)]
            lines.append(f"| {a} - {b} | " + " | ".join(ci([x[i] for x in d], sign=True) for i in range(4)) + " |")
    lines += ["", "Steps to a train reward of 0.8 (10-step trailing mean), paired by seed over the seeds where both "
              "reached it:", "", "| difference | seeds | Δ steps to 0.8 | seeds where the first is sooner |",
              "|---|---|---|---|"]
    for a, b in PAIRS:
        if a in runs and b in runs:
            hit = [(steps_to(rew(runs[a][s][0]), 0.8), steps_to(rew(runs[b][s][0]), 0.8))
                   for s in paired.common(runs, a, b)]
            d = [x - y for x, y in hit if max(x, y) < float("inf")]
            cell = ci(d, digits=0, sign=True) if d else "-"
            lines.append(f"| {a} - {b} | {len(d)}/{len(hit)} | {cell} | {sum(x < 0 for x in d)}/{len(d)} |")
    lines += ["", "Spread over seeds (the seed-to-seed variance of a whole run): standard deviation over seeds of the "
              "mean train reward of the last 50 steps and of pass@1 at the last eval; the ratio with a 95% bootstrap "
              "CI that resamples seeds (the seeds both algorithms have):", "",
              "| algos | sd of reward, last 50 steps | ratio | sd of pass@1, last eval | ratio |", "|---" * 5 + "|"]
    last50 = {a: {s: sum(rew(tr)[-50:]) / 50 for s, (tr, _) in by_seed.items()} for a, by_seed in runs.items()}
    final = {a: {s: ev[-1]["pass@1"] for s, (_, ev) in by_seed.items()} for a, by_seed in runs.items()}
    for a, b in PAIRS:
        if a in runs and b in runs:
            both = paired.common(runs, a, b)
            cells = [f"{sd_ratio([x[a][s] for s in both], [x[b][s] for s in both])}" for x in (last50, final)]
            lines.append(f"| {a} / {b} | {cells[0]} | {cells[1]} |")
    cols = [NAMES.get(c, c) for c in COLS]
    lines += ["", "pass@k (64 answers per question, T = 1.0), maj@64 and greedy accuracy along training, mean [95% "
              "CI] over seeds:", "", "| algo | step | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    lines.append("| start | 0 | " + " | ".join(ci([ev[c] for ev in starts(runs).values()]) for c in COLS) + " |")
    for algo, by_seed in runs.items():
        for i, step in enumerate(steps[1:], 1):
            lines.append(f"| {algo} | {step} | " + " | ".join(
                ci([ev[i][c] for _, ev in by_seed.values()]) for c in COLS) + " |")
    lines += ["", "Paired by seed, minus the starting policy (same questions):", "",
              "| algo | step | " + " | ".join(f"Δ {c}" for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for algo, by_seed in runs.items():
        for i, step in enumerate(steps[1:], 1):
            lines.append(f"| {algo} | {step} | " + " | ".join(
                ci([ev[i][c] - ev[0][c] for _, ev in by_seed.values()], sign=True) for c in COLS) + " |")
    lines += ["", "Paired by seed, between algorithms:", "",
              "| difference | step | " + " | ".join(f"Δ {c}" for c in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for a, b in PAIRS:
        if a in runs and b in runs:
            for i, step in enumerate(steps[1:], 1):
                lines.append(f"| {a} - {b} | {step} | " + " | ".join(
                    ci([runs[a][s][1][i][c] - runs[b][s][1][i][c] for s in paired.common(runs, a, b)], sign=True)
                    for c in COLS) + " |")
    return lines


def plot(runs, title, png):
    """Train reward (10-step mean); pass@1, pass@64 and maj@64 at each eval; Δ pass@k against the start at the end."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (ax_r, ax_p, ax_d) = plt.subplots(1, 3, figsize=(16, 4.4))
    for i, (algo, by_seed) in enumerate(runs.items()):
        color = f"C{i}"
        mean, lo, hi = band([moving_average([x["reward_mean"] for x in tr]) for tr, _ in by_seed.values()])
        x = np.arange(10, 10 + len(mean))
        ax_r.plot(x, mean, color=color, label=f"{algo} (n={len(by_seed)})")
        ax_r.fill_between(x, lo, hi, color=color, alpha=0.2)
        steps = [e["step"] for e in next(iter(by_seed.values()))[1]]
        for col, ls in (("pass@1", "-"), ("pass@64", "--"), ("maj@64", ":")):
            mean, lo, hi = band([[e[col] for e in ev] for _, ev in by_seed.values()])
            ax_p.plot(steps, mean, color=color, ls=ls, marker="o", ms=3, label=f"{algo} {col}")
            ax_p.fill_between(steps, lo, hi, color=color, alpha=0.12)
        mean, lo, hi = band(end_minus_start(by_seed, KS))
        ax_d.plot(KS, mean, color=color, marker="o", ms=3, label=algo)
        ax_d.fill_between(KS, lo, hi, color=color, alpha=0.15)
    ax_r.set(title="train reward (10-step mean)", xlabel="step", ylim=(0, 1))
    fig.suptitle(title, fontsize=10)
    ax_p.set(title="held-out: pass@1 (—), pass@64 (--), maj@64 (:)", xlabel="step", ylim=(0, 1))
    ax_d.axhline(0, color="black", lw=0.8)
    ax_d.set(xscale="log", title="end minus start, paired by seed", xlabel="k", ylabel="Δ pass@k")
    ax_d.set_xticks(KS)
    ax_d.set_xticklabels([str(k) for k in KS])
    for ax in (ax_r, ax_p, ax_d):
        ax.grid(alpha=0.3)
    ax_r.legend(loc="lower right", fontsize=8)
    ax_p.legend(loc="lower right", fontsize=7, ncol=2)
    ax_d.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def by_kind(seed, first, last, n=200):
    """pass@1 on each kind of arith question (a + b, a - b, a * b) at the first and last eval: which facts moved."""
    import grpo
    rows = grpo.load_data("arith", seed)[1][:n]
    kinds = ["add" if " more." in r["question"] else "sub" if " away." in r["question"] else "mul" for r in rows]
    cells = []
    for kind in ("add", "sub", "mul"):
        solved = [sum(c for c, k in zip(ev["correct"], kinds) if k == kind) for ev in (first, last)]
        cells.append(" → ".join(f"{x / (64 * kinds.count(kind)):.2f}" for x in solved))
    return " / ".join(cells)


def sweep(settings, study=HERE):
    """One row per run of the sweep settings (folders of `study`): how far the train reward got, and the spectrum at
    the start and end."""
    cols = ["setting", "algo", "seed", "train reward, first 50 steps → last 50", "best 10-step mean", "steps to 0.5",
            "steps to 0.8", "pass@1 start → end", "pass@64 start → end", "maj@64 start → end", "entropy, last 20",
            "KL, last 20", "pass@1 on a + b / a - b / a * b, start → end"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for setting in settings:
        folder = os.path.join(study, setting)
        for algo in ALGOS:
            for name in sorted(os.listdir(folder)):
                if not (name.startswith(f"{algo}_seed") and name.endswith(".jsonl.gz")):
                    continue
                config, train, ev = read_run(os.path.join(folder, name))
                r = [x["reward_mean"] for x in train]
                last = lambda k: sum(x[k] for x in train[-20:]) / 20  # noqa: E731
                hit = [steps_to(r, t) for t in (0.5, 0.8)]
                cells = [setting, algo, str(config["seed"]), f"{sum(r[:50]) / 50:.3f} → {sum(r[-50:]) / 50:.3f}",
                         f"{max(moving_average(r)):.3f}", *(f"{h:.0f}" if h < float("inf") else "never" for h in hit),
                         *(f"{ev[0][c]:.3f} → {ev[-1][c]:.3f}" for c in ("pass@1", "pass@64", "maj@64")),
                         f"{last('entropy'):.3f}", f"{last('kl'):.3f}", by_kind(config["seed"], ev[0], ev[-1])]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", default=HERE, help="the study folder the settings are in (default: this one)")
    p.add_argument("--setting", nargs="+", required=True,
                   help="folders of --study written by seeds run --eval-samples: FOLDER (every algorithm in it) "
                        "or algo=FOLDER; with --sweep, one row per run of each FOLDER")
    p.add_argument("--sweep", action="store_true", help="one row per run of each setting (the lr / batch sweep)")
    p.add_argument("--md", default=None)
    p.add_argument("--png", default=None)
    a = p.parse_args()
    if a.sweep:
        lines = sweep(a.setting, a.study)
    else:
        runs = load(a.setting, a.study)
        seeds = {algo: sorted(by_seed) for algo, by_seed in runs.items()}
        lines = [f"{' '.join(a.setting)}: seeds per algorithm {json.dumps(seeds)}; each difference over the seeds both "
                 "algorithms have; 64 answers per question at T = 1.0 on each seed's 200 "
                 "held-out questions at each eval.", ""] + tables(runs)
    text = "\n".join(lines)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.png and not a.sweep:
        plot(runs, " ".join(a.setting), a.png)
    print(text)


if __name__ == "__main__":
    main()
