"""Where one decode step of grpo.generate spends its time, on the offline quick start's batch.

SmolLM2-135M-Instruct, 2 arith prompts x G=8 = 16 rows, 64 new tokens, temperature 0.7, no EOS (every row runs
the full length), one thread. Per compute dtype it prints
    decode step   median seconds between successive forward calls after the prompt pass (forward + sampling
                  of one token for all rows), pooled over --reps generate calls after one warm-up call;
                  the same definition as bench/floors.py
    weight read   bench/floors.py's floor: every parameter read once (bf16 copies for bfloat16)
    profile       torch.profiler over --steps decode steps of one more call: the top ops by self CPU time,
                  with their counts, and how many ops (profiler events, nested ones included) one step runs.
The profiler adds its own cost per op, so its times are above the timed medians; compare them with each other.

    python bench/profile_decode.py --out results/bench/profile_decode_before.txt
    python bench/profile_decode.py --grpo /other/checkout/grpo.py   # the same measurement of another grpo.py
"""

import argparse
import os
import statistics
import sys
import time

from common import generate_fixed_length, load_grpo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
B = 2  # prompts
G = 8  # answers per prompt
N = 64  # new tokens
T = 0.7  # sampling temperature


def run(grpo, model, tokenizer, prompts, dtype, on_forward=None):
    """One fixed-length generate call; returns the time of each forward call's start, and of the end."""
    marks = []

    def hook(module, args):
        marks.append(time.perf_counter())
        if on_forward:
            on_forward(len(marks) - 1)  # 0 is the prompt pass, k >= 1 the k-th decode step
    handle = model.register_forward_pre_hook(hook)
    try:
        out = generate_fixed_length(grpo, model, tokenizer, prompts, N, G, T, dtype)
    finally:
        handle.remove()
    assert out["completion_ids"].shape == (B * G, N) and len(marks) == N
    return marks + [time.perf_counter()]


def decode_steps(grpo, model, tokenizer, prompts, dtype, reps):
    steps = []
    for rep in range(reps + 1):
        marks = run(grpo, model, tokenizer, prompts, dtype)
        if rep:  # the first call warms up (and compiles, where something is compiled)
            steps += [b - a for a, b in zip(marks[1:], marks[2:])]
    return steps


def profile(grpo, model, tokenizer, prompts, dtype, first, n):
    """torch.profiler over decode steps first .. first+n-1 (each: from its forward call to the next one)."""
    from torch.profiler import ProfilerActivity, profile as Profile
    prof = Profile(activities=[ProfilerActivity.CPU])

    def on_forward(k):
        if k == first:
            prof.start()
        elif k == first + n:
            prof.stop()
    run(grpo, model, tokenizer, prompts, dtype, on_forward)
    return prof.key_averages()


def report(grpo, model, tokenizer, prompts, dtype, reps, steps, floors):
    import torch
    read = statistics.median(floors.weight_read_s(model, dtype, 10)[0])
    step = statistics.median(decode_steps(grpo, model, tokenizer, prompts, dtype, reps))
    events = profile(grpo, model, tokenizer, prompts, dtype, first=N // 2, n=steps)
    n_ops = sum(e.count for e in events) / steps
    aten = sum(e.count for e in events if e.key.startswith("aten::")) / steps
    lines = [f"== {dtype}: decode step {step * 1e3:.1f} ms, weight read {read * 1e3:.1f} ms, "
             f"ratio {step / read:.2f} (threads {torch.get_num_threads()})",
             f"profiled decode steps {N // 2}..{N // 2 + steps - 1}: {n_ops:.0f} profiler events per step "
             f"({aten:.0f} aten ops, nested ones included)",
             events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=48)]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grpo", default=os.path.join(ROOT, "grpo.py"), help="the grpo.py to measure")
    p.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    p.add_argument("--reps", type=int, default=2, help="timed generate calls per dtype, after one warm-up")
    p.add_argument("--steps", type=int, default=3, help="decode steps in the profile")
    p.add_argument("--out", help="also write the text to this file")
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    torch.set_num_threads(1)
    grpo = load_grpo(os.path.abspath(a.grpo))
    sys.path.insert(0, HERE)
    import floors
    model, tokenizer = grpo.load_model("smollm2", torch.device("cpu"))[:2]  # [:2]: older ones also return eos_ids
    model.eval()
    train, _ = grpo.load_data("arith", 0)
    prompts = [grpo.build_prompt(tokenizer, grpo.GSM8K, r["question"]) for r in train[:B]]
    torch.manual_seed(0)
    text = [f"# python bench/profile_decode.py {' '.join(sys.argv[1:])}",
            f"# grpo.py: {os.path.abspath(a.grpo)}; SmolLM2-135M-Instruct, {B} prompts x G={G} = {B * G} rows, "
            f"{N} new tokens, T={T}, no EOS; torch {torch.__version__}"]
    print("\n".join(text), flush=True)
    for dtype in a.dtype:
        text.append(report(grpo, model, tokenizer, prompts, dtype, a.reps, a.steps, floors))
        print(text[-1], flush=True)
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
