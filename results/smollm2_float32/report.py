"""The paired report of this study (README.md): reinforce - grpo on SmolLM2-135M-Instruct, paired by seed, each
algorithm at the learning rate `run.py pick` chose for it (lr.json).

    python -m results.smollm2_float32.report       # seeds 0-9, 100 steps, lr.json's rates: writes report.md, prints it
    python -m results.smollm2_float32.report --steps 50 --lr grpo=1e-5 --lr reinforce=1e-5 --seeds 100,101

The second command makes the same tables from the 50-step sweep runs and only prints them (--md PATH writes them).
report.md is written by default only for the study itself (100 steps, the rates of lr.json). A seed counts when both
algorithms have a finished run of it (its file exists and reaches the last step and its eval); with fewer than 2
such seeds the report says so and nothing more. The numbers come from results/stats.py.
"""
import argparse
import json
import math
import os
import statistics

from results import stats

HERE = os.path.dirname(os.path.abspath(__file__))
ALGOS = ("grpo", "reinforce")
STEPS = 100
SEEDS = "0-9"
THRESHOLD = 0.6
LAST = 10

# The claims of results/README.md a row tests, with the sign stats.verdict takes for reinforce - grpo.
FASTER = ("GRPO learns faster", -1)
AHEAD = ("GRPO ends above REINFORCE", -1)
FORMAT = ("GRPO writes the `#### N` format, which the lenient reward does not pay for", -1)  # strict accuracy
ENTROPY = ("without a baseline the entropy falls faster", -1)
DRIFT = ("REINFORCE drifts further from the reference late", +1)
SPREAD = ("GRPO's runs lie closer together over the whole run, by the sd of the AUC and not of the end", +1)
LOWER = ("GRPO's gradient estimate has lower variance than REINFORCE's", -1)  # a ratio grpo / reinforce below 1
RATIOS = (SPREAD, LOWER)  # claims tested by a ratio: predicted below or above 1, not 0

# The gradient-variance measurements (grad_variance.py), by the policy each was taken at.
VARIANCE = (("the starting policy", "variance/start.json"),
            ("grpo seed 0 after 50 of its 100 steps", "variance/step50.json"))


def rates(given):
    """{algo: lr} from --lr algo=rate, else lr.json's chosen rates; and where they came from."""
    lrs = dict(spec.split("=", 1) for spec in given or [])
    path = os.path.join(HERE, "lr.json")
    if len(lrs) < len(ALGOS) and os.path.exists(path):
        chosen = json.load(open(path))
        lrs = {algo: lrs.get(algo, chosen[algo]["chosen"]) for algo in ALGOS}
        return lrs, "--lr and lr.json" if given else "lr.json, run.py pick"
    return lrs, "--lr"


def run_path(algo, lr, seed, steps):
    """The gzipped metrics file of one run, in run.py's scheme."""
    return os.path.join(HERE, f"smollm2_lr{lr}_B2_{steps}steps", f"{algo}_seed{seed}.jsonl.gz")


def finished(path, steps):
    """(train lines, eval lines) of a run that reached its last step and its last eval; None otherwise."""
    if not os.path.exists(path):
        return None
    config, train, evals = stats.read_run(path)
    done = config["steps"] == steps and train and train[-1]["step"] == steps and evals[-1]["step"] == steps
    return (train, evals) if done else None


def load(lrs, steps, seeds):
    """{seed: {algo: (train, evals)}} over the seeds where every algorithm has a finished run; and per algorithm the
    seeds it has finished."""
    runs, done = {}, {algo: [] for algo in ALGOS}
    for seed in seeds:
        for algo in ALGOS:
            run = finished(run_path(algo, lrs[algo], seed, steps), steps) if algo in lrs else None
            if run:
                runs.setdefault(seed, {})[algo] = run
                done[algo].append(seed)
    return {s: r for s, r in runs.items() if len(r) == len(ALGOS)}, done


def mean(rows, key):
    """Mean of one key over train lines."""
    return sum(r[key] for r in rows) / len(rows)


def at(evals, step, key):
    """One key of the eval line of one step."""
    return next(e[key] for e in evals if e["step"] == step)


