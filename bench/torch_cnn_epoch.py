"""PyTorch peer of bench/cnn_epoch.cc: the same CNN, data, batch, optimizer and thread count.
(PyTorch 1.13 on CPU runs its convolutions through oneDNN.)

Run with Debian's interpreter, which has python3-torch:
  /usr/bin/python3 bench/torch_cnn_epoch.py [epochs] [threads] [flush_denormal] [seed] [world]
                                            [steps_per_epoch]
flush_denormal 1 runs with torch.set_flush_denormal(True) (FTZ|DAZ, as dtrain by default);
0 (the default) is PyTorch's default. world > 1 trains with DistributedDataParallel (gloo on
loopback), `world` processes of `threads` threads, the global batch of 64 split as in
bench/torch_ddp_epoch.py (the same permutation on every rank, each global batch strided by rank).
Prints the same "key value" lines as the dtrain program (from rank 0; peak RSS is the largest
rank's). steps_per_epoch > 0 stops each epoch after that many steps (0: the whole epoch), as
bench_cnn_epoch's and `dtrain fit --steps-per-epoch`.
"""
import gzip
import os
import resource
import socket
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


def train(rank, world, epochs, threads, flush, seed, port, steps=0):
    torch.set_num_threads(threads)
    if flush and not torch.set_flush_denormal(True):
        sys.exit("torch.set_flush_denormal(True): not supported on this CPU")
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(seed)
    x_train = torch.from_numpy((idx(f"{DIR}/train-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0).astype(np.float32))
    y_train = torch.from_numpy(idx(f"{DIR}/train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    x_test = torch.from_numpy((idx(f"{DIR}/t10k-images-idx3-ubyte.gz", 16).reshape(-1, 1, 28, 28) / 255.0).astype(np.float32))
    y_test = torch.from_numpy(idx(f"{DIR}/t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))

    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                          nn.ReLU(), nn.Linear(128, 10))
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, eps=1e-7)
    n, batch = x_train.shape[0], 64
    per = batch // world
    times, cpu_times = [], []
    for epoch in range(epochs):
        if world > 1:
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
            dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        if world == 1:
            perm = torch.randperm(n)
        total, seen = 0.0, 0
        last = n if world == 1 else n - batch + 1
        if steps > 0:
            last = min(last, steps * batch)
        for i in range(0, last, batch):
            idx_b = perm[i:i + batch] if world == 1 else perm[i + rank * per:i + (rank + 1) * per]
            xb, yb = x_train[idx_b], y_train[idx_b]
            loss = F.cross_entropy(net(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.item() * xb.shape[0]
            seen += xb.shape[0]
        if world > 1:
            dist.barrier()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    if world > 1:
        dist.all_reduce(rss, op=dist.ReduceOp.MAX)
    if rank != 0:
        dist.destroy_process_group()
        return
    start = time.perf_counter()
    correct = 0
    with torch.no_grad():
        for i in range(0, x_test.shape[0], batch):
            correct += (model(x_test[i:i + batch]).argmax(1) == y_test[i:i + batch]).sum().item()
    eval_seconds = time.perf_counter() - start
    for i, t in enumerate(times):
        print(f"epoch_{i + 1}_seconds {t:.4f}")
        print(f"epoch_{i + 1}_cpu_seconds {cpu_times[i]:.4f}")
    steady = sorted(times[1:] if len(times) > 1 else times)
    steady_cpu = sorted(cpu_times[1:] if len(cpu_times) > 1 else cpu_times)
    print(f"flush_denormal {int(flush)}")
    print(f"threads {threads}")
    print(f"world {world}")
    print(f"epoch_seconds_median {steady[len(steady) // 2]:.4f}")
    print(f"epoch_cpu_seconds_median {steady_cpu[len(steady_cpu) // 2]:.4f}")
    print(f"evaluate_seconds {eval_seconds:.4f}")
    print(f"test_accuracy {correct / x_test.shape[0]:.4f}")
    print(f"train_loss_last_epoch {total / seen:.4f}")
    print(f"peak_rss_mib {rss.item():.1f}", flush=True)
    if world > 1:
        dist.destroy_process_group()


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    flush = len(sys.argv) > 3 and sys.argv[3] == "1"
    seed = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    world = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    steps = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    if world == 1:
        train(0, 1, epochs, threads, flush, seed, 0, steps)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(train, args=(world, epochs, threads, flush, seed, port, steps), nprocs=world,
             join=True)


if __name__ == "__main__":
    main()
