#!/usr/bin/python3
"""Golden values for dtrain's nn layer, computed with PyTorch autograd.

Writes tests/golden/nn_golden.json, which tests/nn/golden_test.cc compares dtrain against
(forward values and gradients, 1e-5 relative). Covers the fused dense op for every activation,
each standalone activation and log_softmax, and every loss class of dtrain/nn/losses.h.

Regenerate (from the repository root, with Debian's python3-torch 1.13):

    /usr/bin/python3 tools/golden/gen_nn_golden.py

Inputs come from a seeded torch generator, are rounded to float32 and stored in the JSON; the
expected values are computed in float64 from those float32 inputs, so they are the exact answer
that dtrain's float32 kernels approximate. Keras's loss formulas (keras 2.12 backend) are written
out with torch ops where they differ from torch's built-ins, and cross-checked against the
built-ins where they coincide (the script asserts the agreement).
"""

import json
import os
import re
import sys

import torch
import torch.nn.functional as F

SEED = 20240601
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "nn_golden.json")

# Keras's epsilon and clip bounds as float32 values (what Keras and dtrain compute with).
EPS = float(torch.tensor(1e-7, dtype=torch.float32).item())
ONE_MINUS_EPS = float((torch.tensor(1.0, dtype=torch.float32) -
                       torch.tensor(1e-7, dtype=torch.float32)).item())

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    """float32 uniform values, returned as float64 holding exactly those float32 values."""
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def f32(t):
    """Rounds a float64 tensor to float32 values (kept as float64)."""
    return t.to(torch.float32).to(torch.float64)


def enc(t, dtype="float32"):
    t = t.detach()
    if dtype.startswith("float"):
        data = [float(v) for v in t.reshape(-1).tolist()]
    else:
        data = [int(v) for v in t.reshape(-1).tolist()]
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def check_close(a, b, what, rtol=1e-9, atol=1e-12):
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        sys.exit(f"cross-check failed for {what}: {a} vs {b}")


# ------------------------------------------------------------------------------------------------
# Dense: act(x @ W + b), kernel [in, out] as Keras stores it; gradients of sum(out * R).

ACTS = {
    "linear": lambda z: z,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softmax": lambda z: torch.softmax(z, dim=-1),
}


def dense_case(act, batch=4, n_in=5, n_out=3, with_bias=True):
    x = uniform((batch, n_in), -2, 2).requires_grad_()
    w = uniform((n_in, n_out), -1, 1).requires_grad_()
    b = uniform((n_out,), -0.5, 0.5).requires_grad_() if with_bias else None
    r = uniform((batch, n_out), 0.5, 1.5)
    z = x @ w + (b if with_bias else 0)
    out = ACTS[act](z)
    # Cross-check the linear part against torch's own Linear (weight [out, in]).
    check_close(z, F.linear(x, w.t(), b), f"dense {act} pre-activation")
    (out * r).sum().backward()
    case = {"activation": act, "x": enc(x), "kernel": enc(w), "bias": enc(b) if with_bias else None,
            "r": enc(r), "out": enc(out), "grad_x": enc(x.grad), "grad_kernel": enc(w.grad),
            "grad_bias": enc(b.grad) if with_bias else None}
    return case


# ------------------------------------------------------------------------------------------------
# Standalone activations: gradients of sum(act(x) * R).

STANDALONE = dict(ACTS)
STANDALONE["log_softmax"] = lambda z: torch.log_softmax(z, dim=-1)


def activation_case(name, shape=(3, 6)):
    x = uniform(shape, -3, 3).requires_grad_()
    r = uniform(shape, 0.5, 1.5)
    out = STANDALONE[name](x)
    if name == "log_softmax":
        check_close(out, torch.log(torch.softmax(x, dim=-1)), "log_softmax")
    if name == "sigmoid":
        check_close(out, 1 / (1 + torch.exp(-x)), "sigmoid")
    (out * r).sum().backward()
    return {"name": name, "x": enc(x), "r": enc(r), "out": enc(out), "grad_x": enc(x.grad)}


# ------------------------------------------------------------------------------------------------
# Losses, as Keras 2.12 computes them, reduced with SUM_OVER_BATCH_SIZE (mean over examples).

def keras_mse(y, p):
    return torch.mean(torch.mean(torch.square(p - y), dim=-1))