def metrics(steps, eval_steps):
    """(name, the run's number from (train, evals), digits, claim or None) for each row of the paired table."""
    q = steps // 4
    rows = [(f"train reward AUC (mean over steps 1-{steps})", lambda tr, ev: mean(tr, "reward_mean"), 3, FASTER),
            (f"train reward, steps 1-{q}", lambda tr, ev: mean(tr[:q], "reward_mean"), 3, FASTER),
            (f"train reward, steps {steps - q + 1}-{steps}", lambda tr, ev: mean(tr[-q:], "reward_mean"), 3, AHEAD)]
    for step in eval_steps:
        for key in ("acc_lenient", "acc_strict"):
            claim = FORMAT if key == "acc_strict" else AHEAD if step == steps else FASTER
            rows.append((f"held-out {key}, step {step}", lambda tr, ev, s=step, k=key: at(ev, s, k), 3, claim))
    return rows + [
        (f"entropy, last {LAST} steps", lambda tr, ev: mean(tr[-LAST:], "entropy"), 3, ENTROPY),
        (f"KL, last {LAST} steps", lambda tr, ev: mean(tr[-LAST:], "kl"), 3, DRIFT),
        (f"answer length (tokens), last {LAST} steps", lambda tr, ev: mean(tr[-LAST:], "completion_len"), 1, None),
        ("share of all-equal groups (frac_zero_std), all steps", lambda tr, ev: mean(tr, "frac_zero_std"), 3, None)]


def signed(x, digits):
    """x with its sign."""
    return f"{x:+.{digits}f}"


def p_text(p):
    """A p-value as the tables print it."""
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def sides(d):
    """'above / below' 0 over the seeds, with the ties where there are any: '0 / 6 (4 tied)'."""
    above, below = sum(x > 0 for x in d), sum(x < 0 for x in d)
    tied = len(d) - above - below
    return f"{above} / {below}" + (f" ({tied} tied)" if tied else "")


def verdicts(d, claim):
    """(by the t-interval, by the sign-flip test) for one row: the rule of stats.verdict on each test (the t-interval
    excludes 0 where the t-test's p is below 0.05); a row with no claim says whether its interval excludes 0."""
    lo, hi = stats.t_interval(d)
    if claim is None:
        return (f"no claim on its direction (interval {'contains' if lo <= 0 <= hi else 'excludes'} 0)",) * 2
    return stats.verdict(lo, hi, claim[1]), stats.verdict_p(stats.sign_flip_p(d), statistics.mean(d), claim[1])


def row(name, d, digits, claim):
    """One line of the paired table from the per-seed differences d (reinforce - grpo). The verdict is the
    t-interval's; where the sign-flip test's differs, both are given, each named."""
    lo, hi = stats.t_interval(d)
    lo1, hi1 = stats.loo_range(d)
    wanted = "—" if claim is None else f"{claim[0]} ({'< 0' if claim[1] < 0 else '> 0'})"
    cells = [name, str(len(d)), signed(statistics.mean(d), digits), f"[{signed(lo, digits)}, {signed(hi, digits)}]",
             p_text(stats.t_test_p(d)), p_text(stats.sign_flip_p(d)), f"[{signed(lo1, digits)}, {signed(hi1, digits)}]",
             sides(d), wanted, stats.split_verdict(*verdicts(d, claim))]
    return "| " + " | ".join(cells) + " |"


def paired_rows(runs, steps, eval_steps):
    """(name, per-seed differences reinforce - grpo, digits, claim) of each row of the paired table, steps to 0.6
    last (over the seeds where both reached it; None where fewer than 2 did); and steps to 0.6 per algorithm and
    seed."""
    seeds = sorted(runs)
    rows = [(name, [get(*runs[s]["reinforce"]) - get(*runs[s]["grpo"]) for s in seeds], digits, claim)
            for name, get, digits, claim in metrics(steps, eval_steps)]
    hit = {algo: {s: stats.steps_to([x["reward_mean"] for x in runs[s][algo][0]], THRESHOLD) for s in seeds}
           for algo in ALGOS}
    both = [s for s in seeds if all(math.isfinite(hit[algo][s]) for algo in ALGOS)]
    d = [hit["reinforce"][s] - hit["grpo"][s] for s in both]
    rows.append((f"steps to a train reward of {THRESHOLD} (seeds where both reached it)", d if len(d) >= 2 else None,
                 1, (FASTER[0], +1)))
    return rows, hit


