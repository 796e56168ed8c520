"""PyTorch DDP peer for the multi-worker benchmark: the Fashion-MNIST MLP (784-128-10), Adam 1e-3,
global batch 64 = WORLD x (64 / WORLD), one thread per process, gloo backend on loopback, the same
permutation on every rank split by DistributedSampler-style striding of each global batch.

Run with Debian's interpreter (python3-torch):
  /usr/bin/python3 bench/torch_ddp_epoch.py [epochs] [world] [flush_denormal]
flush_denormal 1 runs every rank with torch.set_flush_denormal(True) (FTZ|DAZ); 0 (the default) is
PyTorch's default. Prints "key value" lines from rank 0.
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def worker(rank, world, epochs, port, flush):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    if flush and not torch.set_flush_denormal(True):
        sys.exit("torch.set_flush_denormal(True): not supported on this CPU")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    x = torch.from_numpy((idx(f"{DIR}/train-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0).astype(np.float32))
    y = torch.from_numpy(idx(f"{DIR}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xt = torch.from_numpy((idx(f"{DIR}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0).astype(np.float32))
    yt = torch.from_numpy(idx(f"{DIR}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3, eps=1e-7)
    global_batch, n = 64, x.shape[0]
    per = global_batch // world
    times = []
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(epoch)
        perm = torch.randperm(n, generator=g)
        dist.barrier()
        start = time.perf_counter()
        for i in range(0, n - global_batch + 1, global_batch):
            idx_b = perm[i + rank * per:i + (rank + 1) * per]
            loss = F.cross_entropy(ddp(x[idx_b]), y[idx_b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        dist.barrier()
        times.append(time.perf_counter() - start)
    if rank == 0:
        with torch.no_grad():
            acc = (model(xt).argmax(1) == yt).float().mean().item()
        for i, t in enumerate(times):
            print(f"epoch_{i + 1}_seconds {t:.4f}")
        steady = sorted(times[1:] if len(times) > 1 else times)
        print(f"flush_denormal {int(flush)}")
        print(f"epoch_seconds_median {steady[len(steady) // 2]:.4f}")
        print(f"test_accuracy {acc:.4f}", flush=True)
    dist.destroy_process_group()


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    world = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    flush = len(sys.argv) > 3 and sys.argv[3] == "1"
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, epochs, port, flush), nprocs=world, join=True)


if __name__ == "__main__":
    main()
