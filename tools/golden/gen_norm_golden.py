#!/usr/bin/python3
"""Golden values for dtrain's activations and normalization layers, computed with PyTorch.

Writes tests/golden/norm_golden.json, which tests/nn/normalization_golden_test.cc compares
dtrain against (forward values and gradients, 1e-5 relative). Covers every activation of
dtrain/ops/activations.h standalone and fused into Dense where the derivative needs the
pre-activation (gelu, swish), BatchNormalization in training mode (output, gradients and the
updated moving statistics) and inference mode, channels-last (axis -1) and channels-first
(axis 1), and LayerNormalization over the last axis and over the last two.

Regenerate (from the repository root, with Debian's python3-torch 1.13):

    /usr/bin/python3 tools/golden/gen_norm_golden.py

Layout: Keras is channels-last (NHWC) and normalizes over every axis but `axis`; torch's
batch_norm takes NCHW, so the channels-last case is cross-checked against F.batch_norm after
permuting NHWC -> NCHW. The moving variance is updated with the biased batch variance (Keras 3;
torch's running_var uses the unbiased one, so it is computed explicitly). Inputs are float32
values; expected values are computed in float64 from them.
"""

import json
import math
import os
import sys

import torch
import torch.nn.functional as F

SEED = 20261201
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "norm_golden.json")

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def f32(x):
    return float(torch.tensor(x, dtype=torch.float32).item())


def enc(t):
    t = t.detach()
    return {"shape": list(t.shape), "dtype": "float32",
            "data": [float(v) for v in t.reshape(-1).tolist()]}


def check_close(a, b, what, rtol=1e-9, atol=1e-12):
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        sys.exit(f"cross-check failed for {what}")


SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717

ACTS = {
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "gelu": lambda x: 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_approximate": lambda x: 0.5 * x * (1.0 + torch.tanh(
        math.sqrt(2.0 / math.pi) * (x + f32(0.044715) * x ** 3))),
    "swish": lambda x: x * torch.sigmoid(x),
    "leaky_relu": lambda x: torch.where(x > 0, x, f32(0.2) * x),
    "elu": lambda x: torch.where(x > 0, x, torch.expm1(x)),
    "selu": lambda x: SELU_SCALE * torch.where(x > 0, x, SELU_ALPHA * torch.expm1(x)),
    "softplus": F.softplus,
    "softsign": lambda x: x / (1.0 + x.abs()),
    "hard_sigmoid": lambda x: torch.clamp(x + 3.0, 0.0, 6.0) / 6.0,
    "exponential": torch.exp,
    "relu6": lambda x: torch.clamp(x, 0.0, 6.0),
}

# Cross-checks against torch's built-ins where they exist.
CROSS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_approximate": lambda x: F.gelu(x, approximate="tanh"),
    "swish": F.silu,
    "elu": F.elu,
    "selu": F.selu,
    "softsign": F.softsign,
    "hard_sigmoid": F.hardsigmoid,
    "relu6": F.relu6,
}


def activations():
    out = []
    for name, fn in ACTS.items():
        x = uniform((4, 6), -4.0, 4.0).requires_grad_(True)
        r = uniform((4, 6), 0.5, 1.5)
        y = fn(x)
        if name in CROSS:
            check_close(y, CROSS[name](x), name, rtol=1e-6 if name == "gelu_approximate" else 1e-9)
        (g,) = torch.autograd.grad((y * r).sum(), x)
        out.append({"name": name, "x": enc(x), "r": enc(r), "y": enc(y), "dx": enc(g)})
    return out


def dense():
    out = []
    for name in ["gelu", "gelu_approximate", "swish", "elu", "leaky_relu"]:
        x = uniform((3, 4)).requires_grad_(True)
        w = uniform((4, 5)).requires_grad_(True)
        b = uniform((5,)).requires_grad_(True)
        r = uniform((3, 5), 0.5, 1.5)
        y = ACTS[name](x @ w + b)
        gx, gw, gb = torch.autograd.grad((y * r).sum(), [x, w, b])
        out.append({"activation": name, "x": enc(x), "kernel": enc(w), "bias": enc(b), "r": enc(r),
                    "y": enc(y), "dx": enc(gx), "dkernel": enc(gw), "dbias": enc(gb)})
    return out


