"""Cheap pretrained policies for the many-seed GRPO study: a tiny GPT-2 taught the arith format by SFT.

The model: GPT-2 with 3 layers, width 128, 4 heads, 128 positions, random init from --seed, and a small
word-level tokenizer whose tokens are whole words and whole numbers, each with or without one leading space
(" 12", " apples", " =", "####", "\\n"), so a question is about 30 tokens and an answer about 9. Decoding
concatenates the tokens, so the text round-trips exactly (lower-cased); the EOS token is also the pad token.

The data: rows of grpo.make_arith, prompt = grpo.build_prompt(tokenizer, question) ("Question: ...\\nAnswer:",
the tokenizer has no chat template), target = " " + the row's answer ("7 + 5 = 12\\n#### 12") + EOS, loss on the
target tokens only. Training questions are drawn fresh each step from random.Random(seed + 1000); every
question of the held-out test sets of `grpo.py --dataset arith --seed 0..EXCLUDE_SEEDS-1` is left out, so the
greedy eval of those GRPO runs never sees a question this model was trained on (the arithmetic facts, a + b,
recur under other names: the space of questions is small).

Along the way it saves a checkpoint every --save-every steps (save_pretrained: loadable by
`python grpo.py --model DIR`) and measures each one's SAMPLED accuracy at temperature 1.0 (grpo.generate,
grpo.reward, lenient: the reward grpo.py trains on) on the held-out test questions of grpo.py seeds 0 and 1
(600 questions, one sample each, sampling seeded). It then copies the checkpoint closest to each --targets
accuracy to OUT/ckpt05 and OUT/ckpt30 and writes OUT/sft_log.jsonl (every checkpoint's accuracies) and
OUT/selection.json. Deterministic: no dropout, init from torch.manual_seed(seed), data from random.Random,
evaluation sampling under torch.random.fork_rng, one thread; the same seed gives the same weights (sha256 in
selection.json). Checkpoints are stored in float16 to keep them small (1.4 MB each); training runs in float32,
and every accuracy is measured on the stored float16 weights, loaded in float32 as grpo.py loads them.

The sampled accuracies (and so which step is closest to a target) depend on how grpo.generate draws its random
numbers, which a later change to the sampler changed; the weights at a given step do not. --pick NAME=STEP keeps
exactly those steps (and measures only them), and --expect FILE checks their sha256 against a selection.json: this
is how a remade policy is checked against the stored one in results/tiny_policy/ (fp32 kernels differ between CPU
families, so a remake matches only on a CPU like the one that made it).

Usage, from the repository root (about 10 minutes on one thread; with --pick about 3):
    OMP_NUM_THREADS=1 python -m results.tiny_policy.sft_tiny --seed 0 --out runs/tiny_policy_targets
    OMP_NUM_THREADS=1 python -m results.tiny_policy.sft_tiny --seed 0 --pick ckpt05=60 ckpt30=230 ckpt60=820 \
        --expect results/tiny_policy/picked.json --out runs/tiny_policy
"""
import argparse
import copy
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time

import torch

import grpo

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXCLUDE_SEEDS = 20  # grpo.py --seed 0..19: the seeds of the studies in results/tiny30/ and results/tiny60s/
SPLIT = r" ?[0-9]+| ?[a-z]+|####| ?[^\sa-z0-9]|\s"  # numbers, words, '####', whitespace, punctuation


