"""Tests of the studies' statistics and reports (results/): the tests over seeds and their correction for many rows
(stats.py), the claims rows (paired.py), the reports of tiny60s and of the SmolLM2 float32 study, and its runner. CPU
only, no network, no model. Run from the repository root: python -m pytest -q results/test_results.py"""

import json
import math
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


def test_paired_tests_by_hand():
    from results import stats as paired
    for df, table in [(2, 4.302653), (9, 2.262157), (19, 2.093024)]:  # Student's t table, 97.5% quantile
        assert paired.t_quantile(0.975, df) == pytest.approx(table, abs=1e-5)
    lo, hi = paired.t_interval([1, 2, 3, 4])  # mean 2.5, sd 1.290994, t(3) = 3.182446
    assert (lo, hi) == pytest.approx((2.5 - 3.182446 * 1.290994 / 2, 2.5 + 3.182446 * 1.290994 / 2), abs=1e-5)
    assert paired.sign_flip_p([1, 2, 3]) == 0.25  # of the 8 sums +-1 +-2 +-3, only +6 and -6 reach |6|
    assert paired.sign_flip_p([1, -1]) == 1.0
    assert paired.sign_flip_p([3, 1, 1, 1]) == 0.125  # 2 of 16
    assert paired.sign_flip_p([2, 1, -1]) == 0.75  # |+-2 +-1 +-1| is 4, 2, 2, 0, 0, 2, 2, 4: ties count
    assert paired.loo_range([1, 2, 3, 6]) == pytest.approx((2.0, 11 / 3))


@pytest.mark.parametrize("lo, hi, sign, said", [
    (0.1, 0.3, +1, "reproduced"), (0.1, 0.3, -1, "contradicted"),
    (-0.3, -0.1, -1, "reproduced"), (-0.3, -0.1, +1, "contradicted"),
    (-0.1, 0.3, +1, "inconclusive"), (-0.1, 0.3, -1, "inconclusive"),
    (-0.1, 0.3, 0, "inconclusive (no difference detected)"), (-0.3, -0.1, 0, "contradicted"),
    (0.1, 0.3, 0, "contradicted")])
def test_the_verdict_rule(lo, hi, sign, said):
    from results.stats import verdict
    assert verdict(lo, hi, sign) == said


def test_the_claims_rows_follow_from_their_intervals():
    from results import paired

    def run(kl, entropy, pass64_end, reward=0.5):
        train = [{"reward_mean": reward, "entropy": entropy, "kl": kl} for _ in range(40)]
        start = {"step": 0, "pass@1": 0.5, "pass@16": 0.9, "pass@64": 0.995, "maj@64": 0.5}
        return train, [start, {"step": 40, "pass@1": 0.6, "pass@16": 0.9, "pass@64": pass64_end, "maj@64": 0.6}]

    runs = {"grpo": {s: run(0.1, 0.2, 0.995 - d, 0.5 + 0.01 * s) for s, d in enumerate([0.005, 0.004, 0.006])},
            "reinforce": {s: run(0.1 + d, 0.2 + e, 0.995, 0.5 + 0.02 * s)
                          for s, (d, e) in enumerate([(0.5, 0.1), (0.7, -0.1), (0.9, 0.3)])}}
    rows = {r.split(" | ")[0][2:]: r for r in paired.claims(runs, "toy")}
    half = 4.302653 * 0.2 / math.sqrt(3)  # t(2) times the sd of the KL differences 0.5, 0.7, 0.9 over sqrt(3)
    kl = rows["REINFORCE drifts further from the reference late: KL over the last 20 steps, reinforce - grpo"]
    assert f"KL, last 20 steps +0.700 [{0.7 - half:+.3f}, {0.7 + half:+.3f}] | reproduced" in kl
    assert "toy, 3 seeds" in kl
    entropy = rows["Without a baseline the entropy falls faster: entropy, reinforce - grpo"]
    assert entropy.endswith("+0.100 [-0.397, +0.597] | inconclusive; the same with Holm's correction |")
    # grpo's pass@64 falls by 0.004-0.006 from 0.995: Yue et al.'s fall is shown, and DeepSeekMath's "pass@K does
    # not move" is contradicted by it; pass@16 does not move on any seed, which the rule cannot call reproduced.
    assert "pass@64 (start 0.995) -0.005 [-0.007, -0.003] | reproduced" in rows[
        "The RL model beats its base at small k and falls below it at large k"]
    assert "| maj@64: reproduced; pass@16: inconclusive (no difference detected); pass@64: contradicted" in rows[
        "RL lifts maj@K, not pass@K"]
    # reinforce - grpo train reward 0, 0.01, 0.02 on the 3 seeds: mean 0.01, sd 0.01; its spread over seeds is twice
    # grpo's, and a resample that draws one seed 3 times (3 of 27) gives 0 / 0, counted as 0
    assert (f"train reward (AUC) +0.010 [{0.01 - 4.302653 * 0.01 / math.sqrt(3):+.3f}, "
            f"{0.01 + 4.302653 * 0.01 / math.sqrt(3):+.3f}] | inconclusive") in rows[
        "GRPO learns faster: train reward, reinforce - grpo"]
    assert [r for r in rows.values() if r.startswith("| GRPO's runs end closer")][0].endswith(
        "| 2.0 [0.0, 2.0] (bootstrap over seeds) | inconclusive; a primary row, not corrected |")
    assert not any(r.startswith("| GRPO sits below NSR") for r in rows.values())  # no negative runs


