"""GRPO vs REINFORCE (no baseline) vs GRPO without the std division, many seeds, on a cheap pretrained policy.

Runs `grpo.py` once per (policy, algorithm, learning rate, seed), each in a child process forked from this one
(grpo.main with the same argv as the command line; forking skips re-importing torch and transformers),
one at a time, on one thread. Every run writes STUDY/<setting>/<algo>_seed<k>.jsonl.gz, the gzipped
metrics.jsonl of the run (config line first), STUDY being --study (this folder, results/tiny30, by default) and
<setting> = <policy>_lr<lr>_B<questions per step>_<steps>steps, with _passk added for runs with sampled evals, e.g.
tiny30_lr3e-5_B4_300steps (setting_name). A run whose file exists is skipped, so every command here can be stopped
and started again; a run cut short is redone from its last checkpoint (every 100 steps, in SCRATCH; grpo.py's resume
is exact). Each finished run's wall and CPU seconds, summed over its attempts, are appended to STUDY/runs.jsonl.

Algorithms (identical flags otherwise, FLAGS below):
    grpo        --algo grpo                        adv = (r - mean) / (std + eps), loss 1/G sum_i 1/|o_i| sum_t
    reinforce   --algo reinforce                   adv = r, no baseline
    drgrpo_seq  --algo drgrpo --loss-agg seq       adv = r - mean: GRPO without the std division, same loss sum
    negative    --algo negative                    adv = r - 1: only wrong answers pushed down;
                                                   not in `pipeline`, which runs the three above

pass@k spectrum: `run --eval-samples K` adds --eval-samples K --eval-every E (E = 0, eval at step 0 and at the end
only, at 4 questions per step and 300 steps; else a quarter of the run): K answers sampled at the training
temperature, FLAGS's --temperature 1.0; summarized by results/tiny30/passk.py and results/tiny60s/horizon.py.

Usage, from the repository root:
    python -m results.tiny30.seeds run --policy tiny30=results/tiny_policy/ckpt30 --lr 3e-5 --seeds 0-4
    python -m results.tiny30.seeds run --policy tiny30=results/tiny_policy/ckpt30 --lr 1e-4 --seeds 0-19 \
        --algos grpo reinforce drgrpo_seq negative --eval-samples 64   # -> tiny30_lr1e-4_B4_300steps_passk/
    python -m results.tiny30.seeds pipeline                # the whole study, in order, resumable (see `pipeline`)
    python -m results.tiny30.seeds summarize --setting tiny30_lr3e-5_B4_300steps --md out.md --png out.png
    python -m results.tiny30.seeds run --study results/tiny60s ...   # another study's runs, in its folder
"""
import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import sys
import time

from results.stats import (TIMING, band, bootstrap_ci, fmt_steps, lr_name, moving_average, parse_seeds, read_run,
                           steps_to)

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

ALGOS = {"grpo": ["--algo", "grpo"], "reinforce": ["--algo", "reinforce"],
         "drgrpo_seq": ["--algo", "drgrpo", "--loss-agg", "seq"], "negative": ["--algo", "negative"]}
PIPELINE_ALGOS = ["grpo", "reinforce", "drgrpo_seq"]  # the section-4 study; `negative` came later
POLICIES = {"tiny30": "results/tiny_policy/ckpt30", "tiny05": "results/tiny_policy/ckpt05"}  # stored, see sft_tiny.py
STEPS = 300
BATCH_PROMPTS = 4  # questions per step; G = 8 answers each
# everything but --model, --algo, --lr, --seed and --out; micro-batch 32 = the whole batch in one pass (same gradient)
# (run_one adds --batch-prompts and --micro-batch)
FLAGS = ["--dataset", "arith", "--G", "8", "--max-new-tokens", "16", "--temperature", "1.0",
         "--beta", "0.04", "--eval-every", "100", "--eval-n", "200", "--dtype", "float32"]