def batch_norm():
    out = []
    eps, momentum = f32(1e-3), f32(0.9)
    for axis, shape in [(-1, (4, 3, 2, 5)), (1, (4, 3, 2, 2)), (-1, (6, 4))]:
        ax = axis % len(shape)
        c = shape[ax]
        x = uniform(shape, -2.0, 3.0).requires_grad_(True)
        gamma = uniform((c,), 0.5, 1.5).requires_grad_(True)
        beta = uniform((c,), -0.5, 0.5).requires_grad_(True)
        mm = uniform((c,), -0.2, 0.2)
        mv = uniform((c,), 0.5, 1.5)
        r = uniform(shape, 0.5, 1.5)
        dims = [d for d in range(len(shape)) if d != ax]
        bshape = [1] * len(shape)
        bshape[ax] = c
        mean = x.mean(dim=dims)
        var = ((x - mean.reshape(bshape)) ** 2).mean(dim=dims)
        y = (x - mean.reshape(bshape)) / torch.sqrt(var.reshape(bshape) + eps) * \
            gamma.reshape(bshape) + beta.reshape(bshape)
        # Cross-check with torch (NCHW): move the channel axis to position 1.
        perm = [0, ax] + [d for d in range(1, len(shape)) if d != ax]
        ref = F.batch_norm(x.permute(perm), None, None, gamma, beta, training=True, eps=eps)
        check_close(y.permute(perm), ref, "batch_norm train", rtol=1e-7, atol=1e-9)
        gx, gg, gb = torch.autograd.grad((y * r).sum(), [x, gamma, beta])
        new_mm = mm * momentum + mean.detach() * (1 - momentum)
        new_mv = mv * momentum + var.detach() * (1 - momentum)
        # Inference with the updated moving statistics.
        xi = uniform(shape, -2.0, 3.0).requires_grad_(True)
        gi = gamma.detach().clone().requires_grad_(True)
        bi = beta.detach().clone().requires_grad_(True)
        mmf, mvf = new_mm.to(torch.float32).to(torch.float64), new_mv.to(torch.float32).to(
            torch.float64)
        yi = (xi - mmf.reshape(bshape)) / torch.sqrt(mvf.reshape(bshape) + eps) * \
            gi.reshape(bshape) + bi.reshape(bshape)
        gxi, ggi, gbi = torch.autograd.grad((yi * r).sum(), [xi, gi, bi])
        out.append({"axis": axis, "epsilon": eps, "momentum": momentum, "x": enc(x),
                    "gamma": enc(gamma), "beta": enc(beta), "moving_mean": enc(mm),
                    "moving_variance": enc(mv), "r": enc(r), "y": enc(y), "dx": enc(gx),
                    "dgamma": enc(gg), "dbeta": enc(gb), "new_moving_mean": enc(new_mm),
                    "new_moving_variance": enc(new_mv), "x_infer": enc(xi), "y_infer": enc(yi),
                    "dx_infer": enc(gxi), "dgamma_infer": enc(ggi), "dbeta_infer": enc(gbi)})
    return out


def layer_norm():
    out = []
    eps = f32(1e-3)
    for axes, shape in [([-1], (3, 4, 6)), ([-2, -1], (2, 3, 4)), ([-1], (5, 8))]:
        norm_shape = shape[len(shape) - len(axes):]
        x = uniform(shape, -2.0, 3.0).requires_grad_(True)
        gamma = uniform(norm_shape, 0.5, 1.5).requires_grad_(True)
        beta = uniform(norm_shape, -0.5, 0.5).requires_grad_(True)
        r = uniform(shape, 0.5, 1.5)
        y = F.layer_norm(x, norm_shape, gamma, beta, eps=eps)
        dims = list(range(len(shape) - len(axes), len(shape)))
        mean = x.mean(dim=dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=dims, keepdim=True)
        check_close(y, (x - mean) / torch.sqrt(var + eps) * gamma + beta, "layer_norm",
                    rtol=1e-7, atol=1e-9)
        gx, gg, gb = torch.autograd.grad((y * r).sum(), [x, gamma, beta])
        out.append({"axis": axes, "epsilon": eps, "x": enc(x), "gamma": enc(gamma),
                    "beta": enc(beta), "r": enc(r), "y": enc(y), "dx": enc(gx), "dgamma": enc(gg),
                    "dbeta": enc(gb)})
    return out


def main():
    doc = {"generator": "tools/golden/gen_norm_golden.py", "torch": torch.__version__,
           "seed": SEED, "activations": activations(), "dense": dense(),
           "batch_norm": batch_norm(), "layer_norm": layer_norm()}
    with open(OUT, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
