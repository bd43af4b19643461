"""What the studies share: reading a run's metrics file, the train-reward curves, and the intervals and the verdict rule
of results/README.md.

Reading
  read_run        (config, train lines, eval lines) of one gzipped metrics.jsonl
  TIMING          the per-step timing keys, which differ between two runs of one seed
Curves
  moving_average  trailing mean over k steps
  steps_to        first step at which the 10-step trailing mean train reward reaches a threshold
Intervals over seeds
  bootstrap_ci    95% percentile bootstrap of the mean; ci and fmt_steps format it
  band            per-column mean and 95% bootstrap band of per-seed curves
  t_interval      mean +- t(0.975, n-1) sd / sqrt(n), the interval the verdicts use (t_quantile: no scipy here)
  sign_flip_p     exact two-sided sign-flip permutation p of a mean difference
  loo_range       the smallest and largest mean when one seed is left out
  sd_ratio_ci     sd(x) / sd(y) over seeds with a bootstrap interval; sd_ratio formats it
Tests over seeds and their correction for many rows
  t_test_p        two-sided p of the one-sample t-test of mean = 0, the test of the t-interval (t_cdf)
  bootstrap_p     two-sided p of a percentile bootstrap: the test whose 95% interval the ratio rows print
  sd_ratio_p      bootstrap_p of sd_ratio_ci's resamples
  holm            Holm's step-down adjusted p-values of a family of rows (monotone, capped at 1)
The rule
  verdict         reproduced / contradicted / inconclusive from a 95% interval and the direction a claim predicts
  verdict_p       the same rule from a p-value and the sign of the difference (for a corrected p)
  split_verdict   the verdict of each of two tests, both named where they disagree
Provenance
  machine         the commit of grpo.py, the CPU model and torch that made a result
"""
import gzip
import json
import math
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
ALGOS = ("grpo", "reinforce", "drgrpo_seq", "negative")  # the order the tables list algorithms in
TIMING = {"step_s", "gen_s", "gen_tok_per_s"}  # per-step timings: they differ between two runs of one seed


def lr_name(lr):
    return f"{lr:.0e}".replace("e-0", "e-")  # 3e-05 -> 3e-5


def parse_seeds(spec):
    """'0-4' or '0,3,5' or '7'."""
    out = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def read_run(path):
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    return lines[0], [x for x in lines if x["type"] == "train"], [x for x in lines if x["type"] == "eval"]


def moving_average(x, k=10):
    """Trailing mean over k steps; entry i is the mean of steps i-k+2 .. i+1 (1-based), defined from step k on."""
    import numpy as np
    c = np.cumsum(np.insert(np.asarray(x, float), 0, 0.0))
    return (c[k:] - c[:-k]) / k


def steps_to(rewards, threshold, k=10):
    """First step (1-based) at which the 10-step trailing mean train reward reaches threshold; inf if never."""
    import numpy as np
    hit = np.nonzero(moving_average(rewards, k) >= threshold)[0]
    return float(hit[0] + k) if len(hit) else math.inf


def bootstrap_ci(values, n=10000, seed=0, stat=None):
    """95% percentile bootstrap CI of the mean (or `stat`) over the given per-seed values."""
    import numpy as np
    x = np.asarray(values, float)
    if len(x) == 0:
        return math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, len(x), (n, len(x)))
    stats = x[idx].mean(1) if stat is None else np.apply_along_axis(stat, 1, x[idx])
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(lo), float(hi)


def ci(values, digits=3, sign=False):
    """'mean [lo, hi]' with the 95% bootstrap CI over seeds."""
    import numpy as np
    lo, hi = bootstrap_ci(values)
    f = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{f.format(np.mean(values))} [{f.format(lo)}, {f.format(hi)}]"