# each run's folder (checkpoints, model), deleted once its file is written; kept on disk between sessions
SCRATCH = os.environ.get("SEEDS_SCRATCH", os.path.join(ROOT, "runs", "seeds_scratch"))
SAVE_EVERY = 100  # steps between checkpoints: a run stopped by the end of a session continues from the last one


def setting_name(policy, lr, steps=STEPS, batch_prompts=BATCH_PROMPTS, eval_samples=0):
    """The folder of a grid's runs, one scheme for every study:
    <policy>_lr<lr>_B<questions per step>_<steps>steps, with _passk added for runs with sampled evals."""
    return f"{policy}_lr{lr_name(lr)}_B{batch_prompts}_{steps}steps" + ("_passk" if eval_samples else "")


# --------------------------------------------------------------------------------------------------
# Running: one forked child per run, one at a time.
# --------------------------------------------------------------------------------------------------

def passk_flags(k, every=0):
    """The sampled-eval flags of the pass@k spectrum runs: K answers per question at the training temperature,
    evaluated at step 0, every `every` steps and at the end."""
    return ["--eval-samples", str(k), "--eval-every", str(every)] if k else []


def run_one(study, policy, path, algo, lr, seed, steps, eval_samples=0, batch_prompts=None):
    """Run grpo.py for one (policy, algo, lr, seed) unless its file exists. Returns (wall_s, cpu_s) or None.
    eval_samples > 0: the pass@k spectrum runs (passk_flags); at the FLAGS batch size and step count they evaluate
    at step 0 and the end only, else also at 25, 50 and 75% of the run. batch_prompts: questions per step, FLAGS's
    4 if None, the whole batch in one micro-batch either way."""
    batch_prompts = batch_prompts or BATCH_PROMPTS
    setting = setting_name(policy, lr, steps, batch_prompts, eval_samples)
    every = 0 if (batch_prompts, steps) == (BATCH_PROMPTS, STEPS) else steps // 4
    final = os.path.join(study, setting, f"{algo}_seed{seed}.jsonl.gz")
    if os.path.exists(final):
        return None
    out = os.path.join(SCRATCH, setting, f"{algo}_seed{seed}")
    argv = ["--model", path, *ALGOS[algo], "--lr", str(lr), "--seed", str(seed), "--steps", str(steps),
            *FLAGS, *passk_flags(eval_samples, every), "--batch-prompts", str(batch_prompts),
            "--micro-batch", str(batch_prompts * 8), "--save-every", str(SAVE_EVERY), "--out", out]
    spent = out + ".spent.json"  # wall and CPU seconds of the attempts before this one; beside the run's folder
    log = os.path.join(SCRATCH, f"{setting}_{algo}_seed{seed}.log")
    started = os.path.isdir(out) and os.path.exists(spent)
    if started and os.path.isdir(os.path.join(out, "model")):  # the run ended, its file was not written yet
        with open(spent) as f:
            record = json.load(f)
        wall, cpu = record["wall_s"], record["cpu_s"]
    else:
        if started and any(re.fullmatch(r"checkpoint-[0-9]+", name) for name in os.listdir(out)):
            argv = ["--resume", out]
        else:  # this script's own scratch folder: a run only starts in a new one
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(spent, "w") as f:
                json.dump({"wall_s": 0.0, "cpu_s": 0.0}, f)
        wall, cpu = attempt(argv, spent, log)
    os.makedirs(os.path.dirname(final), exist_ok=True)
    with open(os.path.join(out, "metrics.jsonl")) as src, gzip.open(final + ".tmp", "wt") as dst:
        for line in src:
            dst.write(json.dumps(compact(json.loads(line))) + "\n")
    os.replace(final + ".tmp", final)  # the file appears only once complete
    shutil.rmtree(out)
    os.remove(spent)
    if os.path.exists(log):
        os.remove(log)
    with open(os.path.join(study, "runs.jsonl"), "a") as f:
        f.write(json.dumps({"setting": setting, "algo": algo, "seed": seed, "steps": steps,
                            "batch_prompts": batch_prompts, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}) + "\n")
    print(f"{setting} {algo} seed {seed}: {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
    return wall, cpu


def attempt(argv, spent, log):
    """grpo.main(argv) in a forked child, its output to `log`; returns the wall and CPU seconds of this attempt and
    the ones before it (kept current in `spent`, so an attempt ended with the session still counts)."""
    t0 = time.time()
    pid = os.fork()
    if pid == 0:  # the child: grpo.py's own main(), stdout and stderr to the run's log
        status = 1
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            import torch
            torch.set_num_threads(1)
            import grpo
            grpo.main(argv)
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
    with open(spent) as f:
        before = json.load(f)
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            cpu = usage.ru_utime + usage.ru_stime
        else:
            time.sleep(2)
            with open(f"/proc/{pid}/stat") as f:  # the child's utime and stime, in clock ticks
                cpu = sum(int(x) for x in f.read().rsplit(")", 1)[1].split()[11:13]) / os.sysconf("SC_CLK_TCK")
        wall, cpu = before["wall_s"] + time.time() - t0, before["cpu_s"] + cpu
        with open(spent + ".tmp", "w") as f:
            json.dump({"wall_s": wall, "cpu_s": cpu}, f)
        os.replace(spent + ".tmp", spent)
        if done:
            break
    if os.waitstatus_to_exitcode(status) != 0:
        with open(log) as f:
            tail = f.read()[-2000:]
        raise RuntimeError(f"grpo.py {' '.join(argv)} failed (exit {os.waitstatus_to_exitcode(status)}):\n{tail}")
    return wall, cpu


def compact(x):
    """A metrics.jsonl record as stored: floats to 6 significant digits (float32 holds about 7) and no per-step
    timings (stats.TIMING; each run's wall and CPU seconds are in runs.jsonl); 60% smaller gzipped. Of the stored
    files only those of the tiny60s 1000-step settings are compact; the others keep every digit and their timings."""
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, list):
        return [compact(v) for v in x]
    if isinstance(x, dict):
        return {k: compact(v) for k, v in x.items() if k not in TIMING}
    return x


