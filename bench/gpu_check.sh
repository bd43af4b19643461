#!/usr/bin/env bash
# The first GPU run, one command, under 8 minutes on one GPU, offline, without `datasets`:
#   1. the device tests: GRPO_TEST_DEVICE=cuda python -m pytest -q test_grpo.py -k on_device
#   2. 10 GRPO steps (B=4, G=8, 256 new tokens, --dtype auto) of a randomly initialised model of
#      Qwen2.5-0.5B-Instruct's shape on GSM8K (bench/gpu_check.py): s/step, sampling share, peak GPU memory,
#      and a check that every metric in metrics.jsonl is finite.
# Exits non-zero if any part fails, or if no test is named test_on_device_*.
#
# usage: bench/gpu_check.sh [--device cuda|cpu] [--tiny] [--skip-tests] [--keep DIR] [GSM8K_DIR]
#   GSM8K_DIR    folder with train.jsonl and test.jsonl (default: shared_data/gsm8k)
#   --tiny       a 2-layer model and 2 steps: the same code path in seconds (for a check on CPU)
#   --keep DIR   copy metrics.jsonl and summary.json there
#   PYTHON=...   the interpreter (default: python)
# e.g. on CPU: bench/gpu_check.sh --device cpu --tiny ../shared/gsm8k
set -euo pipefail
device=cuda tiny="" tests=1 keep="" data=""
while [ $# -gt 0 ]; do
    case "$1" in
        --device) device=$2; shift 2 ;;
        --tiny) tiny=--tiny; shift ;;
        --skip-tests) tests=0; shift ;;
        --keep) keep=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "error: unknown option $1 (see $0 --help)" >&2; exit 2 ;;
        *) data=$1; shift ;;
    esac
done
# paths given are relative to where the command runs; the default one to the repository root
[ -n "$data" ] && [ -d "$data" ] && data=$(cd "$data" && pwd)
[ -n "$keep" ] && keep=$(mkdir -p "$keep" && cd "$keep" && pwd)
cd "$(dirname "$0")/.."
data=${data:-shared_data/gsm8k}
PYTHON=${PYTHON:-python}
if [ ! -f "$data/train.jsonl" ] || [ ! -f "$data/test.jsonl" ]; then
    echo "error: $data must hold GSM8K's train.jsonl and test.jsonl; pass the folder as the last argument" >&2
    exit 2
fi
start=$SECONDS

if [ "$tests" = 1 ]; then
    echo "== 1/2 device tests: GRPO_TEST_DEVICE=$device $PYTHON -m pytest -q test_grpo.py -k on_device"
    "$PYTHON" -c "import pytest, hypothesis" 2>/dev/null ||
        { echo "error: the tests need pytest and hypothesis (pip install pytest hypothesis), or pass --skip-tests" >&2; exit 1; }
    status=0
    GRPO_TEST_DEVICE=$device "$PYTHON" -m pytest -q test_grpo.py -k on_device || status=$?
    if [ "$status" = 5 ]; then  # pytest's exit status when no test was selected
        echo "error: -k on_device selected no test: test_grpo.py has no test named test_on_device_*" >&2
        exit 1
    elif [ "$status" != 0 ]; then
        echo "error: the device tests failed (pytest exit status $status)" >&2
        exit 1
    fi
    echo "device tests passed in $((SECONDS - start)) s"
fi

echo "== 2/2 training: bench/gpu_check.py --device $device $tiny"
t=$SECONDS
"$PYTHON" bench/gpu_check.py --device "$device" --data "$data" $tiny ${keep:+--keep "$keep"}
echo "training check passed in $((SECONDS - t)) s"
echo "gpu_check: all passed in $((SECONDS - start)) s"
