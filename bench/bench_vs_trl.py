"""grpo.py before and after, against TRL's GRPOTrainer and a plain-transformers floor, side by side, per compute
dtype: seconds per step, its parts, peak memory, and this machine's floors, from one command.

The parent process prepares one model directory (same weights for every run) and one list of prompts, then
starts one child process per run, one after the other, each with torch.set_num_threads(1), and prints tables
from the JSON line each child prints last. The runs (--impls, any subset, in this order):

    before      grpo.py as of --before (a git revision of this repository, default e7b32a3, or a folder holding
                a grpo.py), fp32: it predates --dtype, and on CPU it computes in fp32
    ours        this checkout's grpo.py (or --grpo-dir's), --dtype float32
    ours-bf16   the same, --dtype bfloat16 (autocast: weights and AdamW stay fp32)
    trl         trl.GRPOTrainer, fp32; a TrainerCallback times on_step_begin -> on_step_end
    trl-bf16    the same with GRPOConfig(bf16=True): accelerate's bf16 autocast (mixed_precision is recorded)
    floor       the work itself with plain transformers calls and nothing else: one model.generate of the
                same batch, one forward + backward over the same tokens (cross-entropy on the completion
                tokens), one no-grad reference forward; the AdamW step is timed next to it, not in it
    floor-bf16  the same under torch.autocast("cpu", dtype=torch.bfloat16)

Every run says which dtype its matmuls really ran in: a forward hook on the model's first weight matrix records
its output dtype, per model (policy, ref) and phase (decode: one new token per row; forward: the rest).
And each run splits its step into parts: sampling, the reference forward, the AdamW step, and the rest
(policy forward + backward, rewards, bookkeeping), timed by wrapping the functions that do them.

Before the runs, one more child measures this machine's floors (bench/floors.py; --no-machine skips it):
reading every weight once, a 1024x576 @ 576x1536 matmul, and one decode step of grpo.generate for the preset's
B*G rows, each in fp32 and in bf16. The tables end with the issue's targets: ours-bf16 / before <= 0.5 and
ours / TRL at the same dtype <= 0.6 (s/step), peak RSS / TRL at the same dtype <= 1.0, decode step / weight
read <= 2.5 per dtype. All are ratios of medians; the other tables also give min-max.

Settings matched on all sides: G answers per prompt, B prompts per step (one forward/backward of all B*G
sequences: --micro-batch B*G here, per_device_train_batch_size=B*G with no gradient accumulation in TRL),
beta 0.04 (reference model on), clip eps 0.2, mu 1, the paper's per-sequence loss (TRL loss_type="grpo"),
group std scaling, temperature 1.0 with top-k/top-p off, no gradient checkpointing, dropout off, AdamW lr 1e-6
constant, gradient norm clipped at 1.0; the compute dtype as named above, weights fp32 everywhere.

Fixed completion length: every completion has exactly N = max_new_tokens tokens on every side.
TRL and the floor get min_new_tokens=N, which masks the EOS logit out until N tokens exist. grpo.py
runs with an empty EOS list (the benchmark wraps grpo.load_model), so generation never stops early
and every token is in the loss mask; for a grpo.py that samples with model.generate the wrapper also
sets generation_config.min_new_tokens=N. Same work on every side: N tokens sampled and N scored per
answer (only whether the EOS token may be drawn differs). Each child checks that every completion it
trained on had exactly N tokens and records its prompts; the parent checks all runs saw the same ones.

Peak memory: each run has its own process, so resource.getrusage(RUSAGE_SELF).ru_maxrss (the process's
resident-set high-water mark) is that run's peak, from interpreter start through model loading and all steps.

Usage (TRL is a benchmark-only dependency: pip install trl==1.16.0; more in bench/README.md):
    python bench/bench_vs_trl.py --model tiny --steps 20 --warmup 3 --rounds 3 --out results/bench/tiny.json
    python bench/bench_vs_trl.py --model smollm2 --steps 20 --warmup 1 --out results/bench/smollm2.json
    python bench/bench_vs_trl.py --model smollm2 --scaling --batch-prompts 1 --impls ours --steps 2 --warmup 1 \\
        --out results/bench/scaling_smollm2.json
    python bench/bench_vs_trl.py --report results/bench/tiny.json    # the tables again, from a run's JSON
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
sys.path.insert(1, HERE)

PRESETS = {  # the two settings
    "tiny": {"batch_prompts": 1, "G": 8, "new_tokens": 32},
    "smollm2": {"batch_prompts": 2, "G": 8, "new_tokens": 64},
}
IMPLS = {  # name: (family, compute dtype); the module docstring says what each one is
    "before": ("grpo", "float32"), "ours": ("grpo", "float32"), "ours-bf16": ("grpo", "bfloat16"),
    "trl": ("trl", "float32"), "trl-bf16": ("trl", "bfloat16"),
    "floor": ("floor", "float32"), "floor-bf16": ("floor", "bfloat16"),
}
BEFORE = "e7b32a3"  # main before the --dtype work (issue 11)
LABELS = {"before": "grpo.py at {before}", "ours": "grpo.py --dtype float32", "ours-bf16": "grpo.py --dtype bfloat16",
          "trl": "TRL GRPOTrainer", "trl-bf16": "TRL GRPOTrainer, bf16=True", "floor": "plain transformers",
          "floor-bf16": "plain transformers, bf16 autocast"}


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ------------------------------------------------------------------ parent: one model dir, one prompt list

def prepare_model(name, cache):
    """A directory all implementations load with from_pretrained: the same fp32 weights everywhere."""
    path = os.path.join(cache, name)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path
    import torch
    import grpo
    if name == "tiny":
        from test_grpo import make_tiny_model
        return make_tiny_model(path, seed=0, n_layer=2, n_embd=64)  # GPT-2, 2 layers, width 64, char tokenizer
    # SmolLM2 ships as GGUF; TRL builds its reference model with from_pretrained(path), so save plain weights once
    model, tokenizer = grpo.load_model("smollm2", torch.device("cpu"))[:2]
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


def prepare_before(before, cache):
    """A folder holding the 'before' grpo.py: `before` itself if it is one, else grpo.py at git revision `before`."""
    if os.path.isfile(os.path.join(before, "grpo.py")):
        return os.path.abspath(before)
    shown = subprocess.run(["git", "-C", ROOT, "show", f"{before}:grpo.py"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise SystemExit(f"--before {before}: neither a folder with a grpo.py nor a git revision of {ROOT} "
                         f"({shown.stderr.strip()})")
    path = os.path.join(cache, f"before-{before}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "grpo.py"), "w") as f:
        f.write(shown.stdout)
    return path


def run_child(spec, log):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, __file__, "--child", f.name], capture_output=True, text=True, env=env)
    os.unlink(f.name)
    setting = {k: spec[k] for k in ("batch_prompts", "G", "new_tokens") if k in spec}
    log.write(f"===== {spec['impl']} {setting} rc={proc.returncode} wall={time.time() - t0:.0f}s\n{proc.stderr[-20000:]}\n")
    log.flush()
    if proc.returncode != 0:
        raise SystemExit(f"{spec['impl']} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall_s"] = time.time() - t0
    return result


def summarize(runs):
    """One implementation's rounds pooled: the timed steps (after each round's warm-up) of all of them."""
    def timed(key, part=None):
        return [t for x in runs for t in (x[key][part] if part else x[key])[x["warmup"]:]]
    r = dict(runs[-1], rounds=runs, peak_rss_mib=max(x["peak_rss_mib"] for x in runs), timed_step_s=timed("step_s"))
    r.update(median_step_s=statistics.median(r["timed_step_s"]), n_timed=len(r["timed_step_s"]))
    if "gen_s" in r:
        r["median_gen_s"] = statistics.median(timed("gen_s"))
    r["parts_s"] = {k: timed("step_parts_s", k) for k in r["step_parts_s"]}
    r["compute_dtypes"] = {k: sorted({d for x in runs for d in x["compute_dtypes"].get(k, [])})
                           for x in runs for k in x["compute_dtypes"]}
    return r


def machine_info():
    import platform
    import torch
    import transformers
    machine = {"cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
               "transformers": transformers.__version__, "threads": 1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    machine["cpu"] = names[0] if names else machine["cpu"]
    try:
        import trl
        machine["trl"] = trl.__version__
    except ImportError:
        pass
    return machine


def tables_text(out):
    from report import floors_table, parts_table, step_table, targets_table
    results, floors = out.get("results"), out.get("floors")
    tables = [step_table(results, out["model"]), parts_table(results)] if results else []
    tables += [floors_table(floors, out["model"])] if floors else []
    return "\n\n".join(tables + [targets_table(results or {}, floors)])


def parent(a):
    impls = a.impls.split(",")
    unknown = [i for i in impls if i not in IMPLS]
    if unknown:
        raise SystemExit(f"--impls: unknown {unknown}; choose from {','.join(IMPLS)}")
    cache = a.cache or os.path.join(tempfile.gettempdir(), "grpo-bench")
    model_dir = prepare_model(a.model, cache)
    data_dir = os.path.join(cache, f"data-{a.model}")
    grpo_dirs = {i: os.path.abspath(a.grpo_dir) for i in impls}
    if "before" in impls:
        grpo_dirs["before"] = prepare_before(a.before, cache)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    log = open(os.path.splitext(a.out)[0] + ".log", "w")
    out = {"model": a.model, "machine": machine_info(), "before": a.before,
           "command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:])}

    def spec(impl, setting, prompts):
        family, dtype = IMPLS[impl]
        return {"impl": impl, "family": family, "dtype": dtype, "grpo_dir": grpo_dirs[impl], "model_dir": model_dir,
                "data_dir": data_dir, "prompts": prompts, "steps": a.steps, "warmup": a.warmup, "seed": a.seed,
                **setting}

    if not a.scaling:
        setting = dict(PRESETS[a.model])
        prompts = prepare_prompts(model_dir, data_dir, a.warmup + a.steps, setting["batch_prompts"], a.seed)
        if a.machine:
            out["floors"] = run_child({"impl": "machine", "grpo_dir": os.path.abspath(a.grpo_dir),
                                       "model_dir": model_dir, "prompts": prompts[:setting["batch_prompts"]],
                                       "reps": a.machine_reps, **setting}, log)
            f = {d: out["floors"][d] for d in ("float32", "bfloat16")}
            print("machine: decode step / weight read " + ", ".join(
                f"{d} {statistics.median(f[d]['decode_step_s']) / statistics.median(f[d]['weight_read_s']):.2f}"
                for d in f), flush=True)
        runs = {impl: [] for impl in impls}
        for _ in range(a.rounds):  # rounds alternate the implementations, so slow spells of the machine hit all
            for impl in runs:
                runs[impl].append(run_child(spec(impl, setting, prompts), log))
                assert runs[impl][-1]["prompts_seen"] == prompts, f"{impl} did not train on the prompts given"
                print(f"{impl}: median {summarize(runs[impl][-1:])['median_step_s']:.3f} s/step, "
                      f"peak RSS {runs[impl][-1]['peak_rss_mib']:.0f} MiB", flush=True)
        out["results"] = {impl: dict(summarize(r), label=LABELS[impl].format(before=a.before))
                          for impl, r in runs.items()}
        with open(a.out, "w") as f:  # the measurements first: the tables can be made again from them (--report)
            json.dump(out, f, indent=1)
        out["table"] = tables_text(out)
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
            for impl in impls:
                r = summarize([run_child(spec(impl, setting, prompts), log)])
                row = {"impl": impl, **setting, "median_step_s": r["median_step_s"], "peak_rss_mib": r["peak_rss_mib"],
                       **{f"{k}_s": statistics.median(v) for k, v in r["parts_s"].items()}}
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

class StepParts:
    """Seconds per step spent in sampling, the reference forward and the optimizer step, timed by wrapping the
    functions that do them; per_part() adds 'rest', the step's time outside those three."""

    def __init__(self):
        self.steps = []

    def new_step(self):
        self.steps.append(dict.fromkeys(("sample", "ref_forward", "optimizer"), 0.0))

    def add(self, part, seconds):
        if self.steps:
            self.steps[-1][part] += seconds

    def timed(self, fn, part, when=None, before=None):
        """fn, timed into `part` on the calls for which when(*args, **kwargs) holds; before() runs first."""
        def wrapper(*args, **kwargs):
            if before:
                before()
            if when and not when(*args, **kwargs):
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part, time.perf_counter() - t0)
        return wrapper

    def time_adamw_steps(self):
        """torch's global optimizer hooks, counted for AdamW itself (not the wrappers around it)."""
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        t0 = []

        def pre(optimizer, args, kwargs):
            if isinstance(optimizer, torch.optim.AdamW):
                t0.append(time.perf_counter())

        def post(optimizer, args, kwargs):
            if isinstance(optimizer, torch.optim.AdamW):
                self.add("optimizer", time.perf_counter() - t0.pop())
        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)

    def per_part(self, step_s):
        parts = {k: [s[k] for s in self.steps] for k in self.steps[0]}
        parts["rest"] = [t - sum(s.values()) for t, s in zip(step_s, self.steps)]
        return parts


