#!/usr/bin/python3
"""Golden values for dtrain's sequence layers, computed with PyTorch autograd.

Writes tests/golden/seq_golden.json, which tests/nn/seq_golden_test.cc compares dtrain against
(forward values and gradients, 1e-5 relative). Regenerate (from the repository root, with
Debian's python3-torch 1.13):

    /usr/bin/python3 tools/golden/gen_seq_golden.py

Inputs and weights come from a seeded torch generator, are rounded to float32 and stored in the
JSON in Keras's layouts; expected values are computed in float64 from those float32 values.

MultiHeadAttention: Keras's computation (query scaled by 1/sqrt(key_dim) before q·kᵀ, −1e9
added to masked scores, Keras's lower-triangular causal mask) is written out with torch ops and
cross-checked against torch.nn.MultiheadAttention where torch can express the same layer (value
head size = key head size = output size / heads). Keras → torch weight mapping:

    q_proj_weight = query/kernel.reshape(q_features, heads * key_dim).T   (and key, value)
    in_proj_bias  = concat(query/bias.ravel(), key/bias.ravel(), value/bias.ravel())
    out_proj.weight = attention_output/kernel.reshape(heads * value_dim, out).T
    out_proj.bias   = attention_output/bias
    attn_mask (bool) = ~keras_mask, repeated per head (torch masks True positions);
    causal = torch.triu(ones(T, S), 1).bool()

LSTM / GRU: Keras's gate layouts (LSTM kernel columns i, f, c, o; GRU z, r, h) computed with
torch ops and cross-checked against torch.nn.LSTM / torch.nn.GRU after the mapping
(torch: LSTM rows i, f, g, o, GRU rows r, z, n):

    LSTM: weight_ih = kernel.T, weight_hh = recurrent_kernel.T, bias_ih = bias, bias_hh = 0
    GRU (reset_after=True): weight_ih = kernel.T with column blocks (z, r, h) reordered to
          (r, z, n), weight_hh = recurrent_kernel.T likewise, bias_ih = bias[0] reordered,
          bias_hh = bias[1] reordered. reset_after=False has no torch equivalent (torch applies
          the reset gate after the recurrent matmul), so it is checked against the explicit
          formula only.
"""

import json
import os
import re
import sys

import torch
import torch.nn.functional as F

SEED = 20261201
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "seq_golden.json")

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    """float32 uniform values, returned as float64 holding exactly those float32 values."""
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def enc(t, dtype="float32"):
    t = t.detach()
    if dtype.startswith("float"):
        data = [float(v) for v in t.reshape(-1).tolist()]
    else:
        data = [int(v) for v in t.reshape(-1).tolist()]
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


def check_close(a, b, what, rtol=1e-9, atol=1e-11):
    if not torch.allclose(a, b, rtol=rtol, atol=atol):
        sys.exit(f"cross-check failed for {what}: max |diff| {(a - b).abs().max().item()}")


# ------------------------------------------------------------------------------------------------
# MultiHeadAttention.

def keras_mha(q_in, v_in, k_in, w, heads, key_dim, value_dim, mask, causal):
    """Keras's MultiHeadAttention forward in float64. Returns (output, scores)."""
    def proj(x, name, dim):
        y = torch.einsum("abc,cde->abde", x, w[name + "/kernel"])
        if name + "/bias" in w:
            y = y + w[name + "/bias"]
        return y
    q = proj(q_in, "query", key_dim)
    k = proj(k_in, "key", key_dim)
    v = proj(v_in, "value", value_dim)
    T, S = q_in.shape[1], v_in.shape[1]
    keep = torch.ones((q_in.shape[0], T, S), dtype=torch.bool)
    if mask is not None:
        keep = keep & mask.bool()
    if causal:
        keep = keep & torch.tril(torch.ones((T, S), dtype=torch.bool))
    q = q * (1.0 / float(key_dim) ** 0.5)
    scores = torch.einsum("aecd,abcd->acbe", k, q)
    scores = scores + (~keep).unsqueeze(1).to(scores.dtype) * -1e9
    probs = torch.softmax(scores, dim=-1)
    ctx = torch.einsum("acbe,aecd->abcd", probs, v)
    out = torch.einsum("abcd,cde->abe", ctx, w["attention_output/kernel"])
    if "attention_output/bias" in w:
        out = out + w["attention_output/bias"]
    return out, probs


