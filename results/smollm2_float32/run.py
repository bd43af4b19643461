"""SmolLM2-135M-Instruct on arith in float32: GRPO vs REINFORCE, each at a learning rate of its own, 10 seeds.

    python -m results.smollm2_float32.run sweep --seeds 100   # one queue; a second one takes --seeds 101
    python -m results.smollm2_float32.run sweep               # or both sweep seeds, 100-101, in one queue
    python -m results.smollm2_float32.run pick                # the rule of README.md -> lr.json
    python -m results.smollm2_float32.run seeds --seeds 0-4   # 100-step runs at the picked rates
    python -m results.smollm2_float32.run seeds --algos grpo  # one algorithm's seeds, a queue of its own

Each run is `grpo.py` with FLAGS in a child process on one thread, its folder under runs/smollm2_float32/ (checkpoint
every 10 steps). A run whose file here exists is skipped; a run stopped part-way continues from its last checkpoint.
When a run ends its metrics.jsonl is gzipped into this folder as <setting>/<algo>_seed<k>.jsonl.gz, the scheme
of every study here (setting: smollm2_lr<lr>_B2_<steps>steps), and one line is appended to runs.jsonl: wall and
CPU seconds summed over its attempts, and for each attempt the commit, the CPU model, torch, its own seconds and its
exit status (none for an attempt killed with its session, whose seconds are those noted last, every 30 s).
"""
import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time

from results.stats import machine  # the commit, CPU model and torch that made an attempt

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

SCRATCH = os.path.join(ROOT, "runs", "smollm2_float32")
FLAGS = ["--model", "smollm2", "--dataset", "arith", "--G", "8", "--batch-prompts", "2", "--max-new-tokens", "64",
         "--temperature", "0.7", "--eval-every", "50", "--eval-n", "200", "--dtype", "float32", "--save-every", "10"]
SWEEP_LRS = ["3e-6", "1e-5", "3e-5"]
SWEEP_STEPS = 50
SWEEP_SEEDS = "100-101"  # not the study's seeds
STEPS = 100
ALGOS = ["grpo", "reinforce"]
NOTE_S = 30  # how often a running attempt's time is written down