def test_horizon_pairs_each_difference_over_the_seeds_both_algorithms_have():
    from results.tiny60s import horizon
    cols = {"pass@1": 0.5, "pass@4": 0.7, "pass@16": 0.9, "pass@64": 0.95, "maj@64": 0.5, "acc_lenient": 0.5}

    def run(reward, start):
        train = [{"reward_mean": reward, "entropy": 0.1, "kl": 0.01} for _ in range(100)]
        return train, [{"step": 0, **{c: v + start for c, v in cols.items()}},
                       {"step": 100, **{c: v + reward for c, v in cols.items()}}]

    # grpo has seeds 0-2, negative only 0 and 1; seed 2 of grpo is far off, so a difference that took it in, or a
    # grpo row that left it out, would show
    runs = {"grpo": {0: run(0.1, 0.00), 1: run(0.2, 0.02), 2: run(0.9, 0.04)},
            "negative": {0: run(0.4, 0.00), 1: run(0.3, 0.02)}}
    lines = horizon.tables(runs)
    row = lambda first: next(x for x in lines if x.startswith(first))  # noqa: E731
    assert row("| start | 3 |").endswith(f"| {0.52:.3f} | {0.92:.3f} | {0.97:.3f} | {0.52:.3f} |")
    assert row("| grpo | 3 |").split(" | ")[3].startswith(f"{(0.1 + 0.2 + 0.9) / 3:.3f} [")
    assert row("| negative | 2 |").split(" | ")[3].startswith(f"{0.35:.3f} [")
    # negative - grpo, train reward in every quarter: (0.4 - 0.1 + 0.3 - 0.2) / 2 = +0.2, ahead on 2 of 2 seeds
    quarters = row("| negative - grpo | +")
    assert quarters.count("+0.200 [") == 4 and quarters.endswith("| 2/2 |")
    # at step 100, Δ pass@1 against grpo on seeds 0 and 1 alone: +0.3 and +0.1
    assert row("| negative - grpo | 100 |").split(" | ")[2].startswith("+0.200 [")
    # spread: sd over seeds 0 and 1 of the last-50-step reward, 0.4 / 0.3 against 0.1 / 0.2: equal, ratio 1 (with
    # grpo's seed 2 in, its sd would be 0.43)
    assert row("| negative / grpo |").startswith(f"| negative / grpo | {0.1 / math.sqrt(2):.3f} / "
                                                 f"{0.1 / math.sqrt(2):.3f} | 1.0 [")


