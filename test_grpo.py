"""Tests for grpo.py: CPU only, no network. Tiny models are built from a config with a character-level
tokenizer made here; data files are written by the tests. Run: python -m pytest -q test_grpo.py"""

import copy
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import grpo

HERE = os.path.dirname(os.path.abspath(__file__))
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz ?.:#+-*=,$\n"


# ------------------------------------------------------------------ fixtures: a tiny model, tiny data

def make_tiny_model(path, seed=0, n_layer=2, n_embd=32, dropout=0.0, generation_extra=None):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one token per character
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(vocab), n_positions=256, n_embd=n_embd, n_layer=n_layer, n_head=2,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    model = GPT2LMHeadModel(config)
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


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    model, tokenizer, eos_ids = grpo.load_model(tiny_dir, torch.device("cpu"))
    return model, tokenizer, eos_ids


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data"), sums(40), sums(10, offset=100))


def run_cli(*flags, env=None, timeout=600):
    return subprocess.run([sys.executable, os.path.join(HERE, "grpo.py"), *flags], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def args_for(**overrides):
    args = grpo.get_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


# ------------------------------------------------------------------ advantages

def test_advantages_hand_computed():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    adv = grpo.group_advantages(r, G=4, algo="grpo")
    # group 1: mean 1/4, sample std sqrt((3/4)^2 + 3*(1/4)^2)/3) = 1/2
    # group 2: mean 1/2, sample std sqrt(4 * (1/2)^2 / 3) = 1/sqrt(3)
    s2 = 1 / math.sqrt(3) + 1e-4
    expected = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0.5 / s2, 0.5 / s2, -0.5 / s2, -0.5 / s2]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_advantages_all_equal_group_is_zero_not_nan():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    for algo in ("grpo", "drgrpo"):
        adv = grpo.group_advantages(r, G=3, algo=algo)
        assert torch.isfinite(adv).all()
        assert adv.tolist() == [0.0] * 6


def test_advantages_reinforce_and_drgrpo():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert grpo.group_advantages(r, G=3, algo="reinforce").tolist() == r.tolist()
    dr = grpo.group_advantages(r, G=3, algo="drgrpo")
    assert dr.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])


def test_advantages_shape_for_B_times_G():
    B, G = 3, 5
    r = torch.randint(0, 2, (B * G,)).float()
    r[:G] = torch.tensor([1.0, 0, 0, 0, 1])  # at least one group with signal
    adv = grpo.group_advantages(r, G=G)
    assert adv.shape == (B * G,)
    assert adv.view(B, G).mean(1).abs().max() < 1e-6  # every group is centred on its own mean
    mixed = r.view(B, G).std(1) > 0
    assert torch.allclose(adv.view(B, G)[mixed].std(1), torch.ones(int(mixed.sum())), atol=1e-3)


# ------------------------------------------------------------------ reward

@pytest.mark.parametrize("text, strict, expected", [
    ("so the total is\n#### 1,234", False, "1234"),
    ("#### $18.", False, "18"),
    ("She pays $18.", False, "18"),
    ("The change is -5 degrees.\n#### -5", False, "-5"),
    ("#### 2.5", False, "2.5"),
    ("#### 7\nwait, no\n#### 8", False, "8"),       # the last #### wins
    ("#### 7 apples and 3 pears", False, "7"),      # the first number after the last ####
    ("I think 3 then 4", False, "4"),               # lenient: last number in the text
    ("I think 3 then 4", True, None),               # strict: needs ####
    ("no number at all", False, None),
    ("no number at all", True, None),
    ("####", False, None),
    ("total 10 #### none", False, "10"),            # nothing after ####: lenient falls back
    ("total 10 #### none", True, None),
    ("#### -1,000,000", True, "-1000000"),
])
def test_extract_answer(text, strict, expected):
    assert grpo.extract_answer(text, strict=strict) == expected


@pytest.mark.parametrize("completion, ref, expected", [
    ("#### 18.0", "18", 1.0), ("#### 18", "18.00", 1.0), ("#### 18.5", "18", 0.0), ("#### -18", "18", 0.0),
    ("#### 1,234", "1234", 1.0), ("nothing", "3", 0.0), ("#### 0", "-0", 1.0),
])
def test_reward_numeric_comparison(completion, ref, expected):
    assert grpo.reward(completion, ref) == expected


def test_reward_strict_vs_lenient():
    assert grpo.reward("the answer is 42", "42") == 1.0
    assert grpo.reward("the answer is 42", "42", strict=True) == 0.0


