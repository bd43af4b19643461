"""SQuAD v1.1 (Rajpurkar et al. 2016) trained with grpo.py as a task of one's own, `SQUAD`, passed to grpo.main:
the rows come from SQuAD, the reward is SQuAD's, and everything else (flags, evaluation, checkpoints) is grpo.py's.

Each row asks for a span of a Wikipedia paragraph: the question holds "Context: ...\\n\\nQuestion: ...", and the
completion's first non-empty line is the answer, scored as SQuAD's official v1.1 script scores it against the gold
answers (the best over them): --reward strict pays its exact match (1.0 or 0.0), --reward lenient its F1 (the
overlap of the normalized words, partial credit for an answer that holds the span in a sentence). Greedy accuracy
"strict" is then SQuAD's EM and "lenient" its F1; maj@K votes over the normalized answers. Training draws from the
train split; evaluation is held out on the validation split.

Run it from the repository root, with any flag of grpo.py. Naming --dataset picks grpo.py's full setting (200
steps, 256 tokens), so the CPU command gives its small values itself:

    python -m examples.squad --dataset squad --max-new-tokens 32      # rajpurkar/squad from the Hub, on a GPU
    python -m examples.squad --model smollm2 --dataset DIR --steps 12 --batch-prompts 2 --max-new-tokens 32 \\
        --temperature 0.7 --lr 2e-5 --eval-every 0 --eval-n 48          # a CPU, offline

DIR holds SQuAD's own files, train-v1.1.json and dev-v1.1.json; pass@k counts the answers a reward pays 1.0. A
stopped run prints the command that resumes it: python -m examples.squad --resume OUT.
"""

import collections
import json
import os
import random
import re
import string

import grpo

INSTRUCTION = ("Answer with the shortest span of the context that answers the question, copied exactly, and nothing "
               "else.")
FILES = {"train": "train-v1.1.json", "validation": "dev-v1.1.json"}  # SQuAD v1.1's own names for its two splits


def load_squad(spec, seed):
    """(train rows, validation rows). The validation rows come in one fixed shuffled order (not --seed's), so
    --eval-n N takes the same N questions in every run, from across the articles rather than the first one."""
    if spec == "squad":
        splits = {split: from_hub(split) for split in FILES}
    else:
        splits = {split: from_file(spec, name) for split, name in FILES.items()}
    train, test = ([make_row(*found) for found in splits[split]] for split in FILES)
    random.Random(0).shuffle(test)
    return train, test


def make_row(context, question, golds):
    golds = list(dict.fromkeys(golds))  # the validation split often repeats an answer
    return {"question": f"Context: {context}\n\nQuestion: {question}", "answer": golds[0], "ref": golds}


def from_hub(split):
    """(context, question, gold answers) of each question of a split of rajpurkar/squad on the Hugging Face Hub."""
    import datasets
    try:
        ds = datasets.load_dataset("rajpurkar/squad", split=split)
    except (OSError, ValueError):  # offline and not cached
        raise grpo.ConfigError("cannot download rajpurkar/squad from the Hugging Face Hub and it is not cached; pass "
                               "a folder with SQuAD's train-v1.1.json and dev-v1.1.json: --dataset DIR") from None
    return [(r["context"], r["question"], r["answers"]["text"]) for r in ds]


def from_file(folder, name):
    """(context, question, gold answers) of each question in folder/name, a file in SQuAD's JSON format:
    {"data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question", "answers": [{"text", ...}]}]}]}]}."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        raise grpo.ConfigError(f"--dataset {folder}: no {path}; pass squad (the Hub) or a folder with SQuAD v1.1's "
                               "train-v1.1.json and dev-v1.1.json")
    try:
        with open(path, encoding="utf-8") as f:
            found = [(p["context"], qa["question"], [a["text"] for a in qa["answers"]])
                     for article in json.load(f)["data"] for p in article["paragraphs"] for qa in p["qas"]]
        if not found or not all(isinstance(x, str) for c, q, golds in found for x in (c, q, *golds)):
            raise ValueError("no questions" if not found else "a context, question or answer is not a string")
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # not JSON, not UTF-8, or not SQuAD's layout
        raise grpo.ConfigError(f"{path} is not a SQuAD v1.1 file ({type(e).__name__}: {str(e)[:60]}); download "
                               "it again or pass another --dataset") from None
    if any(not golds or not all(gold.strip() for gold in golds) for c, q, golds in found):
        raise grpo.ConfigError(f"{path} has a question without a gold answer, or an empty one (SQuAD 2.0's "
                               "unanswerable ones); pass SQuAD v1.1's files")
    return found


# Reward: SQuAD's exact match and F1. ----------------------------------------------------------------------------------

NO_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize(text):
    """SQuAD's answer normalization (its evaluate-v1.1.py), in its order: lower case, ASCII punctuation deleted,
    the words a, an and the deleted, runs of whitespace made one space: 'The  U.S.!' -> 'us'."""
    text = re.sub(r"\b(a|an|the)\b", " ", text.lower().translate(NO_PUNCTUATION))
    return " ".join(text.split())


def first_line(completion):
    return next((line for line in completion.splitlines() if line.strip()), "")


def exact_match(completion, ref):
    """1.0 if the completion's first non-empty line is one of the gold answers `ref` once both are normalized, else
    0.0."""
    return 1.0 if any(normalize(first_line(completion)) == normalize(gold) for gold in ref) else 0.0


def f1(completion, ref):
    """SQuAD's F1 of the completion's first non-empty line: the harmonic mean of the precision and recall of its
    normalized words against a gold answer's (a multiset overlap), the best over the gold answers."""
    words = normalize(first_line(completion)).split()

    def one(gold):
        gold = normalize(gold).split()
        same = sum((collections.Counter(words) & collections.Counter(gold)).values())
        return 0.0 if not same else 2 * same / (len(words) + len(gold))
    return max(one(gold) for gold in ref)


def squad_reward(completion, ref, strict=False):
    """strict: exact match; lenient: F1, partial credit for a sentence that holds the span."""
    return exact_match(completion, ref) if strict else f1(completion, ref)


def vote(completion, strict=False):
    """What maj@K votes on: the normalized answer (None if empty)."""
    return normalize(first_line(completion)) or None


SQUAD = grpo.Task(INSTRUCTION, squad_reward, vote, load_squad)


if __name__ == "__main__":
    grpo.main(task=SQUAD)
