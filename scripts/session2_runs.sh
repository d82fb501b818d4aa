#!/usr/bin/env bash
# The CPU benchmark runs behind benchmarks/ (one after another: timings need the whole machine).
set -u
B=".venv/bin/python -m racer.bench --turns first --dtype float32 --no-progress"
SB=../shared/data/spec_bench.jsonl
M=ar,pld,tr,racer,hf,hf-pld
$B --data $SB --per-category 2 --methods $M --max-new-tokens 256 --capacity auto --out benchmarks/cpu-specbench-auto
$B --data ../shared/data/human_eval.jsonl --limit 10 --methods $M --max-new-tokens 256 --capacity auto --out benchmarks/cpu-humaneval-auto
$B --data ../shared/data/mgsm.jsonl --limit 10 --methods $M --max-new-tokens 256 --capacity auto --out benchmarks/cpu-mgsm-auto
for C in 8 16 32 64; do
  $B --data assets/bench_prompts.jsonl --per-category 1 --methods ar,tr,racer --max-new-tokens 128 --capacity $C --no-cost-curve --out benchmarks/cpu-sweep/cap$C
done
.venv/bin/python -m racer.bench --turns first --dtype bfloat16 --no-progress --data assets/bench_prompts.jsonl --per-category 1 \
  --methods ar,tr,racer --max-new-tokens 128 --capacity auto --out benchmarks/cpu-shipped-auto-bf16
$B --data $SB --per-category 1 --methods racer,tr,pld --max-new-tokens 256 --capacity 64 --no-cost-curve --out benchmarks/cpu-specbench-cap64-mat