# ------------------------------------------------------------------ masks and log-probs

def test_completion_mask_includes_first_eos_only():
    ids = torch.tensor([[5, 6, 0, 7, 0], [5, 6, 7, 8, 9], [0, 3, 3, 3, 3], [4, 9, 4, 4, 9]])
    expected = [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert grpo.completion_mask(ids[:3], [0]).tolist() == expected[:3]
    assert grpo.completion_mask(ids, [0, 9]).tolist() == expected  # several EOS ids (Qwen has two)


def test_left_padding_does_not_change_logprobs(tiny):
    model, tokenizer, _ = tiny
    prompts = ["question: what is 1 + 2?\nanswer:", "q: 9?", "question: a much longer prompt with many characters: 3 * 4?"]
    completion = tokenizer(" 3 = 3", add_special_tokens=False, return_tensors="pt").input_ids[0]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    assert (enc.attention_mask == 0).any(), "the test needs left padding"
    T = len(completion)
    ids = torch.cat([enc.input_ids, completion.expand(len(prompts), T)], 1)
    attn = torch.cat([enc.attention_mask, torch.ones(len(prompts), T, dtype=torch.long)], 1)
    with torch.no_grad():
        batched = grpo.completion_logprobs(model, ids, attn, T, temperature=0.7)
        for i, p in enumerate(prompts):
            alone_ids = torch.cat([tokenizer(p, return_tensors="pt").input_ids[0], completion])[None]
            alone = grpo.completion_logprobs(model, alone_ids, torch.ones_like(alone_ids), T, temperature=0.7)
            torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=0)


def test_logprobs_match_log_softmax_at_temperature(tiny):
    model, tokenizer, _ = tiny
    ids = tokenizer(["question: 1 + 1?\nanswer: 2"], return_tensors="pt").input_ids
    T, temp = 4, 0.6
    with torch.no_grad():
        got = grpo.completion_logprobs(model, ids, torch.ones_like(ids), T, temperature=temp)
        logits = model(ids).logits[0]
    ref = torch.log_softmax(logits / temp, -1)[-T - 1:-1].gather(-1, ids[0, -T:, None]).squeeze(-1)
    torch.testing.assert_close(got[0], ref, atol=1e-5, rtol=0)


def test_generate_masks_and_truncation(tiny):
    model, tokenizer, eos_ids = tiny
    torch.manual_seed(0)
    out = grpo.generate(model, tokenizer, ["question: 1 + 1?\nanswer:", "q?"], eos_ids, max_new_tokens=12,
                        repeat=3, temperature=1.0)
    assert out["input_ids"].shape[0] == 6
    assert out["attention_mask"].shape == out["input_ids"].shape
    assert (out["input_ids"][:, -out["completion_ids"].shape[1]:] == out["completion_ids"]).all()
    has_eos = torch.isin(out["completion_ids"], torch.tensor(eos_ids)).any(1)
    assert (out["truncated"] == ~has_eos).all()
    lengths = out["completion_mask"].sum(1)
    for row, n in zip(out["completion_ids"], lengths):  # the EOS is the last kept token, when there is one
        if (row == 0).any():
            assert row[n - 1] == 0 and (row[:n - 1] != 0).all()
        else:
            assert n == 12


@pytest.mark.parametrize("temperature", [None, 0.8])
def test_generate_matches_transformers_generate(tiny, temperature):
    """Same seed, same tokens as model.generate: the shared prompt pass, the cache, positions, padding after EOS and
    the sampled distribution (softmax(logits / T), nothing else) all agree with transformers' implementation."""
    model, tokenizer, eos_ids = tiny
    prompts = ["question: 1 + 1?\nanswer:", "q?", "question: what is 3 * 4?\nanswer:"]
    torch.manual_seed(0)
    out = grpo.generate(model, tokenizer, prompts, eos_ids, max_new_tokens=40, repeat=2, temperature=temperature)
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    torch.manual_seed(0)
    with torch.no_grad():
        expected = model.generate(input_ids=enc.input_ids.repeat_interleave(2, 0), max_new_tokens=40,
                                  attention_mask=enc.attention_mask.repeat_interleave(2, 0), **sampling)
    assert torch.equal(out["input_ids"], expected)
    if temperature:  # measured with seed 0: five answers stop at an EOS (then padding), one runs to the limit
        assert out["truncated"].any() and not out["truncated"].all()


