"""The pass@k spectrum in one figure: after training minus the starting policy, against k, in the
three settings where it was measured. Reads the raw files only; draws no new samples.

- tiny30, 300 steps (the tiny30 study): results/tiny30/tiny30_lr1e-4_B4_300steps_passk/, 64 answers per question at
  T = 1.0, 200 questions per seed, band: 95% bootstrap over seeds.
- tiny60s, 1000 steps (the tiny60s study): grpo and reinforce at the rates of results/tiny60s/lr.json (their folders
  results/tiny60s/tiny60s_lr<lr>_B16_1000steps_passk/), negative at 3e-4, the same eval at the last step.
- SmolLM2-135M, 100 steps (the smollm2_arith study):
  results/smollm2_arith/smollm2_lr1e-5_B2_100steps_passk/passk.jsonl, 16 answers per question at T = 0.7, 100
  questions per seed; with 3 seeds the band resamples questions within each seed (as passk.md's CIs).

    python -m results.spectrum --png results/spectrum.png
"""
import argparse
import json
import os

from results.smollm2_arith import smollm2_passk
from results.stats import band
from results.tiny30 import passk
from results.tiny60s import horizon

COLORS = {"grpo": "C0", "reinforce": "C1", "drgrpo_seq": "C2", "negative": "C3"}


def smollm2_bands(ks):
    """{algo: (mean, lo, hi)} of Δ pass@k against the start, questions resampled within each seed; the seeds; the
    start's mean pass@1."""
    import numpy as np
    records = smollm2_passk.read_records()
    seeds = smollm2_passk.complete_seeds(records)
    start = {s: records[f"start_seed{s}"] for s in seeds}
    bands = {}
    for algo in smollm2_passk.ALGOS:
        end = {s: records[f"{algo}_seed{s}"] for s in seeds}
        means, boots = zip(*(smollm2_passk.paired_boots(start, end, k) for k in ks))
        bands[algo] = (np.array(means), *np.percentile(np.array(boots), [2.5, 97.5], 1))
    return bands, seeds, np.mean([r["pass@1"] for r in start.values()])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--png", required=True)
    a = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ks64, ks16 = passk.KS, [1, 2, 4, 8, 16]
    tiny30, _ = passk.load(os.path.join(passk.HERE, "tiny30_lr1e-4_B4_300steps_passk"))
    start30 = sum(e["pass@1"] for e in tiny30["start"].values()) / len(tiny30["start"])
    panels = [(f"tiny30, 300 steps (start pass@1 {start30:.2f})", ks64,
               {algo: band([[by_seed[s][f"pass@{k}"] - tiny30["start"][s][f"pass@{k}"] for k in ks64]
                                  for s in by_seed]) for algo, by_seed in tiny30.items() if algo != "start"},
               f"{len(tiny30['start'])} seeds")]
    with open(os.path.join(horizon.HERE, "lr.json")) as f:
        lr = json.load(f)  # each algorithm's rate, as run_all.sh reads it
    runs = horizon.load([f"grpo=tiny60s_lr{lr['grpo']['chosen']}_B16_1000steps_passk",
                         f"reinforce=tiny60s_lr{lr['reinforce']['chosen']}_B16_1000steps_passk",
                         "negative=tiny60s_lr3e-4_B16_1000steps_passk"])
    start60 = [ev["pass@1"] for ev in horizon.starts(runs).values()]
    panels.append((f"tiny60s, 1000 steps (start pass@1 {sum(start60) / len(start60):.2f})", ks64,
                   {algo: band(horizon.end_minus_start(by_seed, ks64)) for algo, by_seed in runs.items()},
                   ", ".join(f"{algo} {len(by_seed)}" for algo, by_seed in runs.items()) + " seeds"))
    bands, seeds, start = smollm2_bands(ks16)
    panels.append((f"SmolLM2-135M, 100 steps (start pass@1 {start:.2f})", ks16, bands,
                   f"{len(seeds)} seeds, questions resampled"))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (title, ks, by_algo, note) in zip(axes, panels):
        for algo, (mean, lo, hi) in by_algo.items():
            ax.plot(ks, mean, marker="o", ms=3, color=COLORS[algo], label=algo)
            ax.fill_between(ks, lo, hi, color=COLORS[algo], alpha=0.15)
        ax.axhline(0, color="black", lw=0.8)
        ax.set(xscale="log", title=f"{title}\n{note}, 95% band", xlabel="k")
        ax.set_xticks(ks)
        ax.set_xticklabels([str(k) for k in ks])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("Δ pass@k, after training minus start")
    fig.tight_layout()
    fig.savefig(a.png, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
