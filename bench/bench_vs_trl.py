"""grpo.py against TRL's GRPOTrainer, side by side: seconds per step, peak memory, and the floor.

One command runs everything. The parent process prepares one model directory (same weights for
every run) and one list of prompts, then starts one child process per implementation, one after
the other, each with torch.set_num_threads(1), and prints a table from the JSON line each child
prints last:

    ours   grpo.train() itself, on the same prompts; its own per-step timer (`step_s` in metrics.jsonl)
    trl    trl.GRPOTrainer; a TrainerCallback times on_step_begin -> on_step_end
    floor  the work itself with plain transformers calls and nothing else: one model.generate of the
           same batch, one forward + backward over the same tokens (cross-entropy on the completion
           tokens), one no-grad reference forward; the AdamW step is timed next to it, not in it

Settings matched on both sides: G answers per prompt, B prompts per step (one forward/backward of
all B*G sequences: --micro-batch B*G here, per_device_train_batch_size=B*G with no gradient
accumulation in TRL), beta 0.04 (reference model on), clip eps 0.2, mu 1, the paper's per-sequence
loss (TRL loss_type="grpo"), group std scaling, temperature 1.0 with top-k/top-p off, fp32, no
gradient checkpointing, dropout off, AdamW lr 1e-6 constant, gradient norm clipped at 1.0.

Fixed completion length: every completion has exactly N = max_new_tokens tokens on every side.
TRL and the floor get min_new_tokens=N, which masks the EOS logit out until N tokens exist. grpo.py
runs with an empty EOS list (the benchmark wraps grpo.load_model), so generation never stops early
and every token is in the loss mask; for a grpo.py that samples with model.generate the wrapper also
sets generation_config.min_new_tokens=N. Same work on every side: N tokens sampled and N scored per
answer (only whether the EOS token may be drawn differs). Each child checks that every completion it
trained on had exactly N tokens and records its prompts; the parent checks all runs saw the same ones.

Peak memory: each implementation runs in its own process, so resource.getrusage(RUSAGE_SELF).ru_maxrss
(the process's resident-set high-water mark) is that implementation's peak, from interpreter start
through model loading and all steps.

Usage (TRL is a benchmark-only dependency: pip install trl==1.16.0); the README's numbers come from
    python bench/bench_vs_trl.py --model tiny --steps 20 --warmup 3 --rounds 3 --out results/bench/tiny.json
    python bench/bench_vs_trl.py --model smollm2 --steps 20 --warmup 1 --out results/bench/smollm2.json
    python bench/bench_vs_trl.py --model smollm2 --scaling --batch-prompts 1 --impls ours --steps 2 --warmup 1 \
        --out results/bench/scaling_smollm2.json
--grpo-dir DIR times another grpo.py as 'ours' (e.g. an older commit's, for before/after).
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

PRESETS = {  # the two settings
    "tiny": {"batch_prompts": 1, "G": 8, "new_tokens": 32},
    "smollm2": {"batch_prompts": 2, "G": 8, "new_tokens": 64},
}


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------ parent: one model dir, one prompt list

def prepare_model(name, cache):
    """A directory both implementations load with from_pretrained: the same fp32 weights everywhere."""
    path = os.path.join(cache, name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    import torch
    import grpo
    if name == "tiny":
        from test_grpo import make_tiny_model
        return make_tiny_model(path, seed=0, n_layer=2, n_embd=64)  # GPT-2, 2 layers, width 64, char tokenizer
    # SmolLM2 ships as GGUF; TRL builds its reference model with from_pretrained(path), so save plain weights once
    model, tokenizer, _ = grpo.load_model("smollm2", torch.device("cpu"))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def prepare_prompts(model_dir, data_dir, n_steps, B, seed):
    """Arith questions written as a GSM8K-format dataset for grpo.py, and the prompt texts of the first
    n_steps batches in the order grpo.train() draws them (it reshuffles with random.Random(seed))."""
    import grpo
    from transformers import AutoTokenizer
    train, test = grpo.load_data("arith", seed)
    train = train[:max(64, n_steps * B)]
    os.makedirs(data_dir, exist_ok=True)
    for split, rows in (("train", train), ("test", test[:8])):
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in rows)
    order = random.Random(seed).sample(range(len(train)), len(train))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [grpo.build_prompt(tokenizer, train[i]["question"]) for i in order[:n_steps * B]]


def run_child(impl, a, model_dir, data_dir, prompts, setting, log):
    spec = {"impl": impl, "model_dir": model_dir, "data_dir": data_dir, "prompts": prompts, "grpo_dir": a.grpo_dir,
            "steps": a.steps, "warmup": a.warmup, "seed": a.seed, **setting}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, __file__, "--child", f.name], capture_output=True, text=True, env=env)
    os.unlink(f.name)
    log.write(f"===== {impl} {setting} rc={proc.returncode} wall={time.time() - t0:.0f}s\n{proc.stderr[-20000:]}\n")
    log.flush()
    if proc.returncode != 0:
        raise SystemExit(f"{impl} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.time() - t0
    return result


def summarize(runs):
    """One implementation's rounds pooled: the timed steps (after each round's warm-up) of all of them."""
    r = dict(runs[-1], rounds=runs, peak_rss_mib=max(x["peak_rss_mib"] for x in runs))
    timed = [t for x in runs for t in x["step_s"][x["warmup"]:]]
    r.update(median_step_s=statistics.median(timed), min_step_s=min(timed), max_step_s=max(timed), n_timed=len(timed))
    if "gen_s" in r:
        r["median_gen_s"] = statistics.median(t for x in runs for t in x["gen_s"][x["warmup"]:])
    if "parts_s" in r:
        r["parts_median_s"] = {k: statistics.median(t for x in runs for t in x["parts_s"][k][x["warmup"]:]) for k in r["parts_s"]}
    return r


def table(results, model):
    ours, trl, floor = (results.get(k) for k in ("ours", "trl", "floor"))
    any_run = next(iter(results.values()))
    lines = [f"model {model}: B={any_run['batch_prompts']} prompts x G={any_run['G']}, {any_run['new_tokens']} new tokens, "
             f"median over {any_run['n_timed']} steps ({len(any_run['rounds'])} round(s) of {any_run['steps']} after "
             f"{any_run['warmup']} warm-up), 1 thread",
             "| run | median s/step (min-max) | peak RSS MiB | step / TRL | step / floor | peak RSS / TRL |",
             "|---|---|---|---|---|---|"]
    for name, r in (("grpo.py", ours), ("TRL GRPOTrainer", trl), ("floor", floor)):
        if r is None:
            continue
        vs_trl = f"{r['median_step_s'] / trl['median_step_s']:.2f}" if trl else "-"
        vs_floor = f"{r['median_step_s'] / floor['median_step_s']:.2f}" if floor else "-"
        mem = f"{r['peak_rss_mib'] / trl['peak_rss_mib']:.2f}" if trl else "-"
        lines.append(f"| {name} | {r['median_step_s']:.3f} ({r['min_step_s']:.3f}-{r['max_step_s']:.3f}) | "
                     f"{r['peak_rss_mib']:.0f} | {vs_trl} | {vs_floor} | {mem} |")
    if floor:
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in floor["parts_median_s"].items())
        lines.append(f"floor parts (medians): {parts}")
    if ours:
        lines.append(f"grpo.py generation (median gen_s): {ours['median_gen_s']:.3f} s")
    return "\n".join(lines)


def parent(a):
    cache = a.cache or os.path.join(tempfile.gettempdir(), "grpo-bench")
    model_dir = prepare_model(a.model, cache)
    data_dir = os.path.join(cache, f"data-{a.model}")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    log = open(os.path.splitext(a.out)[0] + ".log", "w")
    import platform
    import torch
    import transformers
    machine = {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
               "transformers": transformers.__version__, "threads": 1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        import trl
        machine["trl"] = trl.__version__
    except ImportError:
        pass
    out = {"model": a.model, "machine": machine, "command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:])}
    if not a.scaling:
        setting = dict(PRESETS[a.model])
        prompts = prepare_prompts(model_dir, data_dir, a.warmup + a.steps, setting["batch_prompts"], a.seed)
        runs = {impl: [] for impl in a.impls.split(",")}
        for _ in range(a.rounds):  # rounds alternate the implementations, so slow spells of the machine hit all
            for impl in runs:
                runs[impl].append(run_child(impl, a, model_dir, data_dir, prompts, setting, log))
                assert runs[impl][-1]["prompts_seen"] == prompts, f"{impl} did not train on the prompts given"
                print(f"{impl}: median {summarize(runs[impl][-1:])['median_step_s']:.3f} s/step, "
                      f"peak RSS {runs[impl][-1]['peak_rss_mib']:.0f} MiB", flush=True)
        results = {impl: summarize(r) for impl, r in runs.items()}
        out["results"] = results
        out["table"] = table(results, a.model)
        print(out["table"])
    else:
        rows = []
        base = dict(PRESETS[a.model], **({"batch_prompts": a.batch_prompts} if a.batch_prompts else {}))
        grid = [dict(base, G=g) for g in (2, 4, 8, 16)] + [dict(base, new_tokens=n) for n in (32, 64, 128, 256)]
        seen = set()
        for setting in grid:
            key = (setting["G"], setting["new_tokens"])
            if key in seen:
                continue
            seen.add(key)
            prompts = prepare_prompts(model_dir, data_dir, a.warmup + a.steps, setting["batch_prompts"], a.seed)
            for impl in a.impls.split(","):
                r = summarize([run_child(impl, a, model_dir, data_dir, prompts, setting, log)])
                row = {"impl": impl, **setting, "median_step_s": r["median_step_s"], "peak_rss_mib": r["peak_rss_mib"]}
                if impl == "ours":
                    row["median_gen_s"] = r["median_gen_s"]
                if impl == "floor":
                    row.update({f"floor_{k}_s": v for k, v in r["parts_median_s"].items()})
                rows.append(row)
                print(json.dumps(row), flush=True)
        out["scaling"] = rows
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    if "table" in out:
        with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
            f.write(f"`python {out['command']}`\n\n{out['table']}\n")
    log.close()


# ------------------------------------------------------------------ children: one implementation each

def child_ours(s):
    """grpo.train() as users run it, with three benchmark-only substitutions: fixed completion length,
    no evaluation and no saving of the final model or checkpoints (neither is part of a step)."""
    sys.path.insert(0, s["grpo_dir"])  # the grpo.py under test (default: this checkout's)
    import grpo
    N = s["new_tokens"]
    seen, lengths = [], []
    load_model, generate = grpo.load_model, grpo.generate

    def load_fixed_length(name, device):
        model, tokenizer, _ = load_model(name, device)
        model.generation_config.min_new_tokens = N  # for model.generate: EOS is masked out until N tokens exist
        return model, tokenizer, []  # no EOS ids: generation runs to max_new_tokens and every token is in the mask

    def recording_generate(model, tokenizer, prompts, eos_ids, max_new_tokens, repeat=1, temperature=None):
        out = generate(model, tokenizer, prompts, eos_ids, max_new_tokens, repeat=repeat, temperature=temperature)
        seen.extend(prompts)
        lengths.extend(out["completion_mask"].sum(1).tolist())
        return out

    grpo.load_model, grpo.generate = load_fixed_length, recording_generate
    grpo.evaluate = lambda *args, **kwargs: {"acc_strict": 0.0, "acc_lenient": 0.0, "n": 0, "samples": []}
    grpo.save = grpo.save_checkpoint = lambda *args: None  # writing weights is not part of a step
    out_dir = tempfile.mkdtemp(prefix="bench-ours-")
    B, G = s["batch_prompts"], s["G"]
    args = grpo.get_args([
        "--model", s["model_dir"], "--dataset", s["data_dir"], "--algo", "grpo", "--G", str(G),
        "--batch-prompts", str(B), "--micro-batch", str(B * G), "--max-new-tokens", str(N),
        "--temperature", "1.0", "--beta", "0.04", "--clip-eps", "0.2", "--mu", "1", "--loss-agg", "seq",
        "--lr", "1e-6", "--steps", str(s["warmup"] + s["steps"]), "--eval-every", "0", "--seed", str(s["seed"]),
        "--device", "cpu", "--out", out_dir, "--overwrite"])
    grpo.train(args)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if r["type"] == "train"]
    assert all(n == N for n in lengths), f"completion lengths {set(lengths)} != {N}"
    return {"step_s": [r["step_s"] for r in train], "gen_s": [r["gen_s"] for r in train],
            "prompts_seen": seen, "completion_tokens": lengths[:B * G]}


def child_trl(s):
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    N, B, G = s["new_tokens"], s["batch_prompts"], s["G"]
    steps = s["warmup"] + s["steps"]
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    # grpo.py tokenizes chat prompts without special tokens (the template holds them); check TRL gets the same ids
    for p in s["prompts"][:4]:
        assert tokenizer(text=p)["input_ids"] == tokenizer(p, add_special_tokens=not tokenizer.chat_template)["input_ids"]
    seen, lengths = [], []

    def constant_reward(prompts, completions, completion_ids, **kwargs):
        seen.extend(prompts[::G])
        lengths.extend(len(c) for c in completion_ids)
        return [float(i % 2) for i in range(len(prompts))]  # fixed 0/1 pattern: every group has signal

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.step_s, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self.t0)

    timer = StepTimer()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), num_generations=G, per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1, beta=0.04, epsilon=0.2, num_iterations=1, loss_type="grpo",
        scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, max_completion_length=N,
        generation_kwargs={"min_new_tokens": N}, use_vllm=False, bf16=False, fp16=False,
        gradient_checkpointing=False, disable_dropout=True, learning_rate=1e-6, lr_scheduler_type="constant",
        max_grad_norm=1.0, weight_decay=0.0, report_to="none", logging_steps=steps, max_steps=steps,
        save_strategy="no", shuffle_dataset=False, seed=s["seed"], use_cpu=True, dataloader_num_workers=0)
    dataset = Dataset.from_list([{"prompt": p} for p in s["prompts"]])
    trainer = GRPOTrainer(model=s["model_dir"], reward_funcs=constant_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    assert all(n == N for n in lengths), f"completion lengths {set(lengths)} != {N}"
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {"step_s": timer.step_s, "prompts_seen": seen, "completion_tokens": lengths[:B * G],
            "optimizer": f"{type(optimizer).__name__} fused={optimizer.defaults.get('fused')}",
            "gradient_checkpointing": trainer.model.is_gradient_checkpointing}


def child_floor(s):
    """The work a GRPO step cannot avoid, in plain transformers: sample, score the samples under the policy
    with gradients and under the reference without, and nothing else."""
    import copy
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer
    N, B, G = s["new_tokens"], s["batch_prompts"], s["G"]
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(s["model_dir"], dtype=torch.float32).eval()
    ref_model = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    parts = {"generate": [], "forward_backward": [], "ref_forward": [], "adamw_step": []}
    step_s, seen, lengths = [], [], []
    for step in range(s["warmup"] + s["steps"]):
        prompts = s["prompts"][step * B:(step + 1) * B]
        seen.extend(prompts)
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not tokenizer.chat_template)
        ids, attn = enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)
        t0 = time.perf_counter()
        with torch.no_grad():
            seqs = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=N, min_new_tokens=N, pad_token_id=tokenizer.pad_token_id)
        t1 = time.perf_counter()
        attn = torch.cat([attn, torch.ones_like(seqs[:, ids.shape[1]:])], 1)
        position_ids = (attn.cumsum(1) - 1).clamp(min=0)
        targets = seqs[:, -N:]
        logits = model(input_ids=seqs, attention_mask=attn, position_ids=position_ids, logits_to_keep=N + 1).logits[:, :-1]
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        t2 = time.perf_counter()
        with torch.no_grad():
            ref_logits = ref_model(input_ids=seqs, attention_mask=attn, position_ids=position_ids, logits_to_keep=N + 1).logits[:, :-1]
            F.cross_entropy(ref_logits.reshape(-1, ref_logits.shape[-1]), targets.reshape(-1))
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v)
        step_s.append(t3 - t0)  # the floor: generate + forward/backward + reference forward
        lengths.extend([seqs.shape[1] - ids.shape[1]] * (B * G))
        del logits, ref_logits
    w = s["warmup"]
    return {"step_s": step_s, "parts_s": parts, "parts_median_s": {k: statistics.median(v[w:]) for k, v in parts.items()},
            "prompts_seen": seen, "completion_tokens": lengths[:B * G]}


def child(spec_path):
    import torch
    torch.set_num_threads(1)
    with open(spec_path) as f:
        s = json.load(f)
    t0 = time.time()
    r = {"ours": child_ours, "trl": child_trl, "floor": child_floor}[s["impl"]](s)
    r.update({k: s[k] for k in ("impl", "batch_prompts", "G", "new_tokens", "warmup", "steps")},
             peak_rss_mib=peak_rss_mib(), final_rss_mib=current_rss_mib(), child_wall_s=time.time() - t0,
             torch_threads=torch.get_num_threads())
    print(json.dumps(r))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--impls", default="ours,trl,floor", help="comma-separated, run in this order")
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=1, help="run every implementation this many times, alternating; "
                   "the timed steps of all rounds are pooled")
    p.add_argument("--scaling", action="store_true", help="step time against G (2,4,8,16) and new tokens (32..256)")
    p.add_argument("--batch-prompts", type=int, default=None, help="prompts per step for --scaling (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo-dir", default=ROOT, help="directory holding the grpo.py to time as 'ours' (default: this checkout)")
    p.add_argument("--cache", default=None, help="where the model directory and data are kept (default: $TMPDIR/grpo-bench)")
    p.add_argument("--out", default="results/bench/bench.json")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child)
    else:
        parent(a)


if __name__ == "__main__":
    main()
