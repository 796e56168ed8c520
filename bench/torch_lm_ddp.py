"""PyTorch peer of bench/lm_scale.sh: the char GPT of bench/torch_lm_tokens.py (torch_gpt.GPT)
under DistributedDataParallel, WORLD processes on loopback (gloo), one thread each, global batch
BATCH = WORLD x (BATCH / WORLD), AdamW 3e-4 and clip_grad_norm_ 1.0; with ZERO=1 the optimizer is
torch.distributed.optim.ZeroRedundancyOptimizer (AdamW's state partitioned across the ranks).
Prints, from rank 0, `step_seconds_median S`, `tokens_per_second T` (steps after the first two)
and, for every rank, `optimizer_state_bytes_rank<r> B`: the bytes of the AdamW moments
(exp_avg, exp_avg_sq) that rank holds, the quantity dtrain reports as optimizer_slot_bytes.

Usage (Debian's interpreter, python3-torch):
  /usr/bin/python3 bench/torch_lm_ddp.py CORPUS STEPS CONTEXT LAYERS D_MODEL HEADS BATCH WORLD ZERO
"""
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

from torch_gpt import GPT


def moment_bytes(opt):
    local = opt.optim if isinstance(opt, ZeroRedundancyOptimizer) else opt
    total = 0
    for state in local.state.values():
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                total += state[key].numel() * state[key].element_size()
    return total


def worker(rank, world, args, port, out):
    corpus, steps, context, layers, d, heads, batch, zero = args
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    text = open(corpus, encoding="utf-8", errors="replace").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n_windows = (len(ids) - 1) // context
    model = DistributedDataParallel(GPT(len(vocab), context, layers, d, heads))
    kwargs = dict(lr=3e-4, weight_decay=0.004, eps=1e-7)
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **kwargs)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    per = batch // world
    g = torch.Generator().manual_seed(1)
    times = []
    for _ in range(steps):
        starts = torch.randint(0, n_windows, (batch,), generator=g) * context
        mine = starts[rank * per:(rank + 1) * per]
        x = torch.stack([ids[s:s + context] for s in mine])
        y = torch.stack([ids[s + 1:s + context + 1] for s in mine])
        dist.barrier()
        t0 = time.perf_counter()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, len(vocab)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    step = torch.tensor([statistics.median(times[2:])])
    dist.all_reduce(step, op=dist.ReduceOp.MAX)  # the slowest rank's median sets the pace
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([moment_bytes(opt)]))
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"params {sum(p.numel() for p in model.parameters())}\n")
            f.write(f"step_seconds_median {step.item():.4f}\n")
            f.write(f"tokens_per_second {per * world * context / step.item():.0f}\n")
            for r, s in enumerate(sizes):
                f.write(f"optimizer_state_bytes_rank{r} {s.item()}\n")
    dist.destroy_process_group()


def main():
    corpus = sys.argv[1]
    steps, context, layers, d, heads, batch, world, zero = map(int, sys.argv[2:10])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = f"/tmp/torch_lm_ddp.{os.getpid()}"
    args = (corpus, steps, context, layers, d, heads, batch, zero)
    mp.spawn(worker, args=(world, args, port, out), nprocs=world, join=True)
    sys.stdout.write(open(out).read())
    os.remove(out)


if __name__ == "__main__":
    main()