def test_shipped_sampling_defaults_are_replaced(tmp_path):
    path = make_tiny_model(tmp_path / "m", generation_extra={"do_sample": True, "top_k": 3, "top_p": 0.5, "repetition_penalty": 1.5})
    model, _, _ = grpo.load_model(path, torch.device("cpu"))
    g = model.generation_config
    assert g.top_k != 3 and g.top_p != 0.5 and g.repetition_penalty != 1.5


def test_dropout_is_disabled(tmp_path):
    path = make_tiny_model(tmp_path / "m", dropout=0.5)
    model, tokenizer, _ = grpo.load_model(path, torch.device("cpu"))
    ids = tokenizer(["question: 2 + 2?\nanswer: 4"], return_tensors="pt").input_ids
    model.train()
    a = grpo.completion_logprobs(model, ids, torch.ones_like(ids), 5, 1.0)
    b = grpo.completion_logprobs(model, ids, torch.ones_like(ids), 5, 1.0)
    model.eval()
    c = grpo.completion_logprobs(model, ids, torch.ones_like(ids), 5, 1.0)
    assert torch.equal(a, b) and torch.allclose(a, c, atol=1e-6)


# ------------------------------------------------------------------ loss

def rollout(model, tokenizer, eos_ids, seed=0, G=4):
    torch.manual_seed(seed)
    return grpo.generate(model, tokenizer, ["question: 1 + 2?\nanswer:", "q: 3 * 3?"], eos_ids, max_new_tokens=10,
                         repeat=G, temperature=1.0)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_shared_prompt_pass_equals_whole_rows(tiny):
    """Log-probs and gradients are the same whether a group's prompt is run once (and its cache shared) or per row."""
    model, tokenizer, eos_ids = tiny
    batch = rollout(model, tokenizer, eos_ids, seed=3)
    assert (batch["attention_mask"] == 0).any(), "the test needs left padding"
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0, 0.0, 1.5, -1.0, 0.5])
    T = batch["completion_mask"].shape[1]
    result = {}
    for share in (True, False):
        model.zero_grad()
        logp = grpo.completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, 0.7, share_prompts=share)
        (adv[:, None] * logp * batch["completion_mask"]).sum().backward()
        result[share] = logp.detach(), grads(model)
    torch.testing.assert_close(result[True][0], result[False][0], atol=1e-5, rtol=0)
    for a, b in zip(result[True][1], result[False][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_gradient_equals_policy_gradient_formula(tiny):
    """ratio = 1, beta = 0: the gradient is that of -mean_i adv_i * mean_t log pi(o_it)."""
    model, tokenizer, eos_ids = tiny
    batch = rollout(model, tokenizer, eos_ids)
    mask = batch["completion_mask"].float()
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0, 0.0, 1.5, -1.0, 0.5])
    T = mask.shape[1]

    model.zero_grad()
    logp = grpo.completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, 1.0)
    loss, _ = grpo.grpo_loss(logp, logp.detach(), None, adv, mask, clip_eps=0.2, beta=0.0)
    loss.backward()
    got = grads(model)

    model.zero_grad()  # independent formula: a plain loop over sequences
    logp = grpo.completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, 1.0)
    total = sum(adv[i] * logp[i][mask[i].bool()].mean() for i in range(len(adv)))
    (-total / len(adv)).backward()
    for g, w in zip(got, grads(model)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in got)