def accepts_dtype_flag(grpo):
    try:
        grpo.get_args(["--dtype", "float32"])
        return True
    except (grpo.ConfigError, SystemExit):
        return False


def child_grpo(s):
    """grpo.train() as users run it, with three benchmark-only substitutions: fixed completion length,
    no evaluation and no saving of the final model or checkpoints (neither is part of a step)."""
    sys.path.insert(0, s["grpo_dir"])  # the grpo.py under test: this checkout's, --grpo-dir's, or --before's
    import torch
    import grpo
    from floors import as_lists, probe_compute_dtype
    N = s["new_tokens"]
    seen, lengths, dtypes, parts = [], [], {}, StepParts()
    load_model, generate = grpo.load_model, grpo.generate

    def load_fixed_length(*args, **kwargs):
        model, tokenizer, _ = load_model(*args, **kwargs)
        model.generation_config.min_new_tokens = N  # for model.generate: EOS is masked out until N tokens exist
        probe_compute_dtype(model, dtypes)  # train() deep-copies the model, hook included, for the reference
        return model, tokenizer, []  # no EOS ids: generation runs to max_new_tokens and every token is in the mask

    def recording_generate(model, tokenizer, prompts, *args, **kwargs):
        out = generate(model, tokenizer, prompts, *args, **kwargs)
        seen.extend(prompts)
        lengths.extend(out["completion_mask"].sum(1).tolist())
        return out

    grpo.load_model = load_fixed_length
    grpo.generate = parts.timed(recording_generate, "sample", before=parts.new_step)  # each step starts sampling
    grpo.completion_logprobs = parts.timed(grpo.completion_logprobs, "ref_forward",  # with mu=1 only the reference
                                           when=lambda *args, **kwargs: not torch.is_grad_enabled())  # runs no-grad
    parts.time_adamw_steps()
    grpo.evaluate = lambda *args, **kwargs: {"acc_strict": 0.0, "acc_lenient": 0.0, "n": 0, "samples": []}
    grpo.save = grpo.save_checkpoint = lambda *args: None  # writing weights is not part of a step
    dtype_flag = []
    if accepts_dtype_flag(grpo):
        dtype_flag = ["--dtype", s["dtype"]]
    elif s["dtype"] != "float32":
        raise SystemExit(f"{s['grpo_dir']}/grpo.py has no --dtype flag; it can only run as float32 (on CPU)")
    out_dir = tempfile.mkdtemp(prefix="bench-grpo-")
    B, G = s["batch_prompts"], s["G"]
    args = grpo.get_args([
        "--model", s["model_dir"], "--dataset", s["data_dir"], "--algo", "grpo", "--G", str(G),
        "--batch-prompts", str(B), "--micro-batch", str(B * G), "--max-new-tokens", str(N),
        "--temperature", "1.0", "--beta", "0.04", "--clip-eps", "0.2", "--mu", "1", "--loss-agg", "seq",
        "--lr", "1e-6", "--steps", str(s["warmup"] + s["steps"]), "--eval-every", "0", "--seed", str(s["seed"]),
        "--device", "cpu", "--out", out_dir, "--overwrite", *dtype_flag])
    grpo.train(args)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    train = [r for r in records if r["type"] == "train"]
    assert all(n == N for n in lengths), f"completion lengths {set(lengths)} != {N}"
    step_s = [r["step_s"] for r in train]
    return {"step_s": step_s, "gen_s": [r["gen_s"] for r in train], "step_parts_s": parts.per_part(step_s),
            "compute_dtypes": as_lists(dtypes), "dtype_flag": " ".join(dtype_flag) or "(none)",
            "prompts_seen": seen, "completion_tokens": lengths[:B * G]}


