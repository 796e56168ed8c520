#!/usr/bin/python3
"""Golden values for dtrain's convolutions and pools, computed with PyTorch autograd.

Writes tests/golden/conv_golden.json, which tests/autograd/convolution_gradient_test.cc compares
dtrain against (forward values and the gradients of sum(y * r) for a fixed random r: dx, dW,
db; 1e-5 relative). Regenerate from the repository root with Debian's python3-torch 1.13:

    /usr/bin/python3 tools/golden/gen_conv_golden.py

Inputs are seeded float32 values stored in the JSON; the expected values are computed in float64.

Layout mapping, Keras/TF (what dtrain implements) to PyTorch:
  * activations: Keras NHWC [n, h, w, c]  ->  torch NCHW: x.permute(0, 3, 1, 2); results back
    with .permute(0, 2, 3, 1). Conv1D: NWC [n, l, c] -> NCW: x.permute(0, 2, 1).
  * Conv2D kernel: Keras HWIO [kh, kw, in/groups, out] -> torch OIHW [out, in/groups, kh, kw]:
    w.permute(3, 2, 0, 1). Grouping agrees: output channel o belongs to group o // (out/groups)
    and reads input channels [g*in/groups, (g+1)*in/groups) in both.
  * Conv1D kernel: Keras [k, in/groups, out] -> torch [out, in/groups, k]: w.permute(2, 1, 0).
  * DepthwiseConv2D kernel: Keras [kh, kw, in, depth_multiplier] -> torch groups=in,
    [in*dm, 1, kh, kw]: w.reshape(kh, kw, 1, in*dm).permute(3, 2, 0, 1); Keras's output
    channel c*dm + m is torch's output channel c*dm + m (group c).
  * Conv2DTranspose kernel: Keras [kh, kw, filters, in] -> torch ConvTranspose2d weight
    [in, filters, kh, kw]: w.permute(3, 2, 0, 1) (both are the adjoint of the conv2d whose
    OIHW weight is [in, filters, kh, kw]).
  * TF "same" padding: total = max((out-1)*stride + (k-1)*dilation + 1 - in, 0) with
    out = ceil(in / stride); total // 2 before (top/left), the rest after (bottom/right). torch's
    padding= is symmetric, so the input is padded explicitly with F.pad(left, right, top,
    bottom) and the op runs with padding 0. Causal (Conv1D): (k-1)*dilation on the left.
  * Conv2DTranspose "same": out = in*stride; torch computes the full transposed output
    ((in-1)*stride + (k-1)*dilation + 1) with padding 0, and it is cropped to rows
    [pad_before, pad_before + out) where pad_before is the conv2d "same" padding for an input of
    size out (TF's conv2d_transpose is the gradient of that conv2d).
  * Max pooling "same": padded with -inf. Average pooling "same" (TF divides by the number of
    valid elements): sum over the zero-padded input divided by the same sum over a zero-padded
    tensor of ones.
"""

import json
import math
import os

import torch
import torch.nn.functional as F

SEED = 20261201
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "conv_golden.json")

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def enc(t):
    t = t.detach()
    return {"shape": list(t.shape), "dtype": "float32",
            "data": [float(v) for v in t.reshape(-1).tolist()]}


def same_pads(size, k, s, d):
    out = (size + s - 1) // s
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def pad_nchw(x, padding, kh, kw, sh, sw, dh, dw, value=0.0):
    """Explicit TF padding of an NCHW tensor."""
    if padding == "valid":
        return x
    if padding == "causal":
        return F.pad(x, ((kw - 1) * dw, 0, 0, 0), value=value)
    t, b = same_pads(x.shape[2], kh, sh, dh)
    l, r = same_pads(x.shape[3], kw, sw, dw)
    return F.pad(x, (l, r, t, b), value=value)


cases = []


def record(op, attrs, inputs, y_fn):
    """inputs: dict name -> float64 tensor (leaf). y_fn(inputs) -> NHWC (or NWC) output."""
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    y = y_fn(leaves)
    r = uniform(tuple(y.shape), 0.5, 1.5)
    (y * r).sum().backward()
    c = {"op": op, **attrs, "r": enc(r), "y": enc(y)}
    for k, v in inputs.items():
        c[k] = enc(v)
        c["d" + k] = enc(leaves[k].grad)
    cases.append(c)


