"""This machine's floors for one model, per compute dtype, measured in one process with one thread.

    weight read   every parameter read once (a sum over each): the least any decode step can cost, since
                  a decode step multiplies by every weight. For bfloat16, over bf16 copies of the weights.
    matmul        one (1024 x 576) @ (576 x 1536) matmul in that dtype (SmolLM2's width and MLP width):
                  what the CPU's matrix units deliver, in GFLOP/s.
    decode step   grpo.generate for B*G rows, fixed length (no EOS): the seconds between one forward call
                  after the prompt pass and the next (forward + sampling one token for every row), with
                  the matmuls in that dtype (under autocast; the dtype argument of the grpo.py versions that had one).

The number to watch is decode step / weight read: how close sampling comes to the memory floor.
bench_vs_trl.py runs `measure` in a child process (bench/child.py); standalone: python bench/floors.py --model tiny
"""

import argparse
import json
import os
import sys
import time

from common import PRESETS, ROOT, as_lists, generate_fixed_length, prepare_model, probe_compute_dtype

DTYPES = ("float32", "bfloat16")
MATMUL = (1024, 576, 1536)  # (m, k, n)


def repeat_timed(f, reps):
    """f() once to warm up, then reps timed calls: the list of seconds."""
    f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return times


def weight_read_s(model, dtype, reps):
    import torch
    weights = [p.detach().to(getattr(torch, dtype)) for p in model.parameters()]  # tied weights appear once
    n_bytes = sum(w.numel() * w.element_size() for w in weights)
    return repeat_timed(lambda: [w.sum() for w in weights], reps), n_bytes


def matmul_s(dtype, reps):
    import torch
    m, k, n = MATMUL
    a = torch.randn(m, k).to(getattr(torch, dtype))
    b = torch.randn(k, n).to(getattr(torch, dtype))
    return repeat_timed(lambda: a @ b, reps)


def decode_step_s(grpo, model, tokenizer, prompts, G, N, dtype, reps):
    """Seconds per decode step of grpo.generate, pooled over reps calls after one warm-up: the gaps between
    successive forward calls after the prompt pass, and from the last one to the end of generate."""
    starts = []
    handle = model.register_forward_pre_hook(lambda module, args: starts.append(time.perf_counter()))
    seen = {}
    probe = probe_compute_dtype(model, seen)
    steps = []
    for rep in range(reps + 1):
        starts.clear()
        out = generate_fixed_length(grpo, model, tokenizer, prompts, N, G, 1.0, dtype)
        end = time.perf_counter()
        assert out["completion_ids"].shape == (len(prompts) * G, N) and len(starts) == N
        if rep:
            marks = starts[1:] + [end]  # starts[0] is the prompt pass
            steps += [b - a for a, b in zip(marks, marks[1:])]
    handle.remove()
    probe.remove()
    return steps, as_lists(seen)


def measure(s):
    """s: model_dir, grpo_dir, prompts (B of them), G, new_tokens, reps. Returns {dtype: {...}} plus the setting."""
    sys.path.insert(0, s["grpo_dir"])
    import torch
    import grpo
    model, tokenizer = grpo.load_model(s["model_dir"], torch.device("cpu"))[:2]
    model.eval()
    out = {"rows": len(s["prompts"]) * s["G"], "new_tokens": s["new_tokens"], "matmul_mkn": MATMUL,
           "n_params": sum(p.numel() for p in model.parameters()),
           "cpu_bf16_native": bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
                                   or getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())}
    torch.manual_seed(0)
    for dtype in DTYPES:
        read, n_bytes = weight_read_s(model, dtype, s["reps"])
        decode, seen = decode_step_s(grpo, model, tokenizer, s["prompts"], s["G"], s["new_tokens"], dtype,
                                     max(1, s["reps"] // 5))
        out[dtype] = {"weight_read_s": read, "weight_bytes": n_bytes, "matmul_s": matmul_s(dtype, s["reps"]),
                      "decode_step_s": decode, "decode_compute_dtypes": seen}
    return out


def main():
    import tempfile
    import torch
    import grpo
    from report import floors_table
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--reps", type=int, default=10, help="timed repetitions (decode: reps/5 generate calls)")
    a = p.parse_args()
    torch.set_num_threads(1)
    preset = PRESETS[a.model]
    model_dir = prepare_model(a.model, os.path.join(tempfile.gettempdir(), "grpo-bench"))
    tokenizer = grpo.load_model(model_dir, torch.device("cpu"))[1]
    train, _ = grpo.load_data("arith", 0)
    prompts = [grpo.build_prompt(tokenizer, grpo.GSM8K, r["question"]) for r in train[:preset["batch_prompts"]]]
    result = measure({"model_dir": model_dir, "grpo_dir": ROOT, "prompts": prompts, "G": preset["G"],
                      "new_tokens": preset["new_tokens"], "reps": a.reps})
    print(json.dumps(result))
    print(floors_table(result, a.model))


if __name__ == "__main__":
    main()