def preload():
    """Import what every run needs once, here, so each forked child starts with it loaded."""
    import torch
    torch.set_num_threads(1)
    import grpo  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2LMHeadModel, PreTrainedTokenizerFast  # noqa: F401
    import tqdm  # noqa: F401


def run_grid(study, policies, lrs, seeds, algos, steps, eval_samples=0, batch_prompts=None):
    """Seeds in the outer loop, so a grid stopped half-way holds the same seeds for every algorithm."""
    for seed in seeds:
        for policy, path in policies:
            for lr in lrs:
                for algo in algos:
                    lr_here = lr[algo] if isinstance(lr, dict) else lr
                    run_one(study, policy, path, algo, lr_here, seed, steps, eval_samples, batch_prompts)


# --------------------------------------------------------------------------------------------------
# Summary: per-run numbers, bootstrap CIs over seeds, a markdown table, a plot.
# --------------------------------------------------------------------------------------------------

def run_numbers(path):
    config, train, evals = read_run(path)
    r = [x["reward_mean"] for x in train]
    last20 = train[-20:]
    return {"seed": config["seed"], "lr": config["lr"], "steps": len(train), "reward": r,
            "entropy": [x["entropy"] for x in train],
            "steps_to_0.5": steps_to(r, 0.5), "steps_to_0.8": steps_to(r, 0.8),
            "auc": sum(r) / len(r), "reward_first100": sum(r[:100]) / len(r[:100]),
            "reward_last100": sum(r[-100:]) / len(r[-100:]), "reward_last50": sum(r[-50:]) / len(r[-50:]),
            "acc_start": evals[0]["acc_lenient"], "acc_final": evals[-1]["acc_lenient"],
            "acc_final_step": evals[-1]["step"],
            "entropy_end": sum(x["entropy"] for x in last20) / len(last20),
            "kl_end": sum(x["kl"] for x in last20) / len(last20),
            "all_correct": sum(x["frac_all_correct"] for x in train) / len(train),
            "all_wrong": sum(x["frac_all_wrong"] for x in train) / len(train),
            "step_s": sorted(x["step_s"] for x in train)[len(train) // 2] if "step_s" in train[0] else None}


def load_setting(study, setting, seeds=None, algos=None):
    """{algo: [run_numbers, ...]} for the algos with files in STUDY/setting, restricted to `seeds` if given."""
    runs = {}
    for algo in algos or ALGOS:
        found = []
        for name in sorted(os.listdir(os.path.join(study, setting))):
            if name.startswith(f"{algo}_seed") and name.endswith(".jsonl.gz"):
                seed = int(name[len(f"{algo}_seed"):-len(".jsonl.gz")])
                if seeds is None or seed in seeds:
                    found.append(run_numbers(os.path.join(study, setting, name)))
        if found:
            runs[algo] = sorted(found, key=lambda x: x["seed"])
    return runs


def load_group(study, settings, seeds=None):
    """settings: one setting name (every algo from it) or {algo: setting} (each algo from its own setting)."""
    if isinstance(settings, str):
        return load_setting(study, settings, seeds)
    runs = {}
    for algo, setting in settings.items():
        runs.update(load_setting(study, setting, seeds, [algo]))
    return runs


def fmt_ci(values, digits=3):
    import numpy as np
    lo, hi = bootstrap_ci(values)
    return f"{np.mean(values):.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def table(runs, title):
    cols = ["lr", "seeds", "steps to 0.5", "steps to 0.8", "mean train reward (AUC)",
            "train reward, last 50 steps (sd over seeds)", "greedy acc start → final",
            "entropy, last 20", "KL, last 20", "all-correct groups", "all-wrong groups"]
    lines = [f"**{title}**", "", "| algo | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    for algo, rs in runs.items():
        get = lambda k: [r[k] for r in rs]  # noqa: E731
        cells = ["/".join(sorted({lr_name(r["lr"]) for r in rs})), str(len(rs)), fmt_steps(get("steps_to_0.5")),
                 fmt_steps(get("steps_to_0.8")), fmt_ci(get("auc")),
                 f"{fmt_ci(get('reward_last50'))} ({statistics.stdev(get('reward_last50')) if len(rs) > 1 else 0:.3f})",
                 f"{sum(get('acc_start')) / len(rs):.3f} → {fmt_ci(get('acc_final'))}",
                 fmt_ci(get("entropy_end")), fmt_ci(get("kl_end"), 4), fmt_ci(get("all_correct")),
                 fmt_ci(get("all_wrong"))]
        lines.append(f"| {algo} | " + " | ".join(cells) + " |")
    return lines


def paired_table(runs, base="grpo"):
    """Per-seed differences algo - base on the same seed (same initial policy, same questions in the same
    order; only the sampled answers and the updates differ), mean and 95% bootstrap CI."""
    if base not in runs:
        return []
    by_seed = {r["seed"]: r for r in runs[base]}
    lines = ["", f"Paired by seed, algo minus {base} (mean [95% CI]):", "",
             "| algo | seeds | Δ mean train reward (AUC) | Δ reward, steps 1-100 | Δ reward, last 100 steps "
             "| Δ final greedy acc | Δ entropy, last 20 |", "|---|---|---|---|---|---|---|"]
    for algo, rs in runs.items():
        if algo == base:
            continue
        pairs = [(r, by_seed[r["seed"]]) for r in rs if r["seed"] in by_seed]
        if not pairs:
            continue
        d = lambda k: [a[k] - b[k] for a, b in pairs]  # noqa: E731
        lines.append(f"| {algo} | {len(pairs)} | {fmt_ci(d('auc'))} | {fmt_ci(d('reward_first100'))} | "
                     f"{fmt_ci(d('reward_last100'))} | {fmt_ci(d('acc_final'))} | {fmt_ci(d('entropy_end'))} |")
    return lines


def plot(groups, png):
    """groups: [(title, runs)], one row of panels each: train reward and entropy vs step, each the 10-step trailing
    mean per run, then the mean over seeds with a 95% bootstrap band."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.6 * len(groups)), squeeze=False)
    for (title, runs), (ax_r, ax_e) in zip(groups, axes):
        for algo, rs in runs.items():
            n = min(r["steps"] for r in rs)
            for ax, key in ((ax_r, "reward"), (ax_e, "entropy")):
                mean, lo, hi = band([moving_average(r[key][:n]) for r in rs], n=2000)
                steps = np.arange(10, 10 + len(mean))
                line, = ax.plot(steps, mean, label=f"{algo} (n={len(rs)})")
                ax.fill_between(steps, lo, hi, alpha=0.2, color=line.get_color())
        ax_r.set(title=f"{title}: train reward (10-step mean)", xlabel="step", ylabel="reward", ylim=(0, 1))
        ax_e.set(title=f"{title}: entropy (nats/token, 10-step mean)", xlabel="step", ylabel="entropy")
        ax_r.legend(loc="upper left")
        ax_r.grid(alpha=0.3)
        ax_e.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def summarize(study, groups, seeds, md, png, header=""):
    """groups: [(title, settings)] with settings as in load_group. Writes the tables to md and the curves to png."""
    lines = [header, ""] if header else []
    loaded = []
    for title, settings in groups:
        runs = load_group(study, settings, seeds)
        if not runs:
            continue
        lines += table(runs, title) + paired_table(runs) + [""]
        loaded.append((title, runs))
    lines += ["Mean [95% bootstrap CI over seeds]. Steps to T: first step at which the 10-step trailing mean train "
              "reward reaches T; 'k/n' seeds reached it, the mean and CI are over those k, the median over all n "
              "with never = inf. AUC: mean train reward over all steps. Greedy acc: eval acc_lenient on 200 "
              "held-out questions at step 0 (the same for every algo on a seed) and at the last step. Entropy "
              "and KL: mean over the last 20 steps. All-correct / all-wrong groups: share of the B groups per "
              "step, mean over all steps."]
    text = "\n".join(lines)
    if md:
        with open(md, "w") as f:
            f.write(text + "\n")
    if png and loaded:
        plot(loaded, png)
    print(text, flush=True)
    return loaded


def best_lrs(study, policy, lrs, seeds, steps=STEPS):
    """Per algo, the lr with the highest mean AUC over seeds; and the common lr: highest AUC averaged over algos."""
    auc = {}
    for lr in lrs:
        for algo, rs in load_setting(study, setting_name(policy, lr, steps), seeds).items():
            auc.setdefault(algo, {})[lr] = sum(r["auc"] for r in rs) / len(rs)
    best = {algo: max(by_lr, key=by_lr.get) for algo, by_lr in auc.items()}
    common = max(lrs, key=lambda lr: sum(auc[a][lr] for a in auc) / len(auc))
    return best, common, auc


# --------------------------------------------------------------------------------------------------
# The study, in order. Each phase skips the runs already done.
# --------------------------------------------------------------------------------------------------

def pipeline(a):
    study = a.study
    tiny30 = ("tiny30", POLICIES["tiny30"])
    tiny05 = ("tiny05", POLICIES["tiny05"])
    sweep_seeds = parse_seeds(a.sweep_seeds)
    all_seeds = parse_seeds(a.seeds)
    name = lambda policy, lr: setting_name(policy, lr, a.steps)  # noqa: E731
    print(f"phase 1: lr sweep on tiny30, lrs {a.lrs}, seeds {a.sweep_seeds}", flush=True)
    run_grid(study, [tiny30], a.lrs, sweep_seeds, PIPELINE_ALGOS, a.steps)
    best, common, auc = best_lrs(study, "tiny30", a.lrs, sweep_seeds, a.steps)
    with open(os.path.join(study, "lr.json"), "w") as f:
        json.dump({"best": best, "common": common, "auc": {k: {lr_name(lr): v for lr, v in d.items()}
                                                              for k, d in auc.items()}}, f, indent=1)
    summarize(study, [(name("tiny30", lr), name("tiny30", lr)) for lr in a.lrs], sweep_seeds,
              os.path.join(study, "sweep.md"), os.path.join(study, "sweep.png"),
              f"Learning-rate sweep on tiny30, seeds {a.sweep_seeds}, {a.steps} steps")
    print(f"best lr per algo {best}, common lr {common}", flush=True)
    print("phase 2: 20 seeds at the common lr, tiny30 and tiny05", flush=True)
    run_grid(study, [tiny30, tiny05], [common], all_seeds, PIPELINE_ALGOS, a.steps)
    summarize(study, [(name(p, common), name(p, common)) for p in ("tiny30", "tiny05")], all_seeds,
              os.path.join(study, "common.md"), os.path.join(study, "common.png"),
              f"All algorithms at the common lr {lr_name(common)}, seeds {a.seeds}, {a.steps} steps")
    print("phase 3: 20 seeds at each algorithm's best lr (where it is not the common one)", flush=True)
    run_grid(study, [tiny30, tiny05], [best], all_seeds, [x for x in PIPELINE_ALGOS if best[x] != common],
             a.steps)
    if any(best[x] != common for x in PIPELINE_ALGOS):
        summarize(study, [(f"{p}, best lr per algo", {x: name(p, best[x]) for x in PIPELINE_ALGOS})
                          for p in ("tiny30", "tiny05")], all_seeds,
                  os.path.join(study, "best.md"), os.path.join(study, "best.png"),
                  f"Each algorithm at its own best lr "
                  f"{{{', '.join(f'{x}: {lr_name(best[x])}' for x in PIPELINE_ALGOS)}}}, "
                  f"seeds {a.seeds}, {a.steps} steps")
    print("done", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--study", default=HERE, help="the study folder: where the <setting>/ folders and runs.jsonl go "
                                                "(default: this one, results/tiny30)")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="a grid of runs")
    r.add_argument("--policy", action="append", required=True, help="NAME=DIR, e.g. tiny30=results/tiny_policy/ckpt30")
    r.add_argument("--lr", type=float, nargs="+", required=True)
    r.add_argument("--seeds", default="0-4")
    r.add_argument("--algos", nargs="+", default=PIPELINE_ALGOS, choices=list(ALGOS))
    r.add_argument("--steps", type=int, default=STEPS)
    r.add_argument("--eval-samples", type=int, default=0,
                   help="K > 0: the pass@k spectrum runs (K sampled answers per eval question, eval at step 0 and "
                        "the end only at 4 questions and 300 steps, else every quarter), written to "
                        "<policy>_lr<lr>_B<B>_<steps>steps_passk/")
    r.add_argument("--batch-prompts", type=int, default=BATCH_PROMPTS,
                   help="questions per step (the setting's B)")
    q = sub.add_parser("pipeline", help="lr sweep on tiny30, then 20 seeds at the common and at the best lrs")
    q.add_argument("--lrs", type=float, nargs="+", default=[3e-5, 1e-4, 3e-4])
    q.add_argument("--sweep-seeds", default="0-4")
    q.add_argument("--seeds", default="0-19")
    q.add_argument("--steps", type=int, default=STEPS)
    s = sub.add_parser("summarize", help="tables and plot from the files already there")
    s.add_argument("--setting", action="append", required=True)
    s.add_argument("--seeds", default=None, help="only these seeds, e.g. 0-19")
    s.add_argument("--md", default=None)
    s.add_argument("--png", default=None)
    s.add_argument("--header", default="")
    a = p.parse_args()
    a.study = os.path.abspath(a.study)
    os.chdir(ROOT)  # policies are given relative to the repository root
    if a.cmd == "summarize":
        summarize(a.study, [(x, x) for x in a.setting], parse_seeds(a.seeds) if a.seeds else None, a.md, a.png,
                  a.header)
        return
    preload()
    if a.cmd == "run":
        policies = [tuple(x.split("=", 1)) for x in a.policy]
        run_grid(a.study, policies, a.lr, parse_seeds(a.seeds), a.algos, a.steps, a.eval_samples, a.batch_prompts)
    else:
        pipeline(a)


if __name__ == "__main__":
    main()
