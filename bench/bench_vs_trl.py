"""grpo.py before and after, against TRL's GRPOTrainer and a plain-transformers floor, side by side, per compute
dtype: seconds per step, its parts, peak memory, and this machine's floors, from one command.

The parent process prepares one model directory (same weights for every run) and one list of prompts, then
starts one child process per run (bench/child.py), one after the other, each with torch.set_num_threads(1), and
prints tables from the JSON line each child prints last. The runs (--impls, any subset, in this order):

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
B*G rows, each in fp32 and in bf16. The tables end with the speed targets: ours-bf16 / before <= 0.5 and
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
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from common import HERE, PRESETS, ROOT, prepare_model

IMPLS = {  # name: (family, compute dtype); the module docstring says what each one is
    "before": ("grpo", "float32"), "ours": ("grpo", "float32"), "ours-bf16": ("grpo", "bfloat16"),
    "trl": ("trl", "float32"), "trl-bf16": ("trl", "bfloat16"),
    "floor": ("floor", "float32"), "floor-bf16": ("floor", "bfloat16"),
}
BEFORE = "e7b32a3"  # main before the --dtype work
LABELS = {"before": "grpo.py at {before}", "ours": "grpo.py --dtype float32", "ours-bf16": "grpo.py --dtype bfloat16",
          "trl": "TRL GRPOTrainer", "trl-bf16": "TRL GRPOTrainer, bf16=True", "floor": "plain transformers",
          "floor-bf16": "plain transformers, bf16 autocast"}


# ------------------------------------------------------------------ parent: one model dir, one prompt list

def prepare_prompts(model_dir, n_steps, B, seed):
    """The arith training rows and the prompt texts of the first n_steps batches, B each: the rows' first
    n_steps*B questions in their order."""
    import grpo
    from transformers import AutoTokenizer
    train, test = grpo.load_data("arith", seed)
    train = train[:max(64, n_steps * B)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return train, test, [grpo.build_prompt(tokenizer, grpo.GSM8K, r["question"]) for r in train[:n_steps * B]]


def draw_order(grpo_dir, n, n_steps, B, seed):
    """The indices of the training rows, of n, that the grpo.py in grpo_dir draws in its first n_steps steps:
    step_questions where it has one, else one random.Random(seed) shuffle as older ones drew."""
    spec = importlib.util.spec_from_file_location("grpo_drawing", os.path.join(grpo_dir, "grpo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "step_questions"):
        return [i for step in range(1, n_steps + 1) for i in module.step_questions(list(range(n)), step, B, seed)]
    return random.Random(seed).sample(range(n), n)[:n_steps * B]


def write_data(data_dir, train, test, order):
    """train and test as a GSM8K-format dataset whose row order[k] is train[k]: a grpo.py that draws rows
    order[0], order[1], ... trains on train[0], train[1], ... (the prompts every other run gets too)."""
    rows = [None] * len(train)
    for k, i in enumerate(order):
        rows[i] = train[k]
    rest = iter(train[len(order):])
    rows = [r if r is not None else next(rest) for r in rows]
    os.makedirs(data_dir, exist_ok=True)
    for split, split_rows in (("train", rows), ("test", test[:8])):
        with open(os.path.join(data_dir, f"{split}.jsonl"), "w") as f:
            f.writelines(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in split_rows)
    return data_dir


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
    command = [sys.executable, os.path.join(HERE, "child.py"), f.name]
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    os.unlink(f.name)
    setting = {k: spec[k] for k in ("batch_prompts", "G", "new_tokens") if k in spec}
    log.write(f"===== {spec['impl']} {setting} rc={proc.returncode} wall={time.time() - t0:.0f}s\n")
    log.write(proc.stderr[-20000:] + "\n")
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
               "transformers": transformers.__version__, "threads": 1,
               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
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
    results = out.get("results")
    floors = out.get("floors")
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
    grpo_dirs = {i: os.path.abspath(a.grpo_dir) for i in impls}
    if "before" in impls:
        grpo_dirs["before"] = prepare_before(a.before, cache)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    log = open(os.path.splitext(a.out)[0] + ".log", "w")
    out = {"model": a.model, "machine": machine_info(), "before": a.before,
           "command": " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:])}

    def prompts_and_data(B):
        """The prompts of every run, and for each grpo.py run a dataset from which it draws them in that order."""
        train, test, prompts = prepare_prompts(model_dir, a.warmup + a.steps, B, a.seed)
        data_dirs = {impl: write_data(os.path.join(cache, f"data-{a.model}-{impl}"), train, test,
                                      draw_order(grpo_dirs[impl], len(train), a.warmup + a.steps, B, a.seed))
                     for impl in impls if IMPLS[impl][0] == "grpo"}
        return prompts, data_dirs

    def spec(impl, setting, prompts, data_dirs):
        family, dtype = IMPLS[impl]
        return {"impl": impl, "family": family, "dtype": dtype, "grpo_dir": grpo_dirs[impl], "model_dir": model_dir,
                "data_dir": data_dirs.get(impl), "prompts": prompts, "steps": a.steps, "warmup": a.warmup,
                "seed": a.seed, **setting}

    if not a.scaling:
        setting = dict(PRESETS[a.model])
        prompts, data_dirs = prompts_and_data(setting["batch_prompts"])
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
                runs[impl].append(run_child(spec(impl, setting, prompts, data_dirs), log))
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
            prompts, data_dirs = prompts_and_data(setting["batch_prompts"])
            for impl in impls:
                r = summarize([run_child(spec(impl, setting, prompts, data_dirs), log)])
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
    p.add_argument("--machine-reps", type=int, default=10,
                   help="timed repetitions of each floor (decode: reps/5 calls)")
    p.add_argument("--scaling", action="store_true", help="step time against G (2,4,8,16) and new tokens (32..256)")
    p.add_argument("--batch-prompts", type=int, default=None,
                   help="prompts per step for --scaling (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--grpo-dir", default=ROOT, help="folder holding the grpo.py to time as ours, ours-bf16 "
                   "(default: this checkout)")
    p.add_argument("--before", default=BEFORE, help="the grpo.py to time as 'before': a git revision of this "
                   "repository or a folder holding a grpo.py")
    p.add_argument("--cache", default=None,
                   help="where the model directory and data are kept (default: $TMPDIR/grpo-bench)")
    p.add_argument("--out", default="results/bench/bench.json")
    p.add_argument("--report", metavar="JSON", default=None,
                   help="print the tables of an earlier --out JSON, run nothing")
    a = p.parse_args()
    if a.report:
        with open(a.report) as f:
            print(tables_text(json.load(f)))
    else:
        parent(a)


if __name__ == "__main__":
    main()
