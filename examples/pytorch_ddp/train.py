#!/usr/bin/env python3
"""A stock PyTorch DistributedDataParallel training script.

Nothing in it is agentrt-specific: it is the script one would start with
`torchrun --nproc-per-node 2 train.py`. `agentctl run` starts it the same way,
because every rank gets the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and, for GPU agents, exactly its own
CUDA_VISIBLE_DEVICES.

The task: fit a small MLP to y = sin(3x) + noise, each rank on its own shard of
the data (DistributedSampler); DDP averages gradients across ranks. Rank 0
prints the loss per epoch and, with --out, writes a JSON summary at the end.
"""
import argparse
import datetime
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--out", default="", help="rank 0 writes a JSON summary here")
    parser.add_argument("--timeout-s", type=float, default=300.0,
                        help="a collective a peer never joins fails after this many seconds")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda and local_rank >= torch.cuda.device_count():
        # Two ranks on one GPU: NCCL refuses them ("Duplicate GPU detected").
        raise SystemExit("local rank %d needs a GPU of its own but sees %d; give the agent one "
                         "GPU per rank" % (local_rank, torch.cuda.device_count()))
    backend = "nccl" if use_cuda else "gloo"
    # A collective a peer never joins fails after --timeout-s instead of hanging.
    dist.init_process_group(backend=backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=args.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)

    # The same data set on every rank (same seed); the sampler gives each rank its shard.
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(args.samples, 1, generator=gen) * 2 - 1
    y = torch.sin(3 * x) + 0.05 * torch.randn(args.samples, 1, generator=gen)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)  # identical initial weights (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    start = time.time()
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, count = torch.zeros(2, device=device), 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(ddp(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total[0] += loss.detach() * len(xb)
            total[1] += len(xb)
            count += 1
        dist.all_reduce(total)  # the epoch's mean loss over every rank's samples
        mean = (total[0] / total[1]).item()
        losses.append(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean:.5f} ranks {world} batches/rank {count}", flush=True)

    # The replicas must hold identical weights: DDP's contract.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    spread = flat.clone()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    low = flat.clone()
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    max_weight_diff = (spread - low).abs().max().item()
    if rank == 0:
        summary = {"world_size": world, "backend": backend, "epochs": args.epochs,
                   "first_loss": losses[0], "final_loss": losses[-1],
                   "max_weight_diff": max_weight_diff, "seconds": time.time() - start}
        print(json.dumps(summary), flush=True)
        if args.out:
            tmp = args.out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(summary, f)
            os.replace(tmp, args.out)
    dist.destroy_process_group()
    ok = math.isfinite(losses[-1]) and losses[-1] < losses[0]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
