"""How noisy is each algorithm's policy-gradient estimate at a fixed policy?

For one model and one fixed set of B questions, draw K independent rollout batches (B*G answers each).
From every batch compute the gradient that one training step would take (grpo.grpo_loss at mu = 1, the
KL term left out since its gradient is zero at the reference), once with GRPO's advantages and once
with REINFORCE's (adv = r), from the same rollouts and one shared forward pass. Report per algorithm:
  total variance   mean_k ||g_k - mean_g||^2 (the trace of the covariance)
  |mean_g|         the norm of the mean gradient
  rel. variance    total variance / |mean_g|^2 (scale-free: GRPO's std division rescales gradients)
  mean cosine      mean_k cos(g_k, mean_g)
The K x K inner products of each algorithm's gradients are stored too, so the table can give the ratios a 95% CI by
resampling the K rollout batches (the same resample for both algorithms, which share the rollouts).
Usage, from the repository root:
  python -m results.variance.grad_variance --model tiny --task seven --batches 32 --G 8 --batch-prompts 4 \
      --max-new-tokens 3
  python -m results.variance.grad_variance --model tiny --task seven --train-steps 40 ...   (a partly trained policy)
  python -m results.variance.grad_variance --model smollm2 --task arith --batches 12 --G 8 --batch-prompts 2 \
      --max-new-tokens 48
  python -m results.variance.grad_variance --table results/variance/*.json > results/variance/table.md
"""
import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import torch

import grpo
from results.stats import machine  # the commit, CPU model and torch that made a result

ALGOS = ("grpo", "reinforce")


def setup(name, task, seed, train_steps=0):
    """(model, tokenizer, rows). 'tiny' is a fresh random tiny GPT-2 from testing_utils.py; any other
    name goes to grpo.load_model (smollm2, or a folder that grpo.py saved, to measure a trained policy)."""
    if name == "tiny":
        from testing_utils import make_tiny_model
        name = make_tiny_model(os.path.join(tempfile.mkdtemp(), "tiny"), seed=seed)
    if task == "seven":  # the toy task of results/toy/toy_seeds.py: the answer is always 7
        rows = [{"question": f"what is {i}?", "answer": "#### 7", "ref": "7"} for i in range(64)]
    else:
        rows = grpo.make_arith(64, random.Random(seed))
    if train_steps:  # measure at a policy that GRPO has already moved, with the toy settings of toy_seeds.py
        from testing_utils import write_data
        tmp = tempfile.mkdtemp()
        data = write_data(os.path.join(tmp, "data"), rows, rows[:8])
        name = os.path.join(grpo.train(grpo.get_args([
            "--model", name, "--dataset", data, "--G", "8", "--batch-prompts", "4", "--steps", str(train_steps),
            "--max-new-tokens", "3", "--micro-batch", "32", "--lr", "3e-3", "--eval-every", "0", "--eval-n", "8",
            "--seed", str(seed), "--dtype", "float32", "--out", os.path.join(tmp, "run")])), "model")  # final model
    return (*grpo.load_model(name, torch.device("cpu")), rows)


def ratio_ci(d, n=10000, seed=0):
    """95% percentile CIs of the total-variance and relative-variance ratios grpo / reinforce, resampling the K
    rollout batches with replacement (one resample serves both algorithms); None without stored inner products."""
    if "gram" not in d["grpo"]:
        return None
    import numpy as np
    grams = [np.asarray(d[algo]["gram"]) for algo in ALGOS]
    K = len(grams[0])
    idx = np.random.default_rng(seed).integers(0, K, (n, K))
    total, rel = [], []
    for gram in grams:
        sub = gram[idx[:, :, None], idx[:, None, :]]  # n x K x K
        mean_sq = sub.sum((1, 2)) / K ** 2
        var = np.diagonal(sub, axis1=1, axis2=2).mean(1) - mean_sq
        total.append(var)
        rel.append(var / mean_sq)
    return [np.percentile(x[0] / x[1], [2.5, 97.5]) for x in (total, rel)]


def table(paths):
    """A markdown table from result files of this script."""
    out = ["| model, task | policy | mean reward | total variance grpo / reinforce (ratio [95% CI]) "
           "| norm of mean g, grpo / reinforce | relative variance grpo / reinforce (ratio [95% CI]) "
           "| mean cosine grpo / reinforce |",
           "|---|---|---|---|---|---|---|"]
    for path in paths:
        d = json.load(open(path))
        g = d["grpo"]
        r = d["reinforce"]
        cis = ratio_ci(d)
        span = [f" [{lo:.2f}, {hi:.2f}]" for lo, hi in cis] if cis else ["", ""]
        policy = f"after {d['train_steps']} GRPO steps" if d.get("train_steps") else "initial"
        out.append(f"| {os.path.basename(d['model'])}, {d['task']} | {policy} | {d['reward_mean']:.3f} "
                   f"| {g['total_variance']:.3g} / {r['total_variance']:.3g} "
                   f"({d['variance_ratio_grpo_over_reinforce']:.2f}{span[0]}) "
                   f"| {g['mean_grad_norm']:.3g} / {r['mean_grad_norm']:.3g} "
                   f"| {g['rel_variance']:.2f} / {r['rel_variance']:.2f} "
                   f"({d['rel_variance_ratio_grpo_over_reinforce']:.2f}{span[1]}) "
                   f"| {g['mean_cosine']:.3f} / {r['mean_cosine']:.3f} |")
    return "\n".join(out)


