"""Between-algorithm differences paired by seed, with the tests that suit 3-20 seeds.

For each per-seed difference d_1..d_n (same seed: same starting policy, same questions, same held-out set):
  mean          the mean difference
  bootstrap     95% percentile bootstrap over seeds (stats.bootstrap_ci), anti-conservative at n = 10
  t-interval    mean +- t(0.975, n-1) sd / sqrt(n), the interval the verdicts of results/README.md use
  sign-flip p   exact two-sided permutation test of mean = 0: the share of all 2^n sign patterns whose
                |sum of +-d_i| is at least the observed |sum d_i| (n <= 20)
  leave-one-out the smallest and largest mean over the n subsets that drop one seed
  ahead         seeds where the difference is above 0

Settings are folders of a study (--study) holding seeds.py runs with sampled evals (<algo>_seed<k>.jsonl.gz);
`algo=FOLDER` takes that algorithm from its own folder (each algorithm at its own learning rate). Each pair uses the
seeds both have.

    python -m results.paired --study results/tiny30 --setting tiny30_lr1e-4_B4_300steps_passk \
        --md results/tiny30/tiny30_lr1e-4_B4_300steps_passk/paired.md --claims "tiny30, 300 steps"
    python -m results.paired --study results/tiny60s --setting grpo=tiny60s_lr1e-4_B16_1000steps_passk \
        reinforce=tiny60s_lr1e-4_B16_1000steps_passk negative=tiny60s_lr3e-4_B16_1000steps_passk --claims tiny60s

--claims NAME adds the rows of the claims table that these runs test, each part's verdict under the one rule
(stats.verdict), so that no verdict is written by hand, and each verdict again with Holm's correction (stats.holm)
over the distinct tests of those rows other than the two primary rows (PRIMARY), with every p-value.
"""
import argparse
import json
import math
import os

from results.stats import (ALGOS, bootstrap_ci, holm, loo_range, read_run, sd_ratio, sd_ratio_ci, sd_ratio_p,
                           sign_flip_p, steps_to, t_interval, t_test_p, verdict, verdict_p)

EVAL_COLS = ["pass@1", "pass@4", "pass@16", "pass@64", "maj@64", "acc_lenient"]
NAMES = {"acc_lenient": "greedy"}
PAIRS = [("reinforce", "grpo"), ("negative", "grpo"), ("drgrpo_seq", "grpo"), ("negative", "reinforce")]


def describe(d):
    """Every column of the tables for one list of per-seed differences."""
    import numpy as np
    return {"n": len(d), "mean": float(np.mean(d)), "boot": bootstrap_ci(d), "t": t_interval(d),
            "p": sign_flip_p(d), "loo": loo_range(d), "ahead": int(sum(x > 0 for x in d))}


def row(label, metric, d, digits=3):
    s = describe(d)
    f = lambda x: f"{x:+.{digits}f}"  # noqa: E731
    span = lambda lo_hi: f"[{f(lo_hi[0])}, {f(lo_hi[1])}]"  # noqa: E731
    p = "< 0.001" if s["p"] < 0.001 else f"{s['p']:.3f}"
    return (f"| {label} | {metric} | {s['n']} | {f(s['mean'])} | {span(s['t'])} | {p} | {span(s['boot'])} "
            f"| {span(s['loo'])} | {s['ahead']}/{s['n']} |")


def load(specs, study):
    """{algo: {seed: (train, evals)}} from specs 'FOLDER' (every algorithm in it) or 'algo=FOLDER', folders of the
    study folder `study`; checks that the step-0 evals of one seed are the same draw in every file."""
    runs, starts = {}, {}
    for spec in specs:
        only, _, folder = spec.rpartition("=")
        folder = os.path.join(study, folder)
        if not os.path.isdir(folder):
            continue  # not started yet
        for algo in ([only] if only else ALGOS):
            for name in sorted(os.listdir(folder)):
                if name.startswith(f"{algo}_seed") and name.endswith(".jsonl.gz"):
                    config, train, evals = read_run(os.path.join(folder, name))
                    seed = config["seed"]
                    first = json.dumps(evals[0]["correct"])
                    assert starts.setdefault(seed, first) == first, f"step-0 evals differ on seed {seed}"
                    runs.setdefault(algo, {})[seed] = (train, evals)
    return runs


