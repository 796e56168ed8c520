"""PyTorch peer of bench/checkpoint_throughput.cc: torch.save / torch.load of the same tensors.

The same count and sizes of float32 tensors (a dict of N tensors [rows, 1024], random values),
saved with torch.save (its default zip format) to DIR/torch_bench.pt. "save_sync" opens the file,
calls torch.save on the file object, then f.flush() and os.fsync(f.fileno()) before closing, so
the bytes are on disk as with dtrain's synchronous save (dtrain also renames the temporary file
and fsyncs the directory; torch.save does neither). "save_nosync" is plain torch.save(d, path).
"load" is torch.load(path) with the page cache warm (right after the save), as dtrain's restore
is measured. The file is deleted before each save.

Run with Debian's interpreter, which has python3-torch:
  /usr/bin/python3 bench/checkpoint_torch.py DIR [total_mib] [tensors] [repeats]
"""
import os
import sys
import time

import torch


def median(v):
    return sorted(v)[len(v) // 2]


def series(key, v):
    print(f"{key} {median(v):.4f}")
    print(f"{key}_all " + " ".join(f"{x:.4f}" for x in v))


def main():
    d = sys.argv[1]
    total_mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    torch.set_num_threads(1)
    floats_each = total_mib * (1 << 20) // 4 // n
    g = torch.Generator().manual_seed(0)
    state = {f"v{i}": torch.rand(floats_each // 1024, 1024, generator=g) * 2 - 1 for i in range(n)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    path = os.path.join(d, "torch_bench.pt")
    save_sync, save_nosync, load = [], [], []
    for _ in range(repeats):
        if os.path.exists(path):
            os.remove(path)
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        save_sync.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        loaded = torch.load(path)
        load.append(time.perf_counter() - t0)
        assert torch.equal(loaded["v0"], state["v0"])
        del loaded
        os.remove(path)
        t0 = time.perf_counter()
        torch.save(state, path)
        save_nosync.append(time.perf_counter() - t0)
        os.remove(path)
    print(f"tensors {n}")
    print(f"bytes {nbytes}")
    series("save_sync_seconds", save_sync)
    series("save_nosync_seconds", save_nosync)
    series("load_seconds", load)


if __name__ == "__main__":
    main()
