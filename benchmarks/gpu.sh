#!/usr/bin/env bash
# The headline GPU tables in one device call (at most 9.2 minutes of caps on an H100, model builds included):
#   0. the step table (benchmarks/gpu_step.py table): per bucket (1, 8, 32 rows; 1 and 4 query entries
#      per row) the 7B decode step eager, graphed and compiled, each against the bandwidth floor, and
#      each bucket's compile time, one JSON line per figure (step-table.jsonl); then pool-attention
#      (gpu_step.py graphs): the same steps with attention that gathers each row's history and with
#      attention that reads the KV pool in place (FlexAttention), eager and graphed (pool-attention.jsonl);
#   1. `tot-step` at alpha 0.4 with ar, parallel, seed, sd, seed@db1@vb1 (each mode's row shows the
#      target's busy share, "target busy"), then `seed` again with the step loop's other schedule
#      (tot-step-other-schedule: drafting overlapped with verification), the A/B of the overlapped schedule;
#   2. replay-tot-step and replay-tot-gsm8k: the workloads on the replay-* preset, whose target replays
#      a real SmolLM2-135M run's text (seed_tot/replay.py), with parallel, seed (the draft model),
#      seed+suffix and seed+choose: the text drafts see real text. The recording fixes their problems
#      (tests/fixtures/gsm8k_small.jsonl) and 64 new tokens per call;
#   3. tot-gsm8k --limit 8 at concurrency 1 and 4 with parallel and seed.
#   `thoughts` (the first GPU table's other workload) runs where STEPS names it (the smoke runs it).
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
# space separated, default "step-table pool-attention tot-step tot-step-other-schedule replay-tot-step tot-gsm8k replay-tot-gsm8k"),
# MODES (the modes of thoughts and tot-step), TABLE_MODELS (the step table's models, default 7b; gpu_step.py's
# SHAPES), COMPILE (the bench steps' --compile: default off, so that they fit the call beside the step table,
# which measures the compiled step; auto compiles on CUDA, one compile per bucket), and TRACE=1 (each bench
# step also writes the Fig.-4 trace, GPU utilization per mode, under $OUT/trace-STEP; it needs nvidia-ml-py
# and matplotlib). SEED_TOT_OVERLAP_DRAFTING=1 overlaps every step's drafting with verification on two
# streams instead of running them in turn (the default, seed_tot/engine/draft_stream.py); each bench's header
# line and every rows.jsonl row say which ran (overlap_drafting).
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
  repeats="${REPEATS:-1}" warmup="${WARMUP:-0}" replay_limit=1
  declare -A caps=([step-table]=120 [pool-attention]=60 [thoughts]=50 [tot-step]=50 [tot-step-other-schedule]=40 [replay-tot-step]=60
                   [tot-gsm8k]=70 [replay-tot-gsm8k]=90)
  default_steps="step-table pool-attention thoughts tot-step tot-step-other-schedule replay-tot-step tot-gsm8k replay-tot-gsm8k"
  table_models="${TABLE_MODELS:-tiny}" table_args=(--rows 1 --widths 1,4 --steps 3) pool_rows=1
  data="${GSM8K_DATA:-$root/tests/fixtures/gsm8k_small.jsonl}"
else
  # Sized for one 10-minute device call: the step table first (the compiles take most of its cap, and
  # come after every eager and graphed figure, the decode buckets first: a cap that cuts the table cuts
  # the last compiles only), then 16 new tokens per sequence (the issue's first GPU table used 16), one
  # warm-up and one timed run per mode; the caps (seconds per step) add up to 550 s (9.2 minutes).
  preset="${PRESET:-llama2-7b+llama-160m}" device="${DEVICE:-cuda}" tokens="${TOKENS:-16}" tot_tokens="${TOT_TOKENS:-16}"
  repeats="${REPEATS:-1}" warmup="${WARMUP:-1}" replay_limit=3
  declare -A caps=([step-table]=130 [pool-attention]=80 [thoughts]=75 [tot-step]=90 [tot-step-other-schedule]=40
                   [replay-tot-step]=70 [tot-gsm8k]=70 [replay-tot-gsm8k]=70)
  default_steps="step-table pool-attention tot-step tot-step-other-schedule replay-tot-step tot-gsm8k replay-tot-gsm8k"
  table_models="${TABLE_MODELS:-7b}" table_args=() pool_rows=1,8,32
  data="${GSM8K_DATA:-}"
  for candidate in "$root/shared/data/gsm8k/test.jsonl" "$root/../shared/data/gsm8k/test.jsonl" \
                   "$root/tests/fixtures/gsm8k_small.jsonl"; do
    [ -n "$data" ] || { [ -f "$candidate" ] && data="$candidate"; }
  done
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
    | tee "$out/gpu.txt"
fi

if [ -n "${CAP_S:-}" ]; then for name in "${!caps[@]}"; do caps[$name]="$CAP_S"; done; fi
# a fresh start: rows.jsonl is appended to, and a solve refuses a directory that holds results
rm -rf "$out/rows.jsonl" "$out/tot-gsm8k-runs" "$out/replay-tot-gsm8k-runs" "$out/step-table.jsonl" "$out/pool-attention.jsonl"
failed=0
steps=" ${STEPS:-$default_steps} "
report_failure() {  # report_failure NAME RC: the step's error tail and what was kept
  tail -n 15 "$out/$1.err"
  echo "== $1: exit $2$([ "$2" = 124 ] && echo ' (timed out)'); the figures printed above are kept in $out"
  failed=1
}

