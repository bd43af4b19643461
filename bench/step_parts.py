"""Seconds for each part of one grpo.py step, one thread: where the time goes.

Times generate (fixed length: no EOS ids), the policy log-prob forward + backward through the loss,
the reference forward, clip + fused AdamW, and token_logprobs alone (the vocabulary-sized part).
With --ab it instead times completion_logprobs with whole_rows=False (each prompt through the model once, its
answers continuing from its KV cache) and True (prompt + answer row by row), twice each (forward with grad,
backward, forward without grad). --dtype is grpo.py's (the matmuls' dtype under autocast).
Uses the model directory bench_vs_trl.py uses (bench/common.py's prepare_model makes it if it is missing).
Usage:
    python bench/step_parts.py --model smollm2 --reps 1 [--dtype bfloat16]
    python bench/step_parts.py --model smollm2 --ab
"""
import argparse
import copy
import json
import os
import statistics
import tempfile
import time

import torch

from common import PRESETS, generate_fixed_length, prepare_model  # also puts the repository root on sys.path
import grpo


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2", choices=sorted(PRESETS))
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--ab", action="store_true")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = p.parse_args()
    torch.set_num_threads(1)
    B, G, N = (PRESETS[a.model][k] for k in ("batch_prompts", "G", "new_tokens"))
    model, tok = grpo.load_model(prepare_model(a.model, os.path.join(tempfile.gettempdir(), "grpo-bench")),
                                 torch.device("cpu"))
    cpu = torch.device("cpu")
    train, _ = grpo.load_data("arith", 0)
    prompts = [grpo.build_prompt(tok, grpo.GSM8K, r["question"]) for r in train[:B]]
    torch.manual_seed(0)
    batch = generate_fixed_length(grpo, model, tok, prompts, N, G, 1.0, a.dtype)
    x, m = batch["completion_ids"], batch["completion_mask"]
    if a.ab:
        res = {}
        for whole_rows in (False, True, False, True):
            t0 = time.perf_counter()
            with grpo.autocast(cpu, a.dtype):
                logp = grpo.completion_logprobs(model, batch, whole_rows=whole_rows)[0]
            t1 = time.perf_counter()
            (logp * m).sum().backward()
            t2 = time.perf_counter()
            with torch.no_grad(), grpo.autocast(cpu, a.dtype):
                grpo.completion_logprobs(model, batch, whole_rows=whole_rows)
            t3 = time.perf_counter()
            model.zero_grad(set_to_none=True)
            res.setdefault(f"whole_rows={whole_rows}", []).append(
                {"forward": round(t1 - t0, 2), "backward": round(t2 - t1, 2), "no_grad_forward": round(t3 - t2, 2)})
        print(a.model, a.dtype, tuple(x.shape), json.dumps(res))
        return

    ref = copy.deepcopy(model).eval().requires_grad_(False)
    adv = torch.randn(B * G)

    def timeit(f):
        f()
        ts = []
        for _ in range(a.reps):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    def policy():  # one autocast region around forward and backward, as train() has
        with grpo.autocast(cpu, a.dtype):
            logp = grpo.completion_logprobs(model, batch)[0]
            grpo.grpo_loss(logp, logp.detach(), logp.detach(), adv, m, len(adv), clip_eps=0.2,
                           beta=0.04)[0].backward()  # seq: the norm is the batch's number of answers

    def reference():
        with torch.no_grad(), grpo.autocast(cpu, a.dtype):
            grpo.completion_logprobs(ref, batch)

    def sample():
        return generate_fixed_length(grpo, model, tok, prompts, N, G, 1.0, a.dtype)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-9, fused=True)
    logits = torch.randn(B * G, N, model.config.vocab_size, requires_grad=True)  # one row per completion token
    res = {"generate": timeit(sample),
           "policy_fwd_bwd": timeit(policy), "ref_fwd": timeit(reference),
           "clip+adamw": timeit(lambda: (torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0), opt.step())),
           "token_logprobs_fwd_bwd": timeit(lambda: grpo.token_logprobs(logits, x, 1.0)[0].sum().backward())}
    print(a.model, a.dtype, tuple(x.shape), json.dumps({k: round(v, 3) for k, v in res.items()}))


if __name__ == "__main__":
    main()
