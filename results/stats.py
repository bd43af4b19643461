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
The rule
  verdict         reproduced / contradicted / inconclusive from a 95% interval and the direction a claim predicts
"""
import gzip
import json
import math

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


def fmt_steps(values):
    """Steps to a threshold over seeds (inf: never): 'k/n: mean [CI]; median M', the mean and CI over the k seeds that
    reached it, the median over all n."""
    import numpy as np
    reached = [v for v in values if math.isfinite(v)]
    median = float(np.median(values))  # never = inf, so a median over all seeds
    med = f"{median:.0f}" if math.isfinite(median) else "never"
    if not reached:
        return f"0/{len(values)}; median never"
    lo, hi = bootstrap_ci(reached)
    return f"{len(reached)}/{len(values)}: {np.mean(reached):.0f} [{lo:.0f}, {hi:.0f}]; median {med}"


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


def loo_range(d):
    import numpy as np
    d = np.asarray(d, float)
    means = (d.sum() - d) / (len(d) - 1)
    return float(means.min()), float(means.max())


def sd_ratio_ci(x, y, n=10000, seed=0):
    """sd(x) / sd(y) over paired per-seed values, with a 95% percentile bootstrap interval that resamples seeds (the
    same resampled seeds for both)."""
    import numpy as np
    x, y = np.asarray(x), np.asarray(y)
    idx = np.random.default_rng(seed).integers(0, len(x), (n, len(x)))
    lo, hi = np.percentile(x[idx].std(1, ddof=1) / np.maximum(y[idx].std(1, ddof=1), 1e-12), [2.5, 97.5])
    return x.std(ddof=1) / y.std(ddof=1), lo, hi


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
