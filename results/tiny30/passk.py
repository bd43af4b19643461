"""The pass@k spectrum of the tiny30 runs: tables and a plot from results/tiny30/tiny30_lr1e-4_B4_300steps_passk/.

Each file <algo>_seed<k>.jsonl.gz there is one `seeds run --eval-samples 64` run (seeds.py FLAGS, lr 1e-4, 300
steps) with two eval lines: step 0 (the starting policy) and step 300. Each eval line has pass@k for k = 1, 2, 4, ..,
64 (unbiased, from 64 answers per question sampled at T = 1.0), maj@64, and their strict variants, on the 200
held-out questions of that seed. The eval sampler is seeded from --seed alone, so the step-0 evals of the algorithms
on one seed are the same draw; this script checks that and uses it once per seed as the starting policy.

CIs: 95% percentile bootstrap over seeds (stats.bootstrap_ci). Each seed draws its own 200 arith questions (--seed
also draws the data set), so resampling seeds resamples whole (question set, run) pairs; questions are not resampled
within a seed. Paired differences are taken within a seed, on the same 200 questions.

Usage:
    python -m results.tiny30.passk --md results/tiny30/tiny30_lr1e-4_B4_300steps_passk/passk.md \
        --png results/tiny30/tiny30_lr1e-4_B4_300steps_passk/passk.png
"""
import argparse
import os

from results.stats import ALGOS, band, bootstrap_ci, ci, parse_seeds, read_run

HERE = os.path.dirname(os.path.abspath(__file__))

KS = [1, 2, 4, 8, 16, 32, 64]
COLS = [f"pass@{k}" for k in KS] + ["maj@64", "acc_lenient"]
NAMES = {"acc_lenient": "greedy"}
PAIRS = [("reinforce", "grpo"), ("negative", "grpo"), ("drgrpo_seq", "grpo"), ("negative", "reinforce")]


def read_evals(path):
    config, train, evals = read_run(path)
    return config, evals[0], evals[-1], train


def load(folder, seeds=None):
    """{"start": {seed: eval}, algo: {seed: eval at the end}}, plus {algo: {seed: TRAIN_COLS of the run}}; only seeds
    done for every algorithm present (so every row has the same seeds)."""
    ends, starts, entropy = {}, {}, {}
    for algo in ALGOS:
        for name in sorted(os.listdir(folder)):
            if not (name.startswith(f"{algo}_seed") and name.endswith(".jsonl.gz")):
                continue
            seed = int(name[len(f"{algo}_seed"):-len(".jsonl.gz")])
            if seeds is not None and seed not in seeds:
                continue
            config, first, last, train = read_evals(os.path.join(folder, name))
            assert first["step"] == 0 and last["step"] == config["steps"], name
            if seed in starts:  # the same policy and the same sampler seed: the same draw
                assert starts[seed]["correct"] == first["correct"], f"step-0 evals differ on seed {seed}"
            starts[seed] = first
            ends.setdefault(algo, {})[seed] = last
            last = lambda k: sum(x[k] for x in train[-20:]) / len(train[-20:])  # noqa: E731
            entropy.setdefault(algo, {})[seed] = {"auc": sum(x["reward_mean"] for x in train) / len(train),
                                                  "reward": last("reward_mean"), "entropy": last("entropy"),
                                                  "completion_len": last("completion_len"),
                                                  "trunc_rate": last("trunc_rate")}
    common = set(starts)
    for by_seed in ends.values():
        common &= set(by_seed)
    keep = lambda d: {s: d[s] for s in sorted(common)}  # noqa: E731
    return {"start": keep(starts), **{a: keep(d) for a, d in ends.items()}}, {a: keep(d) for a, d in entropy.items()}


