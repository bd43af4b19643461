"""grpo.py's answer extraction against lm-evaluation-harness's GSM8K filters, on GSM8K's reference answers and on
the model answers saved under results/ (the "samples" of eval records). Writes agreement.md next to this file.

lm-eval's side is written here from its gsm8k.yaml (not imported): strict-match is the first match of
'#### (\\-?[0-9\\.\\,]+)'; flexible-extract the last match of '(-?[$0-9.,]{2,})|(-?[0-9]+)' (the non-empty group);
no match gives '[invalid]'. Its exact_match then deletes ',', '$', '(?s).*#### ' and a trailing '.' from prediction
and target, lowercases both and compares the strings. Its target is answer.split('####')[-1].strip().
grpo.py's side is grpo.extract_answer(text, strict) and its reward's answers_equal (numbers compared by value).

Run from the repository root: python -m results.extraction.compare   (reads ../shared/gsm8k and results/)"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
from decimal import Decimal, InvalidOperation

import grpo

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = [",", r"\$", r"(?s).*#### ", r"\.$"]
INVALID = "[invalid]"


def lm_eval_filter(text, flexible):
    """lm-eval's RegexFilter + take_first: strict takes the first match, flexible the last."""
    found = (FLEXIBLE if flexible else STRICT).findall(text)
    if not found:
        return INVALID
    match = found[-1] if flexible else found[0]
    if isinstance(match, tuple):  # several groups: the first non-empty one
        match = next((m for m in match if m), INVALID)
    return match.strip()


def lm_eval_clean(s):
    """exact_match's regexes_to_ignore and ignore_case."""
    for pattern in IGNORE:
        s = re.sub(pattern, "", s)
    return s.lower()


def number(s):
    try:
        return Decimal(s) if s not in (None, INVALID) else None
    except InvalidOperation:
        return None


def same_number(a, b):
    a, b = number(a), number(b)
    return a is not None and b is not None and a == b


def reference_answers(gsm8k_dir):
    """(source, text, ref): every GSM8K answer, with lm-eval's target as the reference (commas and '$' dropped)."""
    for split in ("train", "test"):
        with open(os.path.join(gsm8k_dir, f"{split}.jsonl"), encoding="utf-8") as f:
            for i, line in enumerate(f):
                answer = json.loads(line)["answer"]
                yield f"gsm8k {split} row {i}", answer, lm_eval_clean(answer.split("####")[-1].strip())


def model_answers(results_dir):
    """(source, completion, ref) of every eval sample saved under results/, each (completion, ref) once."""
    seen = set()
    paths = sorted(glob.glob(os.path.join(results_dir, "**", "*.jsonl.gz"), recursive=True)
                   + glob.glob(os.path.join(results_dir, "**", "*.jsonl"), recursive=True))
    for path in paths:
        dataset = "?"
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and record.get("type") == "config":
                    dataset = os.path.basename(str(record.get("dataset")).rstrip("/"))
                samples = record.get("samples") if isinstance(record, dict) else None
                for sample in samples or []:
                    key = (sample.get("completion"), sample.get("ref"))
                    if isinstance(key[0], str) and isinstance(key[1], str) and key not in seen:
                        seen.add(key)
                        yield f"{os.path.relpath(path, results_dir)} ({dataset})", key[0], key[1]


EDGE_CASES = [(f"edge case {i}", text, ref) for i, (text, ref) in enumerate([
    ("So the total is 18.0\n#### 18.0", "18"),
    ("She pays $5 each, 4 times.\n#### $20", "20"),
    ("4 + 5 = 9\n####9", "9"),
    ("The answer is 1,234.", "1234"),
    ("#### 3,4,5", "3"),
    ("Half of 1 is 0.50\n#### 0.50", ".5"),
    ("It is 12. Then we wait...", "12"),
    ("The change is \u22127 degrees.\n#### \u22127", "-7"),
    ("#### 12\nQuestion: Tom has 3 apples", "12"),
    ("#### 7.", "7"),
])]


def classify(text, ours, theirs_raw, theirs, ref, flexible, ours_right):
    """Why grpo.py's verdict and lm-eval's differ on one answer: the first rule that applies."""
    after = text.rsplit("####", 1)[1] if "####" in text else None
    if "\u2212" in text and ours is not None and ours.startswith("-"):
        return "a typeset minus sign (U+2212): grpo.py reads it as '-', lm-eval's regexes do not"
    if not flexible and text.count("####") > 1:
        return "several '####': lm-eval's strict-match takes the first, grpo.py's strict the last"
    if not flexible and theirs == INVALID and after is not None:
        if re.match(r"\s*\$", after):
            return "'#### $N': lm-eval's strict regex wants '-' or a digit right after '#### '"
        if not after.startswith(" "):
            return "'####N' or '####\\nN': lm-eval's strict regex wants exactly one space after '####'"
        return "'#### ' then a non-number ('#### = 12'): lm-eval's strict regex stops; grpo.py reads on"
    if theirs != INVALID and not re.search(r"[0-9]", theirs):
        return "flexible-extract's last match has no digit ('...', '.,', '$.')"
    if re.search(r",(?![0-9]{3}(?![0-9]))", theirs_raw):
        return "a comma not before 3 digits ('3,4,5', '1,23'): lm-eval deletes it and reads one number"
    if flexible and after is not None and ours is not None and theirs != lm_eval_clean(ours):
        return "text after the last '#### N': flexible-extract takes the text's last number, grpo.py N"
    if ours_right and same_number(theirs, ref):
        return "same number, other form: lm-eval compares strings ('18.0' != '18', '0.50' != '.5')"
    if theirs_raw.count(".") > 1:
        return "several '.' in lm-eval's match ('1.2.3')"
    if ours is None:
        return "grpo.py finds no number"
    return "other"


