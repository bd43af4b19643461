"""What the tests, bench/ and results/ share: a tiny model with a character-level tokenizer, GSM8K-format data
written to a folder, and a task's rows. Nothing here downloads; everything is made from a seed."""
import json
import os

import torch

CHARS = "0123456789abcdefghijklmnopqrstuvwxyz ?.:#+-*=,$\n"


def make_tiny_model(path, seed=0, n_layer=2, n_embd=32, dropout=0.0, generation_extra=None, eos=True, arch="gpt2",
                    bos=False):
    """A tiny randomly initialized model with a character-level tokenizer, saved to `path`. arch "gpt2" has learned
    absolute positions; "llama" and "qwen2" (the families of SmolLM2 and Qwen2.5) have rotary positions and
    grouped-query attention, so left padding and the KV cache go through other code in transformers; "gemma3" adds
    sliding-window attention on every other layer, with a window of 4 tokens, shorter than any prompt here. bos: as
    Llama 3 and Gemma ship, a <bos> token that the tokenizer adds before every text and a chat template that writes
    it itself."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM)
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    if bos:
        vocab["<bos>"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<bos> $A",
                                                           special_tokens=[("<bos>", vocab["<bos>"])])
    # pad = EOS, as load_model sets it; said here too because Qwen2's tokenizer class would add a pad token of its own
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>" if eos else None, unk_token="<unk>",
                                        pad_token="<eos>" if eos else None, **({"bos_token": "<bos>"} if bos else {}))
    if bos:
        tokenizer.chat_template = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                   "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")
    torch.manual_seed(seed)
    eos_id = 0 if eos else None  # GPT2Config's own default is 50256, so "no EOS" must be said explicitly
    if arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=256, n_embd=n_embd, n_layer=n_layer,
                                           n_head=2, bos_token_id=eos_id, eos_token_id=eos_id, resid_pdrop=dropout,
                                           embd_pdrop=dropout, attn_pdrop=dropout))
    elif arch == "gemma3":  # sliding-window attention on the first layer, a window shorter than the prompts
        model = Gemma3ForCausalLM(Gemma3TextConfig(
            vocab_size=len(vocab), max_position_embeddings=256, hidden_size=n_embd, intermediate_size=2 * n_embd,
            num_hidden_layers=n_layer, num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
            layer_types=(["sliding_attention", "full_attention"] * n_layer)[:n_layer],
            bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, attention_dropout=dropout,
            tie_word_embeddings=True))
    else:
        classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
        config_class, model_class = classes[arch]
        model = model_class(config_class(vocab_size=len(vocab), max_position_embeddings=256, hidden_size=n_embd,
                                         intermediate_size=2 * n_embd, num_hidden_layers=n_layer, num_attention_heads=4,
                                         num_key_value_heads=2, bos_token_id=eos_id, eos_token_id=eos_id,
                                         attention_dropout=dropout, tie_word_embeddings=True))
    for key, value in (generation_extra or {}).items():
        setattr(model.generation_config, key, value)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def write_data(path, train, test):
    os.makedirs(path, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(os.path.join(path, f"{name}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def sums(n, offset=0):
    rows = []
    for i in range(n):
        a, b = (i + offset) % 7, (3 * i + offset) % 5
        rows.append({"question": f"what is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"})
    return rows


def plain_logprobs(model, batch, temperature):
    """log softmax(logits / T)[token] of each completion token of a grpo.generate-style batch, from a plain forward
    pass of each row alone (its prompt without the left padding, then its completion): no grpo code, no padding, no
    cache. Positions after an answer's end hold the log-probs of the pad tokens there."""
    rows = []
    for i, ids in enumerate(batch["completion_ids"]):
        p = batch["prompt_index"][i]
        prompt = batch["prompt_ids"][p][batch["prompt_mask"][p].bool()]
        logits = model(input_ids=torch.cat([prompt, ids])[None]).logits[0, len(prompt) - 1:-1].float()
        rows.append(torch.log_softmax(logits / temperature, -1).gather(-1, ids[:, None]).squeeze(-1))
    return torch.stack(rows)


def make_batch(tokenizer, prompts, completions, G=1, temperature=1.0):
    """A batch as grpo.generate returns it, from texts: the prompts left-padded, G rows a prompt, each completion
    (text, one per row) tokenized and padded on the right with a mask of ones over its tokens, sampled at
    `temperature`."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    ids = [tokenizer(text, add_special_tokens=False).input_ids for text in completions]
    width = max(map(len, ids))
    return {"prompt_ids": enc.input_ids, "prompt_mask": enc.attention_mask,
            "prompt_index": torch.arange(len(prompts)).repeat_interleave(G), "temperature": temperature,
            "completion_ids": torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids]),
            "completion_mask": torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])}


def counting_rows(spec, seed):
    """A task's load for tests: "Say i." answered by i, 6 rows to train on and 2 to test."""
    rows = [{"question": f"Say {i}.", "answer": str(i), "ref": str(i)} for i in range(8)]
    return rows[2:], rows[:2]
