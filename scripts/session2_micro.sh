#!/usr/bin/env bash
# The forward-time and per-step profiles behind docs/PERFORMANCE.md (run after the benchmark runs).
set -u
P=.venv/bin/python
mkdir -p benchmarks/micro
$P -m racer.bench.kernels --dtype float32 > benchmarks/micro/kernels-float32.md
$P -m racer.bench.kernels --dtype bfloat16 --repeats 6 > benchmarks/micro/kernels-bfloat16.md
$P -m racer.bench.dtypes --repeats 7 --sizes 1,2,4,8,16,32,64 > benchmarks/micro/dtypes.md
$P -m racer.bench.profile --methods ar,pld,tr,racer --capacity auto > benchmarks/micro/profile-auto.md
$P -m racer.bench.profile --methods tr,racer --capacity 64 --max-new-tokens 64 > benchmarks/micro/profile-cap64.md
