"""The training half of bench/gpu_check.sh: 10 GRPO steps of a randomly initialised model of Qwen2.5-0.5B-Instruct's
shape on GSM8K, run in this process with grpo.train(), so the peak GPU memory can be read afterwards.

No network and no downloads: the model's config is Qwen2.5-0.5B-Instruct's published one, typed in below; its
weights are random; its tokenizer is a byte-level BPE with Qwen2's pre-tokenizer, trained here on the GSM8K files
(16,000 tokens: prompts come out about as long as with Qwen's), with Qwen's chat template and <|im_end|> as EOS,
then filled up with unused tokens to Qwen2.5's 151,936 embedding rows, so the embedding, the output layer and the
B*G x T x V logits cost what they cost with the real model. A random model almost never draws EOS: every
completion runs to --max-new-tokens, the worst case for time and memory. Rewards come out (nearly) all 0, as
expected.

Reports seconds per step, the sampling share (gen_s / step_s from metrics.jsonl), and the peak GPU memory
(torch.cuda.max_memory_allocated), and exits 1 unless every number in metrics.jsonl is finite and all steps ran.

    python bench/gpu_check.py --device cuda --data shared_data/gsm8k       # the GPU run (gpu_check.sh calls this)
    python bench/gpu_check.py --device cpu --tiny --data ../shared/gsm8k   # the same path on CPU, tiny model, 2 steps
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QWEN25_05B = {  # Qwen/Qwen2.5-0.5B-Instruct config.json (architectures: Qwen2ForCausalLM)
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_act": "silu", "initializer_range": 0.02, "use_sliding_window": False, "sliding_window": 32768,
    "max_window_layers": 21, "attention_dropout": 0.0, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}
QWEN25_VOCAB = 151936  # rows of Qwen2.5's embedding matrix
TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # pad, chat turn start, EOS: Qwen2.5's
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Qwen2's pre-tokenizer split: letters with one leading non-letter, each digit alone, punctuation runs, spaces
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
               r"\s+(?!\S)|\s+")


def build_tokenizer(data_dir, trained_size, vocab_size=None):
    """A byte-level BPE tokenizer with Qwen2's pipeline (so transformers' Qwen2Tokenizer, which AutoTokenizer picks
    for a qwen2 model folder, reads it as it is), trained here on the GSM8K files to trained_size tokens, then
    filled with unused tokens up to vocab_size if given."""
    import grpo
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    texts = [grpo.INSTRUCTION, "user\nassistant\n"]
    for split in ("train", "test"):
        with open(os.path.join(data_dir, f"{split}.jsonl"), encoding="utf-8") as f:
            texts += [v for line in f if line.strip() for v in json.loads(line).values() if isinstance(v, str)]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=trained_size, special_tokens=SPECIAL,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    if vocab_size:
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        for i in range(len(vocab), vocab_size):  # in the vocabulary but in no merge: never produced by encoding
            vocab[f"<|unused_{letters(i)}|>"] = i  # no digits in them, so a sampled filler never reads as a number
        tok = Tokenizer.from_str(json.dumps(spec))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def letters(i):
    out = ""
    while True:
        i, r = divmod(i, 26)
        out = chr(97 + r) + out
        if i == 0:
            return out


def build_model(path, tokenizer, shape, device):
    """Qwen2ForCausalLM with `shape`, random weights (seed 0), the tokenizer's vocabulary; saved to path."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=None, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, **shape)
    assert config.rope_parameters["rope_theta"] == 1e6, config.rope_parameters
    torch.manual_seed(0)
    with torch.device(device):  # initialising 0.5B weights on the GPU takes a second, on one CPU core a minute
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    del model
    return n_params