def test_the_float32_studys_paired_rows_follow_from_the_seeds():
    from results.smollm2_float32 import report

    def run(z):  # train reward 0 for z steps, then 1: AUC (100 - z) / 100, a trailing 10-step mean of 0.6 at z + 6
        train = [{"step": i + 1, "reward_mean": float(i >= z), "entropy": 0.5, "kl": 0.1, "completion_len": 30.0,
                  "frac_zero_std": 0.5} for i in range(100)]
        return train, [{"step": s, "acc_lenient": 0.5, "acc_strict": 0.1} for s in (0, 50, 100)]

    zeros = [(30, 20), (40, 20), (50, 96)]  # (grpo, reinforce) per seed
    runs = {seed: {"grpo": run(zg), "reinforce": run(zr)} for seed, (zg, zr) in enumerate(zeros)}
    lines = report.paired_table(runs, 100, [50, 100])
    row = lambda first: next(x for x in lines if x.startswith(first)).split(" | ")  # noqa: E731
    # AUC, reinforce - grpo: +0.1, +0.2, -0.46; t(2) = 4.302653; leaving out one seed: -0.13, -0.18, +0.15; of the 8
    # sign patterns of (0.1, 0.2, 0.46) none has a sum nearer 0 than the observed -0.16: sign-flip p = 1
    d = [0.1, 0.2, -0.46]
    half = 4.302653 * statistics.stdev(d) / math.sqrt(3)
    auc = row("| train reward AUC")
    t = (sum(d) / 3) / (statistics.stdev(d) / math.sqrt(3))
    p_t = 1 - abs(t) / math.sqrt(t * t + 2)  # Student's t with 2 degrees of freedom: P(|T| >= t) in closed form
    assert auc[2:8] == [f"{sum(d) / 3:+.3f}", f"[{sum(d) / 3 - half:+.3f}, {sum(d) / 3 + half:+.3f}]", f"{p_t:.3f}",
                        "1.000", "[-0.180, +0.150]", "2 / 1"]
    assert auc[-1] == "inconclusive |"
    # steps to 0.6: seeds 0 and 1 (26 - 36, 26 - 46), t(1) = 12.706205; seed 2's reinforce never gets there
    half = 12.706205 * statistics.stdev([-10, -20]) / math.sqrt(2)
    steps = row("| steps to a train reward of 0.6")
    assert steps[1:4] == ["2", "-15.0", f"[{-15 - half:+.1f}, {-15 + half:+.1f}]"]
    assert "- reached by grpo only, left out of the paired row: seeds [2]" in lines
    assert "- reinforce: 2/3: 26.0 [26.0, 26.0]; median 26.0" in lines  # steps print with one decimal
    assert row("| KL, last 10 steps")[2:4] == ["+0.000", "[+0.000, +0.000]"]


def test_the_float32_studys_per_algorithm_rows_average_the_seeds():
    from results.smollm2_float32 import report

    def run(reward, end):  # entropy 1.0 then 0.2 and KL 0.0 then 0.5 over the last 10 steps: a wrong window shows
        train = [{"step": i + 1, "reward_mean": reward, "entropy": 1.0 if i < 90 else 0.2, "kl": 0.0 if i < 90 else 0.5}
                 for i in range(100)]
        return train, [{"step": s, "acc_lenient": a, "acc_strict": a / 2} for s, a in ((0, 0.4), (50, 0.0), (100, end))]

    runs = {seed: {"grpo": run(g, 0.8), "reinforce": run(r, e)}
            for seed, (g, r, e) in enumerate([(0.1, 0.5, 0.6), (0.2, 0.5, 0.7), (0.6, 0.5, 0.8)])}
    grpo, reinforce = (line.split(" | ") for line in report.per_algo(runs, 100)[2:])
    assert grpo[:2] == ["| grpo", "3"] and grpo[2].startswith(f"{0.9 / 3:.3f} [")
    assert grpo[3:] == ["0.400 → 0.800 [0.800, 0.800]", "0.200 → 0.400 [0.400, 0.400]", "0.200 [0.200, 0.200]",
                        "0.500 [0.500, 0.500] |"]
    assert reinforce[2] == "0.500 [0.500, 0.500]"
    assert reinforce[3].startswith(f"0.400 → {0.7:.3f} [") and reinforce[4].startswith(f"0.200 → {0.35:.3f} [")


def test_the_gram_of_k_gradients_gives_their_variance_and_cosines():
    from results.variance.grad_variance import Gram
    g = torch.tensor([[1.0, 0.0, 2.0], [3.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, -1.0, 1.0]])
    gram = Gram(len(g))
    for x in g:
        gram.add(x.clone())
    got = gram.summary()
    mean = g.mean(0)  # from the vectors themselves, not from their inner products
    total = ((g - mean) ** 2).sum(1).mean().item()
    assert got["total_variance"] == pytest.approx(total, rel=1e-6)
    assert got["mean_grad_norm"] == pytest.approx(mean.norm().item(), rel=1e-6)
    assert got["rel_variance"] == pytest.approx(total / mean.norm().item() ** 2, rel=1e-6)
    cos = [torch.nn.functional.cosine_similarity(x, mean, dim=0).item() if x.norm() > 0 else 0.0 for x in g]
    assert got["mean_cosine"] == pytest.approx(sum(cos) / len(cos), rel=1e-6)
    assert got["zero_grad_batches"] == 1