def torch_mha(q_in, v_in, k_in, w, heads, key_dim, mask, causal):
    """The same layer through torch.nn.MultiheadAttention (value_dim == key_dim,
    output = heads·key_dim)."""
    E = heads * key_dim
    m = torch.nn.MultiheadAttention(E, heads, bias=True, kdim=k_in.shape[-1],
                                    vdim=v_in.shape[-1], batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        wq = w["query/kernel"].reshape(q_in.shape[-1], E).T
        wk = w["key/kernel"].reshape(k_in.shape[-1], E).T
        wv = w["value/kernel"].reshape(v_in.shape[-1], E).T
        if m._qkv_same_embed_dim:  # one packed [3E, E] in_proj_weight
            m.in_proj_weight.copy_(torch.cat([wq, wk, wv]))
        else:
            m.q_proj_weight.copy_(wq)
            m.k_proj_weight.copy_(wk)
            m.v_proj_weight.copy_(wv)
        m.in_proj_bias.copy_(torch.cat([w["query/bias"].reshape(-1), w["key/bias"].reshape(-1),
                                        w["value/bias"].reshape(-1)]))
        m.out_proj.weight.copy_(w["attention_output/kernel"].reshape(E, -1).T)
        m.out_proj.bias.copy_(w["attention_output/bias"])
    B, T, S = q_in.shape[0], q_in.shape[1], v_in.shape[1]
    blocked = torch.zeros((B, T, S), dtype=torch.bool)
    if mask is not None:
        blocked = blocked | ~mask.bool()
    if causal:
        blocked = blocked | torch.triu(torch.ones((T, S), dtype=torch.bool), 1)
    attn_mask = blocked.repeat_interleave(heads, dim=0)
    out, probs = m(q_in, k_in, v_in, attn_mask=attn_mask, need_weights=True,
                   average_attn_weights=False)
    return out, probs


def mha_case(name, B, T, S, qf, vf, kf, heads, key_dim, value_dim=None, out=None, use_bias=True,
             mask=False, causal=False, self_attention=False):
    value_dim = value_dim or key_dim
    out = out or qf
    q_in = uniform((B, T, qf)).requires_grad_()
    if self_attention:
        v_in = k_in = q_in
    else:
        v_in = uniform((B, S, vf)).requires_grad_()
        k_in = uniform((B, S, kf)).requires_grad_()
    w = {"query/kernel": uniform((qf, heads, key_dim), -0.6, 0.6)}
    if use_bias:
        w["query/bias"] = uniform((heads, key_dim), -0.3, 0.3)
    w["key/kernel"] = uniform((kf, heads, key_dim), -0.6, 0.6)
    if use_bias:
        w["key/bias"] = uniform((heads, key_dim), -0.3, 0.3)
    w["value/kernel"] = uniform((vf, heads, value_dim), -0.6, 0.6)
    if use_bias:
        w["value/bias"] = uniform((heads, value_dim), -0.3, 0.3)
    w["attention_output/kernel"] = uniform((heads, value_dim, out), -0.6, 0.6)
    if use_bias:
        w["attention_output/bias"] = uniform((out,), -0.3, 0.3)
    for t in w.values():
        t.requires_grad_()
    m = None
    if mask:
        m = (torch.rand((B, T, S), generator=gen) > 0.3).to(torch.float64)
        m[:, :, 0] = 1  # every query keeps a key (a fully masked row is checked in C++)
    y, probs = keras_mha(q_in, v_in, k_in, w, heads, key_dim, value_dim, m, causal)
    if use_bias and value_dim == key_dim and out == heads * key_dim:
        ty, tprobs = torch_mha(q_in, v_in, k_in, w, heads, key_dim, m, causal)
        check_close(y, ty, name + " output vs torch.nn.MultiheadAttention")
        check_close(probs, tprobs, name + " scores vs torch.nn.MultiheadAttention")
        checked = True
    else:
        checked = False
    r = uniform(y.shape, 0.5, 1.5)
    leaves = [q_in] if self_attention else [q_in, v_in, k_in]
    grads = torch.autograd.grad((y * r).sum(), leaves + list(w.values()))
    case = {
        "name": name, "num_heads": heads, "key_dim": key_dim, "value_dim": value_dim,
        "output_shape": out, "use_bias": use_bias, "causal": causal,
        "self_attention": self_attention, "torch_module_checked": checked,
        "query": enc(q_in), "weights": {k: enc(v) for k, v in w.items()},
        "r": enc(r), "output": enc(y), "scores": enc(probs),
        "grad_query": enc(grads[0]),
        "grad_weights": {k: enc(g) for k, g in zip(w.keys(), grads[len(leaves):])},
    }
    if not self_attention:
        case.update({"value": enc(v_in), "key": enc(k_in), "grad_value": enc(grads[1]),
                     "grad_key": enc(grads[2])})
    if m is not None:
        case["mask"] = enc(m)
    return case


def mha_cases():
    return [
        mha_case("self_attention", 2, 4, 4, 6, 6, 6, 2, 3, self_attention=True),
        mha_case("cross_attention_mask", 2, 3, 5, 6, 5, 4, 2, 3, mask=True),
        mha_case("causal_self", 2, 5, 5, 8, 8, 8, 2, 4, causal=True, self_attention=True),
        mha_case("causal_mask_no_bias_value_dim_output_shape", 2, 4, 4, 5, 3, 4, 3, 2,
                 value_dim=3, out=7, use_bias=False, mask=True, causal=True),
    ]


# ------------------------------------------------------------------------------------------------
# LSTM and GRU (Keras's cells, zero initial state).

def keras_rnn(cell, x, w, units, go_backwards, reset_after=True):
    """Returns (h for every step in processing order [B, T, u], last h, last c or None)."""
    B, T, _ = x.shape
    u = units
    h = torch.zeros((B, u))
    c = torch.zeros((B, u))
    outs = []
    steps = range(T - 1, -1, -1) if go_backwards else range(T)
    W, U, b = w["kernel"], w["recurrent_kernel"], w.get("bias")
    for t in steps:
        xt = x[:, t, :]
        if cell == "lstm":
            z = xt @ W + h @ U + (b if b is not None else 0)
            i, f, g, o = (z[:, k * u:(k + 1) * u] for k in range(4))
            i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
            c = f * c + i * g
            h = o * torch.tanh(c)
        elif reset_after:
            xz = xt @ W + (b[0] if b is not None else 0)
            hz = h @ U + (b[1] if b is not None else 0)
            z = torch.sigmoid(xz[:, :u] + hz[:, :u])
            r = torch.sigmoid(xz[:, u:2 * u] + hz[:, u:2 * u])
            hh = torch.tanh(xz[:, 2 * u:] + r * hz[:, 2 * u:])
            h = z * h + (1 - z) * hh
        else:
            xz = xt @ W + (b if b is not None else 0)
            z = torch.sigmoid(xz[:, :u] + h @ U[:, :u])
            r = torch.sigmoid(xz[:, u:2 * u] + h @ U[:, u:2 * u])
            hh = torch.tanh(xz[:, 2 * u:] + (r * h) @ U[:, 2 * u:])
            h = z * h + (1 - z) * hh
        outs.append(h)
    return torch.stack(outs, dim=1), h, (c if cell == "lstm" else None)


def torch_rnn(cell, x, w, units, go_backwards):
    """The same through torch.nn.LSTM / torch.nn.GRU (GRU: reset_after=True only)."""
    u = units
    xin = torch.flip(x, [1]) if go_backwards else x
    if cell == "lstm":
        m = torch.nn.LSTM(x.shape[-1], u, batch_first=True, dtype=torch.float64)
        with torch.no_grad():
            m.weight_ih_l0.copy_(w["kernel"].T)       # torch rows i, f, g, o = Keras's i, f, c, o
            m.weight_hh_l0.copy_(w["recurrent_kernel"].T)
            m.bias_ih_l0.copy_(w["bias"])
            m.bias_hh_l0.zero_()
        y, (h, c) = m(xin)
        return y, h[0], c[0]
    def reorder(t):  # Keras (z, r, h) column blocks → torch (r, z, n)
        return torch.cat([t[..., u:2 * u], t[..., :u], t[..., 2 * u:]], dim=-1)
    m = torch.nn.GRU(x.shape[-1], u, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        m.weight_ih_l0.copy_(reorder(w["kernel"]).T)
        m.weight_hh_l0.copy_(reorder(w["recurrent_kernel"]).T)
        m.bias_ih_l0.copy_(reorder(w["bias"][0]))
        m.bias_hh_l0.copy_(reorder(w["bias"][1]))
    y, h = m(xin)
    return y, h[0], None


def rnn_case(name, cell, B, T, F, u, go_backwards=False, reset_after=True, return_sequences=True):
    G = 4 if cell == "lstm" else 3
    x = uniform((B, T, F)).requires_grad_()
    w = {"kernel": uniform((F, G * u), -0.7, 0.7),
         "recurrent_kernel": uniform((u, G * u), -0.7, 0.7),
         "bias": uniform((2, G * u) if cell == "gru" and reset_after else (G * u,), -0.4, 0.4)}
    for t in w.values():
        t.requires_grad_()
    seq, h, c = keras_rnn(cell, x, w, u, go_backwards, reset_after)
    checked = cell == "lstm" or reset_after
    if checked:
        tseq, th, tc = torch_rnn(cell, x, w, u, go_backwards)
        check_close(seq, tseq, name + " outputs vs torch")
        check_close(h, th, name + " h vs torch")
        if c is not None:
            check_close(c, tc, name + " c vs torch")
    y = seq if return_sequences else h
    r = uniform(y.shape, 0.5, 1.5)
    loss = (y * r).sum()
    rc = None
    if c is not None:  # the final cell state feeds the loss too (return_state)
        rc = uniform(c.shape, 0.5, 1.5)
        loss = loss + (c * rc).sum()
    grads = torch.autograd.grad(loss, [x] + list(w.values()))
    case = {"name": name, "cell": cell, "units": u, "go_backwards": go_backwards,
            "reset_after": reset_after, "return_sequences": return_sequences,
            "torch_module_checked": checked, "x": enc(x),
            "weights": {k: enc(v) for k, v in w.items()}, "r": enc(r), "output": enc(y),
            "h": enc(h), "grad_x": enc(grads[0]),
            "grad_weights": {k: enc(g) for k, g in zip(w.keys(), grads[1:])}}
    if c is not None:
        case["c"] = enc(c)
        case["r_c"] = enc(rc)
    return case


def rnn_cases():
    return [
        rnn_case("lstm_sequences", "lstm", 2, 5, 3, 4),
        rnn_case("lstm_last_go_backwards", "lstm", 3, 4, 2, 3, go_backwards=True,
                 return_sequences=False),
        rnn_case("gru_reset_after_sequences", "gru", 2, 5, 3, 4),
        rnn_case("gru_reset_after_go_backwards_last", "gru", 2, 4, 3, 3, go_backwards=True,
                 return_sequences=False),
        rnn_case("gru_reset_before_sequences", "gru", 2, 4, 3, 3, reset_after=False),
    ]


def main():
    torch.set_default_dtype(torch.float64)
    doc = {
        "generator": "tools/golden/gen_seq_golden.py",
        "torch_version": torch.__version__,
        "seed": SEED,
        "mha": mha_cases(),
        "rnn": rnn_cases(),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    text = json.dumps(doc, indent=1)
    text = re.sub(r"\[\s*([-0-9.e+,\s]*?)\s*\]",
                  lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)
    with open(OUT, "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.normpath(OUT)}: {len(doc['mha'])} attention, {len(doc['rnn'])} "
          "recurrent cases")


if __name__ == "__main__":
    main()
