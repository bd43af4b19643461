"""Reward signal at step 0: SmolLM2-135M-Instruct, untrained, on the first N Notre Dame (train split) questions.

For each question, G answers sampled at a temperature with grpo.py's own prompt, sampler and decoding; reports the
answers that are an exact span (EM = 1), the mean F1, and the share of groups whose G rewards are not all equal (a
group with equal rewards has zero GRPO advantage and gives no gradient) under EM (--reward strict) and F1
(--reward lenient).

    OMP_NUM_THREADS=1 python -m results.squad.probe [--n 16] [--G 8] [--tokens 32] [--temps 0.7 1.0] [--seed 0]
"""

import argparse
import time

import torch

import examples.squad
import grpo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--temps", type=float, nargs="+", default=[0.7, 1.0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--show", type=int, default=3, help="questions whose answers are printed")
    args = p.parse_args()
    grpo.INSTRUCTION = examples.squad.INSTRUCTION
    torch.manual_seed(args.seed)
    model, tok = grpo.load_model("smollm2", torch.device("cpu"))
    train, _ = examples.squad.load_squad("../shared/squad", 0)
    rows = train[:args.n]  # the train rows in file order
    print(f"SmolLM2-135M-Instruct, first {len(rows)} University_of_Notre_Dame questions, G={args.G}, "
          f"{args.tokens} new tokens, seed {args.seed}, torch threads {torch.get_num_threads()}")
    for temp in args.temps:
        t0 = time.time()
        gen = torch.Generator("cpu").manual_seed(args.seed)
        em_all, f1_all, em_sig, f1_sig, trunc = [], [], 0, 0, 0
        for i, row in enumerate(rows):
            batch = grpo.generate(model, tok, [grpo.build_prompt(tok, row["question"])], args.tokens,
                                  temperature=temp, G=args.G, generator=gen)
            texts = grpo.decode_completions(tok, batch)
            trunc += int(batch["truncated"].sum())
            em = [examples.squad.squad_reward(t, row["ref"], strict=True) for t in texts]
            f1 = [examples.squad.squad_reward(t, row["ref"], strict=False) for t in texts]
            em_all += em
            f1_all += f1
            em_sig += len(set(em)) > 1
            f1_sig += len(set(f1)) > 1
            if i < args.show:
                q = row["question"].split("Question: ", 1)[1]
                print(f"\n  T={temp} q{i}: {q!r} gold {row['ref']!r}")
                for t, e, f in zip(texts, em, f1):
                    print(f"    EM {e:.0f} F1 {f:.2f}  {t[:110]!r}")
        n, N = len(rows), len(em_all)
        print(f"\nT={temp}: exact spans (EM=1) {int(sum(em_all))}/{N}; mean EM {sum(em_all) / N:.3f}; "
              f"mean F1 {sum(f1_all) / N:.3f}; answers with F1>0 {sum(f > 0 for f in f1_all)}/{N}; "
              f"groups with a signal: EM {em_sig}/{n}, F1 {f1_sig}/{n}; truncated at {args.tokens} tokens "
              f"{trunc}/{N}; {time.time() - t0:.0f} s\n")


if __name__ == "__main__":
    main()