def test_the_float32_studys_variance_rows_follow_from_the_batches(tmp_path, monkeypatch):
    from results.smollm2_float32 import report
    from results.variance.grad_variance import Gram
    noise = torch.randn(16, 50, generator=torch.Generator().manual_seed(0))
    mean = torch.ones(50)

    def measured(grpo_g, reinforce_g):
        d = {"K": 16, "reward_mean": 0.25}
        for algo, g in (("grpo", grpo_g), ("reinforce", reinforce_g)):
            gram = Gram(16)
            for x in g:
                gram.add(x.clone())
            d[algo] = gram.summary()
        d["variance_ratio_grpo_over_reinforce"] = d["grpo"]["total_variance"] / d["reinforce"]["total_variance"]
        d["rel_variance_ratio_grpo_over_reinforce"] = d["grpo"]["rel_variance"] / d["reinforce"]["rel_variance"]
        return d

    (tmp_path / "variance").mkdir()
    # REINFORCE's gradients twice GRPO's: the same relative variance in every resample, the total variance a quarter
    (tmp_path / "variance" / "start.json").write_text(json.dumps(measured(mean + noise, 2 * (mean + noise))))
    # GRPO's noise ten times REINFORCE's around the same mean: a relative variance 100x, every resample far above 1
    (tmp_path / "variance" / "step50.json").write_text(json.dumps(measured(mean + 10 * noise, mean + noise)))
    monkeypatch.setattr(report, "HERE", str(tmp_path))
    start, step50 = [line for line in report.variance() if line.startswith("| the starting policy")
                     or line.startswith("| grpo seed 0")]
    assert "| 1.00 [1.00, 1.00] | 0.25 [0.25, 0.25] |" in start and start.endswith("| inconclusive |")
    rel = lambda g: ((g - g.mean(0)) ** 2).sum(1).mean().item() / g.mean(0).norm().item() ** 2  # noqa: E731
    want = rel(mean + 10 * noise) / rel(mean + noise)
    assert step50.split(" | ")[5].startswith(f"{want:.2f} [")
    assert step50.endswith("| contradicted |")  # the claim predicts a ratio below 1


def test_the_float32_studys_runner_keeps_the_time_of_a_killed_attempt(tmp_path, monkeypatch):
    import multiprocessing
    from results.smollm2_float32 import run
    (tmp_path / "results").mkdir()
    # a stand-in for grpo.py: makes its folder and checkpoint, burns 1 s of CPU, writes one metrics line
    (tmp_path / "grpo.py").write_text(
        "import os, sys, time\n"
        "out = sys.argv[sys.argv.index('--resume' if '--resume' in sys.argv else '--out') + 1]\n"
        "os.makedirs(os.path.join(out, 'checkpoint'), exist_ok=True)\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 1.0:\n"
        "    pass\n"
        "open(os.path.join(out, 'metrics.jsonl'), 'a').write('{}\\n')\n")
    for name, value in (("ROOT", str(tmp_path)), ("HERE", str(tmp_path / "results")),
                        ("SCRATCH", str(tmp_path / "runs")), ("NOTE_S", 0.1)):
        monkeypatch.setattr(run, name, value)
    monkeypatch.setattr(run, "machine", lambda: {"commit": "c"})
    spent = tmp_path / "runs" / "seeds" / "grpo_lr1e-5_seed0.spent.json"
    first = multiprocessing.get_context("fork").Process(target=run.run_one, args=("seeds", "grpo", "1e-5", 0, 100))
    first.start()
    deadline = time.time() + 30
    # spent.json's total is unrounded and the attempt's own seconds are rounded to 0.1: wait for a total over 0.4, so
    # that the attempt's reads over 0.3 (a total of 0.31 is an attempt of 0.3)
    while time.time() < deadline and not (spent.exists() and json.loads(spent.read_text())["cpu_s"] > 0.4):
        time.sleep(0.05)
    subprocess.run(["pkill", "-KILL", "-f", str(tmp_path / "grpo.py")])  # as the end of a session kills both
    first.kill()
    first.join()
    killed = json.loads(spent.read_text())["attempts"][0]
    assert 0.3 < killed["cpu_s"] < 1.0 and "exit" not in killed
    run.run_one("seeds", "grpo", "1e-5", 0, 100)  # resumes from the checkpoint the first attempt left
    line = json.loads((tmp_path / "results" / "runs.jsonl").read_text())
    first_s, second = line["attempts"][0]["cpu_s"], line["attempts"][1]
    assert first_s == killed["cpu_s"] and second["exit"] == 0 and second["cpu_s"] >= 1.0
    assert line["cpu_s"] == pytest.approx(first_s + second["cpu_s"], abs=0.11)
    assert (tmp_path / "results" / "smollm2_lr1e-5_B2_100steps" / "grpo_seed0.jsonl.gz").exists()