def header(first):
    cols = [NAMES.get(c, c) for c in COLS]
    return [f"| {first} | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]


def tables(policies, entropy, suffix=""):
    col = lambda c: ("acc_strict" if suffix else c) if c == "acc_lenient" else c + suffix  # noqa: E731
    seeds = list(policies["start"])
    lines = [f"pass@k, maj@64 and greedy accuracy{' (strict)' if suffix else ''}, mean [95% CI] over {len(seeds)} "
             f"seeds:", ""] + header("policy")
    for name, by_seed in policies.items():
        label = "start (step 0)" if name == "start" else f"{name}, step 300"
        lines.append(f"| {label} | " + " | ".join(ci([e[col(c)] for e in by_seed.values()]) for c in COLS) + " |")
    lines += ["", "Paired by seed, after training minus the starting policy (same seed, same questions):", ""]
    lines += header("algo")
    for name, by_seed in policies.items():
        if name != "start":
            lines.append(f"| {name} | " + " | ".join(
                ci([by_seed[s][col(c)] - policies["start"][s][col(c)] for s in seeds], sign=True) for c in COLS)
                + " |")
    lines += ["", "Paired by seed, between algorithms at step 300:", ""] + header("difference")
    for a, b in PAIRS:
        if a in policies and b in policies:
            lines.append(f"| {a} - {b} | " + " | ".join(
                ci([policies[a][s][col(c)] - policies[b][s][col(c)] for s in seeds], sign=True) for c in COLS)
                + " |")
    if not suffix:
        lines += ["", "The training side (train reward over all 300 steps = AUC; the rest: mean of the last 20 steps; "
                  "entropy in nats/token; answer length in tokens; truncated: share of answers cut at 16 tokens), "
                  "and the seeds where pass@1 rose / pass@64 fell against the start:", "",
                  "| algo | train reward (AUC) | train reward, last 20 | entropy, last 20 | answer length, last 20 "
                  "| truncated, last 20 | pass@1 up | pass@64 down |", "|---|---|---|---|---|---|---|---|"]
        for name, by_seed in policies.items():
            if name != "start":
                up = sum(by_seed[s]["pass@1"] > policies["start"][s]["pass@1"] for s in seeds)
                down = sum(by_seed[s]["pass@64"] < policies["start"][s]["pass@64"] for s in seeds)
                cells = [ci([entropy[name][s][k] for s in seeds], 2 if k == "completion_len" else 3)
                         for k in ("auc", "reward", "entropy", "completion_len", "trunc_rate")]
                lines.append(f"| {name} | " + " | ".join(cells) + f" | {up}/{len(seeds)} | {down}/{len(seeds)} |")
        lines += ["", "Coverage, per seed out of its 200 questions (mean [CI] over seeds): questions with no right "
                  "answer "
                  "among the 64 at step 300; questions lost (some right answer at step 0, none at step 300) and "
                  "gained (none at step 0, some at step 300); questions a majority of the 64 answers gets right "
                  "(more than 32 right):", "",
                  "| policy | unsolved at 64 | lost | gained | majority right |", "|---|---|---|---|---|"]
        for name, by_seed in policies.items():
            st = [policies["start"][s]["correct"] for s in seeds]
            en = [by_seed[s]["correct"] for s in seeds]
            count = lambda f: [sum(f(a, b) for a, b in zip(x, y)) for x, y in zip(st, en)]  # noqa: E731
            cells = [count(lambda a, b: b == 0), count(lambda a, b: a > 0 and b == 0),
                     count(lambda a, b: a == 0 and b > 0), count(lambda a, b: b > 32)]
            label = "start (step 0)" if name == "start" else name
            lines.append(f"| {label} | " + " | ".join(ci(c, 1) for c in cells) + " |")
        lines += ["", "Paired by seed, the training side:", "",
                  "| difference | Δ train reward (AUC) | Δ train reward, last 20 | Δ entropy, last 20 |",
                  "|---|---|---|---|"]
        for a, b in PAIRS:
            if a in entropy and b in entropy:
                lines.append(f"| {a} - {b} | " + " | ".join(
                    ci([entropy[a][s][k] - entropy[b][s][k] for s in seeds], sign=True)
                    for k in ("auc", "reward", "entropy")) + " |")
    return lines


def plot(policies, png):
    """Left: pass@k against k per policy (Yue et al.'s / Zhu et al.'s form). Right: the same, minus the starting
    policy on the same seed, where the differences are visible. maj@64 as a marker at k = 64 on the right."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    seeds = list(policies["start"])
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(12, 4.4))
    for i, (name, by_seed) in enumerate(policies.items()):
        color = "black" if name == "start" else f"C{i - 1}"
        label = f"start (step 0), n={len(seeds)}" if name == "start" else f"{name}, step 300"
        curves = [[by_seed[s][f"pass@{k}"] for k in KS] for s in seeds]
        mean, lo, hi = band(curves)
        ax.plot(KS, mean, marker="o", ms=3, color=color, label=label, ls="--" if name == "start" else "-")
        ax.fill_between(KS, lo, hi, color=color, alpha=0.15)
        if name == "start":
            continue
        diffs = [[by_seed[s][f"pass@{k}"] - policies["start"][s][f"pass@{k}"] for k in KS] for s in seeds]
        mean, lo, hi = band(diffs)
        ax_d.plot(KS, mean, marker="o", ms=3, color=color, label=name)
        ax_d.fill_between(KS, lo, hi, color=color, alpha=0.15)
        maj = [by_seed[s]["maj@64"] - policies["start"][s]["maj@64"] for s in seeds]
        lo, hi = bootstrap_ci(maj)
        x = 64 * 1.12 ** (i - 2.5)
        ax_d.errorbar([x], [np.mean(maj)], yerr=[[np.mean(maj) - lo], [hi - np.mean(maj)]], color=color,
                      marker="s", ms=4, capsize=2, ls="none")
    ax.set(xscale="log", title="tiny30 on arith: pass@k, T = 1.0, 200 questions per seed", xlabel="k",
           ylabel="pass@k", ylim=(0, 1))
    ax_d.axhline(0, color="black", lw=0.8)
    ax_d.set(xscale="log", title="after 300 steps minus start (paired by seed); squares: maj@64", xlabel="k",
             ylabel="Δ pass@k")
    for a in (ax, ax_d):
        a.set_xticks(KS)
        a.set_xticklabels([str(k) for k in KS])
        a.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax_d.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--folder", default=os.path.join(HERE, "tiny30_lr1e-4_B4_300steps_passk"))
    p.add_argument("--seeds", default=None, help="only these seeds, e.g. 0-9")
    p.add_argument("--md", default=None)
    p.add_argument("--png", default=None)
    a = p.parse_args()
    policies, entropy = load(a.folder, parse_seeds(a.seeds) if a.seeds else None)
    seeds = list(policies["start"])
    lines = [f"pass@k spectrum, tiny30, seeds.py FLAGS, lr 1e-4, 300 steps; seeds {seeds}; 64 answers per question "
             "at T = 1.0 on each seed's 200 held-out questions.", ""]
    lines += tables(policies, entropy)
    gap = max(abs(e[f"{c}_strict"] - e[c]) for by_seed in policies.values() for e in by_seed.values()
              for c in COLS if c != "acc_lenient")
    lines += ["", f"Strict minus lenient, largest absolute difference in any cell of any run: {gap:.4f}."]
    if gap > 0.01:
        lines += [""] + tables(policies, entropy, "_strict")
    lines += ["", "Mean [95% percentile bootstrap CI over seeds; each seed has its own 200 questions, not resampled "
              "within a seed]. pass@k: unbiased estimate from 64 samples (Chen et al. 2021). maj@64: majority vote of "
              "the 64 answers, ties split. greedy: greedy accuracy on the same questions. The step-0 eval is one "
              "draw per seed, the same for every algorithm."]
    text = "\n".join(lines)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    if a.png:
        plot(policies, a.png)
    print(text)


if __name__ == "__main__":
    main()
