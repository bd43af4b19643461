"""A base model's starting accuracy through grpo.py's own evaluation: greedy (and optionally sampled) answers to
held-out questions, per data set and number of few-shot examples, in the Question/Answer frame with the answer
ending at the first "Question:" the model writes (grpo.BASE_STOP).

One line of JSON per setting is appended to --out (a setting already there is skipped, so the command can be
stopped and started again), then the table is printed:

    python -m results.gemma3_base.base_model --model gemma-3-270m-q4_k_m.gguf \
        --settings arith:0 arith:4 gsm8k:0 gsm8k:4 --out results/gemma3_base/start.jsonl
"""

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported

import torch  # noqa: E402

import grpo  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DATASETS = {"arith": ("arith", 64), "gsm8k": (os.path.join(ROOT, "..", "shared", "gsm8k"), 256)}  # max new tokens


def measure(model, tokenizer, dataset, shots, a):
    spec, max_new_tokens = DATASETS[dataset]
    train_rows, test_rows = grpo.load_data(spec, a.seed)
    prefix, _, test_rows, picked = grpo.fewshot_prefix(train_rows, test_rows, shots, a.seed)
    flags = ["--model", a.model, "--dataset", spec, "--fewshot", str(shots), "--eval-n", str(a.n),
             "--max-new-tokens", str(max_new_tokens), "--batch-prompts", "4", "--G", "8", "--dtype", a.dtype,
             "--eval-samples", str(a.samples), "--temperature", "1.0", "--seed", str(a.seed)]
    args = grpo.get_args(flags)
    t0 = time.time()
    cpu = torch.device("cpu")
    with grpo.autocast(cpu, args.dtype):  # as train() evaluates at step 0
        result = grpo.evaluate(model, tokenizer, test_rows[:args.eval_n], args.max_new_tokens, K=args.eval_samples,
                               temperature=args.temperature, shots=prefix, batch_size=args.batch_prompts * args.G,
                               generator=grpo.seeded_generator(cpu, a.seed, "eval", 0, 0))
    return {"dataset": dataset, "shots": shots, "fewshot_rows": picked, "max_new_tokens": max_new_tokens,
            "dtype": a.dtype, "seconds": round(time.time() - t0, 1), "threads": torch.get_num_threads(), **result}


def table(records):
    lines = ["| data set | shots | n | greedy lenient | greedy strict | sampled pass@1 (T=1) | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        sampled = f"{r['pass@1']:.3f}" if "pass@1" in r else "-"
        lines.append(f"| {r['dataset']} | {r['shots']} | {r['n']} | {r['acc_lenient']:.3f} | {r['acc_strict']:.3f} "
                     f"| {sampled} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="what grpo.py's --model takes: a GGUF file, a folder, a Hub id")
    p.add_argument("--settings", nargs="+", default=["arith:0", "arith:4", "gsm8k:0", "gsm8k:4"],
                   help="DATASET:SHOTS, DATASET one of " + ", ".join(DATASETS))
    p.add_argument("--n", type=int, default=200, help="held-out questions per setting")
    p.add_argument("--samples", type=int, default=0, help="also K sampled answers per question at T = 1")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    done = []
    if os.path.exists(a.out):
        done = [json.loads(line) for line in open(a.out)]
    model, tokenizer = grpo.load_model(a.model, torch.device("cpu"))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for setting in a.settings:
        dataset, shots = setting.split(":")
        if any(r["dataset"] == dataset and r["shots"] == int(shots) and r["n"] == a.n for r in done):
            continue
        record = measure(model, tokenizer, dataset, int(shots), a)
        print(json.dumps({k: v for k, v in record.items() if k not in ("samples", "correct", "correct_strict")}),
              flush=True)
        with open(a.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        done.append(record)
    print(table(done))


if __name__ == "__main__":
    main()
