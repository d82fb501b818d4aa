#!/usr/bin/env bash
# Session 7's CPU runs, on a 2-core EPYC with AVX512-BF16, where dtype "auto" is bfloat16: the bf16 tiled linear
# kernel and the packed one-token attention. One after another: timings need the whole machine. Reports under
# benchmarks/s7-* and benchmarks/micro/*-bfloat16*.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --no-progress --no-images --capacity auto"
# The cost curve for the new kernel (its key holds the kernel source hash), before any timed decoding.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default')))"
# Whole verify forward per linear kernel in bfloat16 (tiled bf16 against oneDNN packed, small-batch and stock).
{ echo "Command: \`python -m racer.bench.kernels --dtype bfloat16 --context 300 --repeats 8 --sizes 1,2,4,8,16,32\` (session 7, AVX512-BF16 CPU)"; echo
  $P -m racer.bench.kernels --dtype bfloat16 --context 300 --repeats 8 --sizes 1,2,4,8,16,32; } > benchmarks/micro/kernels-tiled-bfloat16.md
# transformers' sdpa against racer_sdpa in bfloat16 (one token now packed too).
{ echo "Command: \`python -m racer.bench.attention --dtype bfloat16 --context 600 --repeats 8 --sizes 1,2,4,8,16\` (session 7)"; echo
  $P -m racer.bench.attention --dtype bfloat16 --context 600 --repeats 8 --sizes 1,2,4,8,16; } > benchmarks/micro/attention-bfloat16-ctx600.md
# The shipped prompts in the default dtype, each turn timed 3 times interleaved (median).
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s7-cpu-shipped-r3
# Spec-Bench, 2 questions per category (26), categories in turn.
$B --data ../shared/data/spec_bench.jsonl --per-category 2 --round-robin --methods ar,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s7-cpu-specbench2
# float32 on the same machine and prompts (the AVX2 tiled kernel), for the side-by-side.
$B --dtype float32 --data assets/bench_prompts.jsonl --per-category 1 --methods ar,racer,hf-pld --max-new-tokens 128 \
  --out benchmarks/s7-cpu-shipped-fp32
# Spec-Bench, 5 questions per category (65), after the runs above.
$B --data ../shared/data/spec_bench.jsonl --per-category 5 --round-robin --methods ar,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s7-cpu-specbench5
