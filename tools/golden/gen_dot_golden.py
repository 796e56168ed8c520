#!/usr/bin/python3
"""Golden values for dtrain's Dot layer (keras.layers.Dot), computed with PyTorch autograd.

Writes tests/golden/dot_golden.json, which tests/nn/merging_test.cc compares dtrain against
(forward values and the gradients of sum(out * w) for a fixed random w, 1e-5 relative).
Regenerate (from the repository root, with Debian's python3-torch 1.13):

    /usr/bin/python3 tools/golden/gen_dot_golden.py

Keras's batch_dot of x [B, ...] and y [B, ...] along axes (a, b) is, in torch,
torch.tensordot per batch entry: x moved to [B, M, K] (axis a last), y to [B, K, N] (axis b
second), torch.bmm, then the kept dimensions (x's, then y's) restored; two [B, K] inputs give
[B, 1]. normalize=True first applies Keras's l2_normalize(x, axis) = x / sqrt(max(sum(x^2),
1e-12)). Layouts are the same in both (no NHWC/NCHW question: Dot has no weights).
"""

import json
import os

import torch

SEED = 20261212
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "dot_golden.json")
gen = torch.Generator().manual_seed(SEED)


def uniform(shape):
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1).to(torch.float64)


def enc(t):
    t = t.detach()
    return {"shape": list(t.shape), "dtype": "float32", "data": [float(v) for v in t.reshape(-1)]}


def l2_normalize(x, axis):
    return x / torch.sqrt(torch.clamp((x * x).sum(dim=axis, keepdim=True), min=1e-12))


def batch_dot(x, y, a, b):
    bsz, k = x.shape[0], x.shape[a]
    xm = torch.movedim(x, a, -1)
    ym = torch.movedim(y, b, 1)
    kept = list(xm.shape[1:-1]) + list(ym.shape[2:])
    out = torch.bmm(xm.reshape(bsz, -1, k), ym.reshape(bsz, k, -1))
    return out.reshape([bsz] + (kept if kept else [1]))


CASES = [
    # (x shape, y shape, axes, normalize)
    ((3, 5), (3, 5), (1, 1), False),
    ((3, 5), (3, 5), (-1, -1), True),
    ((2, 4, 3), (2, 6, 3), (2, 2), False),
    ((2, 4, 3), (2, 4, 6), (1, 1), True),
    ((2, 3, 4), (2, 4, 5), (2, 1), False),
    ((2, 3, 2, 4), (2, 4, 3), (3, 1), True),
]


def main():
    cases = []
    for xs, ys, axes, normalize in CASES:
        x = uniform(xs).requires_grad_()
        y = uniform(ys).requires_grad_()
        a = axes[0] % len(xs)
        b = axes[1] % len(ys)
        xn, yn = (l2_normalize(x, a), l2_normalize(y, b)) if normalize else (x, y)
        out = batch_dot(xn, yn, a, b)
        w = uniform(tuple(out.shape))
        (out * w).sum().backward()
        cases.append({"axes": list(axes), "normalize": normalize, "x": enc(x), "y": enc(y),
                      "w": enc(w), "out": enc(out), "dx": enc(x.grad), "dy": enc(y.grad)})
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/golden/gen_dot_golden.py", "torch": torch.__version__,
                   "seed": SEED, "dot": cases}, f)


if __name__ == "__main__":
    main()