# the step table: one JSON line per figure as it is measured, to the screen and step-table.jsonl
if [[ "$steps" == *" step-table "* ]]; then
  echo "== step-table (cap ${caps[step-table]}s): gpu_step.py table --models $table_models ${table_args[*]}"
  (cd "$pkg" && timeout "${caps[step-table]}" "$python" "$root/benchmarks/gpu_step.py" table --models "$table_models" \
    "${table_args[@]}" 2>"$out/step-table.err") | tee "$out/step-table.jsonl"
  rc="${PIPESTATUS[0]}"
  [ "$rc" = 0 ] || report_failure step-table "$rc"
fi
# the KV pool read in place (attention=pool, FlexAttention) against the per-layer gather of every row's history
if [[ "$steps" == *" pool-attention "* ]]; then
  echo "== pool-attention (cap ${caps[pool-attention]}s): gpu_step.py graphs --models $table_models --attention gather,pool"
  (cd "$pkg" && timeout "${caps[pool-attention]}" "$python" "$root/benchmarks/gpu_step.py" graphs --models "$table_models" \
    --attention gather,pool --rows "$pool_rows" 2>"$out/pool-attention.err") | tee "$out/pool-attention.jsonl"
  rc="${PIPESTATUS[0]}"
  [ "$rc" = 0 ] || report_failure pool-attention "$rc"
fi

step() {  # step NAME BENCH_ARGS...: one bench run, its log and JSON under $out, within the step's cap
  local name="$1" cap="${caps[$1]}"
  shift
  [[ "$steps" == *" $name "* ]] || return 0
  [ "${TRACE:-0}" = 1 ] && set -- "$@" --trace "$out/trace-$name"
  echo "== $name (cap ${cap}s): bench $*"
  # stdout (the banner, each mode's row, the table) to the screen and $name.log; stderr (progress
  # bars, round notices, warnings) to $name.err, whose tail is shown when the step fails
  # from the package tree: `python -m` puts the working directory first on sys.path, and a checkout's
  # root there would shadow the tree (its seed_tot has no tasks/ inside: no install maps it there)
  (cd "$pkg" && timeout "$cap" "$python" -m seed_tot.cli bench --synthetic "${step_preset:-$preset}" --alpha "${ALPHA:-0.4}" --device "$device" \
    --temperature 0 --compile "${COMPILE:-off}" "$@" --json "$out/$name.json" --jsonl "$out/rows.jsonl" \
    2>"$out/$name.err") | tee "$out/$name.log"
  local rc="${PIPESTATUS[0]}"
  [ "$rc" = 0 ] || report_failure "$name" "$rc"
}

# seed right after the baselines it is compared with, the slow serial modes last: a step that hits
# its cap loses those first
modes="${MODES:-ar,parallel,seed,sd,seed@db1@vb1}"
step thoughts --workload thoughts --modes "$modes" --max-new-tokens "$tokens" --repeats "$repeats" --warmup "$warmup"
step tot-step --workload tot-step --modes "$modes" --max-new-tokens "$tokens" --repeats "$repeats" --warmup "$warmup"
# seed again with the step loop's other schedule, the A/B of drafting beside verification (draft_stream.py):
# overlapped where the default takes turns, in turn where SEED_TOT_OVERLAP_DRAFTING=1 asks for the overlap
overlap="${SEED_TOT_OVERLAP_DRAFTING:-0}"
SEED_TOT_OVERLAP_DRAFTING="$([ "$overlap" = 0 ] && echo 1 || echo 0)" step tot-step-other-schedule --workload tot-step --modes parallel,seed --max-new-tokens "$tokens" \
  --repeats "$repeats" --warmup "$warmup"
# replayed real text (step_preset: the replay-* twin of the preset); the recording's problems and tokens
replay_modes="parallel,seed+choose,seed+suffix,seed" replay_data="$root/tests/fixtures/gsm8k_small.jsonl"
step_preset="replay-$preset" step replay-tot-step --workload tot-step --data "$replay_data" \
  --modes "$replay_modes" --max-new-tokens 64 --repeats "$repeats" --warmup "$warmup"
# no warm-up: one would solve all 8 problems again; the first mode carries the process's first kernels
step tot-gsm8k --workload tot-gsm8k --data "$data" --limit 8 \
  --modes parallel,seed,parallel@c4,seed@c4 --max-new-tokens "$tot_tokens" --repeats "$repeats" --warmup 0 \
  --output "$out/tot-gsm8k-runs"
step_preset="replay-$preset" step replay-tot-gsm8k --workload tot-gsm8k --data "$replay_data" \
  --limit "$replay_limit" --concurrency "$replay_limit" --modes "$replay_modes" --max-new-tokens 64 \
  --repeats "$repeats" --warmup 0 --output "$out/replay-tot-gsm8k-runs"
echo "== done: $out (rows.jsonl: one line per mode per timed run)"
exit "$failed"
