"""SmolLM2-135M-Instruct on arith across the pass@k spectrum: pass@k for k = 1, 2, 4, 8, 16 and
maj@16 of 16 answers per question sampled at the training temperature (0.7), on the first 100 held-out questions of
each seed, for the starting policy and for the final model of each 100-step run of the 3-seed command (run into
runs/smollm2_passk/, metrics in FOLDER = smollm2_lr1e-5_B2_100steps_passk/<algo>_seed<k>.jsonl.gz here).

`eval` runs grpo.py's own evaluate (the 3-seed command's flags plus --eval-n 100 --eval-samples 16; the sampler is
seeded from --seed, so every policy of one seed is judged on the same questions with the same sampler seed) and
appends one line to FOLDER/passk.jsonl; a name already there is skipped. `summarize` writes the tables, including
these runs' train lines against those of the same command in OTHER = smollm2_lr1e-5_B2_100steps/.

    python -m results.smollm2_arith.smollm2_passk eval --name grpo_seed0 --model runs/smollm2_passk/grpo_seed0/model \
        --seed 0
    python -m results.smollm2_arith.smollm2_passk eval --name start_seed0 --model smollm2 --seed 0
    python -m results.smollm2_arith.smollm2_passk summarize \
        --md results/smollm2_arith/smollm2_lr1e-5_B2_100steps_passk/passk.md
"""
import argparse
import json
import os
import time

from results.stats import TIMING, read_run

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER = os.path.join(HERE, "smollm2_lr1e-5_B2_100steps_passk")
OTHER = os.path.join(HERE, "smollm2_lr1e-5_B2_100steps")
RECORDS = os.path.join(FOLDER, "passk.jsonl")
ALGOS = ["grpo", "reinforce"]
K, N = 16, 100
COLS = [f"pass@{k}" for k in (1, 2, 4, 8, 16)] + [f"maj@{K}", "acc_lenient"]
FLAGS = ["--dataset", "arith", "--G", "8", "--batch-prompts", "2", "--max-new-tokens", "64", "--temperature", "0.7",
         "--dtype", "bfloat16", "--eval-n", str(N), "--eval-samples", str(K)]


def evaluate(name, model_name, seed):
    import torch
    import grpo
    records = read_records()
    if name in records:
        print(f"{name}: already in {RECORDS}")
        return
    torch.set_num_threads(1)
    args = grpo.get_args(["--model", model_name, "--seed", str(seed)] + FLAGS)
    cpu = torch.device("cpu")
    model, tokenizer = grpo.load_model(model_name, cpu)
    _, test_rows = grpo.load_data("arith", seed)
    t0 = time.time()
    with grpo.autocast(cpu, args.dtype):  # as train() evaluates at step 0
        result = grpo.evaluate(model, tokenizer, test_rows[:args.eval_n], args.max_new_tokens, K=args.eval_samples,
                               temperature=args.temperature, batch_size=args.batch_prompts * args.G,
                               generator=grpo.seeded_generator(cpu, seed, "eval", 0, 0))
    record = {"name": name, "model": model_name, "seed": seed, "flags": FLAGS, "seconds": round(time.time() - t0, 1),
              "threads": torch.get_num_threads(), **result}
    os.makedirs(FOLDER, exist_ok=True)
    with open(RECORDS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k not in ("samples", "correct", "correct_strict")}))


def read_records():
    if not os.path.exists(RECORDS):
        return {}
    with open(RECORDS) as f:
        return {r["name"]: r for r in map(json.loads, f)}


def complete_seeds(records):
    """The seeds whose start and every algorithm's final model have been evaluated."""
    return sorted(r["seed"] for name, r in records.items() if name.startswith("start_seed")
                  and all(f"{a}_seed{r['seed']}" in records for a in ALGOS))


def per_question(start, end, k):
    """Per seed, the per-question differences end - start in pass@k (from each record's counts of right answers)."""
    import numpy as np
    from grpo import pass_at_k
    return [np.array([pass_at_k(K, b, k) - pass_at_k(K, a, k) for a, b in zip(start[s]["correct"], end[s]["correct"])])
            for s in start]


def paired_boots(start, end, k, n=10000, seed=0):
    """Mean over seeds of (end - start) in pass@k, and its n bootstrap means resampling questions within each seed."""
    import numpy as np
    rng = np.random.default_rng(seed)
    diffs = per_question(start, end, k)
    boots = np.mean([d[rng.integers(0, len(d), (n, len(d)))].mean(1) for d in diffs], 0)
    return np.mean([d.mean() for d in diffs]), boots