def paired_table(runs, steps, eval_steps):
    """The table of paired differences, reinforce - grpo, one row a metric, and the lines on steps to 0.6."""
    seeds = sorted(runs)
    lines = ["| reinforce - grpo | seeds | mean | 95% t-interval | t-test p | sign-flip p | leave-one-seed-out range "
             "| seeds above / below 0 | claim (predicted sign) | verdict |", "|---" * 10 + "|"]
    rows, hit = paired_rows(runs, steps, eval_steps)
    for name, d, digits, claim in rows:
        if d is None:
            n = sum(all(math.isfinite(hit[a][s]) for a in ALGOS) for s in seeds)
            lines.append(f"| {name} | {n} |" + " |" * 6 + f" {FASTER[0]} (> 0) | no interval: fewer than 2 seeds |")
        else:
            lines.append(row(name, d, digits, claim))
    lines += ["", f"Steps to {THRESHOLD} per algorithm, k/n seeds reached it: mean [95% bootstrap CI] over those k; "
              "median over all n with never = inf (stats.fmt_steps):", ""]
    lines += [f"- {algo}: {stats.fmt_steps([hit[algo][s] for s in seeds], digits=1)}" for algo in ALGOS]
    for algo, other in (ALGOS, ALGOS[::-1]):
        alone = [s for s in seeds if math.isfinite(hit[algo][s]) and not math.isfinite(hit[other][s])]
        if alone:
            lines.append(f"- reached by {algo} only, left out of the paired row: seeds {alone}")
    return lines


def spread(runs, lrs):
    """Per algorithm the sd over seeds of the train-reward AUC, and the ratio of the sds."""
    seeds = sorted(runs)
    auc = {algo: [mean(runs[s][algo][0], "reward_mean") for s in seeds] for algo in ALGOS}
    lines = ["| algo | lr | seeds | sd over seeds of the train reward AUC (its mean: per algorithm, above) |",
             "|---|---|---|---|"]
    lines += [f"| {algo} | {lrs[algo]} | {len(seeds)} | {statistics.stdev(auc[algo]):.3f} |" for algo in ALGOS]
    r, g = auc["reinforce"], auc["grpo"]
    if statistics.stdev(g) == 0:
        return lines + ["", "The sd of grpo's AUC is 0: no ratio."]
    text = f"sd(reinforce) / sd(grpo) of the train-reward AUC: {statistics.stdev(r) / statistics.stdev(g):.2f}"
    if len(seeds) < 3:
        return lines + ["", f"{text}; no interval and no verdict with fewer than 3 seeds."]
    ratio, lo, hi = stats.sd_ratio_ci(r, g)
    loo = [statistics.stdev(r[:i] + r[i + 1:]) / max(statistics.stdev(g[:i] + g[i + 1:]), 1e-12)
           for i in range(len(seeds))]
    said = stats.verdict(lo - 1, hi - 1, SPREAD[1])
    return lines + ["", f"{text} [{lo:.2f}, {hi:.2f}] (95% bootstrap over seeds, the same resampled seeds for both: "
                    f"stats.sd_ratio_ci), leave-one-seed-out range [{min(loo):.2f}, {max(loo):.2f}]. Claim: "
                    f"{SPREAD[0]}, ratio > 1. Verdict: {said}."]