def fmt_steps(values, digits=0):
    """Steps to a threshold over seeds (inf: never): 'k/n: mean [CI]; median M', the mean and CI over the k seeds that
    reached it, the median over all n; `digits` decimals (a mean of 32.5 steps is 32 with none: round half to even)."""
    import numpy as np
    reached = [v for v in values if math.isfinite(v)]
    median = float(np.median(values))  # never = inf, so a median over all seeds
    med = f"{median:.{digits}f}" if math.isfinite(median) else "never"
    if not reached:
        return f"0/{len(values)}; median never"
    lo, hi = bootstrap_ci(reached)
    f = f"{{:.{digits}f}}"
    return f"{len(reached)}/{len(values)}: {f.format(np.mean(reached))} [{f.format(lo)}, {f.format(hi)}]; median {med}"


def band(values, n=10000, seed=0):
    """Per-column mean and 95% bootstrap band over seeds (rows) of equal-length per-seed curves."""
    import numpy as np
    x = np.asarray(values, float)
    idx = np.random.default_rng(seed).integers(0, len(x), (n, len(x)))
    means = x[idx].mean(1)
    return x.mean(0), np.percentile(means, 2.5, 0), np.percentile(means, 97.5, 0)


def t_quantile(q, df):
    """Student's t quantile by bisection on the CDF, the density integrated numerically (no scipy here)."""
    import numpy as np
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(x):
        t = np.linspace(0.0, x, 20001)
        return 0.5 + np.trapezoid(c * (1 + t * t / df) ** (-(df + 1) / 2), t)

    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < q else (lo, mid)
    return (lo + hi) / 2


def t_interval(d):
    import numpy as np
    d = np.asarray(d, float)
    half = t_quantile(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean() - half), float(d.mean() + half)


def sign_flip_p(d):
    """Exact two-sided sign-flip permutation p-value of the mean difference, all 2^n sign patterns."""
    import numpy as np
    d = np.asarray(d, float)
    assert len(d) <= 20, "exact enumeration up to 20 seeds"
    patterns = np.arange(2 ** len(d))
    sums = np.zeros(len(patterns))
    for j, x in enumerate(d):
        sums += np.where((patterns >> j) & 1, -x, x)
    return float(np.mean(np.abs(sums) >= abs(d.sum()) - 1e-12))


def betainc(a, b, x):
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Numerical Recipes, 6.4)."""
    if x <= 0.0 or x >= 1.0:
        return min(max(x, 0.0), 1.0)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1.0 - betainc(b, a, 1.0 - x)

    def nonzero(v):
        return v if abs(v) > 1e-300 else 1e-300

    c, d = 1.0, 1.0 / nonzero(1.0 - (a + b) * x / (a + 1))
    h = d
    for m in range(1, 1000):
        for aa in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                   -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 / nonzero(1.0 + aa * d)
            c = nonzero(1.0 + aa / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return front * h / a


def t_cdf_tail(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df / (df + t^2)}(df / 2, 1 / 2)."""
    return betainc(df / 2, 0.5, df / (df + t * t))


def t_test_p(d):
    """Two-sided p of the one-sample t-test of mean(d) = 0 with n - 1 degrees of freedom: below 0.05 exactly where
    the 95% t-interval (t_interval) excludes 0."""
    import numpy as np
    d = np.asarray(d, float)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return 1.0 if mean == 0 else 0.0
    return t_cdf_tail(mean / (sd / math.sqrt(len(d))), len(d) - 1)


def bootstrap_p(resamples, null):
    """Two-sided p of a percentile bootstrap test of the statistic = null: twice the smaller share of resamples on
    either side of null (ties count on both), at most 1. Below 0.05 where the 95% percentile interval of the same
    resamples excludes null."""
    import numpy as np
    r = np.asarray(resamples, float)
    return float(min(1.0, 2 * min(np.mean(r <= null), np.mean(r >= null))))


def holm(p):
    """Holm's step-down adjusted p-values, in the order given: sorted ascending, the i-th smallest (i = 0, 1, ...) is
    multiplied by m - i, each adjusted value is at least the one before it (monotone) and at most 1. A row survives
    the correction at level alpha where its adjusted p is below alpha; the family-wise error rate is then at most
    alpha, whatever the dependence between the rows."""
    m = len(p)
    out, running = [1.0] * m, 0.0
    for i, k in enumerate(sorted(range(m), key=lambda k: p[k])):
        running = max(running, min(1.0, (m - i) * p[k]))
        out[k] = running
    return out