def common(runs, a, b):
    """The seeds both algorithms have: a paired difference is taken over these."""
    return sorted(set(runs[a]) & set(runs[b]))


def train_numbers(train):
    """Per-run training numbers: reward over the run (AUC), its first and last quarter, entropy over the last quarter
    and the last 20 steps, KL over the last 20 steps, steps to a 0.8 train reward."""
    mean = lambda xs, k: sum(x[k] for x in xs) / len(xs)  # noqa: E731
    q = train[3 * len(train) // 4:]
    return {"train reward (AUC)": mean(train, "reward_mean"),
            "train reward, first quarter": mean(train[:len(train) // 4], "reward_mean"),
            "train reward, last quarter": mean(q, "reward_mean"),
            "entropy, last quarter": mean(q, "entropy"), "entropy, last 20 steps": mean(train[-20:], "entropy"),
            "KL, last 20 steps": mean(train[-20:], "kl"),
            "steps to 0.8": steps_to([x["reward_mean"] for x in train], 0.8)}


def tables(runs, at_start=True):
    steps = runs[next(iter(runs))][next(iter(runs[next(iter(runs))]))][1][-1]["step"]
    head = ["| difference | metric | seeds | mean | 95% t-interval | sign-flip p | 95% bootstrap | leave-one-out "
            "range | seeds above 0 |", "|---|---|---|---|---|---|---|---|---|"]
    lines = [f"Paired by seed, between algorithms, at the last eval (step {steps}) and over the run:", ""] + head
    for a, b in PAIRS:
        if a not in runs or b not in runs:
            continue
        seeds = common(runs, a, b)
        if len(seeds) < 2:
            continue
        for col in EVAL_COLS:
            d = [runs[a][s][1][-1][col] - runs[b][s][1][-1][col] for s in seeds]
            lines.append(row(f"{a} - {b}", NAMES.get(col, col), d))
        tr = {s: (train_numbers(runs[a][s][0]), train_numbers(runs[b][s][0])) for s in seeds}
        for key in tr[seeds[0]][0]:
            d = [x[key] - y[key] for x, y in tr.values() if math.isfinite(x[key] - y[key])]
            if len(d) >= 2:
                lines.append(row(f"{a} - {b}", key, d, 0 if key == "steps to 0.8" else 3))
    if at_start:
        lines += ["", f"Paired by seed, each algorithm at step {steps} minus the starting policy (same questions):",
                  ""] + head
        for algo, by_seed in runs.items():
            for col in EVAL_COLS if len(by_seed) >= 2 else []:
                d = [ev[-1][col] - ev[0][col] for _, ev in by_seed.values()]
                lines.append(row(f"{algo} - start", NAMES.get(col, col), d))
    return lines + spread(runs)


def spread(runs):
    """The seed-to-seed spread of outcomes (not the gradient's variance): sd over seeds of the last-50-step train reward
    and of pass@1 at the last eval, their ratio with a bootstrap CI over seeds (stats.sd_ratio), and the ratio's
    range when one seed is left out."""
    import numpy as np
    outcomes = [lambda tr, ev: sum(x["reward_mean"] for x in tr[-50:]) / 50, lambda tr, ev: ev[-1]["pass@1"]]
    lines = ["", "Spread over seeds: standard deviation over seeds of the train reward of the last 50 steps and of "
             "pass@1 at the last eval; their ratio with a 95% bootstrap CI over seeds, and its leave-one-out range:",
             "",
             "| algos | seeds | sd of reward, last 50 steps | ratio [95% CI] | leave-one-out | sd of pass@1, last eval "
             "| ratio [95% CI] | leave-one-out |", "|---|---|---|---|---|---|---|---|"]
    for a, b in PAIRS:
        seeds = sorted(set(runs.get(a, {})) & set(runs.get(b, {})))
        if len(seeds) < 3:
            continue
        cells = []
        for get in outcomes:
            x, y = (np.array([get(*runs[algo][s]) for s in seeds]) for algo in (a, b))
            loo = [np.delete(x, i).std(ddof=1) / np.delete(y, i).std(ddof=1) for i in range(len(seeds))]
            cells += [*sd_ratio(x, y).split(" | "), f"[{min(loo):.1f}, {max(loo):.1f}]"]
        lines.append(f"| {a} / {b} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


# The claims of results/README.md that one setting's paired runs test: (claim, source, [(difference, metric, sign)]).
# A difference is "a - b" between algorithms on the same seeds, "a - start" (the last eval minus step 0) or "a / b" (the
# ratio of the seed-to-seed spreads); the sign is the direction the claim predicts (0: no difference, as DeepSeekMath's
# "not pass@K": pass@K does not move).
CLAIMS = [
    ("GRPO learns faster: train reward, reinforce - grpo", "this project's premise",
     [("reinforce - grpo", "train reward, first quarter", -1), ("reinforce - grpo", "train reward (AUC)", -1),
      ("reinforce - grpo", "steps to 0.8", +1)]),
    ("GRPO ends above REINFORCE: reinforce - grpo at the last eval", "ours (the front page)",
     [("reinforce - grpo", "pass@1", -1), ("reinforce - grpo", "pass@64", -1)]),
    ("GRPO's runs end closer together: sd over seeds of the last-50-step train reward, reinforce / grpo (an "
     "outcome's spread, not the gradient's variance)", "ours", [("reinforce / grpo", "sd ratio", +1)]),
    ("REINFORCE drifts further from the reference late: KL over the last 20 steps, reinforce - grpo", "ours",
     [("reinforce - grpo", "KL, last 20 steps", +1)]),
    ("RL lifts maj@K, not pass@K", "DeepSeekMath, Fig. 7",
     [("grpo - start", "maj@64", +1), ("grpo - start", "pass@16", 0), ("grpo - start", "pass@64", 0)]),
    ("The RL model beats its base at small k and falls below it at large k", "Yue et al. 2025",
     [("grpo - start", "pass@1", +1), ("grpo - start", "pass@64", -1)]),
    ("PSR (our `reinforce`) lifts pass@1 and lowers pass@k at large k", "Zhu et al. 2025",
     [("reinforce - start", "pass@1", +1), ("reinforce - start", "pass@16", -1),
      ("reinforce - start", "pass@64", -1)]),
    ("GRPO sits above PSR at large k: reinforce - grpo", "Zhu et al. 2025",
     [("reinforce - grpo", "pass@16", -1), ("reinforce - grpo", "pass@64", -1)]),
    ("GRPO sits below NSR (our `negative`) at large k: negative - grpo", "Zhu et al. 2025",
     [("negative - grpo", "pass@16", +1), ("negative - grpo", "pass@64", +1)]),
    ("NSR keeps or lifts the whole spectrum: negative - start", "Zhu et al. 2025",
     [("negative - start", "pass@1", +1), ("negative - start", "pass@16", +1), ("negative - start", "pass@64", +1)]),
    ("Without a baseline the entropy falls faster: entropy, reinforce - grpo", "Xiong et al. 2025",
     [("reinforce - grpo", "entropy, last 20 steps", -1)]),
    ("The std division is not what matters (GRPO's edge is not the normalization): drgrpo_seq - grpo",
     "Xiong et al. 2025",
     [("drgrpo_seq - grpo", "train reward (AUC)", 0), ("drgrpo_seq - grpo", "pass@1", 0),
      ("drgrpo_seq - grpo", "pass@64", 0)]),
]


def differences(runs, diff, metric):
    """Per-seed values of one difference: 'a - b' on the seeds both algorithms have, or 'a - start'; with the mean
    of the metric at the start (None for train metrics)."""
    a, b = diff.split(" - ")
    key = {"greedy": "acc_lenient"}.get(metric, metric)
    seeds = sorted(runs[a]) if b == "start" else common(runs, a, b)
    if key not in EVAL_COLS:
        d = [train_numbers(runs[a][s][0])[key] - train_numbers(runs[b][s][0])[key] for s in seeds]
        return [x for x in d if math.isfinite(x)], None
    start = sum(runs[a][s][1][0][key] for s in seeds) / len(seeds)
    other = (lambda s: runs[a][s][1][0][key]) if b == "start" else (lambda s: runs[b][s][1][-1][key])
    return [runs[a][s][1][-1][key] - other(s) for s in seeds], start


def spread_ratio(runs, a, b):
    """The number of seeds, and sd over seeds of the last-50-step train reward, a / b, with its interval and its
    bootstrap p (of the same resamples)."""
    seeds = common(runs, a, b)
    x, y = ([sum(t["reward_mean"] for t in runs[algo][s][0][-50:]) / 50 for s in seeds] for algo in (a, b))
    return len(seeds), *sd_ratio_ci(x, y), sd_ratio_p(x, y)


# The two rows that answer the seed's two questions, each judged alone at 5%: GRPO learns faster (the train reward
# over the run) and lower variance (among these rows the spread over seeds; the gradient's variance at a fixed
# policy is measured apart, variance/ and tiny30/variance/). Every other distinct test of the claims rows is one of
# the family Holm's correction is taken over.
PRIMARY = {("reinforce - grpo", "train reward (AUC)"): "GRPO learns faster",
           ("reinforce / grpo", "sd ratio"): "GRPO's runs end closer together"}


def parts(runs):
    """Each part of CLAIMS that these runs test, in order, as (claim, difference, metric, sign, seeds, text, verdict,
    distance from 0 (a ratio: ratio - 1), p of the t-test, p of the sign-flip test); a ratio has its bootstrap p in
    both. Parts whose runs are missing, or with too few seeds, are left out."""
    out = []
    for claim, _, group in CLAIMS:
        last = None
        for diff, metric, sign in group:
            a, b = diff.split(" / ") if " / " in diff else diff.split(" - ")
            if a not in runs or (b != "start" and b not in runs):
                continue
            if " / " in diff:
                n, ratio, lo, hi, p = spread_ratio(runs, a, b)
                if n < 3:
                    continue
                text, said, dist, pt, ps = (f"{ratio:.1f} [{lo:.1f}, {hi:.1f}] (bootstrap over seeds)",
                                            verdict(lo - 1, hi - 1, sign), ratio - 1, p, p)
            else:
                d, start = differences(runs, diff, metric)
                n = len(d)
                if n < 2:
                    continue
                lo, hi = t_interval(d)
                f = (lambda x: f"{x:+.0f}") if metric == "steps to 0.8" else (lambda x: f"{x:+.3f}")
                at = f" (start {start:.3f})" if b == "start" else ""
                text = f"{metric}{at} {f(sum(d) / n)} [{f(lo)}, {f(hi)}]"
                text = text if diff == last else f"{diff}: {text}"
                said, dist, pt, ps = verdict(lo, hi, sign), sum(d) / n, t_test_p(d), sign_flip_p(d)
            out.append((claim, diff, metric, sign, n, text, said, dist, pt, ps))
            last = diff
    return out


def corrected(found):
    """{(difference, metric): (p with Holm from the t-test, from the sign-flip test)} over the distinct tests of the
    parts found, the primary rows left out (a test that two claims share is one test)."""
    tests = {}
    for _, diff, metric, _, _, _, _, _, pt, ps in found:
        if (diff, metric) not in PRIMARY:
            tests[diff, metric] = (pt, ps)
    keys = list(tests)
    return dict(zip(keys, zip(holm([tests[k][0] for k in keys]), holm([tests[k][1] for k in keys]))))


def one_verdict(verdicts):
    """One verdict where every part has the same, else each part's, named by its metric."""
    return verdicts[0][1] if len({v for _, v in verdicts}) == 1 else "; ".join(f"{m}: {v}" for m, v in verdicts)


def claims(runs, setting):
    """The claims table's rows for one setting: each part's mean [95% t-interval] (for the spread, a ratio with its
    bootstrap interval) and its verdict under the rule, then with Holm's correction on the t-test's p (the primary
    rows as they are); parts whose runs are missing are left out."""
    found = parts(runs)
    holm_p = corrected(found)
    lines = ["| claim | source | setting | our number, mean [95% t-interval] | verdict |", "|---|---|---|---|---|"]
    for claim, source, _ in CLAIMS:
        mine = [x for x in found if x[0] == claim]
        if not mine:
            continue
        said = one_verdict([(x[2], x[6]) for x in mine])
        holm_said = one_verdict([(x[2], x[6] if (x[1], x[2]) in PRIMARY else verdict_p(holm_p[x[1], x[2]][0], x[7],
                                                                                         x[3])) for x in mine])
        if all((x[1], x[2]) in PRIMARY for x in mine):
            said += "; a primary row, not corrected"
        elif holm_said == said:
            said += "; the same with Holm's correction"
        else:
            said += f"; with Holm's correction: {holm_said}"
        ns = [x[4] for x in mine]
        seeds = f"{ns[0]} seeds" if len(set(ns)) == 1 else f"{min(ns)}-{max(ns)} seeds"
        lines.append(f"| {claim} | {source} | {setting}, {seeds} | {'; '.join(x[5] for x in mine)} | {said} |")
    return lines + [""] + holm_table(found, holm_p)


def holm_table(found, holm_p):
    """Every distinct test of the claims rows with its p-values, uncorrected and with Holm's correction."""
    p = lambda x: "< 0.001" if x < 0.001 else f"{x:.3f}"  # noqa: E731
    lines = [f"Holm's step-down correction (stats.holm) over the {len(holm_p)} distinct tests of the rows above other "
             "than the primary rows, which answer the seed's two questions and are judged alone ("
             + "; ".join(f"{d} {m}: {c}" for (d, m), c in PRIMARY.items()) + "), once with each test's t-test p and "
             "once with its sign-flip p (the sd ratio: its bootstrap p in both). The verdicts above rest on the "
             "t-test's; a part whose corrected p is not below 0.05 is inconclusive with the correction.", "",
             "| difference | metric | seeds | role | p, t-test | with Holm | p, sign-flip | with Holm |",
             "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for _, diff, metric, _, n, _, _, _, pt, ps in found:
        if (diff, metric) in seen:
            continue
        seen.add((diff, metric))
        if (diff, metric) in PRIMARY:
            lines.append(f"| {diff} | {metric} | {n} | primary: {PRIMARY[diff, metric]} | {p(pt)} | — | {p(ps)} | — |")
        else:
            ht, hs = holm_p[diff, metric]
            lines.append(f"| {diff} | {metric} | {n} | one of {len(holm_p)} | {p(pt)} | {p(ht)} | {p(ps)} | {p(hs)} |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", required=True, help="the study's folder, e.g. results/tiny60s")
    p.add_argument("--setting", nargs="+", required=True, help="FOLDER or algo=FOLDER, folders of --study")
    p.add_argument("--md", default=None)
    p.add_argument("--claims", default=None, metavar="NAME", help="add the claims table's rows, setting named NAME")
    a = p.parse_args()
    runs = load(a.setting, a.study)
    seeds = {algo: sorted(by_seed) for algo, by_seed in runs.items()}
    lines = [f"{' '.join(a.setting)}: seeds per algorithm {json.dumps(seeds)}.", ""] + (tables(runs) if runs else [])
    lines += ["", "The verdicts of results/README.md use the t-interval. sign-flip p: exact two-sided permutation "
              "test over all 2^n sign patterns of the per-seed differences. Bootstrap: 95% percentile bootstrap over "
              "seeds (10,000 resamples), narrower than the t-interval at 10 seeds. Leave-one-out range: the smallest "
              "and largest mean difference when one seed is dropped. Steps to 0.8: over the seeds where both "
              "reached a 0.8 train reward (10-step trailing mean)."]
    if a.claims and runs:
        lines += ["", "The claims these runs test, each part's verdict under the rule of results/README.md (the 95% "
                  "t-interval excludes 0 in the predicted direction: reproduced; in the other: contradicted; else "
                  "inconclusive):", ""] + claims(runs, a.claims)
    text = "\n".join(lines)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
