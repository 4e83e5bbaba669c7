#!/usr/bin/env bash
# Launch `plexus-tune train` with torchrun: one process per GPU, on one node or several.
#
#   runners/examples/torchrun_train.sh NODES GPUS_PER_NODE GRID [train options...]
#
# e.g. on each of 2 nodes (NODE_RANK=0 and 1, same MASTER_ADDR):
#   MASTER_ADDR=node01 NODE_RANK=0 runners/examples/torchrun_train.sh 2 4 2x2x2 \
#       --graph products.plexus --epochs 10 --log measurements/runs.jsonl
#
# Environment: MASTER_ADDR (default 127.0.0.1), MASTER_PORT (29500), NODE_RANK (0),
# BACKEND (nccl; gloo runs on CPUs), TORCHRUN (torchrun), PYTHON (python3).
# NODES * GPUS_PER_NODE must equal the product of GRID.
set -euo pipefail
if [ "$#" -lt 3 ]; then
    echo "usage: $0 NODES GPUS_PER_NODE GRID [plexus-tune train options...]" >&2
    exit 2
fi
NODES=$1
GPUS_PER_NODE=$2
GRID=$3
shift 3
IFS=x read -r GX GY GZ <<<"$GRID"
if [ -z "${GZ:-}" ] || [ $((GX * GY * GZ)) -ne $((NODES * GPUS_PER_NODE)) ]; then
    echo "$0: grid $GRID does not have NODES * GPUS_PER_NODE = $((NODES * GPUS_PER_NODE)) ranks" >&2
    exit 2
fi
# torchrun's own parser would take --log for an abbreviation of its --log-dir
args=()
for a in "$@"; do
    case "$a" in
        --log) args+=(--run-log) ;;
        --log=*) args+=("--run-log=${a#--log=}") ;;
        *) args+=("$a") ;;
    esac
done
exec "${TORCHRUN:-torchrun}" \
    --nnodes "$NODES" --nproc-per-node "$GPUS_PER_NODE" --node-rank "${NODE_RANK:-0}" \
    --master-addr "${MASTER_ADDR:-127.0.0.1}" --master-port "${MASTER_PORT:-29500}" \
    -m plexus_tune train --grid "$GRID" --gpus $((NODES * GPUS_PER_NODE)) --backend "${BACKEND:-nccl}" "${args[@]}"
