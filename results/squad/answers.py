"""The greedy answers behind the eval records, read whole: the first N validation questions (the eval's fixed order)
answered greedily by the untrained model and by each run's final model (OUT/model), as grpo.py's evaluation does
(same prompt, 32 new tokens), with what each answer looks like: words in its first line, whether that line is a
span of the context, EM and F1.

    OMP_NUM_THREADS=1 python -m results.squad.answers --n 64 results/squad/seed1 results/squad/seed2 \
        > results/squad/answers.txt
"""

import argparse
import statistics
import time

import torch

import examples.squad
import grpo
from examples.squad import normalize
from results.squad.report import first_line


def main():
    p = argparse.ArgumentParser()
    p.add_argument("runs", nargs="*")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--show", type=int, default=8)
    args = p.parse_args()
    grpo.INSTRUCTION = examples.squad.INSTRUCTION
    _, test = examples.squad.load_squad("../shared/squad", 0)
    rows = test[:args.n]
    print(f"greedy answers, 32 new tokens, the first {len(rows)} questions of the eval order (Super_Bowl_50)")
    texts = {}
    for name in ["smollm2", *[f"{r.rstrip('/')}/model" for r in args.runs]]:
        t0 = time.time()
        model, tok = grpo.load_model(name, torch.device("cpu"))
        batch = grpo.generate(model, tok, [grpo.build_prompt(tok, r["question"]) for r in rows], 32, temperature=0)
        texts[name] = grpo.decode_completions(tok, batch)
        lines = [first_line(t) for t in texts[name]]
        ctx = [" " + normalize(r["question"].split("\n\nQuestion: ")[0]) + " " for r in rows]
        span = [bool(normalize(x)) and f" {normalize(x)} " in c for x, c in zip(lines, ctx)]
        em = [examples.squad.squad_reward(t, r["ref"], strict=True) for t, r in zip(texts[name], rows)]
        f1 = [examples.squad.squad_reward(t, r["ref"]) for t, r in zip(texts[name], rows)]
        print(f"{name:<28} words in the first line {statistics.mean(len(normalize(x).split()) for x in lines):5.1f}"
              f" (median {statistics.median(len(normalize(x).split()) for x in lines):.0f}), a span of the context "
              f"{sum(span)}/{len(rows)}, EM {statistics.mean(em):.3f}, F1 {statistics.mean(f1):.3f}, cut "
              f"{int(batch['truncated'].sum())}/{len(rows)}; {time.time() - t0:.0f} s")
        del model
    print()
    for i, r in enumerate(rows[:args.show]):
        print(f"q{i} {r['question'].split(chr(10) * 2 + 'Question: ')[1]!r} gold {r['ref']}")
        for name, t in texts.items():
            print(f"    {name:<28} {first_line(t[i])[:140]!r}")


if __name__ == "__main__":
    main()