def child_trl(s):
    import torch
    from datasets import Dataset
    from floors import as_lists, probe_compute_dtype
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    N, B, G = s["new_tokens"], s["batch_prompts"], s["G"]
    steps = s["warmup"] + s["steps"]
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    # grpo.py tokenizes chat prompts without special tokens (the template holds them); check TRL gets the same ids
    for p in s["prompts"][:4]:
        assert tokenizer(text=p)["input_ids"] == tokenizer(p, add_special_tokens=not tokenizer.chat_template)["input_ids"]
    seen, lengths, dtypes, parts = [], [], {}, StepParts()

    def constant_reward(prompts, completions, completion_ids, **kwargs):
        seen.extend(prompts[::G])
        lengths.extend(len(c) for c in completion_ids)
        return [float(i % 2) for i in range(len(prompts))]  # fixed 0/1 pattern: every group has signal

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.step_s, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kwargs):
            parts.new_step()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self.t0)

    timer = StepTimer()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"), num_generations=G, per_device_train_batch_size=B * G,
        gradient_accumulation_steps=1, beta=0.04, epsilon=0.2, num_iterations=1, loss_type="grpo",
        scale_rewards="group", temperature=1.0, top_p=1.0, top_k=0, max_completion_length=N,
        generation_kwargs={"min_new_tokens": N}, use_vllm=False, bf16=s["dtype"] == "bfloat16", fp16=False,
        gradient_checkpointing=False, disable_dropout=True, learning_rate=1e-6, lr_scheduler_type="constant",
        max_grad_norm=1.0, weight_decay=0.0, report_to="none", logging_steps=steps, max_steps=steps,
        save_strategy="no", shuffle_dataset=False, seed=s["seed"], use_cpu=True, dataloader_num_workers=0)
    dataset = Dataset.from_list([{"prompt": p} for p in s["prompts"]])
    trainer = GRPOTrainer(model=s["model_dir"], reward_funcs=constant_reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    probe_compute_dtype(trainer.model, dtypes)
    probe_compute_dtype(trainer.ref_model, dtypes, label="ref")
    trainer._generate_single_turn = parts.timed(trainer._generate_single_turn, "sample")  # TRL 1.16's names
    trainer._get_per_token_logps_and_entropies = parts.timed(trainer._get_per_token_logps_and_entropies, "ref_forward",
                                                             when=lambda model, *a, **k: model is trainer.ref_model)
    parts.time_adamw_steps()
    trainer.train()
    assert all(n == N for n in lengths), f"completion lengths {set(lengths)} != {N}"
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {"step_s": timer.step_s, "step_parts_s": parts.per_part(timer.step_s), "compute_dtypes": as_lists(dtypes),
            "mixed_precision": str(trainer.accelerator.mixed_precision), "prompts_seen": seen,
            "completion_tokens": lengths[:B * G], "weights_dtype": str(next(trainer.model.parameters()).dtype),
            "optimizer": f"{type(optimizer).__name__} fused={optimizer.defaults.get('fused')}",
            "gradient_checkpointing": trainer.model.is_gradient_checkpointing, "torch": torch.__version__}


def child_floor(s):
    """The work a GRPO step cannot avoid, in plain transformers: sample, score the samples under the policy
    with gradients and under the reference without, and nothing else."""
    import copy
    import torch
    import torch.nn.functional as F
    from floors import as_lists, probe_compute_dtype
    from transformers import AutoModelForCausalLM, AutoTokenizer
    N, B, G = s["new_tokens"], s["batch_prompts"], s["G"]
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(s["model_dir"], dtype=torch.float32).eval()
    dtypes = {}
    probe_compute_dtype(model, dtypes)
    ref_model = copy.deepcopy(model).requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    parts = {"sample": [], "rest": [], "ref_forward": [], "optimizer": []}
    step_s, seen, lengths = [], [], []

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=s["dtype"] == "bfloat16")

    for step in range(s["warmup"] + s["steps"]):
        prompts = s["prompts"][step * B:(step + 1) * B]
        seen.extend(prompts)
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not tokenizer.chat_template)
        ids, attn = enc.input_ids.repeat_interleave(G, 0), enc.attention_mask.repeat_interleave(G, 0)
        t0 = time.perf_counter()
        with torch.no_grad(), autocast():
            seqs = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                  max_new_tokens=N, min_new_tokens=N, pad_token_id=tokenizer.pad_token_id)
        t1 = time.perf_counter()
        attn = torch.cat([attn, torch.ones_like(seqs[:, ids.shape[1]:])], 1)
        position_ids = (attn.cumsum(1) - 1).clamp(min=0)
        targets = seqs[:, -N:]
        with autocast():
            logits = model(input_ids=seqs, attention_mask=attn, position_ids=position_ids, logits_to_keep=N + 1).logits[:, :-1]
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        t2 = time.perf_counter()
        with torch.no_grad(), autocast():
            ref_logits = ref_model(input_ids=seqs, attention_mask=attn, position_ids=position_ids, logits_to_keep=N + 1).logits[:, :-1]
            F.cross_entropy(ref_logits.float().reshape(-1, ref_logits.shape[-1]), targets.reshape(-1))
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k].append(v)
        step_s.append(t3 - t0)  # the floor: generate + forward/backward + reference forward
        lengths.extend([seqs.shape[1] - ids.shape[1]] * (B * G))
        del logits, ref_logits
    return {"step_s": step_s, "step_parts_s": parts, "compute_dtypes": as_lists(dtypes),
            "prompts_seen": seen, "completion_tokens": lengths[:B * G]}


