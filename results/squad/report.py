"""Per-seed SQuAD exact match (EM) and F1 of greedy answers at step 0 and at the last eval, their paired changes
with standard errors over the questions, the spread over seeds, and what the training answers look like.

    python -m results.squad.report [results/squad/seed1 results/squad/seed2 ...] > results/squad/report.txt

Reads each folder's metrics.jsonl (eval records: `right` = F1 a question, `right_strict` = EM a question) and
rollouts.jsonl. SE of a change = sd(d) / sqrt(n) of the per-question differences d (last eval minus step 0)."""

import glob
import json
import math
import os
import statistics
import sys

from examples.squad import normalize

T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def records(folder, name="metrics.jsonl"):
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def paired(first, last, key):
    d = [b - a for a, b in zip(first[key], last[key])]
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d)), sum(x > 0 for x in d), sum(x < 0 for x in d)


def first_line(text):
    return next((line for line in text.splitlines() if line.strip()), "")


def answer_shape(groups):
    """Of the sampled answers: mean words of the first line, the share whose normalized first line is a span of the
    normalized context, the share with EM = 1, the mean F1 (the reward), the share cut at the token limit."""
    answers = [(g, a) for g in groups for a in g["answers"]]
    context = {id(g): " " + normalize(g["question"].split("\n\nQuestion: ")[0]) + " " for g in groups}
    words = [len(normalize(first_line(a["text"])).split()) for g, a in answers]
    span = [bool(normalize(first_line(a["text"]))) and f" {normalize(first_line(a['text']))} " in context[id(g)]
            for g, a in answers]
    em = [any(normalize(first_line(a["text"])) == normalize(r) for r in g["ref"]) for g, a in answers]
    n = len(answers)
    return (n, sum(words) / n, sum(span) / n, sum(em) / n, sum(a["reward"] for g, a in answers) / n,
            sum(a["truncated"] for g, a in answers) / n)


def main(folders):
    rows = []
    print("Greedy answers on the first 200 questions of the validation split's fixed shuffled order (Super_Bowl_50);"
          " change = last eval - step 0, paired over the questions, ± SE = sd(d)/sqrt(n); (+k/-m: questions up/down)")
    print()
    print(f"{'run':<8} {'steps':>5} {'n':>4} | {'EM 0':>6} {'EM end':>6} {'EM change ± SE':>18} {'up/down':>7} | "
          f"{'F1 0':>6} {'F1 end':>6} {'F1 change ± SE':>18} {'up/down':>7}")
    for folder in folders:
        recs = records(folder)
        evals = [r for r in recs if r["type"] == "eval"]
        train = [r for r in recs if r["type"] == "train"]
        name = os.path.basename(folder.rstrip("/"))
        if not recs:
            print(f"{name:<8} no metrics.jsonl")
            continue
        config = next(r for r in recs if r["type"] == "config")
        if len(evals) < 2 or evals[-1]["step"] != config["steps"]:
            print(f"{name:<8} not finished: {len(evals)} eval records, {len(train)} of {config['steps']} steps")
            continue
        first, last = evals[0], evals[-1]
        em = paired(first, last, "right_strict")
        f1 = paired(first, last, "right")
        rows.append((name, first, last, em, f1))
        print(f"{name:<8} {last['step']:>5} {last['n']:>4} | {first['acc_strict']:6.3f} {last['acc_strict']:6.3f} "
              f"{em[0]:+8.3f} ± {em[1]:.3f}   {f'+{em[2]}/-{em[3]}':>7} | {first['acc_lenient']:6.3f} "
              f"{last['acc_lenient']:6.3f} {f1[0]:+8.3f} ± {f1[1]:.3f}   {f'+{f1[2]}/-{f1[3]}':>7}")
    if len(rows) >= 2:
        print()
        print(f"over {len(rows)} seeds: change, mean and sd over seeds, and the 95% t interval "
              f"(mean ± t(0.975, {len(rows) - 1}) sd/sqrt({len(rows)}))")
        for label, i in (("EM", 3), ("F1", 4)):
            ch = [r[i][0] for r in rows]
            mean, sd = statistics.mean(ch), statistics.stdev(ch)
            half = T_975[len(ch) - 1] * sd / math.sqrt(len(ch))
            ends = [r[2]["acc_strict" if label == "EM" else "acc_lenient"] for r in rows]
            print(f"  {label}: change {mean:+.3f}, sd {sd:.3f}, 95% [{mean - half:+.3f}, {mean + half:+.3f}]; "
                  f"end {statistics.mean(ends):.3f} (sd {statistics.stdev(ends):.3f}); "
                  f"seeds with a change beyond 2 SE: {sum(abs(r[i][0]) > 2 * r[i][1] for r in rows)} of {len(rows)}")
    print()
    print("Training (train records), mean over the first and the last third of the steps: reward (F1 of the sampled "
          "answers), groups with all-equal rewards (no signal), completion tokens, share cut at the token limit, KL")
    for folder in folders:
        train = [r for r in records(folder) if r["type"] == "train"]
        if len(train) < 3:
            continue
        k = len(train) // 3
        parts = [train[:k], train[-k:]]

        def avg(key):
            return " -> ".join(f"{statistics.mean(r[key] for r in part):.3f}" for part in parts)
        print(f"  {os.path.basename(folder.rstrip('/')):<8} steps 1-{k} -> {len(train) - k + 1}-{len(train)}: reward "
              f"{avg('reward_mean')}, no signal {avg('frac_zero_std')}, tokens {avg('completion_len')}, cut "
              f"{avg('trunc_rate')}, KL {avg('kl')}; {sum(r['step_s'] for r in train) / 60:.1f} min of steps")
    print()
    print("Sampled training answers (rollouts.jsonl, temperature 0.7, all groups of the logged steps): words in the "
          "first line, share that is a span of the context, share with EM = 1, mean F1 (the reward), share cut at "
          "32 tokens")
    for folder in folders:
        for r in records(folder, "rollouts.jsonl"):
            n, words, span, em, f1, cut = answer_shape(r["groups"])
            name = os.path.basename(folder.rstrip("/"))
            print(f"  {name:<8} step {r['step']:>3}: {n:>3} answers, {words:5.1f} words, "
                  f"span {span:.2f}, EM {em:.2f}, F1 {f1:.3f}, cut {cut:.2f}")
    print()
    print("Greedy eval answers kept in the eval records (the first 3 questions), at step 0 and at the end")
    for name, first, last, _, _ in rows:
        for s0, s1 in zip(first["samples"], last["samples"]):
            q = s0["question"].split("\n\nQuestion: ")[1]
            print(f"  {name} {q!r} gold {s0['ref']}")
            print(f"    step {0:<3}: {first_line(s0['completion'])[:150]!r}")
            print(f"    step {last['step']:<3}: {first_line(s1['completion'])[:150]!r}")


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    main(sys.argv[1:] or sorted(glob.glob(os.path.join(here, "seed*/"))))
