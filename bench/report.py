"""The tables bench_vs_trl.py prints and writes: step times with ratios, the step's parts, this machine's
floors, and the speed targets. Every number is a median; (a-b) is the min-max of the same samples."""

import statistics

TARGETS = {  # the speed targets of the --dtype work: (numerator run, denominator run) -> the most the ratio may be
    "step": [("ours-bf16", "before", 0.5), ("ours", "trl", 0.6), ("ours-bf16", "trl-bf16", 0.6)],
    "peak_rss": [("ours", "trl", 1.0), ("ours-bf16", "trl-bf16", 1.0)],
    "decode_per_read": 2.5,
}
SHORT = {"float32": "fp32", "bfloat16": "bf16"}


def spread(xs, scale=1.0, fmt=".3f"):
    """'median (min-max)' of xs, times scale."""
    return f"{statistics.median(xs) * scale:{fmt}} ({min(xs) * scale:{fmt}}-{max(xs) * scale:{fmt}})"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def same_dtype(results, family, dtype):
    """The run of that family (trl, floor) at that dtype, if it ran."""
    return next((r for r in results.values() if r["family"] == family and r["dtype"] == dtype), None)


def dtypes_seen(r):
    """'bf16' if every probed matmul output was bf16, 'fp32' if all fp32, else each phase's dtypes."""
    seen = r.get("compute_dtypes") or {}
    every = {d for v in seen.values() for d in v}
    if len(every) == 1:
        return SHORT.get(next(iter(every)), next(iter(every)))
    return ", ".join(f"{k} {'/'.join(SHORT.get(d, d) for d in v)}" for k, v in sorted(seen.items())) or "-"


def step_table(results, model):
    any_run = next(iter(results.values()))
    before = results.get("before")
    lines = [f"model {model}: B={any_run['batch_prompts']} prompts x G={any_run['G']}, {any_run['new_tokens']} new "
             f"tokens, median over {any_run['n_timed']} steps ({len(any_run['rounds'])} round(s) of "
             f"{any_run['steps']} after {any_run['warmup']} warm-up), 1 thread",
             "| run | what | compute dtype seen | median s/step (min-max) | peak RSS MiB | step / before | "
             "step / TRL same dtype | step / floor same dtype | peak RSS / TRL same dtype |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        trl = same_dtype(results, "trl", r["dtype"])
        floor = same_dtype(results, "floor", r["dtype"])
        lines.append(f"| {name} | {r['label']} | {dtypes_seen(r)} | {spread(r['timed_step_s'])} | "
                     f"{r['peak_rss_mib']:.0f} | {ratio(r['median_step_s'], before and before['median_step_s'])} | "
                     f"{ratio(r['median_step_s'], trl and trl['median_step_s'])} | "
                     f"{ratio(r['median_step_s'], floor and floor['median_step_s'])} | "
                     f"{ratio(r['peak_rss_mib'], trl and trl['peak_rss_mib'])} |")
    return "\n".join(lines)


PARTS = {"sample": "sampling", "ref_forward": "reference forward", "optimizer": "AdamW step",
         "rest": "the rest: policy forward + backward, rewards, bookkeeping"}


def parts_table(results):
    lines = ["Parts of the step, seconds (median over the timed steps; 'rest' = step - the other three):",
             "| run | " + " | ".join(PARTS.values()) + " |", "|---|" + "---|" * len(PARTS)]
    for name, r in results.items():
        parts = r.get("parts_s")
        if not parts:
            continue
        lines.append(f"| {name} | " + " | ".join(spread(parts[k]) if k in parts else "-" for k in PARTS) + " |")
    if any(r["family"] == "floor" for r in results.values()):
        lines.append("The floor's s/step leaves its AdamW step out (it is timed next to it), so its 'rest' is the "
                     "policy forward + backward alone.")
    return "\n".join(lines)


def floors_table(machine, model):
    m, k, n = machine["matmul_mkn"]
    flop = 2 * m * k * n
    lines = [f"This machine's floors, 1 thread, model {model} ({machine['n_params'] / 1e6:.1f}M parameters), "
             f"decode of {machine['rows']} rows x {machine['new_tokens']} tokens; native bf16 matmul: "
             f"{'yes' if machine['cpu_bf16_native'] else 'no'}",
             f"| dtype | weight read ms (min-max) | GB/s | matmul {m}x{k} @ {k}x{n} ms (min-max) | GFLOP/s | "
             "decode step ms (min-max) | decode step / weight read | compute dtype seen |",
             "|---|---|---|---|---|---|---|---|"]
    for dtype in ("float32", "bfloat16"):
        f = machine[dtype]
        read, mm, dec = (statistics.median(f[key]) for key in ("weight_read_s", "matmul_s", "decode_step_s"))
        seen = {d for v in f["decode_compute_dtypes"].values() for d in v}
        lines.append(f"| {dtype} | {spread(f['weight_read_s'], 1e3, '.2f')} | {f['weight_bytes'] / read / 1e9:.1f} | "
                     f"{spread(f['matmul_s'], 1e3, '.2f')} | {flop / mm / 1e9:.0f} | "
                     f"{spread(f['decode_step_s'], 1e3, '.2f')} | {dec / read:.2f} | "
                     f"{'/'.join(SHORT.get(d, d) for d in sorted(seen))} |")
    return "\n".join(lines)


def targets_table(results, machine):
    """Each of the speed targets that this run measured: the ratio of medians, the goal, met or not."""
    rows = []
    for key, what in (("step", "s/step"), ("peak_rss", "peak RSS")):
        for a, b, goal in TARGETS[key]:
            if a in results and b in results:
                x = results[a]["median_step_s" if key == "step" else "peak_rss_mib"]
                y = results[b]["median_step_s" if key == "step" else "peak_rss_mib"]
                rows.append((f"{what} {a} / {b}", x / y, goal))
    if machine:
        for dtype in ("float32", "bfloat16"):
            f = machine[dtype]
            rows.append((f"decode step / weight read, {dtype}",
                         statistics.median(f["decode_step_s"]) / statistics.median(f["weight_read_s"]),
                         TARGETS["decode_per_read"]))
    lines = ["| target | measured | goal | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value:.2f} | <= {goal} | {'yes' if value <= goal else 'NO'} |"
              for name, value, goal in rows]
    return "\n".join(lines)