def child(spec_path):
    import torch
    torch.set_num_threads(1)
    with open(spec_path) as f:
        s = json.load(f)
    t0 = time.time()
    if s["impl"] == "machine":
        from floors import measure
        r = measure(s)
    else:
        r = {"grpo": child_grpo, "trl": child_trl, "floor": child_floor}[s["family"]](s)
        r.update({k: s[k] for k in ("impl", "family", "dtype", "batch_prompts", "G", "new_tokens", "warmup", "steps")})
    r.update(peak_rss_mib=peak_rss_mib(), final_rss_mib=current_rss_mib(), child_wall_s=time.time() - t0,
             torch_threads=torch.get_num_threads())
    print(json.dumps(r))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--impls", default=",".join(IMPLS), help="comma-separated, run in this order: " + ", ".join(IMPLS))
    p.add_argument("--steps", type=int, default=20, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--rounds", type=int, default=1, help="run every implementation this many times, alternating; "
                   "the timed steps of all rounds are pooled")
    p.add_argument("--machine", action=argparse.BooleanOptionalAction, default=True,
                   help="measure this machine's floors first (bench/floors.py): weight read, matmul, decode step")
    p.add_argument("--machine-reps", type=int, default=10, help="timed repetitions of each floor (decode: reps/5 calls)")
    p.add_argument("--scaling", action="store_true", help="step time against G (2,4,8,16) and new tokens (32..256)")
    p.add_argument("--batch-prompts", type=int, default=None, help="prompts per step for --scaling (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo-dir", default=ROOT, help="folder holding the grpo.py to time as ours, ours-bf16 "
                   "(default: this checkout)")
    p.add_argument("--before", default=BEFORE, help="the grpo.py to time as 'before': a git revision of this "
                   "repository or a folder holding a grpo.py")
    p.add_argument("--cache", default=None, help="where the model directory and data are kept (default: $TMPDIR/grpo-bench)")
    p.add_argument("--out", default="results/bench/bench.json")
    p.add_argument("--report", metavar="JSON", default=None, help="print the tables of an earlier --out JSON, run nothing")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child)
    elif a.report:
        with open(a.report) as f:
            print(tables_text(json.load(f)))
    else:
        parent(a)


if __name__ == "__main__":
    main()
