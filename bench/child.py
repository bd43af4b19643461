"""One run of bench_vs_trl.py, in its own process: grpo.py, TRL's GRPOTrainer, the plain-transformers floor, or
this machine's floors (bench/floors.py), as the JSON spec the parent wrote says. Prints one JSON line last: the
step times, their parts, the dtypes the matmuls ran in, and the process's peak memory.

    python bench/child.py SPEC.json
"""

import json
import os
import resource
import shutil
import sys
import tempfile
import time

from common import as_lists, probe_compute_dtype


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20




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
    N = s["new_tokens"]
    seen = []  # the prompts trained on
    lengths = []  # completion lengths in tokens
    dtypes = {}
    parts = StepParts()
    load_model = grpo.load_model
    generate = grpo.generate

    def load_fixed_length(*args, **kwargs):
        model, tokenizer, *eos_ids = load_model(*args, **kwargs)  # older grpo.py: (model, tokenizer, eos_ids)
        model.generation_config.min_new_tokens = N  # for model.generate: EOS is masked out until N tokens exist
        probe_compute_dtype(model, dtypes)  # train() deep-copies the model, hook included, for the reference
        # no EOS ids: generation runs to max_new_tokens and every token is in the mask
        if not eos_ids:  # this grpo.py's generate reads them from the generation config
            model.generation_config.eos_token_id = []
            return model, tokenizer
        return model, tokenizer, []

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
    # a stand-in result of one question answered wrong: what the end-of-run summary reads, without generating
    grpo.evaluate = lambda *args, **kwargs: {"acc_strict": 0.0, "acc_lenient": 0.0, "n": 1, "samples": [],
                                             "right": [0], "right_strict": [0]}
    for name in ("save", "save_checkpoint", "save_final"):  # writing weights is not part of a step
        if hasattr(grpo, name):
            setattr(grpo, name, lambda *args: None)
    if hasattr(grpo, "OWN_NAMES"):  # this grpo.py's finish() removes the last checkpoint: an empty one stands in
        grpo.save_checkpoint = lambda out, model, tokenizer, optimizer, state, log: os.makedirs(
            os.path.join(out, f"checkpoint-{state['step']}"), exist_ok=True)
    if hasattr(grpo, "save_checkpoint") and hasattr(grpo, "save_pretrained"):  # the final model: an empty folder
        grpo.save_pretrained = lambda model, tokenizer, path: os.makedirs(path)
    dtype_flag = []
    if accepts_dtype_flag(grpo):
        dtype_flag = ["--dtype", s["dtype"]]
    elif s["dtype"] != "float32":
        raise SystemExit(f"{s['grpo_dir']}/grpo.py has no --dtype flag; it can only run as float32 (on CPU)")
    out_dir = os.path.join(tempfile.mkdtemp(prefix="bench-grpo-"), "run")  # a new folder, as every grpo.py takes
    B, G = s["batch_prompts"], s["G"]
    args = grpo.get_args([
        "--model", s["model_dir"], "--dataset", s["data_dir"], "--algo", "grpo", "--G", str(G),
        "--batch-prompts", str(B), "--micro-batch", str(B * G), "--max-new-tokens", str(N),
        "--temperature", "1.0", "--beta", "0.04", "--clip-eps", "0.2", "--mu", "1", "--loss-agg", "seq",
        "--lr", "1e-6", "--steps", str(s["warmup"] + s["steps"]), "--eval-every", "0", "--seed", str(s["seed"]),
        "--device", "cpu", "--out", out_dir, *dtype_flag])
    grpo.train(args, *[grpo.GSM8K] * hasattr(grpo, "GSM8K"))  # older grpo.py: no task argument
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    shutil.rmtree(os.path.dirname(out_dir))
    train = [r for r in records if r["type"] == "train"]
    assert all(n == N for n in lengths), f"completion lengths {set(lengths)} != {N}"
    step_s = [r["step_s"] for r in train]
    return {"step_s": step_s, "gen_s": [r["gen_s"] for r in train], "step_parts_s": parts.per_part(step_s),
            "compute_dtypes": as_lists(dtypes), "dtype_flag": " ".join(dtype_flag) or "(none)",
            "prompts_seen": seen, "completion_tokens": lengths[:B * G]}


def child_trl(s):
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    N, B, G = s["new_tokens"], s["batch_prompts"], s["G"]
    steps = s["warmup"] + s["steps"]
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    # grpo.py tokenizes chat prompts without special tokens (the template holds them); check TRL gets the same ids
    for p in s["prompts"][:4]:
        as_grpo = tokenizer(p, add_special_tokens=not tokenizer.chat_template)["input_ids"]
        assert tokenizer(text=p)["input_ids"] == as_grpo
    seen = []
    lengths = []
    dtypes = {}
    parts = StepParts()

    def constant_reward(prompts, completions, completion_ids, **kwargs):
        seen.extend(prompts[::G])
        lengths.extend(len(c) for c in completion_ids)
        return [float(i % 2) for i in range(len(prompts))]  # fixed 0/1 pattern: every group has signal

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.step_s = []
            self.t0 = None

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
    step_s = []
    seen = []
    lengths = []

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=s["dtype"] == "bfloat16")

    for step in range(s["warmup"] + s["steps"]):
        prompts = s["prompts"][step * B:(step + 1) * B]
        seen.extend(prompts)
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=not tokenizer.chat_template)
        ids = enc.input_ids.repeat_interleave(G, 0)
        attn = enc.attention_mask.repeat_interleave(G, 0)
        t0 = time.perf_counter()
        with torch.no_grad(), autocast():
            seqs = model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0,
                                  top_p=1.0, max_new_tokens=N, min_new_tokens=N, pad_token_id=tokenizer.pad_token_id)
        t1 = time.perf_counter()
        attn = torch.cat([attn, torch.ones_like(seqs[:, ids.shape[1]:])], 1)
        position_ids = (attn.cumsum(1) - 1).clamp(min=0)
        targets = seqs[:, -N:]
        inputs = {"input_ids": seqs, "attention_mask": attn, "position_ids": position_ids, "logits_to_keep": N + 1}
        with autocast():
            logits = model(**inputs).logits[:, :-1]
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
        t2 = time.perf_counter()
        with torch.no_grad(), autocast():
            ref_logits = ref_model(**inputs).logits[:, :-1]
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


def main(spec_path):
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


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/child.py SPEC.json (bench_vs_trl.py writes the spec and runs this)")
    main(sys.argv[1])