def loo_range(d):
    import numpy as np
    d = np.asarray(d, float)
    means = (d.sum() - d) / (len(d) - 1)
    return float(means.min()), float(means.max())


def sd_ratio_resamples(x, y, n=10000, seed=0):
    """sd(x) / sd(y) over n bootstrap resamples of the seeds (the same resampled seeds for both); a resample whose y
    has sd 0 divides by 1e-12."""
    import numpy as np
    x, y = np.asarray(x), np.asarray(y)
    idx = np.random.default_rng(seed).integers(0, len(x), (n, len(x)))
    return x[idx].std(1, ddof=1) / np.maximum(y[idx].std(1, ddof=1), 1e-12)


def sd_ratio_ci(x, y, n=10000, seed=0):
    """sd(x) / sd(y) over paired per-seed values, with a 95% percentile bootstrap interval that resamples seeds (the
    same resampled seeds for both)."""
    import numpy as np
    x, y = np.asarray(x), np.asarray(y)
    lo, hi = np.percentile(sd_ratio_resamples(x, y, n, seed), [2.5, 97.5])
    return x.std(ddof=1) / y.std(ddof=1), lo, hi


def sd_ratio_p(x, y, n=10000, seed=0):
    """Two-sided bootstrap p of sd(x) / sd(y) = 1, from the resamples sd_ratio_ci takes its interval from."""
    return bootstrap_p(sd_ratio_resamples(x, y, n, seed), 1.0)


def sd_ratio(x, y):
    """'sd(x) / sd(y) | ratio [95% CI]' over paired per-seed values, resampling seeds (sd_ratio_ci)."""
    import statistics
    ratio, lo, hi = sd_ratio_ci(x, y)
    return f"{statistics.stdev(x):.3f} / {statistics.stdev(y):.3f} | {ratio:.1f} [{lo:.1f}, {hi:.1f}]"


def verdict(lo, hi, sign):
    """The one rule of results/README.md. sign +1: the claim predicts a difference above 0; -1: below 0; 0: no
    difference (a metric that does not move). Reproduced where the 95% interval excludes 0 in that direction,
    contradicted where it excludes 0 in the other, inconclusive otherwise. An interval can show a difference but never
    its absence: a claim of none is contradicted or inconclusive, never reproduced."""
    if sign == 0:
        return "contradicted" if lo > 0 or hi < 0 else "inconclusive (no difference detected)"
    if (lo > 0 and sign < 0) or (hi < 0 and sign > 0):
        return "contradicted"
    return "reproduced" if (lo > 0 and sign > 0) or (hi < 0 and sign < 0) else "inconclusive"


def verdict_p(p, diff, sign, alpha=0.05):
    """The rule of verdict() from a test's p-value (a corrected one, holm) and the sign of the difference (for a
    ratio: ratio - 1): a difference is shown where p < alpha, in the direction of diff."""
    if sign == 0:
        return "contradicted" if p < alpha else "inconclusive (no difference detected)"
    if p >= alpha:
        return "inconclusive"
    return "reproduced" if diff * sign > 0 else "contradicted"


def split_verdict(by_t, by_sign_flip):
    """One verdict where the t-test and the sign-flip test agree; both, each named, where they do not (a per-seed
    outcome with few values, such as an accuracy near 0 on some seeds and far from it on others)."""
    return by_t if by_t == by_sign_flip else f"t-test: {by_t}; sign-flip: {by_sign_flip}"


def machine():
    """What made a result: the commit of grpo.py (+dirty where grpo.py differs from it), the CPU model, torch."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "grpo.py"], cwd=ROOT, capture_output=True, text=True)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    import torch
    return {"commit": commit + ("+dirty" if dirty.stdout.strip() else ""), "cpu": cpu, "torch": torch.__version__}