def compare(rows, pairs):
    """Per pair of extractors: verdict counts and, per class of disagreement, a count and the first example."""
    table = {name: collections.Counter() for name in pairs}
    classes = {name: collections.OrderedDict() for name in pairs}
    values_differ = collections.Counter()
    n = 0
    for source, text, ref in rows:
        n += 1
        for name, (strict, flexible) in pairs.items():
            ours = grpo.extract_answer(text, strict=strict)
            theirs_raw = lm_eval_filter(text, flexible)
            theirs = lm_eval_clean(theirs_raw)
            ours_right = grpo.answers_equal(ours, ref)
            theirs_right = theirs == lm_eval_clean(ref)
            table[name][(ours_right, theirs_right)] += 1
            if ours_right == theirs_right:
                if ours_right is False and (ours or INVALID) != theirs and not same_number(ours, theirs):
                    values_differ[name] += 1
                continue
            why = classify(text, ours, theirs_raw, theirs, ref, flexible, ours_right)
            key = (why, "grpo.py" if ours_right else "lm-eval")  # one example per class and side that matches ref
            entry = classes[name].setdefault(key, {"count": 0, "grpo_right": 0, "example": None})
            entry["count"] += 1
            entry["grpo_right"] += ours_right
            if entry["example"] is None:
                entry["example"] = {"source": source, "text": text, "ref": ref, "grpo": ours, "lm_eval": theirs_raw,
                                    "right": "grpo.py" if ours_right else "lm-eval"}
    return n, table, classes, values_differ


def cell(s, width=160):
    s = repr(s)[1:-1] if isinstance(s, str) else str(s)
    s = s if len(s) <= width else "..." + s[-width:]
    return s.replace("|", "\\|")


def report(title, n, table, classes, values_differ, pairs):
    lines = [f"## {title}: {n} answers", "",
             "| grpo.py vs lm-eval | both right | both wrong (values differ) | only grpo.py right | "
             "only lm-eval right | agreement | accuracy: grpo.py / lm-eval |", "|---|---|---|---|---|---|---|"]
    for name in pairs:
        t = table[name]
        agree = t[(True, True)] + t[(False, False)]
        lines.append(f"| {name} | {t[(True, True)]} | {t[(False, False)]} ({values_differ[name]}) | "
                     f"{t[(True, False)]} | {t[(False, True)]} | {agree / max(n, 1):.2%} | "
                     f"{(t[(True, True)] + t[(True, False)]) / max(n, 1):.2%} / "
                     f"{(t[(True, True)] + t[(False, True)]) / max(n, 1):.2%} |")
    for name in pairs:
        if not classes[name]:
            continue
        lines += ["", f"### {name}: disagreements", "",
                  "| class | side that matches the reference | count | example (source: answer's end) | ref | "
                  "grpo.py | lm-eval |", "|---|---|---|---|---|---|---|"]
        for (why, side), e in sorted(classes[name].items(), key=lambda kv: (kv[0][0], -kv[1]["count"])):
            x = e["example"]
            lines.append(f"| {cell(why)} | {side} | {e['count']} | {cell(x['source'])}: {cell(x['text'], 120)} | "
                         f"{cell(x['ref'])} | {cell(x['grpo'])} | {cell(x['lm_eval'])} |")
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", default=os.path.join(ROOT, "results"))
    parser.add_argument("--gsm8k", default=os.path.join(os.path.dirname(ROOT), "shared", "gsm8k"))
    parser.add_argument("--out", default=os.path.join(HERE, "agreement.md"))
    args = parser.parse_args()

    pairs = {"strict / strict-match": (True, False), "lenient / flexible-extract": (False, True)}
    lines = ["# Answer extraction: grpo.py vs lm-evaluation-harness's GSM8K filters", "",
             "Verdicts against the reference number: grpo.py's reward (extract_answer, numbers equal by value); "
             "lm-eval's exact_match (its filter, then ',' '$' '(?s).*#### ' and a trailing '.' deleted, lowercase, "
             "string equality). 'matches ref' = the side that scores the answer right, i.e. whose extracted number "
             "equals the reference: for GSM8K's answers the number after their last '####' (lm-eval's target), "
             "for model answers the eval sample's 'ref'. Written by compare.py.", ""]
    for title, rows in (("GSM8K reference answers (train + test)", reference_answers(args.gsm8k)),
                        ("Model answers saved in results/ (eval samples, deduplicated)", model_answers(args.results)),
                        ("Constructed edge cases (not data: forms neither corpus holds)", EDGE_CASES)):
        n, table, classes, values_differ = compare(rows, pairs)
        lines += report(title, n, table, classes, values_differ, pairs) + [""]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
