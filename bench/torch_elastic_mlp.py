"""PyTorch peer of bench/kill_loop.sh, run by `torchrun --max-restarts N`: the Fashion-MNIST MLP
(784-128-10), Adam 1e-3, global batch 64 = WORLD x 32, one thread per process, DDP over gloo,
each epoch's permutation seeded by the epoch (so a resumed run sees the batches it would have),
and a `torch.save` checkpoint every EVERY steps written by rank 0 to a temporary file and renamed
over the last one (a kill never leaves a torn checkpoint). On start every worker resumes from
that checkpoint, as torchrun's documentation recommends; torchrun restarts every worker of the
group on any failure.

Appends "resumed STEP" (at start) and "at STEP" (every step) to PROGRESS from rank 0, so the
caller can count the steps each failure lost; prints "test_accuracy A" at the end.

Usage: torchrun ... bench/torch_elastic_mlp.py EPOCHS CKPT_DIR EVERY PROGRESS
"""
import gzip
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def main():
    epochs, ckpt_dir, every, progress = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.from_numpy((idx(f"{DIR}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0).astype(np.float32))
    y = torch.from_numpy(idx(f"{DIR}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, eps=1e-7)
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    global_batch, n = 64, x.shape[0]
    per = global_batch // world
    steps_per_epoch = n // global_batch
    log = open(progress, "a", buffering=1) if rank == 0 else None
    if log:
        log.write(f"resumed {step}\n")
    for epoch in range(step // steps_per_epoch, epochs):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        for i in range(step % steps_per_epoch, steps_per_epoch):
            b = perm[i * global_batch + rank * per:i * global_batch + (rank + 1) * per]
            loss = F.cross_entropy(ddp(x[b]), y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if log:
                log.write(f"at {step}\n")
            if rank == 0 and step % every == 0:
                tmp = path + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": step}, tmp)
                os.replace(tmp, path)
    if rank == 0:
        xt = torch.from_numpy((idx(f"{DIR}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0).astype(np.float32))
        yt = torch.from_numpy(idx(f"{DIR}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
        with torch.no_grad():
            acc = (model(xt).argmax(1) == yt).float().mean().item()
        print(f"test_accuracy {acc:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
