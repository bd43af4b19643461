"""Where one grpo.py step's time goes, by operator kind: torch.profiler over the sampling of B*G answers and over the
training part (policy forward and backward in micro-batches, the reference forward, AdamW), each in its own table:
the share of matrix products and attention, of dtype casts, of drawing tokens, and the largest other operators.

Fixed-length answers (no EOS ids), the benchmark preset's B, G and new tokens (bench/common.py), one warm-up step
before the profiled one. Self CPU time per operator, so nested calls are not counted twice.

    python bench/profile_step.py --model smollm2 --dtype bfloat16 --threads 2
"""
import argparse
import collections
import os
import tempfile

import torch

from common import PRESETS, generate_fixed_length, prepare_model  # also puts the repository root on sys.path
import grpo

KINDS = {  # operator -> kind; everything else is listed by name
    "matrix products and attention": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                                      "aten::_scaled_dot_product_flash_attention_for_cpu",
                                      "aten::_scaled_dot_product_attention_math", "aten::_flash_attention_forward",
                                      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"),
    "dtype casts": ("aten::copy_", "aten::_to_copy"),
    "drawing tokens": ("aten::exponential_", "aten::multinomial", "aten::cumsum", "aten::cumsum_", "aten::searchsorted",
                       "aten::uniform_"),
}


def table(prof, title, top=12):
    by_op = collections.Counter()
    calls = collections.Counter()
    for e in prof.key_averages():
        by_op[e.key] += e.self_cpu_time_total
        calls[e.key] += e.count
    total = sum(by_op.values())
    lines = [f"{title}: {total / 1e6:.2f} s of self CPU time", "", "| kind or operator | seconds | share | calls |",
             "|---|---|---|---|"]
    kinds = {op: kind for kind, ops in KINDS.items() for op in ops}
    grouped = collections.Counter()
    for op, t in by_op.items():
        grouped[kinds.get(op, op)] += t
    for kind in KINDS:
        n = sum(calls[op] for op in KINDS[kind])
        lines.append(f"| **{kind}** | {grouped[kind] / 1e6:.3f} | {grouped[kind] / total:.0%} | {n} |")
    for op, t in grouped.most_common():
        if op not in KINDS and top > 0:
            top -= 1
            lines.append(f"| {op} | {t / 1e6:.3f} | {t / total:.0%} | {calls[op]} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2", choices=sorted(PRESETS))
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    B, G, N = (PRESETS[a.model][k] for k in ("batch_prompts", "G", "new_tokens"))
    model, tok = grpo.load_model(prepare_model(a.model, os.path.join(tempfile.gettempdir(), "grpo-bench")),
                                 torch.device("cpu"))
    ref = grpo.reference_model(model, a.dtype)  # as train() makes it
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9, weight_decay=0.0, fused=True)
    train, _ = grpo.load_data("arith", 0)
    prompts = [grpo.build_prompt(tok, grpo.GSM8K, r["question"]) for r in train[:B]]
    adv = torch.randn(B * G)
    torch.manual_seed(0)
    for profiled in (False, True):  # a warm-up step, then the profiled one
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as sampling:
            batch = generate_fixed_length(grpo, model, tok, prompts, N, G, 1.0, a.dtype)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as training:
            # one autocast region around the step, as train() has; StepConfig's defaults for the rest: mu 1,
            # clip 0.2, beta 0.04, seq
            with grpo.autocast(torch.device("cpu"), a.dtype):
                grpo.train_step(model, ref, optimizer, batch, adv, grpo.StepConfig(micro_batch=8, max_new_tokens=N))
    print(f"{a.model}, {B} x {G} answers of {N} tokens, --dtype {a.dtype}, {a.threads} thread(s), torch "
          f"{torch.__version__}\n")
    print(table(sampling, f"sampling ({N} decode steps)"), "\n")
    print(table(training, "training part (policy forward + backward, reference forward, AdamW)"))


if __name__ == "__main__":
    main()