def test_the_float32_studys_runner_keeps_the_sweep_off_the_studys_seeds(tmp_path, monkeypatch):
    from results.smollm2_float32 import run
    (tmp_path / "lr.json").write_text(json.dumps({"grpo": {"chosen": "1e-5"}, "reinforce": {"chosen": "3e-6"}}))
    monkeypatch.setattr(run, "HERE", str(tmp_path))
    started = []
    monkeypatch.setattr(run, "run_one", lambda *job: started.append(job))
    for argv in (["sweep"], ["seeds"], ["seeds", "--seeds", "3", "--algos", "reinforce"]):
        monkeypatch.setattr(sys, "argv", ["run.py", *argv])
        run.main()
    # the sweep: seeds 100 and 101 only, each rate, both algorithms; the seeds: 0-9 at each algorithm's own rate
    sweep = [("sweep", algo, lr, seed, 50) for seed in (100, 101) for lr in ("3e-6", "1e-5", "3e-5")
             for algo in ("grpo", "reinforce")]
    seeds = [("seeds", algo, lr, seed, 100) for seed in range(10)
             for algo, lr in (("grpo", "1e-5"), ("reinforce", "3e-6"))]
    assert started == sweep + seeds + [("seeds", "reinforce", "3e-6", 3, 100)]


# ---- tests over seeds, their correction for many rows, and the verdicts they give

def test_holm_by_hand():
    from results.stats import holm
    # sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1: 0.04, 0.09, 0.08, 0.2; the third may not fall below the second
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # 2 x 0.6 = 1.2 capped at 1; 0.7, at least the first
    assert holm([0.02, 0.02, 0.9]) == pytest.approx([0.06, 0.06, 0.9])  # ties: 3 x 0.02, then max(0.06, 2 x 0.02)
    assert holm([0.3]) == [0.3] and holm([]) == []


