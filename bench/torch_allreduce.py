"""torch.distributed.all_reduce (gloo backend) latency, the peer for bench_allreduce.

Run by bench/allreduce.sh: /usr/bin/python3 torch_allreduce.py RANK WORLD PORT FLOATS ITERS
Rank 0 prints the same "key value" lines as bench_allreduce.
"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, world, port, floats, iters = (int(a) for a in sys.argv[1:6])
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(floats, dtype=torch.float32)
    warmup = max(3, iters // 10)
    ms = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        t1 = time.perf_counter()
        if i >= warmup:
            ms.append((t1 - t0) * 1e3)
    ms.sort()
    med = ms[len(ms) // 2]
    if rank == 0:
        print("impl torch_gloo")
        print(f"floats {floats}\nworld_size {world}\niters {iters}")
        print(f"median_ms {med:.4f}\np10_ms {ms[len(ms) // 10]:.4f}\n"
              f"p90_ms {ms[len(ms) * 9 // 10]:.4f}\ngbps {floats * 4.0 / (med * 1e6):.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