def keras_sparse_cce(labels, p, from_logits):
    # backend.sparse_categorical_crossentropy: from probabilities, log(clip(p)) is used as
    # logits of tf.nn.sparse_softmax_cross_entropy_with_logits.
    logits = p if from_logits else torch.log(torch.clamp(p, EPS, ONE_MINUS_EPS))
    per_example = -torch.log_softmax(logits, dim=-1).gather(1, labels.view(-1, 1)).view(-1)
    return per_example.mean()


def keras_cce(y, p, from_logits, smoothing):
    classes = p.shape[-1]
    y = y * (1 - smoothing) + smoothing / classes
    if from_logits:
        per_example = -(y * torch.log_softmax(p, dim=-1)).sum(-1)
    else:
        q = p / p.sum(-1, keepdim=True)
        q = torch.clamp(q, EPS, ONE_MINUS_EPS)
        per_example = -(y * torch.log(q)).sum(-1)
    return per_example.mean()


def keras_bce(y, p, from_logits, smoothing):
    y = y * (1 - smoothing) + 0.5 * smoothing
    if from_logits:
        # tf.nn.sigmoid_cross_entropy_with_logits
        elem = torch.clamp(p, min=0) - p * y + torch.log1p(torch.exp(-torch.abs(p)))
    else:
        q = torch.clamp(p, EPS, ONE_MINUS_EPS)
        elem = -(y * torch.log(q + EPS) + (1 - y) * torch.log(1 - q + EPS))
    return torch.mean(torch.mean(elem, dim=-1))


def loss_case(cls, y_true, y_true_dtype, y_pred, fn, from_logits=None, smoothing=None, note=""):
    y_pred = y_pred.detach().clone().requires_grad_()
    loss = fn(y_pred)
    loss.backward()
    case = {"class": cls, "note": note, "y_true": enc(y_true, y_true_dtype), "y_pred": enc(y_pred),
            "loss": float(loss.item()), "grad_y_pred": enc(y_pred.grad)}
    if from_logits is not None:
        case["from_logits"] = from_logits
    if smoothing is not None:
        case["label_smoothing"] = smoothing
    return case