def variance():
    """The relative gradient variance of the two estimators, grpo / reinforce, at each policy measured so far."""
    from results.variance.grad_variance import ratio_ci  # torch and grpo load only when a measurement exists
    lines = ["| policy | K batches | mean reward | batches with a zero grpo gradient | relative variance, grpo / "
             "reinforce | ratio [95% CI] | total variance ratio [95% CI] | mean cosine, grpo / reinforce | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for policy, name in VARIANCE:
        path = os.path.join(HERE, name)
        if not os.path.exists(path):
            lines.append(f"| {policy} | not measured yet ({name}) | | | | | | | |")
            continue
        d = json.load(open(path))
        g, r = d["grpo"], d["reinforce"]
        (tlo, thi), (lo, hi) = ratio_ci(d)
        ratio = d["rel_variance_ratio_grpo_over_reinforce"]
        lines.append(f"| {policy} | {d['K']} | {d['reward_mean']:.3f} | {g['zero_grad_batches']} "
                     f"| {g['rel_variance']:.2f} / {r['rel_variance']:.2f} | {ratio:.2f} [{lo:.2f}, {hi:.2f}] "
                     f"| {d['variance_ratio_grpo_over_reinforce']:.2f} [{tlo:.2f}, {thi:.2f}] "
                     f"| {g['mean_cosine']:.3f} / {r['mean_cosine']:.3f} | {stats.verdict(lo - 1, hi - 1, LOWER[1])} |")
    return lines + ["", "grad_variance.py: the same B = 2 arith questions in each of K rollout batches of G = 8 "
                    "answers (64 new tokens, T = 0.7, lenient reward, float32); per batch the gradient of one step "
                    "(mu = 1, no KL term) with each algorithm's advantages from the same rollouts. Relative variance: "
                    "the trace of the gradients' covariance over their mean's squared norm (scale-free: GRPO's std "
                    "division rescales its gradient); CI: 95% percentile bootstrap over the K batches, the same "
                    f"resample for both algorithms. Claim: {LOWER[0]}, ratio < 1."]


def variance_resamples(d, n=10000, seed=0):
    """The relative-variance ratio grpo / reinforce over the bootstrap resamples of the K batches that
    grad_variance.ratio_ci draws (same n, seed and draws): their 2.5th and 97.5th percentiles are its interval."""
    import numpy as np
    grams = [np.asarray(d[algo]["gram"]) for algo in ALGOS]
    K = len(grams[0])
    idx = np.random.default_rng(seed).integers(0, K, (n, K))
    rel = []
    for gram in grams:
        sub = gram[idx[:, :, None], idx[:, None, :]]
        mean_sq = sub.sum((1, 2)) / K ** 2
        rel.append((np.diagonal(sub, axis1=1, axis2=2).mean(1) - mean_sq) / mean_sq)
    return rel[0] / rel[1]


def said(p, diff, claim):
    """The verdict a p-value gives a row (stats.verdict_p); a row with no claim: whether a difference is shown."""
    if claim is None:
        return "a difference (no claim on its direction)" if p < 0.05 else "no difference detected"
    return stats.verdict_p(p, diff, claim[1])


def family(runs, lrs, steps, eval_steps):
    """Every row that tests a claim or a difference, each as (name, claim, primary or None, difference from 0 (for a
    ratio: ratio - 1), p of the t-test (a ratio: bootstrap), p of the sign-flip test (a ratio: bootstrap), the
    uncorrected verdict). The primary rows answer the seed's two questions; the others are the family Holm's
    correction is taken over."""
    out = []
    rows, _ = paired_rows(runs, steps, eval_steps)
    for name, d, _, claim in rows:
        if d is not None:
            primary = "GRPO learns faster" if name.startswith("train reward AUC") else None
            out.append((name, claim, primary, statistics.mean(d), stats.t_test_p(d), stats.sign_flip_p(d),
                        stats.split_verdict(*verdicts(d, claim))))
    seeds = sorted(runs)
    auc = {algo: [mean(runs[s][algo][0], "reward_mean") for s in seeds] for algo in ALGOS}
    if len(seeds) >= 3 and statistics.stdev(auc["grpo"]) > 0:
        ratio, lo, hi = stats.sd_ratio_ci(auc["reinforce"], auc["grpo"])
        p = stats.sd_ratio_p(auc["reinforce"], auc["grpo"])
        out.append(("sd over seeds of the train reward AUC, reinforce / grpo (bootstrap p)", SPREAD, None, ratio - 1,
                    p, p, stats.verdict(lo - 1, hi - 1, SPREAD[1])))
    for i, (policy, name) in enumerate(VARIANCE if steps == STEPS else ()):
        path = os.path.join(HERE, name)
        if os.path.exists(path):
            from results.variance.grad_variance import ratio_ci
            d = json.load(open(path))
            lo, hi = ratio_ci(d)[1]
            p = stats.bootstrap_p(variance_resamples(d), 1.0)
            out.append((f"relative gradient variance, grpo / reinforce, at {policy} (bootstrap p)", LOWER,
                        "GRPO's gradient has lower variance" if i == 0 else None,
                        d["rel_variance_ratio_grpo_over_reinforce"] - 1, p, p, stats.verdict(lo - 1, hi - 1, LOWER[1])))
    return out


def holm_table(rows):
    """The primary rows, then every other row with its p-values uncorrected and with Holm's correction over those
    rows (stats.holm), once with the t-test's p and once with the sign-flip test's, and the verdicts of both."""
    rest = [r for r in rows if r[2] is None]
    adjusted = {r[0]: pair for r, pair in zip(rest, zip(stats.holm([r[4] for r in rest]),
                                                        stats.holm([r[5] for r in rest])))}
    lines = ["| row | role | claim (predicted side of 0; a ratio: of 1) | p, t-test | with Holm | p, sign-flip "
             "| with Holm | verdict | verdict with Holm |", "|---|---|---|---|---|---|---|---|---|"]
    for name, claim, primary, diff, pt, ps, plain in sorted(rows, key=lambda r: r[2] is None):
        wanted = "—" if claim is None else f"{claim[0]} ({'<' if claim[1] < 0 else '>'} {1 if claim in RATIOS else 0})"
        if primary:
            lines.append(f"| {name} | primary: {primary} | {wanted} | {p_text(pt)} | — | {p_text(ps)} | — | {plain} "
                         "| — (primary: not corrected) |")
            continue
        ht, hs = adjusted[name]
        with_holm = stats.split_verdict(said(ht, diff, claim), said(hs, diff, claim))
        lines.append(f"| {name} | one of {len(rest)} | {wanted} | {p_text(pt)} | {p_text(ht)} | {p_text(ps)} "
                     f"| {p_text(hs)} | {plain} | {with_holm} |")
    return lines


def per_algo(runs, steps):
    """Per algorithm, the mean over seeds with its 95% bootstrap CI (stats.ci, as the front page's tables): train
    reward AUC, held-out accuracy at step 0 and at the last step, entropy and KL over the last steps."""
    seeds = sorted(runs)
    lines = [f"| algo | seeds | train reward AUC | held-out acc_lenient, step 0 → {steps} | held-out acc_strict, "
             f"step 0 → {steps} | entropy, last {LAST} steps | KL, last {LAST} steps |", "|---" * 7 + "|"]
    for algo in ALGOS:
        tr, ev = zip(*(runs[s][algo] for s in seeds))
        cells = [stats.ci([mean(t, "reward_mean") for t in tr])]
        cells += [f"{statistics.mean(at(e, 0, key) for e in ev):.3f} → {stats.ci([at(e, steps, key) for e in ev])}"
                  for key in ("acc_lenient", "acc_strict")]
        cells += [stats.ci([mean(t[-LAST:], key) for t in tr]) for key in ("entropy", "kl")]
        lines.append(f"| {algo} | {len(seeds)} | " + " | ".join(cells) + " |")
    return lines


def per_seed(runs):
    """Seed, grpo AUC, reinforce AUC and their difference."""
    lines = ["| seed | grpo AUC | reinforce AUC | reinforce - grpo |", "|---|---|---|---|"]
    for s in sorted(runs):
        g, r = (mean(runs[s][algo][0], "reward_mean") for algo in ALGOS)
        lines.append(f"| {s} | {g:.3f} | {r:.3f} | {r - g:+.3f} |")
    return lines


def tally(attempts, key):
    """'value (attempts with it), ...' of one key of the attempts."""
    values = [a[key] for a in attempts]
    return ", ".join(f"{v} ({values.count(v)})" for v in sorted(set(values))) or "none"


def provenance(lrs, steps, seeds):
    """The commits, CPU models and torch versions of the runs used (runs.jsonl), and their CPU hours."""
    path = os.path.join(HERE, "runs.jsonl")
    records = {}
    for line in open(path) if os.path.exists(path) else []:
        r = json.loads(line)
        records[r["algo"], float(r["lr"]), r["seed"], r["steps"]] = r
    used = [records.get((algo, float(lrs[algo]), s, steps)) for s in seeds for algo in ALGOS]
    found = [r for r in used if r]
    attempts = [a for r in found for a in r["attempts"]]
    lines = [f"Runs used: {len(used)} ({len(found)} with a line in runs.jsonl), {len(attempts)} attempts recorded "
             "in runs.jsonl, a lower bound: an attempt ended from outside before run.py noted its time has no record "
             "(see README.md, Provenance). "
             f"CPU time: {sum(r['cpu_s'] for r in found) / 3600:.2f} CPU hours "
             f"(wall {sum(r['wall_s'] for r in found) / 3600:.2f} h), summed over the recorded attempts.", "",
             f"- commits (recorded attempts): {tally(attempts, 'commit')}",
             f"- CPU models (recorded attempts): {tally(attempts, 'cpu')}",
             f"- torch (recorded attempts): {tally(attempts, 'torch')}"]
    if len(found) < len(used):
        lines.append(f"- {len(used) - len(found)} runs used have no line in runs.jsonl: their provenance is unknown")
    return lines


def starts(runs):
    """The held-out accuracy at step 0 (both algorithms start from the same policy on a seed) and any seed where the
    two step-0 evals differ."""
    seeds = sorted(runs)
    differ = [s for s in seeds if runs[s]["grpo"][1][0]["right"] != runs[s]["reinforce"][1][0]["right"]]
    text = (f"Held-out accuracy at step 0, mean over seeds: acc_lenient "
            f"{statistics.mean(runs[s]['grpo'][1][0]['acc_lenient'] for s in seeds):.3f}, acc_strict "
            f"{statistics.mean(runs[s]['grpo'][1][0]['acc_strict'] for s in seeds):.3f} (grpo's step-0 eval).")
    if differ:
        return text + f" The two step-0 evals differ on seeds {differ}: those pairs do not start alike."
    return text + " On every seed the step-0 evals of both algorithms are the same answers."


RULE = ("Verdict, the one rule of results/README.md (stats.verdict): a claim is reproduced where the 95% interval of "
        "our measurement excludes 0 (for a ratio: 1) in the direction the claim predicts, contradicted where it "
        "excludes 0 in the other direction, and inconclusive otherwise; for a paired difference the interval is the "
        "t-interval over seeds (n - 1 degrees of freedom), for the ratio of sds a bootstrap over seeds. An interval "
        "can show a difference but not its absence: an inconclusive row means that every value in its interval, of "
        "either sign, remains possible. A paired row's verdict rests on the t-interval (the t-test); where the exact "
        "sign-flip test at 5% gives another verdict, as it can where the per-seed numbers take few values (strict "
        "accuracy: near 0 on some seeds, 0.4-0.8 on others, ties at 0), both are given, each named.")

PRIMARY = ("The seed asks two questions, and one row answers each: GRPO learns faster (the train reward AUC, paired "
           "table) and GRPO's gradient estimate has lower variance (the relative gradient variance at the starting "
           "policy, gradient-variance table). Each is judged alone at 5%. Every other row is one of a family that "
           "Holm's step-down correction (stats.holm) is taken over, once with the t-test's p of each paired row and "
           "once with its sign-flip p (a ratio row has its bootstrap p in both): a verdict that does not survive the "
           "correction is inconclusive with it.")


def notes(steps):
    """How each number is made, and the convention for runs that never reach the threshold."""
    q = steps // 4
    return [f"Differences are reinforce - grpo on the same seed (same starting policy, same questions in the same "
            f"order, same held-out set). AUC: mean train reward over all {steps} steps; quarters: steps 1-{q} and the "
            f"last {q}. Held-out accuracy: acc_lenient and acc_strict of the greedy eval on 200 questions. Entropy, "
            f"KL and answer length (completion_len): mean over the last {LAST} steps; all-equal groups "
            "(frac_zero_std): share of the 2 groups per step whose 8 rewards are all equal, mean over all steps.",
            "",
            "t-test p: two-sided one-sample t-test of mean 0 (stats.t_test_p), below 0.05 exactly where the "
            "t-interval excludes 0. sign-flip p: exact two-sided sign-flip permutation test over all 2^n sign "
            "patterns (with n seeds it cannot go below 2/2^n; seeds with a difference of 0 add nothing to it). "
            "Bootstrap p of a ratio: twice the smaller share of its bootstrap resamples on either side of 1 "
            "(stats.bootstrap_p), below 0.05 where its percentile interval excludes 1. Leave-one-seed-out range: the "
            "smallest and largest mean difference when one seed is dropped. Seeds above / below 0: seeds where "
            "reinforce's number is the larger / the smaller; tied: the same on both.",
            "",
            f"Steps to {THRESHOLD}: the first step at which the 10-step trailing mean train reward reaches "
            f"{THRESHOLD} (stats.steps_to). A run that never reaches it has no number (never = inf): the paired row "
            "is over the seeds where both reached it, as in tiny60s/paired.md, and the seeds where only one did are "
            "listed under it; per algorithm, k/n as in tiny60s/horizon.md."]


def report(a):
    """The report's lines."""
    lrs, source = rates(a.lr)
    seeds = stats.parse_seeds(a.seeds)
    what = "the study's runs" if a.steps == STEPS else "sweep runs, not the study's seeds"
    lines = [f"# SmolLM2-135M-Instruct on arith, float32: reinforce - grpo paired by seed, {a.steps} steps ({what})",
             ""]
    if len(lrs) < len(ALGOS):
        return lines + [f"**0 of {len(seeds)} seeds.** lr.json does not exist yet (the learning-rate sweep is still "
                        "running) and --lr does not name both rates: no run to pair, nothing is claimed."]
    runs, done = load(lrs, a.steps, seeds)
    rates_text = ", ".join(f"{algo} at lr {lrs[algo]}" for algo in ALGOS)
    lines.append(f"**{len(runs)} of {len(seeds)} seeds** ({sorted(runs) or 'none'}) have finished {a.steps}-step runs "
                 f"of both algorithms; {rates_text} (from {source}).")
    if len(runs) < 2:
        finished_text = "; ".join(f"{algo}: {done[algo] or 'none'}" for algo in ALGOS)
        return lines + ["", f"Fewer than 2 seeds have finished runs of both algorithms (finished seeds: "
                        f"{finished_text}): no paired difference is computed and nothing is claimed."]
    eval_steps = sorted({e["step"] for r in runs.values() for _, ev in r.values() for e in ev} - {0})
    eval_steps = [s for s in eval_steps if all(any(e["step"] == s for e in ev) for r in runs.values()
                                               for _, ev in r.values())]
    auc = [mean(runs[s]["reinforce"][0], "reward_mean") - mean(runs[s]["grpo"][0], "reward_mean") for s in runs]
    lo, hi = stats.t_interval(auc)
    lines += ["", f"Train reward AUC, reinforce - grpo, the primary row of \"{FASTER[0]}\": "
              f"{statistics.mean(auc):+.3f} [{lo:+.3f}, {hi:+.3f}] (95% t-interval over {len(runs)} seeds); "
              f"{stats.verdict(lo, hi, FASTER[1])}.", "", RULE]
    if a.steps != STEPS:
        lines += ["", f"These are {a.steps}-step sweep runs, not the study's 100-step seeds: every verdict below is "
                  "the rule applied to them alone, not a verdict of the study."]
    elif len(runs) < len(seeds):
        lines += ["", f"Interim: {len(runs)} of {len(seeds)} seeds. Every verdict below is the rule applied to these "
                  f"{len(runs)} seeds alone; the study's verdicts are those over all {len(seeds)}."]
    lines += ["", "## Paired differences", ""]
    lines += paired_table(runs, a.steps, eval_steps)
    lines += ["", starts(runs), "", "## Per algorithm", ""] + per_algo(runs, a.steps)
    lines += ["", "## Spread over seeds", ""] + spread(runs, lrs)
    lines += ["", "## Per seed", ""] + per_seed(runs)
    if a.steps == STEPS:
        lines += ["", "## Gradient variance", ""] + variance()
    lines += ["", "## Primary rows and Holm's correction", "", PRIMARY, ""]
    lines += holm_table(family(runs, lrs, a.steps, eval_steps))
    lines += ["", "## Runs", ""] + provenance(lrs, a.steps, sorted(runs))
    return lines + ["", "## Definitions", ""] + notes(a.steps)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=STEPS, help="100: the study's seeds; 50: the sweep's runs")
    p.add_argument("--lr", action="append", metavar="ALGO=RATE", help="e.g. grpo=1e-5 (default: lr.json's chosen)")
    p.add_argument("--seeds", default=SEEDS, help="'0-9', '100,101'")
    p.add_argument("--md", default=None, help="where to write the report (default: report.md for the study itself)")
    a = p.parse_args()
    for spec in a.lr or []:
        if spec.partition("=")[0] not in ALGOS or not spec.partition("=")[2]:
            p.error(f"--lr {spec}: expected grpo=RATE or reinforce=RATE")
    text = "\n".join(report(a)) + "\n"
    md = a.md or (os.path.join(HERE, "report.md") if a.steps == STEPS and not a.lr else None)
    if md:
        with open(md, "w") as f:
            f.write(text)
    print(text, end="")


if __name__ == "__main__":
    main()
