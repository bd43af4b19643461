"""Wall time of grpo.py's evaluation on SmolLM2-135M-Instruct and arith, the offline quick start's settings
(B=2, G=8: 16 sequences a batch, 64 new tokens, T 0.7), one thread: the greedy eval of --greedy-n questions and,
where the grpo.py has --eval-samples, a sampled eval with K answers on --sampled-n questions. With --compare DIR
the greedy eval of this checkout and of DIR's grpo.py alternate for --rounds rounds in one process (so both see
the same load), and each also counts the rows its decode steps ran (one row = one token of one answer).

    python bench/eval_cost.py --dtype bfloat16 --out results/bench/eval_cost_after.json
    git show fc109ab:grpo.py > /tmp/before/grpo.py
    python bench/eval_cost.py --grpo-dir /tmp/before --dtype bfloat16 --out results/bench/eval_cost_before.json
    python bench/eval_cost.py --compare /tmp/before --greedy-n 64 --rounds 3
"""

import argparse
import inspect
import json
import os
import time

import torch

from common import ROOT, load_grpo


def timed_eval(grpo, model, tokenizer, rows, eos_ids, flags):
    args = grpo.get_args(flags)
    params = inspect.signature(grpo.evaluate).parameters
    cpu = torch.device("cpu")
    t0 = time.perf_counter()
    if "args" in params:  # an older grpo.py: evaluate reads the flags itself
        result = grpo.evaluate(model, tokenizer, rows, eos_ids, args)
    elif "eos_ids" in params:  # an older grpo.py: the values train() passed it, with eos_ids and dtype
        result = grpo.evaluate(model, tokenizer, rows[:args.eval_n], eos_ids, max_new_tokens=args.max_new_tokens,
                               K=args.eval_samples, temperature=args.eval_temperature, dtype=args.dtype,
                               generator=grpo.seeded_generator(cpu, args.seed, "eval", 0, 0),
                               batch_size=args.batch_prompts * args.G)
    else:  # the values train() passes it, in its autocast region, and the generator of its step-0 evaluation
        task = [grpo.GSM8K] if "task" in params else []  # the task is an argument from this version on
        with grpo.autocast(cpu, args.dtype):
            result = grpo.evaluate(model, tokenizer, *task, rows[:args.eval_n], args.max_new_tokens,
                                   K=args.eval_samples,
                                   temperature=args.temperature, batch_size=args.batch_prompts * args.G,
                                   generator=grpo.seeded_generator(cpu, args.seed, "eval", 0, 0))
    return time.perf_counter() - t0, {k: v for k, v in result.items() if isinstance(v, float)}


def compare(model, tokenizer, rows, eos_ids, flags, a):
    """Greedy eval of this checkout's grpo.py and of a.compare's, alternating; seconds and decoded rows of each."""
    decoded = []
    hook = model.register_forward_pre_hook(
        lambda m, args, kwargs: decoded.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].shape[1] == 1 else None, with_kwargs=True)
    result = {}
    this, other = (load_grpo(os.path.join(folder, "grpo.py")) for folder in (ROOT, a.compare))
    pair = (("this", this), ("other", other))
    for name, module in pair * a.rounds:
        decoded.clear()
        seconds, accuracy = timed_eval(module, model, tokenizer, rows, eos_ids, flags)
        entry = result.setdefault(name, {"seconds": [], "decoded_rows": sum(decoded), "accuracy": accuracy})
        entry["seconds"].append(round(seconds, 2))
    hook.remove()
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grpo-dir", default=ROOT, help="folder holding the grpo.py to time (default: this checkout)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--greedy-n", type=int, default=200)
    p.add_argument("--sampled-n", type=int, default=100)
    p.add_argument("--K", type=int, default=8)
    p.add_argument("--compare", default=None, help="a folder holding another grpo.py: greedy evals alternate")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    a = p.parse_args()
    torch.set_num_threads(1)
    grpo = load_grpo(os.path.join(a.grpo_dir, "grpo.py"))
    model, tokenizer = grpo.load_model("smollm2", torch.device("cpu"))[:2]  # [:2]: older ones also return eos_ids
    eos_ids = model.generation_config.eos_token_id  # what older ones' evaluate takes; every one sets it there
    rows = grpo.load_data("arith", 0)[1]
    common = ["--model", "smollm2", "--dataset", "arith", "--G", "8", "--batch-prompts", "2",
              "--max-new-tokens", "64", "--temperature", "0.7", "--dtype", a.dtype]
    if a.compare:
        print(json.dumps(compare(model, tokenizer, rows, eos_ids, common + ["--eval-n", str(a.greedy_n)], a)))
        return
    greedy_s, greedy = timed_eval(grpo, model, tokenizer, rows, eos_ids, common + ["--eval-n", str(a.greedy_n)])
    result = {"grpo_dir": a.grpo_dir, "dtype": a.dtype, "greedy_n": a.greedy_n, "greedy_s": greedy_s,
              "greedy": greedy}
    if "eval_samples" in vars(grpo.get_args([])):
        flags = common + ["--eval-n", str(a.sampled_n), "--eval-samples", str(a.K)]
        result["sampled_s"], result["sampled"] = timed_eval(grpo, model, tokenizer, rows, eos_ids, flags)
        result.update(sampled_n=a.sampled_n, K=a.K)
    print(json.dumps(result))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
