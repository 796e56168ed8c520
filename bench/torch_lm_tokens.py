#!/usr/bin/python3
"""PyTorch peer of bench/lm_tokens.sh: the same char-level GPT as dtrain's nn::GPT (pre-norm
blocks, nn.MultiheadAttention with a causal mask, exact GELU, learned positions), trained with
AdamW and clip_grad_norm_ on windows of the same text, on THREADS threads (default 1). Prints
`step_seconds_median S` and `tokens_per_second T` (steps after the first two). WORLD > 1 trains
with DistributedDataParallel (gloo on loopback), WORLD processes of THREADS threads, each taking
BATCH / WORLD windows of the global batch (rank 0 prints; tokens are the global batch's); with
ZERO=1 the optimizer is torch.distributed.optim.ZeroRedundancyOptimizer (AdamW's state partitioned
across the ranks). Also prints `optimizer_state_bytes_rank<r> B` for every rank: the bytes of the
AdamW moments (exp_avg, exp_avg_sq) it holds, what dtrain reports as optimizer_slot_bytes.

Usage: torch_lm_tokens.py CORPUS STEPS CONTEXT LAYERS D_MODEL HEADS BATCH [THREADS] [WORLD] [ZERO]
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

from torch_gpt import GPT

corpus, steps, context, layers, d, heads, batch = sys.argv[1:8]
threads = int(sys.argv[8]) if len(sys.argv) > 8 else 1
world = int(sys.argv[9]) if len(sys.argv) > 9 else 1
zero = len(sys.argv) > 10 and sys.argv[10] == "1"
steps, context, layers, d, heads, batch = map(int, (steps, context, layers, d, heads, batch))


def run(rank, port):
    torch.set_num_threads(threads)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)

    text = open(corpus, encoding="utf-8", errors="replace").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n_windows = (len(ids) - 1) // context

    model = GPT(len(vocab), context, layers, d, heads)
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    per = batch // world
    kwargs = dict(lr=3e-4, weight_decay=0.004, eps=1e-7)
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                      **kwargs)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(steps):
        starts = torch.randint(0, n_windows, (batch,), generator=g) * context
        starts = starts[rank * per:(rank + 1) * per]
        x = torch.stack([ids[s:s + context] for s in starts])
        y = torch.stack([ids[s + 1:s + context + 1] for s in starts])
        t0 = time.perf_counter()
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, len(vocab)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    step = statistics.median(times[2:])
    local = opt.optim if zero else opt
    moments = sum(st[k].numel() * st[k].element_size() for st in local.state.values()
                  for k in ("exp_avg", "exp_avg_sq") if k in st)
    sizes = [moments]
    if world > 1:
        gathered = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
        dist.all_gather(gathered, torch.tensor([moments]))
        sizes = [t.item() for t in gathered]
        dist.destroy_process_group()
    if rank != 0:
        finish()
        return
    print(f"params {sum(p.numel() for p in model.parameters())}")
    print(f"vocab {len(vocab)}")
    print(f"final_loss {loss.item():.4f}")
    print(f"step_seconds_median {step:.4f}")
    print(f"tokens_per_second {batch * context / step:.0f}")
    for r, size in enumerate(sizes):
        print(f"optimizer_state_bytes_rank{r} {size}")
    finish()


def finish():
    # Under DDP, PyTorch 1.13 can deadlock at exit: the Reducer's ProcessGroupGloo destructor
    # waits for a mutex its own worker thread holds (seen here: rank 0 hung after printing, one
    # thread spinning, for 10+ minutes). The figures are printed; leave without the teardown.
    if world > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    if world == 1:
        run(0, 0)
    else:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            free_port = sock.getsockname()[1]
        mp.spawn(run, args=(free_port,), nprocs=world)
