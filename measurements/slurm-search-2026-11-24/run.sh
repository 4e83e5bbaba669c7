#!/bin/bash
# exhaustive sweep vs measured search, both through the local Slurm (submitted from outside an allocation)
set -x
cd "$(dirname "$0")/../.."
export PYTHONPATH=$PWD
PT="${PYTHON:-python3} -m plexus_tune"
OUT=measurements/slurm-search-2026-11-24
mkdir -p $OUT
GRAPH="rmat:nodes=4096,edges=32768,features=32,classes=4,seed=5"
COMMON="--graph $GRAPH --layers 3 --hidden 32 --epochs 10 --warmup 2 --launcher slurm"
for g in 2 3 4; do
  $PT measure $COMMON --gpus $g --grids all --trials 3 --log $OUT/sweep.jsonl || exit 1
done
$PT search --measured $COMMON --gpus 2..4 --trials 8 --workers 2 --machine measurements/cpu-gloo-2026-11-23/profiles/cpu-gloo-2core-fitted-2026-11-23.json \
   --log $OUT/search.jsonl --storage sqlite:///$OUT/studies.db --study slurm-search --top 12