def test_clipped_tokens_get_zero_gradient():
    eps = 0.2
    old = torch.zeros(4, 3)
    # token 0: ratio 1.5 > 1 + eps; token 1: ratio 0.5 < 1 - eps; token 2: ratio 1.1, inside
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1])).repeat(4, 1).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4, 3)
    loss, stats = grpo.grpo_loss(logp, old, None, adv, mask, clip_eps=eps, beta=0.0)
    loss.backward()
    g = logp.grad
    assert g[0, 0] == 0 and g[2, 0] == 0          # ratio above 1+eps with adv > 0: clipped
    assert g[1, 1] == 0 and g[3, 1] == 0          # ratio below 1-eps with adv < 0: clipped
    assert g[1, 0] != 0 and g[0, 1] != 0          # the other side of each bound is not clipped (pessimistic min)
    assert (g[:, 2] != 0).all()                   # inside the range every token has a gradient
    # unclipped token gradient by hand: d/dlogp [-(1/4)(1/3) ratio * adv] = -ratio * adv / 12
    assert g[0, 2].item() == pytest.approx(-1.1 / 12, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(4 / 12)


def test_kl_zero_when_policy_equals_reference(tiny):
    model, tokenizer, eos_ids = tiny
    batch = rollout(model, tokenizer, eos_ids)
    ref = copy.deepcopy(model)
    T = batch["completion_mask"].shape[1]
    model.zero_grad()
    logp = grpo.completion_logprobs(model, batch["input_ids"], batch["attention_mask"], T, 1.0)
    with torch.no_grad():
        ref_logp = grpo.completion_logprobs(ref, batch["input_ids"], batch["attention_mask"], T, 1.0)
    loss, stats = grpo.grpo_loss(logp, logp.detach(), ref_logp, torch.zeros(8), batch["completion_mask"], beta=1.0)
    loss.backward()
    assert stats["kl"] == 0.0 and loss.item() == 0.0
    assert all(p.grad.abs().max() == 0 for p in model.parameters())


def test_k3_nonnegative_and_unbiased():
    torch.manual_seed(0)
    a, b = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (grpo.k3_kl(a, b) >= 0).all()
    assert grpo.k3_kl(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))).item() == pytest.approx(
        0.5 - math.log(0.5) - 1)
    # E_{x ~ p}[k3] = KL(p || q) exactly, computed by enumeration over a categorical distribution
    p, q = torch.softmax(torch.randn(7), 0), torch.softmax(torch.randn(7), 0)
    expected = (p * (p.log() - q.log())).sum()
    assert (p * grpo.k3_kl(p.log(), q.log())).sum().item() == pytest.approx(expected.item(), rel=1e-5)


def test_aggregate_by_hand():
    loss_t = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert grpo.aggregate(loss_t, mask, "seq", 2, 4, 3).item() == pytest.approx((2.0 + 4.0) / 2)
    assert grpo.aggregate(loss_t, mask, "token", 2, 4, 3).item() == pytest.approx(10.0 / 4)
    assert grpo.aggregate(loss_t, mask, "const", 2, 4, 3).item() == pytest.approx(10.0 / 6)


@pytest.mark.parametrize("loss_agg", ["seq", "token", "const"])
def test_micro_batching_equals_full_batch(tiny, loss_agg):
    model, tokenizer, eos_ids = tiny
    batch = rollout(model, tokenizer, eos_ids, seed=1)
    assert batch["completion_mask"].sum(1).unique().numel() > 1, "needs completions of different lengths"
    ref = copy.deepcopy(model)
    with torch.no_grad():  # move the reference away so the KL term has a gradient too
        for p in ref.parameters():
            p.add_(0.01 * torch.randn_like(p))
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    result = {}
    for micro in (8, 2):
        args = args_for(micro_batch=micro, loss_agg=loss_agg, beta=0.1, temperature=1.0, max_new_tokens=10)
        model.zero_grad()
        stats = grpo.accumulate_gradients(model, ref, batch, adv, args, cache={})
        result[micro] = (grads(model), stats)
    for g8, g2 in zip(result[8][0], result[2][0]):
        torch.testing.assert_close(g8, g2, atol=1e-6, rtol=1e-5)
    assert result[8][1]["loss"] == pytest.approx(result[2][1]["loss"], abs=1e-6)
    assert result[8][1]["kl"] == pytest.approx(result[2][1]["kl"], rel=1e-5)


