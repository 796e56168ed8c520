#!/usr/bin/python3
"""Golden values for masked recurrent layers (Keras's masking), computed with PyTorch autograd.

Writes tests/golden/mask_golden.json, which tests/nn/masking_test.cc compares dtrain against
(forward values and gradients, 1e-5 relative). Regenerate from the repository root with
Debian's python3-torch 1.13:

    /usr/bin/python3 tools/golden/gen_mask_golden.py

Keras's masked rnn (keras.backend.rnn with a mask, zero_output_for_mask=False): at a masked
step the state and the output are the previous step's. It is written out with torch ops in
float64 from float32 inputs, and its final states for right-padded rows are cross-checked
against torch.nn.LSTM / torch.nn.GRU on a packed sequence (pack_padded_sequence, which runs
each row only over its length). A mask with a hole in the middle has no torch equivalent and
is checked against the explicit formula only. Keras → torch weight mapping as in
gen_seq_golden.py.
"""

import json
import os
import re
import sys

import torch

SEED = 20261202
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "mask_golden.json")

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def enc(t):
    t = t.detach()
    return {"shape": list(t.shape), "dtype": "float32",
            "data": [float(v) for v in t.reshape(-1).tolist()]}


def check_close(a, b, what):
    if not torch.allclose(a, b, rtol=1e-9, atol=1e-11):
        sys.exit(f"cross-check failed for {what}: max |diff| {(a - b).abs().max().item()}")


def keras_masked_rnn(cell, x, mask, w, u):
    B, T, _ = x.shape
    h = torch.zeros((B, u))
    c = torch.zeros((B, u))
    W, U, b = w["kernel"], w["recurrent_kernel"], w["bias"]
    outs = []
    for t in range(T):
        xt = x[:, t, :]
        if cell == "lstm":
            z = xt @ W + h @ U + b
            i, f, g, o = (z[:, k * u:(k + 1) * u] for k in range(4))
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c_new = f * c + i * g
            h_new = o * torch.tanh(c_new)
        else:  # GRU, reset_after=True
            xz = xt @ W + b[0]
            hz = h @ U + b[1]
            z = torch.sigmoid(xz[:, :u] + hz[:, :u])
            r = torch.sigmoid(xz[:, u:2 * u] + hz[:, u:2 * u])
            hh = torch.tanh(xz[:, 2 * u:] + r * hz[:, 2 * u:])
            h_new = z * h + (1 - z) * hh
            c_new = c
        m = mask[:, t:t + 1]
        h = m * h_new + (1 - m) * h
        c = m * c_new + (1 - m) * c
        outs.append(h)
    return torch.stack(outs, dim=1), h, (c if cell == "lstm" else None)


def torch_packed(cell, x, lens, w, u):
    """Final states of torch.nn.LSTM / GRU over each row's first lens[b] steps."""
    def reorder(t):  # Keras (z, r, h) → torch (r, z, n)
        return torch.cat([t[..., u:2 * u], t[..., :u], t[..., 2 * u:]], dim=-1)
    if cell == "lstm":
        m = torch.nn.LSTM(x.shape[-1], u, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            m.weight_ih_l0.copy_(w["kernel"].T)
            m.weight_hh_l0.copy_(w["recurrent_kernel"].T)
            m.bias_ih_l0.copy_(w["bias"])
            m.bias_hh_l0.zero_()
    else:
        m = torch.nn.GRU(x.shape[-1], u, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            m.weight_ih_l0.copy_(reorder(w["kernel"]).T)
            m.weight_hh_l0.copy_(reorder(w["recurrent_kernel"]).T)
            m.bias_ih_l0.copy_(reorder(w["bias"][0]))
            m.bias_hh_l0.copy_(reorder(w["bias"][1]))
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor(lens), batch_first=True,
                                                     enforce_sorted=False)
    out = m(packed)[1]
    if cell == "lstm":
        return out[0][0], out[1][0]
    return out[0], None


def case(name, cell, B, T, F, u, mask_rows, packed_lens=None):
    G = 4 if cell == "lstm" else 3
    x = uniform((B, T, F)).requires_grad_()
    w = {"kernel": uniform((F, G * u), -0.7, 0.7),
         "recurrent_kernel": uniform((u, G * u), -0.7, 0.7),
         "bias": uniform((2, G * u) if cell == "gru" else (G * u,), -0.4, 0.4)}
    for t in w.values():
        t.requires_grad_()
    mask = torch.tensor(mask_rows, dtype=torch.float64)
    seq, h, c = keras_masked_rnn(cell, x, mask, w, u)
    if packed_lens is not None:
        th, tc = torch_packed(cell, x, packed_lens, w, u)
        check_close(h, th, name + " h vs torch packed")
        if c is not None:
            check_close(c, tc, name + " c vs torch packed")
    r = uniform(seq.shape, 0.5, 1.5)
    loss = (seq * r).sum()
    out = {"name": name, "cell": cell, "units": u, "torch_packed_checked": packed_lens is not None,
           "x": enc(x), "mask": enc(mask), "weights": {k: enc(v) for k, v in w.items()},
           "r": enc(r), "output": enc(seq), "h": enc(h)}
    if c is not None:
        rc = uniform(c.shape, 0.5, 1.5)
        loss = loss + (c * rc).sum()
        out["c"] = enc(c)
        out["r_c"] = enc(rc)
    grads = torch.autograd.grad(loss, [x] + list(w.values()))
    out["grad_x"] = enc(grads[0])
    out["grad_weights"] = {k: enc(g) for k, g in zip(w.keys(), grads[1:])}
    return out


def main():
    torch.set_default_dtype(torch.float64)
    lens = [5, 3, 1]
    padded = [[1.0 if t < n else 0.0 for t in range(5)] for n in lens]
    doc = {
        "generator": "tools/golden/gen_mask_golden.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "rnn": [
            case("lstm_right_padded", "lstm", 3, 5, 2, 4, padded, lens),
            case("gru_right_padded", "gru", 3, 5, 2, 3, padded, lens),
            case("lstm_hole", "lstm", 2, 4, 3, 3, [[1, 0, 1, 1], [0, 1, 1, 0]]),
        ],
    }
    text = json.dumps(doc, indent=1)
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    with open(OUT, "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(doc['rnn'])} masked recurrent cases")


if __name__ == "__main__":
    main()
