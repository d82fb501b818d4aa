#!/usr/bin/env bash
# Session 8's CPU runs, on the 2-core EPYC with AVX512-BF16 (dtype "auto" = bfloat16): racer's step-attention
# kernel (exact bf16 tree decoding), the argmax/top-k kernel and the RMSNorm kernel. One after another: timings
# need the whole machine. Reports under benchmarks/s8-* and benchmarks/micro/*-s8*.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --no-progress --no-images --capacity auto"
# The cost curve for the new kernels (its key holds their source hash), before any timed decoding.
$P -c "from racer.models import load_model; from racer.costcurve import get_cost_curve; print(get_cost_curve(load_model('default')))"
# sdpa, racer_sdpa (packed PyTorch flash) and racer's step kernel in bfloat16.
{ echo "Command: \`python -m racer.bench.attention --dtype bfloat16 --context 600 --repeats 8 --sizes 1,2,4,8,16,32\` (session 8, AVX512-BF16 CPU)"; echo
  $P -m racer.bench.attention --dtype bfloat16 --context 600 --repeats 8 --sizes 1,2,4,8,16,32; } > benchmarks/micro/attention-bfloat16-ctx600-s8.md
# Spec-Bench, 10 questions per category (130), categories in turn: the benchmark.
$B --data ../shared/data/spec_bench.jsonl --per-category 10 --round-robin --methods ar,tr,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s8-cpu-specbench10
# The shipped prompts, each turn timed 3 times interleaved (median).
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s8-cpu-shipped-r3
# float32 on the same machine and prompts, for the side-by-side.
$B --dtype float32 --data assets/bench_prompts.jsonl --per-category 1 --methods ar,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s8-cpu-shipped-fp32