def test_mu_passes_reuse_old_logprobs(tiny):
    """With mu > 1 the later passes see ratio != 1 against the cached sampling log-probs."""
    model, tokenizer, eos_ids = tiny
    model = copy.deepcopy(model)
    batch = rollout(model, tokenizer, eos_ids, seed=2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    args = args_for(micro_batch=4, beta=0.0, temperature=1.0, max_new_tokens=10, mu=3, clip_eps=0.01, lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    cache = {}
    clip_fracs = []
    for _ in range(args.mu):
        opt.zero_grad()
        clip_fracs.append(grpo.accumulate_gradients(model, None, batch, adv, args, cache)["clip_frac"])
        opt.step()
    assert clip_fracs[0] == 0.0 and clip_fracs[-1] > 0.0
    assert sorted(cache) == [0, 1]


# ------------------------------------------------------------------ end to end

@pytest.mark.parametrize("algo", ["grpo", "reinforce"])
def test_cli_end_to_end(tiny_dir, data_dir, tmp_path, algo):
    out = tmp_path / "run"
    r = run_cli("--model", tiny_dir, "--dataset", data_dir, "--algo", algo, "--G", "4", "--batch-prompts", "2",
                "--steps", "2", "--max-new-tokens", "8", "--micro-batch", "4", "--eval-every", "1", "--eval-n", "4",
                "--lr", "1e-3", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert lines[0]["type"] == "config" and lines[0]["algo"] == algo and lines[0]["G"] == 4
    train = [x for x in lines if x["type"] == "train"]
    evals = [x for x in lines if x["type"] == "eval"]
    assert [x["step"] for x in train] == [1, 2] and [x["step"] for x in evals] == [0, 1, 2]
    for x in train:
        for key in ("reward_mean", "reward_std", "frac_zero_std", "completion_len", "trunc_rate", "kl",
                    "clip_frac", "loss", "grad_norm", "lr", "step_s", "gen_tok_per_s"):
            assert math.isfinite(x[key]), key
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    original = AutoModelForCausalLM.from_pretrained(tiny_dir)
    changed = any(not torch.equal(a, b) for a, b in zip(saved.parameters(), original.parameters()))
    assert changed, "two steps at lr 1e-3 must move the weights"


def test_grpo_learns_toy_task(tiny_dir, tmp_path):
    """Every answer is 7. The untrained model says 7 by chance now and then; GRPO must make it say 7."""
    rows = [{"question": f"what is {i}?", "answer": "#### 7"} for i in range(30)]
    data = write_data(tmp_path / "d", rows, rows[:8])
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "8", "--batch-prompts", "4",
                              "--steps", "60", "--max-new-tokens", "3", "--micro-batch", "32", "--lr", "1e-2",
                              "--beta", "0.0", "--eval-every", "0", "--eval-n", "8", "--out", str(out), "--seed", "0"]))
    rewards = [x["reward_mean"] for x in map(json.loads, open(out / "metrics.jsonl")) if x["type"] == "train"]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert start < 0.2 and end > start + 0.3, (start, end)  # measured: start 0.05-0.07, end 0.5-1.0 (seeds 0-2)


def test_smollm2_one_step_offline(tmp_path):
    out = tmp_path / "run"
    r = run_cli("--model", "smollm2", "--dataset", "arith", "--G", "2", "--batch-prompts", "1", "--steps", "1",
                "--max-new-tokens", "4", "--micro-batch", "2", "--eval-n", "1", "--eval-every", "0",
                "--out", str(out), env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    train = [x for x in map(json.loads, open(out / "metrics.jsonl")) if x["type"] == "train"]
    assert len(train) == 1 and math.isfinite(train[0]["loss"])


# ------------------------------------------------------------------ bad input: one line, exit 2, nothing written

def assert_one_line_error(r, *words):
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


def test_bad_input(tiny_dir, data_dir, tmp_path):
    out = tmp_path / "out"
    base = ["--model", tiny_dir, "--steps", "1", "--out", str(out)]
    assert_one_line_error(run_cli(*base, "--dataset", str(tmp_path / "nope")), "nope")
    os.makedirs(tmp_path / "half")
    write_data(tmp_path / "half", sums(3), sums(3))
    os.remove(tmp_path / "half" / "test.jsonl")
    assert_one_line_error(run_cli(*base, "--dataset", str(tmp_path / "half")), "test.jsonl")
    bad = write_data(tmp_path / "bad", sums(3), sums(3))
    with open(os.path.join(bad, "train.jsonl"), "a") as f:
        f.write("{not json\n")
    assert_one_line_error(run_cli(*base, "--dataset", bad), "train.jsonl line 4")
    noref = write_data(tmp_path / "noref", sums(3), [{"question": "q", "answer": "42"}])
    assert_one_line_error(run_cli(*base, "--dataset", noref), "test.jsonl line 1", "####")
    assert_one_line_error(run_cli(*base, "--dataset", data_dir, "--G", "1"), "--G")
    assert_one_line_error(run_cli(*base, "--dataset", data_dir, "--G", "4", "--micro-batch", "3"), "--micro-batch")
    assert_one_line_error(run_cli(*base, "--dataset", data_dir, "--device", "tpu9"), "--device")
    assert not out.exists(), "a rejected run must write nothing"
    # a Hub id that cannot be reached fails within seconds, saying how to run offline
    r = run_cli("--model", "org/no-such-model", "--dataset", data_dir, "--out", str(out),
                env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}, timeout=60)
    assert_one_line_error(r, "smollm2")
    assert not (out / "metrics.jsonl").exists()


def test_existing_run_is_not_overwritten(tiny_dir, data_dir, tmp_path):
    out = tmp_path / "run"
    os.makedirs(out)
    (out / "metrics.jsonl").write_text("precious\n")
    r = run_cli("--model", tiny_dir, "--dataset", data_dir, "--out", str(out))
    assert_one_line_error(r, "--overwrite")
    assert (out / "metrics.jsonl").read_text() == "precious\n"


