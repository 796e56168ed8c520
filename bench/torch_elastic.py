"""PyTorch peer of bench/kill_loop.sh, run by `torchrun --max-restarts N`, one thread per process,
DDP over gloo, a `torch.save` checkpoint every EVERY steps written by rank 0 to a temporary file
and renamed over the last one (a kill never leaves a torn checkpoint). On start every worker
resumes from that checkpoint, as torchrun's documentation recommends; torchrun restarts every
worker of the group on any failure. Each epoch's batches are seeded by the epoch, so a resumed run
sees the batches it would have. Two jobs, as kill_loop.sh's JOB:
  mlp: the Fashion-MNIST MLP (784-128-10), Adam 1e-3, global batch 64 = WORLD x 32, full epochs;
       prints the test accuracy.
  lm:  the char GPT of bench/torch_gpt.py on CORPUS (2 blocks, d_model 64, 4 heads, context 64),
       AdamW 1e-3 with clip_grad_norm_ 1.0, global batch 16 = WORLD x 8 windows, STEPS steps per
       epoch (0: one pass over the training windows);
       prints the next-character accuracy on the last 1% of the text.

Appends "resumed STEP" (at start) and "at STEP" (every step) to PROGRESS from rank 0, so the
caller can count the steps each failure lost; prints "test_accuracy A" at the end.

Usage: torchrun ... bench/torch_elastic.py JOB EPOCHS CKPT_DIR EVERY PROGRESS [STEPS CORPUS]
"""
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

DIR = "/usr/share/datasets/fashion-mnist"


def idx(path, offset):
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def images(name):
    raw = idx(f"{DIR}/{name}-images-idx3-ubyte.gz", 16).reshape(-1, 784) / 255.0
    return torch.from_numpy(raw.astype(np.float32)), torch.from_numpy(
        idx(f"{DIR}/{name}-labels-idx1-ubyte.gz", 8).astype(np.int64))


class MlpJob:
    def __init__(self, rank, world):
        self.x, self.y = images("train")
        self.model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, 10))
        self.opt_class, self.opt_args, self.clip = torch.optim.Adam, dict(lr=1e-3, eps=1e-7), None
        self.global_batch, self.rank, self.per = 64, rank, 64 // world
        self.steps_per_epoch = self.x.shape[0] // self.global_batch

    def batch(self, epoch, i):
        if getattr(self, "epoch", None) != epoch:
            n = self.x.shape[0]
            self.epoch = epoch
            self.perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch))
        start = i * self.global_batch + self.rank * self.per
        b = self.perm[start:start + self.per]
        return self.x[b], self.y[b]

    def loss(self, out, y):
        return F.cross_entropy(out, y)

    def accuracy(self):
        xt, yt = images("t10k")
        return (self.model(xt).argmax(1) == yt).float().mean().item()


class LmJob:
    context, global_batch = 64, 16

    def __init__(self, rank, world, steps, corpus):
        from torch_gpt import GPT
        text = open(corpus, encoding="utf-8", errors="replace").read()
        vocab = sorted(set(text))
        index = {c: i for i, c in enumerate(vocab)}
        self.ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        self.train_windows = int((len(self.ids) - 1) * 0.99) // self.context
        self.model = GPT(len(vocab), self.context, 2, 64, 4)
        self.opt_class, self.opt_args, self.clip = torch.optim.AdamW, dict(lr=1e-3, eps=1e-7), 1.0
        # steps 0: one pass over the training windows per epoch (kill_loop.sh's STEPS=0)
        self.rank, self.per = rank, self.global_batch // world
        self.steps_per_epoch = steps if steps > 0 else self.train_windows // self.global_batch

    def windows(self, starts):
        x = torch.stack([self.ids[s:s + self.context] for s in starts])
        y = torch.stack([self.ids[s + 1:s + self.context + 1] for s in starts])
        return x, y

    def batch(self, epoch, i):
        g = torch.Generator().manual_seed(epoch * 100003 + i)
        starts = torch.randint(0, self.train_windows, (self.global_batch,), generator=g)
        return self.windows((starts * self.context)[self.rank * self.per:(self.rank + 1) * self.per])

    def loss(self, out, y):
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def accuracy(self):
        first = self.train_windows * self.context
        starts = range(first, len(self.ids) - self.context - 1, self.context)
        x, y = self.windows(list(starts))
        return (self.model(x).argmax(-1) == y).float().mean().item()


def main():
    job_name, epochs, ckpt_dir, every, progress = sys.argv[1], int(sys.argv[2]), sys.argv[3], \
        int(sys.argv[4]), sys.argv[5]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    job = MlpJob(rank, world) if job_name == "mlp" else LmJob(rank, world, int(sys.argv[6]),
                                                               sys.argv[7])
    model = job.model
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = job.opt_class(ddp.parameters(), **job.opt_args)
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = state["step"]
    log = open(progress, "a", buffering=1) if rank == 0 else None
    if log:
        log.write(f"resumed {step}\n")
    for epoch in range(step // job.steps_per_epoch, epochs):
        for i in range(step % job.steps_per_epoch, job.steps_per_epoch):
            x, y = job.batch(epoch, i)
            loss = job.loss(ddp(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if job.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.clip)
            opt.step()
            step += 1
            if log:
                log.write(f"at {step} {time.time():.6f}\n")
            if rank == 0 and step % every == 0:
                tmp = path + ".tmp"
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "step": step}, tmp)
                os.replace(tmp, path)
    if rank == 0:
        with torch.no_grad():
            print(f"test_accuracy {job.accuracy():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
