#!/usr/bin/env bash
# Issue 10's GPU measurement: batched SEED against its baselines at Llama-2-7B / 160M scale.
#
# Synthetic models of the real shapes (random weights, real forwards, an acceptance oracle at
# `alpha`; seed_tot/engine/synthetic.py), so nothing has to be downloaded or carried: the
# workloads use the built-in GSM8K question when no --data is given. For each alpha given
# (default 0.25 0.4 0.6) it runs the `thoughts` and `tot-step` workloads with the modes the issue
# asks for, and at alpha 0.4 it also writes the SEED paper's Fig. 4 trace (GPU utilization per
# mode, from NVML). Every number lands in $OUT (the device tool's output folder) or ./gpu-out.
#
# Sized for the device tool's limits (10 minutes a command; since session 25 a session gets 15
# minutes of device time in all, start-up included): run one alpha per call, 0.4 first (the
# goal's alpha, and the only one that writes the trace), from the repository root, with nothing
# installed beyond the GPU image:
#     bash benchmarks/issue10_gpu.sh 0.4
#     bash benchmarks/issue10_gpu.sh 0.25      # then 0.6, while device time is left
# Goal (issue 10): batched seed >= 1.5x parallel at alpha >= 0.4, target busy >= 90%.
# The models run in bf16 (the GPU default): a 'NO' in the tokens column is the batch-shape rounding
# README's 'Numerics' describes (session 23 saw it on a CPU in bf16, parallel against ar too).
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)"
out="${OUT:-gpu-out}"
mkdir -p "$out"
modes="ar,parallel,sd,seed@db1@vb1,seed"
alphas=("$@")
[ ${#alphas[@]} -gt 0 ] || alphas=(0.25 0.4 0.6)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
for alpha in "${alphas[@]}"; do
  for workload in thoughts tot-step; do
    trace=()
    [ "$alpha" = 0.4 ] && trace=(--trace "$out/trace-$workload-a$alpha")
    python3 -m seed_tot.cli bench --synthetic llama2-7b+llama-160m --alpha "$alpha" --workload "$workload" \
      --modes "$modes" --temperature 0 --repeats 3 --warmup 1 \
      --json "$out/bench-$workload-llama7b-a$alpha.json" "${trace[@]}" 2>&1 | tee "$out/bench-$workload-a$alpha.log"
  done
done
