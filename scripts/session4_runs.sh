#!/usr/bin/env bash
# Session 4's CPU runs (in-place KV cache, last-occurrence prefill, periodic lookup chain), one
# after another: timings need the whole machine. Reports under benchmarks/s4-* and benchmarks/micro.
set -u
P=.venv/bin/python
B="$P -m racer.bench --turns first --dtype float32 --no-progress --no-images --capacity auto"
$P -m racer.bench.kvcache --context 1000 --repeats 9 --sizes 1,2,4,8,16 > benchmarks/micro/kvcache-ctx1000.md
$P -m racer.bench.kvcache --context 300 --repeats 9 --sizes 1,2,4,8,16 > benchmarks/micro/kvcache-ctx300.md
$P -m racer.bench.dtypes --context 300 --repeats 9 --sizes 1,2,4,8,16 > benchmarks/micro/dtypes-ctx300.md
# The shipped prompts, with a fixed-capacity sweep in the same interleaved run (method@capacity).
$B --data assets/bench_prompts.jsonl --per-category 1 --max-new-tokens 128 \
  --methods ar,tr,racer,hf-pld,racer@4,racer@8,racer@16,racer@32,racer@64 --out benchmarks/s4-cpu-shipped-sweep
# Spec-Bench, 10 questions per category (130), categories in turn so a stopped run stays balanced.
$B --data ../shared/data/spec_bench.jsonl --per-category 10 --round-robin --methods ar,tr,racer,hf-pld \
  --max-new-tokens 256 --out benchmarks/s4-cpu-specbench10
# bfloat16 on the shipped prompts (this CPU has no native bf16; compare with the float32 sweep run above).
$P -m racer.bench --turns first --dtype bfloat16 --no-progress --no-images --capacity auto \
  --data assets/bench_prompts.jsonl --per-category 1 --max-new-tokens 128 --methods ar,tr,racer,hf-pld \
  --out benchmarks/s4-cpu-shipped-bf16
# The shipped prompts again, each turn timed 3 times interleaved (median), to settle the 1.5x line.
$B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer,hf-pld --repeats 3 \
  --max-new-tokens 128 --out benchmarks/s4-cpu-shipped-r3