def loss_cases():
    cases = []
    B, C = 6, 4

    # MeanSquaredError: [B, 3] against [B, 3]; [B] against [B, 1].
    y = uniform((B, 3), -1, 1)
    p = uniform((B, 3), -1, 1)
    check_close(keras_mse(y, p), F.mse_loss(p, y), "mse vs F.mse_loss")
    cases.append(loss_case("MeanSquaredError", y, "float32", p, lambda q: keras_mse(y, q)))
    y1 = uniform((B,), -1, 1)
    p1 = uniform((B, 1), -1, 1)
    cases.append(loss_case("MeanSquaredError", y1, "float32", p1,
                           lambda q: keras_mse(y1.view(B, 1), q), note="[B] against [B, 1]"))

    # SparseCategoricalCrossentropy from logits; labels int32 [B].
    labels = torch.randint(0, C, (B,), generator=gen)
    logits = uniform((B, C), -3, 3)
    check_close(keras_sparse_cce(labels, logits, True), F.cross_entropy(logits, labels),
                "sparse cce from logits vs F.cross_entropy")
    cases.append(loss_case("SparseCategoricalCrossentropy", labels, "int32", logits,
                           lambda q: keras_sparse_cce(labels, q, True), from_logits=True))
    # From probabilities (rows summing to 1, nothing clipped); labels uint8 [B, 1].
    probs = f32(torch.softmax(uniform((B, C), -2, 2), dim=-1))
    check_close(keras_sparse_cce(labels, probs, False),
                F.nll_loss(torch.log(probs / probs.sum(-1, keepdim=True)), labels),
                "sparse cce from probabilities vs F.nll_loss")
    cases.append(loss_case("SparseCategoricalCrossentropy", labels.view(B, 1), "uint8", probs,
                           lambda q: keras_sparse_cce(labels, q, False), from_logits=False,
                           note="labels [B, 1] uint8"))
    # From probabilities with exact zeros and ones (clipped) and rows not summing to 1;
    # float32 labels.
    odd = uniform((B, C), 0.05, 0.9)
    odd[0, :] = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    odd[1, int(labels[1])] = 0.0
    cases.append(loss_case("SparseCategoricalCrossentropy", labels.to(torch.float32), "float32",
                           odd, lambda q: keras_sparse_cce(labels, q, False), from_logits=False,
                           note="clipped and unnormalized probabilities, float labels"))

    # CategoricalCrossentropy.
    onehot = F.one_hot(labels, C).to(torch.float64)
    check_close(keras_cce(onehot, logits, True, 0.0), F.cross_entropy(logits, labels),
                "cce from logits vs F.cross_entropy")
    cases.append(loss_case("CategoricalCrossentropy", onehot, "float32", logits,
                           lambda q: keras_cce(onehot, q, True, 0.0), from_logits=True,
                           smoothing=0.0))
    soft = f32(torch.softmax(uniform((B, C), -1, 1), dim=-1))
    check_close(keras_cce(soft, logits, True, 0.2), F.cross_entropy(logits, soft, label_smoothing=0.2),
                "cce from logits with smoothing vs F.cross_entropy")
    cases.append(loss_case("CategoricalCrossentropy", soft, "float32", logits,
                           lambda q: keras_cce(soft, q, True, 0.2), from_logits=True,
                           smoothing=0.2, note="soft labels, label smoothing 0.2"))
    check_close(keras_cce(onehot, probs, False, 0.0),
                F.nll_loss(torch.log(probs / probs.sum(-1, keepdim=True)), labels),
                "cce from probabilities vs F.nll_loss")
    cases.append(loss_case("CategoricalCrossentropy", onehot, "float32", probs,
                           lambda q: keras_cce(onehot, q, False, 0.0), from_logits=False,
                           smoothing=0.0))
    cases.append(loss_case("CategoricalCrossentropy", onehot, "float32", odd,
                           lambda q: keras_cce(onehot, q, False, 0.0), from_logits=False,
                           smoothing=0.0, note="clipped and unnormalized probabilities"))
    cases.append(loss_case("CategoricalCrossentropy", onehot, "float32", probs,
                           lambda q: keras_cce(onehot, q, False, 0.1), from_logits=False,
                           smoothing=0.1, note="label smoothing 0.1"))

    # BinaryCrossentropy: multi-label [B, 3]; [B] labels against [B, 1].
    yb = torch.randint(0, 2, (B, 3), generator=gen).to(torch.float64)
    zb = uniform((B, 3), -4, 4)
    check_close(keras_bce(yb, zb, True, 0.0), F.binary_cross_entropy_with_logits(zb, yb),
                "bce from logits vs F.binary_cross_entropy_with_logits")
    cases.append(loss_case("BinaryCrossentropy", yb, "float32", zb,
                           lambda q: keras_bce(yb, q, True, 0.0), from_logits=True, smoothing=0.0))
    cases.append(loss_case("BinaryCrossentropy", yb, "float32", zb,
                           lambda q: keras_bce(yb, q, True, 0.1), from_logits=True, smoothing=0.1,
                           note="label smoothing 0.1"))
    pb = f32(torch.sigmoid(zb))
    # Keras adds epsilon inside the logs, so it agrees with torch's BCE to about 1e-6 only.
    check_close(keras_bce(yb, pb, False, 0.0), F.binary_cross_entropy(pb, yb),
                "bce from probabilities vs F.binary_cross_entropy", rtol=1e-5, atol=1e-7)
    cases.append(loss_case("BinaryCrossentropy", yb, "float32", pb,
                           lambda q: keras_bce(yb, q, False, 0.0), from_logits=False,
                           smoothing=0.0))
    y1b = torch.randint(0, 2, (B,), generator=gen).to(torch.float64)
    p1b = uniform((B, 1), 0.02, 0.98)
    p1b[0, 0] = 0.0
    p1b[1, 0] = 1.0
    cases.append(loss_case("BinaryCrossentropy", y1b, "float32", p1b,
                           lambda q: keras_bce(y1b.view(B, 1), q, False, 0.0), from_logits=False,
                           smoothing=0.0, note="[B] against [B, 1], clipped 0 and 1"))
    return cases


def main():
    torch.set_default_dtype(torch.float64)
    doc = {
        "generator": "tools/golden/gen_nn_golden.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "dense": [dense_case(a) for a in ACTS] + [dense_case("relu", with_bias=False)],
        "activations": [activation_case(n) for n in STANDALONE],
        "losses": loss_cases(),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    text = json.dumps(doc, indent=1)
    # One line per number list keeps the file short and its diffs readable.
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    with open(OUT, "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(doc['dense'])} dense, "
          f"{len(doc['activations'])} activation, {len(doc['losses'])} loss cases")


if __name__ == "__main__":
    main()