def main():
    if sys.argv[1:2] == ["--table"]:  # python -m results.variance.grad_variance --table FILE.json ... > table.md
        print(table(sys.argv[2:]))
        return
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny", help="'tiny' (built here) or anything grpo.py --model takes")
    p.add_argument("--task", default="seven", choices=["seven", "arith"], help="which questions to sample answers to")
    p.add_argument("--train-steps", type=int, default=0, help="first train the model this many GRPO steps on --task")
    p.add_argument("--batches", type=int, default=32, help="K independent rollout batches")
    p.add_argument("--G", type=int, default=8)
    p.add_argument("--batch-prompts", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward, to bound memory")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    a = p.parse_args()
    torch.manual_seed(a.seed)
    model, tokenizer, rows = setup(a.model, a.task, a.seed, a.train_steps)
    questions = rows[:a.batch_prompts]  # the same questions in every batch: only the sampling varies
    prompts = [grpo.build_prompt(tokenizer, q["question"]) for q in questions]
    refs = [q["ref"] for q in questions for _ in range(a.G)]
    params = [p for p in model.parameters() if p.requires_grad]
    grams = {algo: Gram(a.batches) for algo in ALGOS}
    n_params = sum(w.numel() for w in params)
    rewards_seen = []
    t0, cpu0 = time.time(), time.process_time()
    for k in range(a.batches):
        batch = grpo.generate(model, tokenizer, prompts, a.max_new_tokens, temperature=a.temperature, G=a.G)
        texts = grpo.decode_completions(tokenizer, batch)
        rewards = torch.tensor([grpo.reward(t, r) for t, r in zip(texts, refs)])
        rewards_seen.append(rewards.mean().item())
        advs = {algo: grpo.group_advantages(rewards, a.G, algo) for algo in ALGOS}
        flat = {algo: torch.zeros(n_params) for algo in ALGOS}
        N = len(texts)
        # One forward per micro-batch serves both algorithms; the micro-batch shares add up to the full-batch
        # loss (test_micro_batching_equals_full_batch), so the summed gradients are the full-batch gradient.
        for start in range(0, N, a.micro_batch):
            sl = slice(start, start + a.micro_batch)
            logp = grpo.completion_logprobs(model, batch, sl)[0]  # at the batch's temperature, a.temperature
            for i, algo in enumerate(ALGOS):
                loss, _ = grpo.grpo_loss(logp, logp.detach(), None, advs[algo][sl], batch["completion_mask"][sl], N,
                                         clip_eps=0.2, beta=0.0)  # seq: divided by the batch's N answers
                g = torch.autograd.grad(loss, params, retain_graph=i < len(ALGOS) - 1, allow_unused=True)
                offset = 0
                for x, w in zip(g, params):  # add into one flat vector in place: no second copy of the gradient
                    if x is not None:
                        flat[algo][offset:offset + w.numel()] += x.reshape(-1)
                    offset += w.numel()
            del logp, g
        for algo in ALGOS:
            grams[algo].add(flat[algo])
        del flat
        print(f"batch {k + 1}/{a.batches}: reward {rewards_seen[-1]:.3f} ({time.time() - t0:.0f}s)", flush=True)
    result = {"model": a.model, "task": a.task, "train_steps": a.train_steps, "K": a.batches, "G": a.G,
              "B": a.batch_prompts, "max_new_tokens": a.max_new_tokens, "temperature": a.temperature,
              "reward_mean": sum(rewards_seen) / len(rewards_seen), "batch_rewards": rewards_seen,
              "seconds": round(time.time() - t0, 1), "cpu_s": round(time.process_time() - cpu0, 1), **machine()}
    for algo in ALGOS:
        result[algo] = grams[algo].summary()
    result["variance_ratio_grpo_over_reinforce"] = (result["grpo"]["total_variance"]
                                                    / result["reinforce"]["total_variance"])
    result["rel_variance_ratio_grpo_over_reinforce"] = (result["grpo"]["rel_variance"]
                                                        / result["reinforce"]["rel_variance"])
    print(json.dumps({k: v for k, v in result.items() if k not in ALGOS}, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, separators=(",", ":"))  # one line: the two K x K Gram matrices dominate


class Gram:
    """Inner products <g_i, g_j> of all K gradient estimates. K gradients of a 135M-parameter model do not
    fit in memory next to the model, so each one is kept on disk and read back (memory-mapped) once per
    later gradient: exact, with one gradient in memory at a time."""

    def __init__(self, K):
        self.dir = tempfile.mkdtemp()
        self.k = 0  # gradients added so far
        self.gram = torch.zeros(K, K, dtype=torch.float64)

    def add(self, g):
        for j in range(self.k):
            other = torch.load(os.path.join(self.dir, f"{j}.pt"), mmap=True)
            self.gram[self.k, j] = self.gram[j, self.k] = torch.dot(g, other).item()
        self.gram[self.k, self.k] = torch.dot(g, g).item()
        torch.save(g, os.path.join(self.dir, f"{self.k}.pt"))
        self.k += 1

    def summary(self):
        K = self.k
        gram = self.gram[:K, :K]
        mean_sq = gram.sum() / K ** 2                     # ||mean_g||^2
        dot_mean = gram.sum(1) / K                        # <g_k, mean_g>
        total_var = (gram.diagonal().mean() - mean_sq).item()
        norms = gram.diagonal().sqrt()
        # a batch whose groups all have equal rewards gives g = 0 under grpo: it points nowhere, cosine 0
        cos = torch.where(norms > 0, dot_mean / (norms * mean_sq.sqrt()).clamp(min=1e-30), torch.zeros_like(norms))
        shutil.rmtree(self.dir)
        return {"total_variance": total_var, "mean_grad_norm": mean_sq.sqrt().item(),
                "rel_variance": total_var / mean_sq.item(), "mean_cosine": cos.mean().item(),
                "zero_grad_batches": int((norms == 0).sum()),
                "gram": [[float(f"{x:.6g}") for x in line] for line in gram.tolist()]}  # for ratio_ci


if __name__ == "__main__":
    main()
