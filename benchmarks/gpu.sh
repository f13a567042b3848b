#!/usr/bin/env bash
# The headline GPU tables in one device call (at most ~8.5 minutes on an H100, model builds included):
#   0. the step table (benchmarks/gpu_step.py table): per bucket (1, 8, 32 rows; 1 and 4 query entries
#      per row) the 7B decode step eager, graphed and compiled, each against the bandwidth floor, and
#      each bucket's compile time, one JSON line per figure (step-table.jsonl);
#   1. `thoughts` and `tot-step` at alpha 0.4 with ar, parallel, seed, sd, seed@db1@vb1 (each mode's row
#      shows the target's busy share, "target busy");
#   2. tot-gsm8k --limit 8 at concurrency 1 and 4 with parallel and seed.
# Synthetic models of Llama-2-7B / Llama-160M shapes (random weights, real forwards, an acceptance
# oracle; seed_tot/synthetic.py), so nothing is downloaded. GSM8K problems come from
# $GSM8K_DATA, else shared/data/gsm8k/test.jsonl (in or beside the checkout), else the 3-problem
# fixture in tests/fixtures; a local JSONL loads without `datasets`.
#
# Runs from a bare checkout on an image with torch and transformers and nothing else installed:
# it imports this checkout's code through a temporary package tree that puts tasks/ and configs/
# where an install's package-dir mapping would (seed_tot.tasks, seed_tot.configs), so an installed
# copy of the project, if any, is not what runs. Every bench prints and appends each mode's row as
# soon as that mode has run (rows.jsonl), and each step has a time cap, so a device call that runs
# out of time keeps every figure measured before it. Everything goes to $OUT, default ./gpu-out.
#
#     bash benchmarks/gpu.sh            # on the GPU (bf16)
#     bash benchmarks/gpu.sh --smoke    # the same steps on the tiny preset on the CPU (CI runs it)
# Settings can be changed without editing: ALPHA, TOKENS, TOT_TOKENS, REPEATS, WARMUP, PRESET, DEVICE, PYTHON,
# CAP_S (one time cap in seconds for every step, in place of the defaults below), STEPS (the steps to run,
# space separated, default "step-table thoughts tot-step tot-gsm8k"), MODES (the modes of the bench steps),
# TABLE_MODELS (the step table's models, default 7b; gpu_step.py's SHAPES), COMPILE (the bench steps'
# --compile: default off, so that they fit the call beside the step table, which measures the compiled
# step; auto compiles on CUDA, one compile per bucket), and TRACE=1 (each bench step also writes the
# Fig.-4 trace, GPU utilization per mode, under $OUT/trace-STEP; it needs nvidia-ml-py and matplotlib).
set -uo pipefail
smoke=0
case "${1:-}" in
  --smoke) smoke=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu.sh [--smoke]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-gpu-out}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
python="${PYTHON:-python3}"

