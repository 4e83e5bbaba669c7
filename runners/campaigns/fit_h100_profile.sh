#!/usr/bin/env bash
# Refit the shipped H100 profile (models/h100-80gb-fitted.json) from the shipped H100
# measurements, exactly as it ships: run from the repository root. OUT defaults to the
# shipped file; give another path to compare a refit with it.
set -euo pipefail
out=${1:-models/h100-80gb-fitted.json}
data=measurements/h100-2026-11-25
python -m plexus_tune fit --machine-name h100-80gb-fitted --out "$out" --force \
  --kind structure-boosted \
  --spmm "$data/spmm-sweep.jsonl" "$data/structure/spmm-structured-sweep.jsonl" "$data/structure/rmat-spmm-shards.jsonl" \
  --gemm "$data/rmat-gemm-shards.jsonl" --collectives-from perlmutter \
  --elementwise-gbps 2967.7 --memory-bandwidth-gbps 2967.7 --optimizer-runs "$data/trainer-runs.jsonl" \
  --device-memory-gib 79.18 --jobs 1 \
  --description "one NVIDIA H100 80GB HBM3 measured 2026-11-25 (SpMM, GEMM, elementwise and optimizer rates); collectives of the perlmutter profile, not measured here" \
  --provenance "elementwise_gbps=device-to-device copy of 1 GiB (bytes read + written over the min of CUDA-event samples) measured on the H100: $data/env.json copy_gbps_read_plus_write" \
               "memory_bandwidth_gbps=the same measured copy rate ($data/env.json copy_gbps_read_plus_write)" \
               "device_memory_gib=85,017,493,504 bytes of the H100 as torch reports them ($data/env.json device_memory_bytes)"