def build_tokenizer():
    """Word-level tokenizer over everything make_arith can write, plus the numbers 0..199 for wrong answers."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    pieces = set()
    probe = type("NoTemplate", (), {"chat_template": None})()
    for row in grpo.make_arith(5000, random.Random(0)):
        text = grpo.build_prompt(probe, row["question"]) + " " + row["answer"]
        pieces.update(re.findall(SPLIT, text.lower()))
    pieces.update(f"{s}{n}" for n in range(200) for s in ("", " "))
    pieces.update(f"{s}{c}" for c in ".,?:+-*=$#" for s in ("", " "))
    pieces.update(w[1:] for w in list(pieces) if w.startswith(" ") and len(w) > 1)
    pieces.update([" ", "\n", "####"])
    vocab = {"<eos>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(sorted(pieces))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate: the spaces live inside the tokens
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>", pad_token="<eos>")


def build_model(vocab_size, seed, n_layer=3, n_embd=128, n_head=4, n_positions=128):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                                      n_head=n_head, bos_token_id=0, eos_token_id=0, pad_token_id=0,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def held_out(n_seeds):
    """The test questions of grpo.py --dataset arith --seed 0..n_seeds-1 (its load_data), in order, deduplicated."""
    rows = []
    seen = set()
    for s in range(n_seeds):
        for r in grpo.load_data("arith", s)[1]:
            if r["question"] not in seen:
                seen.add(r["question"])
                rows.append(r)
    return rows


def encode(tokenizer, rows):
    """Right-padded input ids, attention mask and labels (-100 on the prompt and the padding)."""
    seqs = []
    for r in rows:
        p = tokenizer(grpo.build_prompt(tokenizer, r["question"])).input_ids
        t = tokenizer(" " + r["answer"]).input_ids + [tokenizer.eos_token_id]
        seqs.append((p + t, [-100] * len(p) + t))
    n = max(len(s) for s, _ in seqs)
    ids = torch.tensor([s + [0] * (n - len(s)) for s, _ in seqs])
    labels = torch.tensor([lab + [-100] * (n - len(lab)) for _, lab in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s, _ in seqs])
    return ids, mask, labels


@torch.no_grad()
def accuracy(path, rows, seed, temperature, batch=200):
    """Lenient and strict accuracy of the saved model at `path`, loaded as grpo.py loads it, sampling with
    grpo.generate at `temperature` (0 = greedy) and up to 16 new tokens; the global RNG is restored after."""
    model, tokenizer = grpo.load_model(path, torch.device("cpu"))
    lenient = strict = 0
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        for start in range(0, len(rows), batch):
            chunk = rows[start:start + batch]
            out = grpo.generate(model, tokenizer, [grpo.build_prompt(tokenizer, r["question"]) for r in chunk],
                                16, temperature=temperature)
            for r, text in zip(chunk, grpo.decode_completions(tokenizer, out)):
                lenient += grpo.reward(text, r["ref"])
                strict += grpo.reward(text, r["ref"], strict=True)
    return lenient / len(rows), strict / len(rows)


def sha256_of(path):
    with open(os.path.join(path, "model.safetensors"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, default=0, help="model init and data order")
    p.add_argument("--steps", type=int, default=1200, help="SFT steps (stops early once all --targets are passed)")
    p.add_argument("--batch", type=int, default=32, help="questions per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW, constant after a linear warm-up over 20 steps")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint and measure every N steps")
    p.add_argument("--targets", type=float, nargs="+", default=[0.05, 0.30], help="sampled accuracies to pick")
    p.add_argument("--names", nargs="+", default=["ckpt05", "ckpt30"], help="folder names for the --targets")
    p.add_argument("--eval-seeds", type=int, default=2, help="held-out set: test questions of grpo seeds 0..N-1")
    p.add_argument("--work", default="/tmp/sft_tiny", help="where every checkpoint goes (deleted and remade)")
    p.add_argument("--pick", nargs="+", metavar="NAME=STEP", default=None,
                   help="keep the checkpoints of exactly these steps instead of the --targets")
    p.add_argument("--expect", default=None, help="a selection.json whose sha256 of each picked NAME must match")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "tiny_policy"))
    a = p.parse_args()
    picks = {name: int(step) for name, step in (x.split("=") for x in a.pick)} if a.pick else None
    if picks:
        a.steps = max(picks.values())
    torch.set_num_threads(1)
    t0 = time.time()
    cpu0 = time.process_time()

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), a.seed)
    excluded = {r["question"] for r in held_out(EXCLUDE_SEEDS)}
    evalset = held_out(a.eval_seeds)
    data_rng = random.Random(a.seed + 1000)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.out, exist_ok=True)
    log = []

    def checkpoint(step):
        path = os.path.join(a.work, f"step{step:05d}")
        copy.deepcopy(model).half().save_pretrained(path)  # float16 on disk (1.4 MB); grpo.py loads it as float32
        tokenizer.save_pretrained(path)
        sampled = accuracy(path, evalset, seed=12345, temperature=1.0)
        greedy = accuracy(path, evalset, seed=0, temperature=0)
        rec = {"step": step, "sampled_lenient": sampled[0], "sampled_strict": sampled[1],
               "greedy_lenient": greedy[0], "greedy_strict": greedy[1], "n_eval": len(evalset),
               "wall_s": round(time.time() - t0, 1)}
        log.append(rec)
        print(json.dumps(rec), flush=True)
        return rec

    checkpoint(0)
    model.train()
    for step in range(1, a.steps + 1):
        rows = []
        while len(rows) < a.batch:
            rows += [r for r in grpo.make_arith(a.batch, data_rng) if r["question"] not in excluded]
        ids, mask, labels = encode(tokenizer, rows[:a.batch])
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, step / 20)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step in picks.values()) if picks else step % a.save_every == 0:
            rec = checkpoint(step)
            rec["loss"] = loss.item()
            if not picks and rec["sampled_lenient"] > max(a.targets) + 0.1:
                break  # every target is behind us

    selection = {"seed": a.seed, "eval": f"sampled, T=1.0, lenient reward, {len(evalset)} held-out questions "
                                          f"(test sets of grpo.py --dataset arith --seed 0..{a.eval_seeds - 1})"}
    chosen = {name: (None, next(r for r in log if r["step"] == step)) for name, step in picks.items()} if picks else {
        name: (target, min(log, key=lambda r: (abs(r["sampled_lenient"] - target), r["step"])))
        for target, name in zip(a.targets, a.names)}
    for name, (target, best) in chosen.items():
        src = os.path.join(a.work, f"step{best['step']:05d}")
        dst = os.path.join(a.out, name)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        # the pick's own estimate is biased toward the target (it was chosen for being close): measure it again,
        # with fresh samples, 4 per question
        fresh = accuracy(dst, evalset * 4, seed=999, temperature=1.0)
        selection[name] = {**best, "target": target, "fresh_sampled_lenient": fresh[0],
                           "fresh_sampled_strict": fresh[1], "fresh_n": 4 * len(evalset), "sha256": sha256_of(dst)}
    selection["wall_s"] = round(time.time() - t0, 1)
    selection["cpu_s"] = round(time.process_time() - cpu0, 1)
    with open(os.path.join(a.out, "sft_log.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in log)
    with open(os.path.join(a.out, "selection.json"), "w") as f:
        json.dump(selection, f, indent=1)
    print(json.dumps(selection, indent=1))
    if a.expect:
        with open(a.expect) as f:
            expected = json.load(f)
        for name in chosen:
            if selection[name]["sha256"] != expected[name]["sha256"]:
                sys.exit(f"error: {name} (step {selection[name]['step']}) has sha256 {selection[name]['sha256']}, "
                         f"{a.expect} says {expected[name]['sha256']}: another torch version or code made other "
                         "weights; the study's numbers were measured on the expected ones")
        print(f"sha256 of {', '.join(chosen)} as in {a.expect}")


if __name__ == "__main__":
    main()