pkg="$(mktemp -d)"
trap 'rm -rf "$pkg"' EXIT
mkdir "$pkg/seed_tot"
ln -s "$root"/seed_tot/* "$pkg/seed_tot/"
ln -s "$root/tasks" "$pkg/seed_tot/tasks"
ln -s "$root/configs" "$pkg/seed_tot/configs"
export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

if [ "$smoke" = 1 ]; then
  # tiny models on the CPU: the same steps, each mode's row printed; the caps keep it under 5 minutes
  # (the step table compiles two buckets of the tiny model with inductor's C++ backend)
  preset="${PRESET:-tiny}" device="${DEVICE:-cpu}" tokens="${TOKENS:-4}" tot_tokens="${TOT_TOKENS:-4}"
  repeats="${REPEATS:-1}" warmup="${WARMUP:-0}" caps=(120 50 50 70)
  table_models="${TABLE_MODELS:-tiny}" table_args=(--rows 1 --widths 1,4 --steps 3)
  data="${GSM8K_DATA:-$root/tests/fixtures/gsm8k_small.jsonl}"
else
  # Sized for one 10-minute device call: the step table first (the compiles take most of its cap, and
  # come after every eager and graphed figure, the decode buckets first: a cap that cuts the table cuts
  # the last compiles only), then 16 new tokens per sequence (the issue's first GPU table used 16), one
  # warm-up and one timed run per mode; the caps (seconds per step) add up to 8.5 minutes.
  preset="${PRESET:-llama2-7b+llama-160m}" device="${DEVICE:-cuda}" tokens="${TOKENS:-16}" tot_tokens="${TOT_TOKENS:-16}"
  repeats="${REPEATS:-1}" warmup="${WARMUP:-1}" caps=(210 75 120 100)
  table_models="${TABLE_MODELS:-7b}" table_args=()
  data="${GSM8K_DATA:-}"
  for candidate in "$root/shared/data/gsm8k/test.jsonl" "$root/../shared/data/gsm8k/test.jsonl" \
                   "$root/tests/fixtures/gsm8k_small.jsonl"; do
    [ -n "$data" ] || { [ -f "$candidate" ] && data="$candidate"; }
  done
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    | tee "$out/gpu.txt"
fi

[ -z "${CAP_S:-}" ] || caps=("$CAP_S" "$CAP_S" "$CAP_S" "$CAP_S")
# a fresh start: rows.jsonl is appended to, and a solve refuses a directory that holds results
rm -rf "$out/rows.jsonl" "$out/tot-gsm8k-runs" "$out/step-table.jsonl"
failed=0
steps=" ${STEPS:-step-table thoughts tot-step tot-gsm8k} "
report_failure() {  # report_failure NAME RC: the step's error tail and what was kept
  tail -n 15 "$out/$1.err"
  echo "== $1: exit $2$([ "$2" = 124 ] && echo ' (timed out)'); the figures printed above are kept in $out"
  failed=1
}

# the step table: one JSON line per figure as it is measured, to the screen and step-table.jsonl
if [[ "$steps" == *" step-table "* ]]; then
  echo "== step-table (cap ${caps[0]}s): gpu_step.py table --models $table_models ${table_args[*]}"
  (cd "$pkg" && timeout "${caps[0]}" "$python" "$root/benchmarks/gpu_step.py" table --models "$table_models" \
    "${table_args[@]}" 2>"$out/step-table.err") | tee "$out/step-table.jsonl"
  rc="${PIPESTATUS[0]}"
  [ "$rc" = 0 ] || report_failure step-table "$rc"
fi

step() {  # step NAME CAP_SECONDS BENCH_ARGS...: one bench run, its log and JSON under $out
  local name="$1" cap="$2"
  shift 2
  [[ "$steps" == *" $name "* ]] || return 0
  [ "${TRACE:-0}" = 1 ] && set -- "$@" --trace "$out/trace-$name"
  echo "== $name (cap ${cap}s): bench $*"
  # stdout (the banner, each mode's row, the table) to the screen and $name.log; stderr (progress
  # bars, round notices, warnings) to $name.err, whose tail is shown when the step fails
  # from the package tree: `python -m` puts the working directory first on sys.path, and a checkout's
  # root there would shadow the tree (its seed_tot has no tasks/ inside: no install maps it there)
  (cd "$pkg" && timeout "$cap" "$python" -m seed_tot.cli bench --synthetic "$preset" --alpha "${ALPHA:-0.4}" --device "$device" \
    --temperature 0 --compile "${COMPILE:-off}" "$@" --json "$out/$name.json" --jsonl "$out/rows.jsonl" \
    2>"$out/$name.err") | tee "$out/$name.log"
  local rc="${PIPESTATUS[0]}"
  [ "$rc" = 0 ] || report_failure "$name" "$rc"
}

# seed right after the baselines it is compared with, the slow serial modes last: a step that hits
# its cap loses those first
modes="${MODES:-ar,parallel,seed,sd,seed@db1@vb1}"
step thoughts "${caps[1]}" --workload thoughts --modes "$modes" --max-new-tokens "$tokens" \
  --repeats "$repeats" --warmup "$warmup"
step tot-step "${caps[2]}" --workload tot-step --modes "$modes" --max-new-tokens "$tokens" \
  --repeats "$repeats" --warmup "$warmup"
# no warm-up: one would solve all 8 problems again; the first mode carries the process's first kernels
step tot-gsm8k "${caps[3]}" --workload tot-gsm8k --data "$data" --limit 8 \
  --modes parallel,seed,parallel@c4,seed@c4 --max-new-tokens "$tot_tokens" --repeats "$repeats" --warmup 0 \
  --output "$out/tot-gsm8k-runs"
echo "== done: $out (rows.jsonl: one line per mode per timed run)"
exit "$failed"