def nonfinite(value, where):
    """Every number in value (nested dicts and lists) that is NaN or infinite, as 'where: value'."""
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in nonfinite(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in nonfinite(v, f"{where}[{i}]")]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: {value}"]
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--data", default="shared_data/gsm8k", help="folder with GSM8K's train.jsonl and test.jsonl")
    p.add_argument("--tiny", action="store_true", help="a 2-layer Qwen2 model with a 2,000-token vocabulary and 2 "
                   "steps: the same code path in a minute, for a check on CPU")
    p.add_argument("--steps", type=int, default=None, help="default: 10, or 2 with --tiny")
    p.add_argument("--dtype", default="auto", help="grpo.py --dtype")
    p.add_argument("--keep", default=None, help="copy metrics.jsonl and summary.json to this folder")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never wait for a network
    import torch
    import grpo
    steps = a.steps or (2 if a.tiny else 10)
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no GPU")
    work = tempfile.mkdtemp(prefix="gpu-check-")
    summary = {"device": a.device, "tiny": a.tiny, "steps": steps, "torch": torch.__version__}
    try:
        t0 = time.time()
        tokenizer = build_tokenizer(a.data, 2000 if a.tiny else 16000, None if a.tiny else QWEN25_VOCAB)
        shape = TINY if a.tiny else QWEN25_05B
        summary["n_params"] = build_model(os.path.join(work, "model"), tokenizer, shape, a.device)
        summary.update(vocab_size=len(tokenizer), build_s=round(time.time() - t0, 1))
        print(f"model: Qwen2 {'tiny' if a.tiny else 'Qwen2.5-0.5B shape'}, random weights, "
              f"{summary['n_params'] / 1e6:.1f}M parameters, vocabulary {len(tokenizer)} ({summary['build_s']} s)")
        flags = ["--model", os.path.join(work, "model"), "--dataset", a.data, "--device", a.device,
                 "--steps", str(steps), "--batch-prompts", "4", "--G", "8", "--max-new-tokens", "256",
                 "--eval-every", "0", "--eval-n", "32", "--seed", "0", "--out", os.path.join(work, "run")]
        try:
            grpo.get_args(["--dtype", "float32"])
            flags += ["--dtype", a.dtype]
        except grpo.ConfigError:
            print(f"note: this grpo.py has no --dtype flag; running without --dtype {a.dtype}")
        print("python grpo.py " + " ".join(flags), flush=True)
        if cuda:
            torch.cuda.empty_cache()  # the model built above is gone: count only what grpo.train holds
            torch.cuda.reset_peak_memory_stats(a.device)
        t0 = time.time()
        try:
            grpo.train(grpo.get_args(flags), grpo.GSM8K)
        except grpo.ConfigError as e:
            raise SystemExit(f"error: {e}") from None
        except grpo.Stopped as e:  # e.g. too many non-finite updates in a row: report what metrics.jsonl holds
            print(e, file=sys.stderr)
        summary["train_wall_s"] = round(time.time() - t0, 1)
        if cuda:
            summary.update(peak_gpu_allocated_gib=round(torch.cuda.max_memory_allocated(a.device) / 2**30, 2),
                           peak_gpu_reserved_gib=round(torch.cuda.max_memory_reserved(a.device) / 2**30, 2),
                           gpu=torch.cuda.get_device_name(a.device),
                           gpu_total_gib=round(torch.cuda.get_device_properties(a.device).total_memory / 2**30, 1))
        return report(os.path.join(work, "run", "metrics.jsonl"), steps, summary, a.keep)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(path, steps, summary, keep):
    with open(path) as f:
        records = [json.loads(line, parse_constant=float) for line in f]  # NaN and Infinity read as floats
    train = [r for r in records if r["type"] == "train"]
    later = train[1:] or train  # the first step also pays for warming up the kernels
    summary.update(
        dtype=records[0].get("dtype", "(no --dtype)"), steps_done=len(train),
        first_step_s=round(train[0]["step_s"], 2) if train else None,
        median_step_s=round(statistics.median(r["step_s"] for r in later), 2) if train else None,
        sampling_share=round(statistics.median(r["gen_s"] / r["step_s"] for r in later), 3) if train else None,
        completion_len=statistics.mean(r["completion_len"] for r in train) if train else None,
        reward_mean=statistics.mean(r["reward_mean"] for r in train) if train else None,
        eval_acc=[r["acc_lenient"] for r in records if r["type"] == "eval"],
        nonfinite=[x for r in records for x in nonfinite(r, f"{r['type']} step {r.get('step', '-')}")])
    print(json.dumps(summary, indent=1))
    if keep:
        os.makedirs(keep, exist_ok=True)
        shutil.copy(path, keep)
        with open(os.path.join(keep, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)
    problems = summary["nonfinite"] + ([f"{len(train)} of {steps} steps ran"] if len(train) != steps else [])
    if problems:
        print("FAILED: " + "; ".join(problems[:20]), file=sys.stderr)
        return 1
    print(f"ok: {steps} steps, {summary['median_step_s']} s/step (first {summary['first_step_s']} s), sampling "
          f"{summary['sampling_share']:.0%} of a step" + (f", peak GPU memory {summary['peak_gpu_allocated_gib']} GiB "
          f"allocated, {summary['peak_gpu_reserved_gib']} GiB reserved" if "peak_gpu_allocated_gib" in summary else "")
          + "; every metric finite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