def test_the_t_tests_p_by_hand():
    from results.stats import t_cdf_tail, t_interval, t_test_p
    for df, table in [(2, 4.302653), (9, 2.262157), (19, 2.093024)]:  # Student's t table, 97.5% quantile
        assert t_cdf_tail(table, df) == pytest.approx(0.05, abs=1e-6)
    for t in (0.3, 1.0, 5.0, 50.0):  # closed forms: df 1, Cauchy; df 2; df 3
        assert t_cdf_tail(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-9)
        assert t_cdf_tail(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
        u = t / math.sqrt(3)
        assert t_cdf_tail(t, 3) == pytest.approx(1 - 2 / math.pi * (u / (1 + u * u) + math.atan(u)), rel=1e-9)
    t = 2.5 / (1.290994 / 2)  # [1, 2, 3, 4]: mean 2.5, sd 1.290994, 3 degrees of freedom
    u = t / math.sqrt(3)
    assert t_test_p([1, 2, 3, 4]) == pytest.approx(1 - 2 / math.pi * (u / (1 + u * u) + math.atan(u)), rel=1e-6)
    assert t_test_p([-1, -2, -3, -4]) == t_test_p([1, 2, 3, 4])
    assert t_test_p([0.2, 0.2]) == 0.0 and t_test_p([0.0, 0.0, 0.0]) == 1.0  # no spread: all or nothing
    rng = np.random.default_rng(0)  # below 0.05 exactly where the t-interval excludes 0
    for _ in range(200):
        d = rng.normal(rng.normal(0, 0.5), 1, int(rng.integers(3, 12)))
        lo, hi = t_interval(d)
        p = t_test_p(d)
        if abs(p - 0.05) > 1e-4:
            assert (p < 0.05) == (lo > 0 or hi < 0)


def test_the_bootstrap_p_counts_both_sides_of_the_null():
    from results.stats import bootstrap_p, sd_ratio_ci, sd_ratio_p
    assert bootstrap_p([0.5, 0.8, 1.2, 1.5], 1.0) == 1.0  # half on each side
    assert bootstrap_p([0.9, 1.1, 1.2, 1.3], 1.0) == 0.5  # 1 of 4 at or below 1, doubled
    assert bootstrap_p([1.0, 2.0, 3.0, 4.0], 1.0) == 0.5  # a tie counts on both sides: 1 of 4
    assert bootstrap_p([2.0, 3.0], 1.0) == 0.0
    # the p of the same resamples as sd_ratio_ci: below 0.05 where its interval excludes 1
    x, y = [0.1, 0.5, 0.9, 0.2, 0.8, 0.4], [0.50, 0.52, 0.49, 0.51, 0.50, 0.48]
    _, lo, hi = sd_ratio_ci(x, y)
    assert lo > 1 and sd_ratio_p(x, y) < 0.05
    _, lo, hi = sd_ratio_ci(x, x[::-1])
    assert lo < 1 < hi and sd_ratio_p(x, x[::-1]) > 0.05


@pytest.mark.parametrize("p, diff, sign, said", [
    (0.01, 0.3, +1, "reproduced"), (0.01, 0.3, -1, "contradicted"), (0.01, -0.3, -1, "reproduced"),
    (0.06, 0.3, +1, "inconclusive"), (0.05, -0.3, -1, "inconclusive"),
    (0.01, 0.3, 0, "contradicted"), (0.2, 0.3, 0, "inconclusive (no difference detected)")])
def test_the_verdict_rule_from_a_p_value(p, diff, sign, said):
    from results.stats import verdict_p
    assert verdict_p(p, diff, sign) == said


def test_two_tests_that_disagree_are_both_named():
    from results.stats import split_verdict
    assert split_verdict("reproduced", "reproduced") == "reproduced"
    assert split_verdict("inconclusive", "reproduced") == "t-test: inconclusive; sign-flip: reproduced"


def test_steps_to_a_threshold_print_with_the_decimals_asked_for():
    from results.stats import fmt_steps
    # mean 32.5 and median 32.5 print as 32 with no decimal (round half to even), 32.5 with one
    assert fmt_steps([30, 35]).startswith("2/2: 32 [") and fmt_steps([30, 35]).endswith("; median 32")
    assert fmt_steps([30, 35], digits=1).startswith("2/2: 32.5 [30.0, 35.0]") and \
        fmt_steps([30, 35], digits=1).endswith("; median 32.5")
    assert fmt_steps([30, math.inf, math.inf], digits=1) == "1/3: 30.0 [30.0, 30.0]; median never"


# ---- the claims rows with Holm's correction (paired.py)

def test_the_claims_rows_correct_every_test_but_the_primary_rows(monkeypatch):
    from results import paired
    # (claim, difference, metric, sign, seeds, text, verdict, distance from 0, p of the t-test, p of the sign-flip)
    found = [
        ("GRPO learns faster: train reward, reinforce - grpo", "reinforce - grpo", "train reward, first quarter", -1,
         5, "q", "contradicted", 0.1, 0.01, 0.0625),
        ("GRPO learns faster: train reward, reinforce - grpo", "reinforce - grpo", "train reward (AUC)", -1, 5, "a",
         "contradicted", 0.1, 0.001, 0.0625),
        ("GRPO ends above REINFORCE: reinforce - grpo at the last eval", "reinforce - grpo", "pass@64", -1, 5, "e",
         "reproduced", -0.1, 0.02, 0.0625),
        ("GRPO sits above PSR at large k: reinforce - grpo", "reinforce - grpo", "pass@64", -1, 5, "e",
         "reproduced", -0.1, 0.02, 0.0625),
        ("Without a baseline the entropy falls faster: entropy, reinforce - grpo", "reinforce - grpo",
         "entropy, last 20 steps", -1, 5, "h", "reproduced", -0.1, 0.004, 0.0625)]
    monkeypatch.setattr(paired, "parts", lambda runs: found)
    lines = paired.claims({}, "toy")
    cell = {line.split(" | ")[0][2:]: line.split(" | ")[-1][:-2] for line in lines if line.startswith("| ")}
    # the family: first quarter, pass@64 (one test, in two claims), entropy; the AUC is primary. Holm over
    # p = 0.01, 0.02, 0.004: 0.004 x 3 = 0.012, 0.01 x 2 = 0.02, 0.02 x 1 = 0.02
    assert cell["GRPO learns faster: train reward, reinforce - grpo"] == "contradicted; the same with Holm's correction"
    assert cell["GRPO ends above REINFORCE: reinforce - grpo at the last eval"] == (
        "reproduced; the same with Holm's correction")
    rows = {tuple(x.split(" | ")[:2]): x.split(" | ") for x in lines if x.startswith("| reinforce - grpo |")}
    assert rows["| reinforce - grpo", "train reward, first quarter"][3:] == ["one of 3", "0.010", "0.020", "0.062",
                                                                             "0.188 |"]
    assert rows["| reinforce - grpo", "train reward (AUC)"][3:] == ["primary: GRPO learns faster", "0.001", "—",
                                                                    "0.062", "— |"]
    assert rows["| reinforce - grpo", "pass@64"][4:6] == ["0.020", "0.020"]
    assert rows["| reinforce - grpo", "entropy, last 20 steps"][4:6] == ["0.004", "0.012"]
    assert len([x for x in lines if x.startswith("| reinforce - grpo | pass@64 |")]) == 1
    # p = 0.03 for the first quarter and 0.04 for pass@64: 0.004 x 3 = 0.012, 0.03 x 2 = 0.06, then 0.04 x 1 but at
    # least 0.06: each below 0.05 alone, neither with the correction
    found[0] = found[0][:8] + (0.03, 0.0625)
    found[2], found[3] = (x[:8] + (0.04, 0.0625) for x in found[2:4])
    cell = {line.split(" | ")[0][2:]: line.split(" | ")[-1][:-2] for line in paired.claims({}, "toy")
            if line.startswith("| ")}
    assert cell["GRPO learns faster: train reward, reinforce - grpo"] == (
        "contradicted; with Holm's correction: train reward, first quarter: inconclusive; train reward (AUC): "
        "contradicted")
    assert cell["GRPO sits above PSR at large k: reinforce - grpo"] == (
        "reproduced; with Holm's correction: inconclusive")


# ---- the SmolLM2 float32 study's report: two-valued rows, the primary rows and Holm's correction

STRICT_50 = [-0.005, -0.02, -0.015, 0.0, 0.0, -0.35, 0.0, -0.005, 0.0, -0.815]  # reinforce - grpo, seeds 0-9


def test_the_float32_studys_two_valued_rows_name_both_tests():
    from results import stats
    from results.smollm2_float32 import report

    def run(strict):
        train = [{"step": i + 1, "reward_mean": 0.5, "entropy": 0.5, "kl": 0.1, "completion_len": 30.0,
                  "frac_zero_std": 0.5} for i in range(100)]
        return train, [{"step": s, "acc_lenient": 0.5, "acc_strict": strict if s == 50 else 0.2} for s in (0, 50, 100)]

    runs = {seed: {"grpo": run(-d), "reinforce": run(0.0)} for seed, d in enumerate(STRICT_50)}
    row = next(x for x in report.paired_table(runs, 100, [50, 100])
               if x.startswith("| held-out acc_strict, step 50")).split(" | ")
    # 6 seeds below 0, 4 tied; the sign-flip test counts the 2^6 patterns of the 6 non-zero seeds: 2 of 64 reach the
    # observed sum, p = 0.031; the t-interval includes 0
    assert row[4:6] == [f"{stats.t_test_p(STRICT_50):.3f}", "0.031"] and stats.t_test_p(STRICT_50) > 0.05
    assert row[7] == "0 / 6 (4 tied)"
    assert row[8] == "GRPO writes the `#### N` format, which the lenient reward does not pay for (< 0)"
    assert row[9] == "t-test: inconclusive; sign-flip: reproduced |"
    lenient = next(x for x in report.paired_table(runs, 100, [50, 100]) if x.startswith("| held-out acc_lenient, "
                                                                                        "step 100")).split(" | ")
    assert lenient[7] == "0 / 0 (10 tied)" and lenient[8] == "GRPO ends above REINFORCE (< 0)"


def test_the_float32_studys_holm_table_corrects_all_but_the_primary_rows():
    from results.smollm2_float32 import report
    # (name, claim, primary, difference, p of the t-test, p of the sign-flip test, uncorrected verdict)
    rows = [("auc", report.FASTER, "GRPO learns faster", 0.03, 0.2, 0.2, "inconclusive"),
            ("strict", report.FORMAT, None, -0.3, 0.02, 0.047, "reproduced"),
            ("kl", report.DRIFT, None, 0.3, 0.008, 0.002, "reproduced"),
            ("length", None, None, -9.9, 0.0005, 0.002, "no claim on its direction (interval excludes 0)"),
            ("var", report.LOWER, "GRPO's gradient has lower variance", 0.24, 0.27, 0.27, "inconclusive")]
    lines = report.holm_table(rows)
    got = {x.split(" | ")[0][2:]: x.split(" | ")[1:] for x in lines[2:]}
    assert [x.split(" | ")[0][2:] for x in lines[2:]] == ["auc", "var", "strict", "kl", "length"]  # primaries first
    assert got["auc"][2:] == ["0.200", "—", "0.200", "—", "inconclusive", "— (primary: not corrected) |"]
    # t-test: 0.0005 x 3, 0.008 x 2, 0.02 x 1 = 0.0015, 0.016, 0.02; sign-flip: 0.002 x 3 (twice: a tie) = 0.006, then
    # 0.047: 0.006, 0.006, 0.047
    assert got["strict"][2:6] == ["0.020", "0.020", "0.047", "0.047"]
    assert got["kl"][2:6] == ["0.008", "0.016", "0.002", "0.006"]
    assert got["length"][2:] == ["< 0.001", "0.002", "0.002", "0.006",
                                 "no claim on its direction (interval excludes 0)",
                                 "a difference (no claim on its direction) |"]
    assert got["strict"][0] == "one of 3" and got["strict"][-1] == "reproduced |"
    # t-test p 0.03 for both: 0.0005 x 3, then 0.03 x 2 = 0.06 for both (a tie); the sign-flip p's as before
    rows[1] = ("strict", report.FORMAT, None, -0.3, 0.03, 0.047, "reproduced")
    rows[2] = ("kl", report.DRIFT, None, 0.3, 0.03, 0.002, "reproduced")
    got = {x.split(" | ")[0][2:]: x.split(" | ")[1:] for x in report.holm_table(rows)[2:]}
    assert got["kl"][2:4] == ["0.030", "0.060"] and got["strict"][2:4] == ["0.030", "0.060"]
    assert got["kl"][-1] == got["strict"][-1] == "t-test: inconclusive; sign-flip: reproduced |"
    rows[1] = ("strict", report.FORMAT, None, -0.3, 0.03, 0.06, "t-test: reproduced; sign-flip: inconclusive")
    got = {x.split(" | ")[0][2:]: x.split(" | ")[1:] for x in report.holm_table(rows)[2:]}
    assert got["strict"][-2:] == ["t-test: reproduced; sign-flip: inconclusive", "inconclusive |"]


def test_the_float32_studys_variance_p_comes_from_the_intervals_resamples():
    from results.smollm2_float32 import report
    from results.variance.grad_variance import Gram, ratio_ci
    g = torch.randn(12, 30, generator=torch.Generator().manual_seed(1)) + torch.ones(30)
    d = {}
    for algo, x in (("grpo", g), ("reinforce", g[torch.randperm(12, generator=torch.Generator().manual_seed(2))]
                                  * torch.linspace(0.5, 1.5, 12)[:, None])):
        gram = Gram(12)
        for v in x:
            gram.add(v.clone())
        d[algo] = gram.summary()
    lo, hi = ratio_ci(d)[1]
    assert np.percentile(report.variance_resamples(d), [2.5, 97.5]) == pytest.approx([lo, hi], rel=1e-12)


def test_the_float32_studys_provenance_counts_the_recorded_attempts(tmp_path, monkeypatch):
    from results.smollm2_float32 import report
    attempt = {"commit": "c", "cpu": "Some CPU", "torch": "2"}
    with open(tmp_path / "runs.jsonl", "w") as f:
        for algo, n in (("grpo", 2), ("reinforce", 1)):
            f.write(json.dumps({"algo": algo, "lr": "1e-5", "seed": 0, "steps": 100, "cpu_s": 3600.0,
                                "wall_s": 7200.0, "attempts": [attempt] * n}) + "\n")
    monkeypatch.setattr(report, "HERE", str(tmp_path))
    lines = report.provenance({"grpo": "1e-5", "reinforce": "1e-5"}, 100, [0])
    assert lines[0].startswith("Runs used: 2 (2 with a line in runs.jsonl), 3 attempts recorded in runs.jsonl, a "
                               "lower bound: ")
    assert "CPU time: 2.00 CPU hours (wall 4.00 h), summed over the recorded attempts." in lines[0]
    assert "- CPU models (recorded attempts): Some CPU (3)" in lines
