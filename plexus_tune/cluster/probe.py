"""Collective bandwidth and latency probe for a torchrun-started job (gloo, CPU).

Run by torchrun on every node (see :func:`plexus_tune.launch.emulated.run_torchrun`)::

    python -m plexus_tune.cluster.probe --out DIR --message-bytes 16777216

Times each op for (a) a pair of ranks on two nodes (rank 0 and the first rank of
node 1) and (b) a pair on one node (ranks 0 and 1), and a small-message
send/recv ping-pong across nodes.  Bandwidths follow the nccl-tests
conventions, for a buffer of M bytes on g ranks and time t:
``algbw = M / t``; all-reduce ``busbw = algbw * 2 (g - 1) / g``;
all-gather and reduce-scatter ``busbw = algbw * (g - 1) / g`` (M is the full
gathered buffer).  GB/s = 1e9 bytes/s.  Every rank writes ``DIR/rank<r>.json``.

``--loop-s S`` then all-reduces a small buffer on all ranks for S seconds (a
stand-in for training steps; used to cut a link mid-run); each rank first
creates ``DIR/rank<r>.loop``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def busbw_factor(op: str, ranks: int) -> float:
    """nccl-tests bus-bandwidth factor of ``op`` on ``ranks`` ranks."""
    if op == "all_reduce":
        return 2.0 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    raise ValueError(f"unknown op {op!r}; use one of {', '.join(OPS)}")


def _time_op(dist, torch, op: str, group, ranks: list[int], message_bytes: int, iters: int, warmup: int) -> list[float]:
    g = len(ranks)
    elements = max(g, message_bytes // 4 // g * g)
    full = torch.ones(elements, dtype=torch.float32)
    shard = torch.ones(elements // g, dtype=torch.float32)
    times = []
    for i in range(warmup + iters):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if op == "all_reduce":
            dist.all_reduce(full, group=group)
        elif op == "all_gather":
            dist.all_gather_into_tensor(full, shard, group=group)
        else:
            dist.reduce_scatter_tensor(shard, full, group=group)
        t = time.perf_counter() - t0
        if i >= warmup:
            times.append(t)
    return times


def _pingpong_us(dist, torch, group, a: int, b: int, rank: int, rounds: int) -> list[float]:
    x = torch.zeros(1)
    rtts = []
    dist.barrier(group=group)
    for _ in range(rounds):
        t0 = time.perf_counter()
        if rank == a:
            dist.send(x, dst=b)
            dist.recv(x, src=b)
        else:
            dist.recv(x, src=a)
            dist.send(x, dst=a)
        rtts.append((time.perf_counter() - t0) * 1e6)
    return rtts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexus_tune.cluster.probe")
    parser.add_argument("--out", required=True, help="directory for rank<r>.json")
    parser.add_argument("--message-bytes", type=int, default=16 << 20)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--ops", default="all_reduce", help=f"comma list of {', '.join(OPS)}")
    parser.add_argument("--pingpong-rounds", type=int, default=20)
    parser.add_argument("--loop-s", type=float, default=0.0)
    parser.add_argument("--timeout-s", type=float, default=60.0, help="gloo timeout")
    args = parser.parse_args(argv)
    ops = [op for op in args.ops.split(",") if op]
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        parser.error(f"--ops: unknown {', '.join(unknown) or '(none given)'}; use a comma list of {', '.join(OPS)}")
    if args.message_bytes < 8 or args.iters < 1 or args.warmup < 0:
        parser.error("--message-bytes must be >= 8, --iters >= 1 and --warmup >= 0")

    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    node = int(os.environ.get("PLEXUS_TUNE_NODE", rank // local_world))
    nodes = world // local_world
    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "local_world_size": local_world,
        "node": node,
        "group_rank": int(os.environ.get("GROUP_RANK", -1)),
        "host": socket.gethostname(),
        "cluster": os.environ.get("PLEXUS_TUNE_CLUSTER"),
        "gloo_socket_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "results": [],
    }
    pairs = []
    if nodes >= 2:
        pairs.append(("inter_node", [0, local_world]))
    if local_world >= 2:
        pairs.append(("intra_node", [0, 1]))
    groups = {name: dist.new_group(ranks) for name, ranks in pairs}
    for name, ranks in pairs:
        if rank in ranks:
            for op in ops:
                times = _time_op(dist, torch, op, groups[name], ranks, args.message_bytes, args.iters, args.warmup)
                t = statistics.median(times)
                algbw = args.message_bytes / t / 1e9
                record["results"].append({
                    "pair": name,
                    "ranks": ranks,
                    "op": op,
                    "message_bytes": args.message_bytes,
                    "times_s": times,
                    "time_s": t,
                    "algbw_gbps": algbw,
                    "busbw_gbps": algbw * busbw_factor(op, len(ranks)),
                })
        dist.barrier()
    if nodes >= 2 and args.pingpong_rounds > 0:
        ranks = [0, local_world]
        if rank in ranks:
            rtts = _pingpong_us(dist, torch, groups["inter_node"], ranks[0], ranks[1], rank, args.pingpong_rounds)
            record["pingpong"] = {"ranks": ranks, "rtt_us": rtts, "rtt_us_median": statistics.median(rtts),
                                  "rtt_us_min": min(rtts)}
        dist.barrier()
    if args.loop_s > 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.loop"), "w") as fh:
            fh.write(f"{time.time()}\n")
        x = torch.ones(1024)
        end = time.monotonic() + args.loop_s
        steps = 0
        while True:
            # All ranks stop on the same step: the minimum of "time left" flags.
            flag = torch.tensor([1.0 if time.monotonic() < end else 0.0])
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            if flag.item() == 0.0:
                break
            dist.all_reduce(x)
            steps += 1
            time.sleep(0.01)
        record["loop_steps"] = steps
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(record, fh, indent=1)
    os.replace(path + ".tmp", path)
    for item in record["results"]:
        print(f"rank {rank} node {node} {item['pair']} {item['op']} {item['message_bytes']} B: "
              f"busbw {item['busbw_gbps']:.4f} GB/s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