# ------------------------------------------------------------------ Monte Carlo: the group baseline on a softmax bandit
#
# One question, K answers ("arms"), policy softmax(theta), reward 1 for some arms and 0 for the others.
# J = sum_a pi_a r_a and its exact gradient is dJ/dtheta = pi * (r - J). Each estimate below uses one
# group of G answers and the score grad log pi(a) = onehot(a) - pi, weighted by grpo.group_advantages.

def bandit_estimates(pi, r, G, algo, n_groups, seed):
    gen = torch.Generator().manual_seed(seed)
    arms = torch.multinomial(pi.expand(n_groups, -1), G, replacement=True, generator=gen)  # (n, G)
    rewards = r[arms]
    adv = grpo.group_advantages(rewards.reshape(-1), G, algo).view(n_groups, G)
    score = torch.nn.functional.one_hot(arms, len(pi)).double() - pi  # (n, G, K)
    return (adv.unsqueeze(-1) * score).mean(1)  # (n, K): one gradient estimate per group


def total_variance(est):
    return ((est - est.mean(0)) ** 2).sum(1).mean().item()


def exact_std_scale(J, G, eps=1e-4):
    """E[grpo estimate] = c * dJ/dtheta on one question with a 0/1 reward. Given k successes in the
    group, E[sum_i (r_i - mean) score_i | k] = k(G-k)/(G J (1-J)) * dJ/dtheta, and the sample std is
    sqrt(k(G-k)/(G(G-1))); averaging over k ~ Binomial(G, J) gives c."""
    c = 0.0
    for k in range(1, G):
        p_k = math.comb(G, k) * J ** k * (1 - J) ** (G - k)
        std = math.sqrt(k * (G - k) / (G * (G - 1)))
        c += p_k * k * (G - k) / (G * G * J * (1 - J)) / (std + eps)
    return c


def test_bandit_group_baseline_is_the_scaled_gradient_with_lower_variance():
    pi = torch.softmax(torch.tensor([0.5, 0.0, -0.5, 1.0, -1.0], dtype=torch.float64), 0)
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    J = (pi * r).sum().item()
    exact = pi * (r - J)
    G, n = 8, 200_000
    reinforce = bandit_estimates(pi, r, G, "reinforce", n, seed=1)
    baseline = bandit_estimates(pi, r, G, "drgrpo", n, seed=2)  # r - group mean, no std: the plain baseline
    # REINFORCE is unbiased. The group mean includes r_i itself, so the mean-baseline estimate is
    # unbiased up to the factor (G-1)/G: E[(r_i - mean) score_i] = (1 - 1/G) dJ/dtheta.
    torch.testing.assert_close(reinforce.mean(0), exact, atol=2e-3, rtol=0)
    torch.testing.assert_close(baseline.mean(0), exact * (G - 1) / G, atol=2e-3, rtol=0)
    # Lower variance, even after undoing the (G-1)/G shrink: measured ratio 0.68 at J = 0.32.
    ratio = total_variance(baseline * G / (G - 1)) / total_variance(reinforce)
    print(f"variance ratio baseline/reinforce at J={J:.3f}: {ratio:.3f}")
    assert ratio < 0.8, ratio


def test_bandit_std_normalization_rescales_per_question():
    """With the std division the estimate is no longer the plain gradient: on one question with a 0/1
    reward it stays parallel to it, scaled by c(J) (derived in exact_std_scale), and c depends on the
    question's success rate, so across questions it re-weights them: hard and easy ones count more."""
    G, n = 8, 200_000
    scales = []
    for seed, logits in enumerate(([0.5, 0.0, -0.5, 1.0, -1.0], [-2.5, 0.0, 0.5, 1.0, 0.2])):
        pi = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
        r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        J = (pi * r).sum().item()
        exact = pi * (r - J)
        est = bandit_estimates(pi, r, G, "grpo", n, seed=10 + seed)
        c = exact_std_scale(J, G)
        torch.testing.assert_close(est.mean(0), c * exact, atol=3e-3, rtol=0)
        scales.append((J, c))
    (J_easy, c_easy), (J_hard, c_hard) = scales
    print("(J, c) per question:", scales)
    assert J_hard < 0.05 and J_easy > 0.2 and c_hard > 1.2 * c_easy, scales  # c: 2.43 vs 1.88
