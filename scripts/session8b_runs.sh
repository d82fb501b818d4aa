#!/usr/bin/env bash
# Session 8's second set, after the bf16 linear kernel's 8-row tiles (same machine; the s8-cpu-shipped-fp32 run
# is unaffected: float32 runs the AVX2 kernel). One after another: timings need the whole machine.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --no-progress --no-images --capacity auto"
# The cost curve for the new kernel, before any timed decoding.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default')))"
# Whole verify forward per linear kernel in bfloat16.
{ echo "Command: \`python -m racer.bench.kernels --dtype bfloat16 --context 300 --repeats 8 --sizes 1,2,4,5,6,8,12,16,32\` (session 8, AVX512-BF16 CPU, 8-row tiles)"; echo
  $P -m racer.bench.kernels --dtype bfloat16 --context 300 --repeats 8 --sizes 1,2,4,5,6,8,12,16,32; } > benchmarks/micro/kernels-tiled-bfloat16-s8.md
# Spec-Bench, 10 questions per category (130), categories in turn.
$B --data ../shared/data/spec_bench.jsonl --per-category 10 --round-robin --methods ar,tr,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s8b-cpu-specbench10
# The shipped prompts, each turn timed 3 times interleaved (median).
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s8b-cpu-shipped-r3
# Fixed capacities against auto in one interleaved run (method@capacity), each turn timed twice.
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,racer,racer@4,racer@8,racer@16,racer@32,racer@64,hf-pld \
  --repeats 2 --max-new-tokens 128 --out benchmarks/s8b-cpu-shipped-sweep