def cpu_seconds(pid):
    """User + system CPU seconds of a running process so far (/proc/PID/stat, fields 14 and 15 after the name)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:  # it has just ended: wait4 gives the exact number next
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(kind, algo, lr, seed, steps):
    """One grpo.py run unless its file exists; resumes from its checkpoint where an earlier attempt left one."""
    name = f"{algo}_lr{lr}_seed{seed}"  # its scratch folder's name
    final = os.path.join(HERE, f"smollm2_lr{lr}_B2_{steps}steps", f"{algo}_seed{seed}.jsonl.gz")
    if os.path.exists(final):
        return
    out = os.path.join(SCRATCH, kind, name)
    spent_path = os.path.join(SCRATCH, kind, name + ".spent.json")  # beside the run's folder, which grpo.py owns
    spent = json.load(open(spent_path)) if os.path.exists(spent_path) else {"wall_s": 0.0, "cpu_s": 0.0, "attempts": []}
    if os.path.isdir(out) and any(re.fullmatch(r"checkpoint-[0-9]+", n) for n in os.listdir(out)):
        argv = ["--resume", out]
    else:
        shutil.rmtree(out, ignore_errors=True)  # this script's own folder, killed before its first checkpoint
        argv = [*FLAGS, "--algo", algo, "--lr", lr, "--seed", str(seed), "--steps", str(steps), "--out", out]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    attempt = machine()
    spent["attempts"].append(attempt)
    before = spent["wall_s"], spent["cpu_s"]  # the attempts before this one, a killed one up to its last note

    def note(wall_s, cpu_s):
        """This attempt's time so far into spent.json: an attempt killed with the session loses at most NOTE_S."""
        attempt["wall_s"], attempt["cpu_s"] = round(wall_s, 1), round(cpu_s, 1)
        spent["wall_s"], spent["cpu_s"] = before[0] + wall_s, before[1] + cpu_s
        with open(spent_path + ".tmp", "w") as f:
            json.dump(spent, f)
        os.replace(spent_path + ".tmp", spent_path)

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.time()
    with open(os.path.join(SCRATCH, kind, name + ".log"), "a") as log:
        child = subprocess.Popen([sys.executable, os.path.join(ROOT, "grpo.py"), *argv], cwd=ROOT, env=env,
                                 stdout=log, stderr=subprocess.STDOUT)
        while not (waited := os.wait4(child.pid, os.WNOHANG))[0]:
            cpu_s = cpu_seconds(child.pid)
            if cpu_s is not None:  # never note 0 over a time already noted
                note(time.time() - t0, cpu_s)
            time.sleep(NOTE_S)
    _, status, usage = waited
    attempt["exit"] = os.waitstatus_to_exitcode(status)
    note(time.time() - t0, usage.ru_utime + usage.ru_stime)
    if attempt["exit"] != 0:
        sys.exit(f"error: {name} failed (exit {attempt['exit']}); see its .log in {SCRATCH}/{kind}")
    os.makedirs(os.path.dirname(final), exist_ok=True)
    with open(os.path.join(out, "metrics.jsonl"), "rb") as src, gzip.open(final + ".tmp", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.replace(final + ".tmp", final)
    with open(os.path.join(HERE, "runs.jsonl"), "a") as f:
        f.write(json.dumps({"kind": kind, "algo": algo, "lr": lr, "seed": seed, "steps": steps,
                            "wall_s": round(spent["wall_s"], 1), "cpu_s": round(spent["cpu_s"], 1),
                            "attempts": spent["attempts"]}) + "\n")
    print(f"{kind} {name}: {spent['wall_s']:.0f} s wall, {spent['cpu_s']:.0f} s CPU", flush=True)


def train_rewards(path):
    with gzip.open(path, "rt") as f:
        return [r["reward_mean"] for r in map(json.loads, f) if r.get("type") == "train"]


def pick(seeds):
    """The rule of README.md, per algorithm: a rate is out if on any seed the mean train reward of the last 10 steps
    is below that of the first 10 (a collapse); of the rest, the highest mean train reward over the last 20 steps,
    averaged over the seeds, wins (a tie to 3 decimals goes to the smaller rate). Every rate out: the smallest."""
    chosen = {}
    for algo in ALGOS:
        rows = {}
        for lr in SWEEP_LRS:
            setting = os.path.join(HERE, f"smollm2_lr{lr}_B2_{SWEEP_STEPS}steps")
            runs = [train_rewards(os.path.join(setting, f"{algo}_seed{s}.jsonl.gz")) for s in seeds]
            collapsed = any(sum(r[-10:]) / 10 < sum(r[:10]) / 10 for r in runs)
            last20 = sum(sum(r[-20:]) / 20 for r in runs) / len(runs)
            rows[lr] = {"collapsed": collapsed, "last20": round(last20, 3)}
        kept = [lr for lr in SWEEP_LRS if not rows[lr]["collapsed"]] or SWEEP_LRS[:1]
        best = max(kept, key=lambda lr: (rows[lr]["last20"], -float(lr)))
        chosen[algo] = {"chosen": best, "rates": rows}
    return chosen


def seed_list(spec):
    lo, _, hi = spec.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["sweep", "pick", "seeds"])
    p.add_argument("--seeds", default=None, help="'100', '0-4' (default: sweep 100-101, the sweep's seeds; seeds 0-9)")
    p.add_argument("--algos", default=",".join(ALGOS), help="seeds: which algorithms ('grpo': a queue of its own)")
    a = p.parse_args()
    unknown = sorted(set(a.algos.split(",")) - set(ALGOS))
    if unknown:
        p.error(f"--algos: unknown {', '.join(unknown)}; choose from {', '.join(ALGOS)}")
    if a.what == "sweep":
        for seed in seed_list(a.seeds or SWEEP_SEEDS):
            for lr in SWEEP_LRS:
                for algo in ALGOS:
                    run_one("sweep", algo, lr, seed, SWEEP_STEPS)
    elif a.what == "pick":
        chosen = pick(seed_list(SWEEP_SEEDS))
        with open(os.path.join(HERE, "lr.json"), "w") as f:
            json.dump(chosen, f, indent=1)
        print(json.dumps(chosen, indent=1))
    else:
        lrs = json.load(open(os.path.join(HERE, "lr.json")))
        for seed in seed_list(a.seeds or "0-9"):
            for algo in a.algos.split(","):
                run_one("seeds", algo, lrs[algo]["chosen"], seed, STEPS)


if __name__ == "__main__":
    main()