def conv2d_case(n, h, w, cin, kh, kw, cout, padding, strides, dilation, groups, bias=True):
    inputs = {"x": uniform((n, h, w, cin)), "w": uniform((kh, kw, cin // groups, cout))}
    if bias:
        inputs["b"] = uniform((cout,))

    def f(v):
        x = pad_nchw(v["x"].permute(0, 3, 1, 2), padding, kh, kw, *strides, *dilation)
        y = F.conv2d(x, v["w"].permute(3, 2, 0, 1), v.get("b"), stride=strides,
                     dilation=dilation, groups=groups)
        return y.permute(0, 2, 3, 1)

    record("conv2d", {"padding": padding, "strides": strides, "dilation": dilation,
                      "groups": groups}, inputs, f)


def conv1d_case(n, l, cin, k, cout, padding, stride, dilation, groups):
    inputs = {"x": uniform((n, l, cin)), "w": uniform((k, cin // groups, cout)),
              "b": uniform((cout,))}

    def f(v):
        x = v["x"].permute(0, 2, 1).unsqueeze(2)  # NCW -> NC1W
        x = pad_nchw(x, padding, 1, k, 1, stride, 1, dilation).squeeze(2)
        y = F.conv1d(x, v["w"].permute(2, 1, 0), v["b"], stride=stride, dilation=dilation,
                     groups=groups)
        return y.permute(0, 2, 1)

    record("conv1d", {"padding": padding, "strides": [1, stride], "dilation": [1, dilation],
                      "groups": groups}, inputs, f)


def depthwise_case(n, h, w, cin, k, dm, padding, stride, dilation):
    inputs = {"x": uniform((n, h, w, cin)), "w": uniform((k, k, cin, dm)),
              "b": uniform((cin * dm,))}

    def f(v):
        x = pad_nchw(v["x"].permute(0, 3, 1, 2), padding, k, k, stride, stride, dilation,
                     dilation)
        wt = v["w"].reshape(k, k, 1, cin * dm).permute(3, 2, 0, 1)
        y = F.conv2d(x, wt, v["b"], stride=stride, dilation=dilation, groups=cin)
        return y.permute(0, 2, 3, 1)

    record("depthwise_conv2d", {"padding": padding, "strides": [stride, stride],
                                "dilation": [dilation, dilation], "groups": cin}, inputs, f)


def transpose_case(n, h, w, cin, k, filters, padding, stride, dilation):
    inputs = {"x": uniform((n, h, w, cin)), "w": uniform((k, k, filters, cin)),
              "b": uniform((filters,))}
    keff = (k - 1) * dilation + 1

    def f(v):
        x = v["x"].permute(0, 3, 1, 2)
        full = F.conv_transpose2d(x, v["w"].permute(3, 2, 0, 1), None, stride=stride,
                                  dilation=dilation)
        if padding == "valid":
            y = full
        else:
            oh, ow = h * stride, w * stride
            t, _ = same_pads(oh, k, stride, dilation)
            l, _ = same_pads(ow, k, stride, dilation)
            y = full[:, :, t:t + oh, l:l + ow]
        y = y + v["b"].reshape(1, -1, 1, 1)
        return y.permute(0, 2, 3, 1)

    assert keff >= 1
    record("conv2d_transpose", {"padding": padding, "strides": [stride, stride],
                                "dilation": [dilation, dilation], "groups": 1}, inputs, f)


def pool_case(kind, n, h, w, c, pool, strides, padding):
    # Distinct values spaced apart, so max pooling has no ties.
    perm = torch.randperm(n * h * w * c, generator=gen).to(torch.float64)
    inputs = {"x": (perm / (n * h * w * c) * 2 - 1).reshape(n, h, w, c)}

    def f(v):
        x = v["x"].permute(0, 3, 1, 2)
        if kind == "max_pool2d":
            xp = pad_nchw(x, padding, pool[0], pool[1], strides[0], strides[1], 1, 1,
                          value=-math.inf)
            y = F.max_pool2d(xp, pool, strides)
        else:
            xp = pad_nchw(x, padding, pool[0], pool[1], strides[0], strides[1], 1, 1)
            ones = pad_nchw(torch.ones_like(x), padding, pool[0], pool[1], strides[0],
                            strides[1], 1, 1)
            y = F.avg_pool2d(xp, pool, strides) / F.avg_pool2d(ones, pool, strides)
        return y.permute(0, 2, 3, 1)

    record(kind, {"padding": padding, "pool": pool, "strides": strides}, inputs, f)


def global_case(kind, shape):
    perm = torch.randperm(math.prod(shape), generator=gen).to(torch.float64)
    inputs = {"x": (perm / math.prod(shape) * 2 - 1).reshape(shape)}

    def f(v):
        flat = v["x"].reshape(shape[0], -1, shape[-1])
        return flat.amax(dim=1) if kind == "global_max_pool" else flat.mean(dim=1)

    record(kind, {}, inputs, f)


for padding in ["valid", "same"]:
    conv2d_case(2, 7, 6, 3, 3, 3, 4, padding, [1, 1], [1, 1], 1)
    conv2d_case(2, 7, 6, 3, 3, 3, 4, padding, [2, 2], [1, 1], 1)
    conv2d_case(1, 8, 7, 2, 4, 3, 3, padding, [3, 2], [1, 1], 1)
    conv2d_case(2, 9, 8, 2, 3, 2, 2, padding, [1, 1], [2, 3], 1)
    conv2d_case(2, 6, 6, 6, 3, 3, 9, padding, [1, 2], [1, 1], 3)
    conv2d_case(1, 5, 5, 4, 2, 2, 3, padding, [1, 1], [1, 1], 1, bias=False)
    depthwise_case(2, 6, 5, 3, 3, 2, padding, 1, 1)
    depthwise_case(2, 7, 7, 3, 3, 1, padding, 2, 1)
    transpose_case(2, 3, 4, 3, 3, 2, padding, 2, 1)
    transpose_case(2, 3, 4, 3, 3, 2, padding, 1, 2)
    pool_case("max_pool2d", 2, 5, 7, 3, [2, 2], [2, 2], padding)
    pool_case("max_pool2d", 2, 5, 7, 3, [3, 3], [2, 1], padding)
    pool_case("avg_pool2d", 2, 5, 7, 3, [2, 2], [2, 2], padding)
    pool_case("avg_pool2d", 2, 5, 7, 3, [3, 2], [1, 2], padding)
for padding in ["valid", "same", "causal"]:
    conv1d_case(2, 9, 4, 3, 4, padding, 1, 1, 1)
    conv1d_case(2, 9, 4, 3, 4, padding, 2, 1, 2)
    conv1d_case(2, 9, 4, 2, 4, padding, 1, 3, 1)
global_case("global_max_pool", (2, 4, 3, 5))
global_case("global_avg_pool", (2, 4, 3, 5))
global_case("global_avg_pool", (2, 6, 5))

with open(OUT, "w") as f:
    json.dump({"generator": "tools/golden/gen_conv_golden.py", "torch": torch.__version__,
               "seed": SEED, "cases": cases}, f)
print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")