def hierarchical_boots(start, end, k, n=10000, seed=0):
    """n bootstrap means of (end - start) in pass@k that resample the seeds, then the questions within each seed
    drawn: the interval includes the seed-to-seed variation (with 3 seeds, only 10 distinct draws of seeds)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    diffs = per_question(start, end, k)
    picks = rng.integers(0, len(diffs), (n, len(diffs)))
    total = np.zeros(n)
    for j in range(len(diffs)):
        for s, d in enumerate(diffs):
            rows = picks[:, j] == s
            total[rows] += d[rng.integers(0, len(d), (rows.sum(), len(d)))].mean(1)
    return total / len(diffs)


def paired_ci(start, end, col):
    """`col` (pass@k) of end minus start, mean over seeds with a 95% CI that resamples questions within each seed."""
    import numpy as np
    mean, boots = paired_boots(start, end, int(col.split("@")[1]))
    return f"{mean:+.3f} [{np.percentile(boots, 2.5):+.3f}, {np.percentile(boots, 97.5):+.3f}]"


def summarize(md):
    import statistics
    records = read_records()
    seeds = complete_seeds(records)
    policies = {"start": {s: records[f"start_seed{s}"] for s in seeds}}
    policies.update({a: {s: records[f"{a}_seed{s}"] for s in seeds} for a in ALGOS})
    head = "| policy | seed | " + " | ".join(c.replace("acc_lenient", "greedy") for c in COLS) + " | seconds |"
    lines = [f"SmolLM2-135M-Instruct on arith, the 3-seed command (100 steps, lr 1e-5, T 0.7); {K} answers per "
             f"question sampled at T = 0.7 on the first {N} held-out questions of each seed; seeds {seeds}.", "",
             head, "|---|---|" + "---|" * (len(COLS) + 1)]
    for name, by_seed in policies.items():
        for s, r in by_seed.items():
            lines.append(f"| {name} | {s} | " + " | ".join(f"{r[c]:.3f}" for c in COLS) + f" | {r['seconds']:.0f} |")
    lines += ["", "Mean over seeds:", "", head.replace(" seed |", "").replace(" seconds |", ""),
              "|---|" + "---|" * len(COLS)]
    for name, by_seed in policies.items():
        lines.append(f"| {name} | " + " | ".join(f"{statistics.mean(r[c] for r in by_seed.values()):.3f}"
                                                for c in COLS) + " |")
    passk = [c for c in COLS if c.startswith("pass@")]
    rest = [c for c in COLS if c not in passk]
    lines += ["", "Paired differences (same seed, same questions), mean over seeds; pass@k with a 95% CI that "
              "resamples questions within each seed (maj@16, greedy: the mean only, the records keep no "
              "per-question values of them):", "",
              "| difference | " + " | ".join(passk + rest).replace("acc_lenient", "greedy") + " |",
              "|---|" + "---|" * len(COLS)]
    for a, b in [("grpo", "start"), ("reinforce", "start"), ("reinforce", "grpo")]:
        means = [statistics.mean(policies[a][s][c] - policies[b][s][c] for s in seeds) for c in rest]
        lines.append(f"| {a} - {b} | " + " | ".join(paired_ci(policies[b], policies[a], c) for c in passk) + " | "
                     + " | ".join(f"{m:+.3f}" for m in means) + " |")
    lines += ["", "Each seed's difference (its own 100 questions), the mean over seeds, a 95% CI that resamples "
              "questions within each seed (the seeds fixed), and a hierarchical 95% CI that resamples the 3 seeds and "
              "then the questions within each: the only one of the two that includes seed-to-seed variation, and a "
              "coarse one "
              "(3 seeds allow 10 distinct resamples of seeds):", "",
              "| difference | k | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | CI, questions | CI, seeds "
              "then questions |", "|---|---|" + "---|" * (len(seeds) + 3)]
    import numpy as np
    for a, b in [("grpo", "start"), ("reinforce", "start"), ("reinforce", "grpo")]:
        for c in passk:
            k = int(c.split("@")[1])
            mean, boots = paired_boots(policies[b], policies[a], k)
            hier = hierarchical_boots(policies[b], policies[a], k)
            span = lambda x: "[{:+.3f}, {:+.3f}]".format(*np.percentile(x, [2.5, 97.5]))  # noqa: E731
            lines.append(f"| {a} - {b} | {k} | " + " | ".join(f"{d.mean():+.3f}" for d in per_question(
                policies[b], policies[a], k)) + f" | {mean:+.3f} | {span(boots)} | {span(hier)} |")
    lines += ["", "These runs (here) against the same command's runs in "
              "results/smollm2_arith/smollm2_lr1e-5_B2_100steps/ (other), same seed:", "",
              "| run | step-0 greedy (here / other) | train lines equal | train reward AUC (here / other) "
              "| entropy, last 10 (here / other) | greedy lenient, step 100 (here / other) |",
              "|---|---|---|---|---|---|"]
    for a in ALGOS:
        for s in seeds:
            (_, *new), (_, *old) = (read_run(os.path.join(d, f"{a}_seed{s}.jsonl.gz")) for d in (FOLDER, OTHER))
            tr, ev = zip(new, old)
            untimed = lambda x: {k: v for k, v in x.items() if k not in TIMING}  # noqa: E731
            same = sum(untimed(x) == untimed(y) for x, y in zip(*tr))
            auc = [statistics.mean(x["reward_mean"] for x in t) for t in tr]
            ent = [statistics.mean(x["entropy"] for x in t[-10:]) for t in tr]
            lines.append(f"| {a}_seed{s} | {ev[0][0]['acc_lenient']:.3f} ({ev[0][0]['acc_strict']:.3f}) / "
                         f"{ev[1][0]['acc_lenient']:.3f} ({ev[1][0]['acc_strict']:.3f}) | {same}/{len(tr[0])} | "
                         f"{auc[0]:.3f} / {auc[1]:.3f} | {ent[0]:.3f} / {ent[1]:.3f} | "
                         f"{ev[0][-1]['acc_lenient']:.3f} / {ev[1][-1]['acc_lenient']:.3f} |")
    text = "\n".join(lines)
    with open(md, "w") as f:
        f.write(text + "\n")
    print(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("eval", help="sampled evaluation of one policy")
    e.add_argument("--name", required=True, help="start_seed<k> or <algo>_seed<k>")
    e.add_argument("--model", required=True, help="smollm2 (the starting policy) or a run's output folder")
    e.add_argument("--seed", type=int, required=True, help="draws the held-out questions and seeds the sampler")
    s = sub.add_parser("summarize", help="the tables")
    s.add_argument("--md", required=True)
    a = p.parse_args()
    if a.cmd == "eval":
        evaluate(a.name, a.model, a.seed)
    else:
        summarize(a.md)


if __name__ == "__main__":
    main()
