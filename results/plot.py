"""Turn grpo.py metrics.jsonl files into one PNG and a markdown table.

Each --run is LABEL=FILE[,FILE...]: several files under one label are seeds of the same setting,
drawn as their mean with a min-max band. Left panel: train reward (smoothed over --smooth steps);
right panel: eval accuracy (lenient, solid; strict, dashed) where the files hold eval lines.
matplotlib is optional for grpo.py and needed only here: pip install matplotlib
Usage, from the repository root:
  python -m results.plot --run grpo=runs/gsm8k_grpo/metrics.jsonl --run reinforce=runs/gsm8k_reinforce/metrics.jsonl \
      --png gsm8k.png --md gsm8k.md
"""
import argparse
import json
import statistics


def read(path):
    lines = [json.loads(line) for line in open(path)]
    train = [x for x in lines if x["type"] == "train"]
    evals = [x for x in lines if x["type"] == "eval"]
    return train, evals


def smooth(values, k):
    return [sum(values[max(0, i - k + 1):i + 1]) / len(values[max(0, i - k + 1):i + 1]) for i in range(len(values))]


def band(series):
    """Per-step mean, min and max over seeds (cut to the shortest run)."""
    n = min(len(s) for s in series)
    cols = [[s[i] for s in series] for i in range(n)]
    return [statistics.mean(c) for c in cols], [min(c) for c in cols], [max(c) for c in cols]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--run", action="append", required=True, help="LABEL=FILE[,FILE...]")
    p.add_argument("--png", required=True)
    p.add_argument("--md", required=True)
    p.add_argument("--smooth", type=int, default=5, help="moving-average window for the train reward")
    p.add_argument("--title", default="")
    a = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
    rows = []
    for spec in a.run:
        label, files = spec.split("=", 1)
        runs = [read(f) for f in files.split(",")]
        rewards = [smooth([x["reward_mean"] for x in train], a.smooth) for train, _ in runs]
        mean, lo, hi = band(rewards)
        steps = list(range(1, len(mean) + 1))
        line, = ax_r.plot(steps, mean, label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            ax_r.fill_between(steps, lo, hi, alpha=0.2, color=line.get_color())
        raw = [[x["reward_mean"] for x in train] for train, _ in runs]
        n = min(len(r) for r in raw)
        row = {"label": label, "seeds": len(runs), "steps": n,
               "reward_first10": statistics.mean(statistics.mean(r[:10]) for r in raw),
               "reward_last10": statistics.mean(statistics.mean(r[n - 10:n]) for r in raw),
               "frac_zero_std": statistics.mean(statistics.mean(x["frac_zero_std"] for x in t) for t, _ in runs),
               "step_s": statistics.median(x["step_s"] for t, _ in runs for x in t)}
        if all(evals for _, evals in runs):
            for key, style in (("acc_lenient", "-"), ("acc_strict", "--")):
                series = [[e[key] for e in evals] for _, evals in runs]
                m, lo_a, hi_a = band(series)
                xs = [e["step"] for e in runs[0][1]][:len(m)]
                ax_a.plot(xs, m, style, marker="o", color=line.get_color(), label=f"{label} {key[4:]}")
                if len(runs) > 1:
                    ax_a.fill_between(xs, lo_a, hi_a, alpha=0.15, color=line.get_color())
                row[f"{key}_start"] = m[0]
                row[f"{key}_end"] = m[-1]
        rows.append(row)
    ax_r.set(xlabel="step", ylabel=f"train reward ({a.smooth}-step mean)", title="train reward")
    ax_a.set(xlabel="step", ylabel="accuracy", title="greedy eval accuracy (held-out)")
    for ax in (ax_r, ax_a):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)

    head = ["run", "seeds", "steps", "reward, first 10 steps", "reward, last 10 steps", "groups with no signal",
            "median s/step"]
    has_eval = all("acc_lenient_start" in r for r in rows)
    if has_eval:
        head += ["eval lenient start → end", "eval strict start → end"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], str(r["seeds"]), str(r["steps"]), f"{r['reward_first10']:.3f}",
                 f"{r['reward_last10']:.3f}", f"{r['frac_zero_std']:.2f}", f"{r['step_s']:.1f}"]
        if has_eval:
            cells += [f"{r['acc_lenient_start']:.2f} → {r['acc_lenient_end']:.2f}",
                      f"{r['acc_strict_start']:.2f} → {r['acc_strict_end']:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    with open(a.md, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
