#!/usr/bin/python3
"""20-step training differential of dtrain's nn::GPT against the same model in PyTorch.

Writes tests/golden/gpt_golden.json, which tests/train/gpt_golden_test.cc trains dtrain on and
compares against (per-step losses, final weights within 1e-4 relative). Regenerate (from the
repository root, with Debian's python3-torch 1.13):

    /usr/bin/python3 tools/golden/gen_gpt.py

The model (vocab 16, context 8, d_model 16, 2 layers, 2 heads, dropout 0), as nn::GPT defines
it: h = tok_emb[x] + pos_emb[:T]; per block h += MHA(LN1(h), causal); h += W2 gelu(W1 LN2(h));
logits = head(LN_f(h)); LayerNorm epsilon 1e-5, exact (erf) GELU. Loss: mean sparse
categorical cross-entropy from logits over every (batch, time) position. Optimizer: Keras's
AdamW (learning_rate 1e-2, weight_decay 0.01 on every variable, beta 0.9/0.999, epsilon 1e-7
added to sqrt(v), Keras's bias correction folded into the step size) with global_clipnorm 1.0
(g *= 1.0 / max(||g||_global, 1.0)), written out explicitly because torch.optim.AdamW adds
epsilon to sqrt(v / (1 - beta2^t)) instead. 20 steps on fixed batches of 4 windows.

Initial weights are drawn here (float32), stored in Keras's layout under dtrain's variable names,
and mapped onto torch modules (torch.nn.Embedding, LayerNorm, Linear, MultiheadAttention):

    Embedding  embeddings [V, d]            -> nn.Embedding.weight                    (same)
    LayerNorm  gamma, beta [d]              -> nn.LayerNorm.weight, .bias             (same)
    Dense      kernel [in, out], bias [out] -> nn.Linear.weight = kernel.T, .bias = bias
    MHA        query/kernel [d, heads, k]   -> in_proj_weight rows [0, d)   = kernel.reshape(d, heads*k).T
               key/kernel                   -> in_proj_weight rows [d, 2d)  (likewise)
               value/kernel                 -> in_proj_weight rows [2d, 3d) (likewise)
               query/key/value bias [heads, k] -> in_proj_bias = concat(q.ravel(), k.ravel(), v.ravel())
               attention_output/kernel [heads, k, d] -> out_proj.weight = kernel.reshape(heads*k, d).T
               attention_output/bias [d]    -> out_proj.bias
    causal mask: attn_mask = torch.triu(ones(T, T), 1).bool() (True = masked)

Final weights are mapped back to Keras's layout with the inverse of the same mapping.
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SEED = 20261213
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "gpt_golden.json")

VOCAB, CONTEXT, D, LAYERS, HEADS = 16, 8, 16, 2, 2
KEY_DIM = D // HEADS
BATCH, STEPS = 4, 20
LR, WD, B1, B2, EPS, CLIP = 1e-2, 0.01, 0.9, 0.999, 1e-7, 1.0

torch.set_num_threads(1)
gen = torch.Generator().manual_seed(SEED)


def normal(shape, std):
    return (torch.randn(shape, generator=gen, dtype=torch.float32) * std).contiguous()


def uniform(shape, limit):
    return ((torch.rand(shape, generator=gen, dtype=torch.float32) * 2 - 1) * limit).contiguous()


def glorot(shape, fan_in, fan_out):
    return uniform(shape, math.sqrt(6.0 / (fan_in + fan_out)))


# --- Initial weights, Keras layout, dtrain names ----------------------------------------------
keras = {}
keras["token_embedding/embeddings"] = normal((VOCAB, D), 0.02)
keras["position_embedding/embeddings"] = normal((CONTEXT, D), 0.02)
for i in range(LAYERS):
    p = f"block_{i}/"
    keras[p + "ln1/gamma"] = 1 + normal((D,), 0.1)
    keras[p + "ln1/beta"] = normal((D,), 0.1)
    for part in ("query", "key", "value"):
        keras[p + f"attention/{part}/kernel"] = glorot((D, HEADS, KEY_DIM), D, D)
        keras[p + f"attention/{part}/bias"] = normal((HEADS, KEY_DIM), 0.02)
    keras[p + "attention/attention_output/kernel"] = glorot((HEADS, KEY_DIM, D), D, D)
    keras[p + "attention/attention_output/bias"] = normal((D,), 0.02)
    keras[p + "ln2/gamma"] = 1 + normal((D,), 0.1)
    keras[p + "ln2/beta"] = normal((D,), 0.1)
    keras[p + "ffn_up/kernel"] = glorot((D, 4 * D), D, 4 * D)
    keras[p + "ffn_up/bias"] = normal((4 * D,), 0.02)
    keras[p + "ffn_down/kernel"] = glorot((4 * D, D), 4 * D, D)
    keras[p + "ffn_down/bias"] = normal((D,), 0.02)
keras["final_norm/gamma"] = 1 + normal((D,), 0.1)
keras["final_norm/beta"] = normal((D,), 0.1)
keras["head/kernel"] = glorot((D, VOCAB), D, VOCAB)
keras["head/bias"] = normal((VOCAB,), 0.02)
initial = {k: v.clone() for k, v in keras.items()}


# --- The torch model ----------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D, eps=1e-5)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(D, eps=1e-5)
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        a = self.ln1(x)
        h, _ = self.attn(a, a, a, attn_mask=mask, need_weights=False)
        x = x + h
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TorchGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D)
        self.pos = nn.Embedding(CONTEXT, D)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D, eps=1e-5)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids):
        t = ids.shape[1]
        h = self.tok(ids) + self.pos.weight[:t]
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


def keras_to_torch(model, k):
    """Copies Keras-layout weights `k` into `model` (the mapping in the module docstring)."""
    with torch.no_grad():
        model.tok.weight.copy_(k["token_embedding/embeddings"])
        model.pos.weight.copy_(k["position_embedding/embeddings"])
        for i, b in enumerate(model.blocks):
            p = f"block_{i}/"
            b.ln1.weight.copy_(k[p + "ln1/gamma"])
            b.ln1.bias.copy_(k[p + "ln1/beta"])
            b.attn.in_proj_weight.copy_(torch.cat(
                [k[p + f"attention/{part}/kernel"].reshape(D, HEADS * KEY_DIM).T
                 for part in ("query", "key", "value")], 0))
            b.attn.in_proj_bias.copy_(torch.cat(
                [k[p + f"attention/{part}/bias"].reshape(-1) for part in ("query", "key", "value")]))
            b.attn.out_proj.weight.copy_(
                k[p + "attention/attention_output/kernel"].reshape(HEADS * KEY_DIM, D).T)
            b.attn.out_proj.bias.copy_(k[p + "attention/attention_output/bias"])
            b.ln2.weight.copy_(k[p + "ln2/gamma"])
            b.ln2.bias.copy_(k[p + "ln2/beta"])
            b.up.weight.copy_(k[p + "ffn_up/kernel"].T)
            b.up.bias.copy_(k[p + "ffn_up/bias"])
            b.down.weight.copy_(k[p + "ffn_down/kernel"].T)
            b.down.bias.copy_(k[p + "ffn_down/bias"])
        model.ln_f.weight.copy_(k["final_norm/gamma"])
        model.ln_f.bias.copy_(k["final_norm/beta"])
        model.head.weight.copy_(k["head/kernel"].T)
        model.head.bias.copy_(k["head/bias"])


def torch_to_keras(model):
    """The inverse mapping: Keras-layout tensors under dtrain's names."""
    k = {}
    k["token_embedding/embeddings"] = model.tok.weight
    k["position_embedding/embeddings"] = model.pos.weight
    for i, b in enumerate(model.blocks):
        p = f"block_{i}/"
        k[p + "ln1/gamma"] = b.ln1.weight
        k[p + "ln1/beta"] = b.ln1.bias
        for j, part in enumerate(("query", "key", "value")):
            w = b.attn.in_proj_weight[j * D:(j + 1) * D]
            k[p + f"attention/{part}/kernel"] = w.T.reshape(D, HEADS, KEY_DIM)
            k[p + f"attention/{part}/bias"] = b.attn.in_proj_bias[j * D:(j + 1) * D].reshape(
                HEADS, KEY_DIM)
        k[p + "attention/attention_output/kernel"] = b.attn.out_proj.weight.T.reshape(
            HEADS, KEY_DIM, D)
        k[p + "attention/attention_output/bias"] = b.attn.out_proj.bias
        k[p + "ln2/gamma"] = b.ln2.weight
        k[p + "ln2/beta"] = b.ln2.bias
        k[p + "ffn_up/kernel"] = b.up.weight.T
        k[p + "ffn_up/bias"] = b.up.bias
        k[p + "ffn_down/kernel"] = b.down.weight.T
        k[p + "ffn_down/bias"] = b.down.bias
    k["final_norm/gamma"] = model.ln_f.weight
    k["final_norm/beta"] = model.ln_f.bias
    k["head/kernel"] = model.head.weight.T
    k["head/bias"] = model.head.bias
    return {name: t.detach().clone().contiguous() for name, t in k.items()}


model = TorchGPT()
keras_to_torch(model, keras)
# The mapping is a bijection: mapping back gives the initial weights exactly.
for name, t in torch_to_keras(model).items():
    assert torch.equal(t, initial[name]), name

# --- Data: a token stream with structure (a noisy repeating pattern) cut into windows --------
pattern = torch.randint(0, VOCAB, (11,), generator=gen)
stream = pattern.repeat(40)
noise = torch.rand(stream.shape, generator=gen) < 0.1
stream = torch.where(noise, torch.randint(0, VOCAB, stream.shape, generator=gen), stream)
starts = torch.randint(0, stream.numel() - CONTEXT - 1, (STEPS * BATCH,), generator=gen)
xs = torch.stack([stream[s:s + CONTEXT] for s in starts])
ys = torch.stack([stream[s + 1:s + CONTEXT + 1] for s in starts])

# --- 20 steps of Keras's AdamW with global_clipnorm -------------------------------------------
params = list(model.parameters())
m = [torch.zeros_like(p) for p in params]
v = [torch.zeros_like(p) for p in params]
losses = []
for step in range(STEPS):
    x = xs[step * BATCH:(step + 1) * BATCH]
    y = ys[step * BATCH:(step + 1) * BATCH]
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    losses.append(loss.item())
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        grads = [p.grad for p in params]
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        grads = [g * (CLIP / torch.maximum(norm, torch.tensor(CLIP))) for g in grads]
        t = step + 1
        lr_t = LR * math.sqrt(1 - B2 ** t) / (1 - B1 ** t)
        for p, g, mi, vi in zip(params, grads, m, v):
            p.sub_(p * WD * LR)
            mi.add_((g - mi) * (1 - B1))
            vi.add_((g * g - vi) * (1 - B2))
            p.sub_(lr_t * mi / (torch.sqrt(vi) + EPS))


def enc(t):
    return {"shape": list(t.shape), "data": [float(x) for x in t.reshape(-1).tolist()]}


def enc_int(t):
    return {"shape": list(t.shape), "data": [int(x) for x in t.reshape(-1).tolist()]}


doc = {
    "generator": "tools/golden/gen_gpt.py",
    "torch_version": torch.__version__,
    "config": {"vocab_size": VOCAB, "context": CONTEXT, "d_model": D, "num_layers": LAYERS,
               "num_heads": HEADS, "dropout": 0.0},
    "optimizer": {"class_name": "AdamW", "learning_rate": LR, "weight_decay": WD, "beta_1": B1,
                  "beta_2": B2, "epsilon": EPS, "global_clipnorm": CLIP},
    "batch_size": BATCH,
    "steps": STEPS,
    "x": enc_int(xs),
    "y": enc_int(ys),
    "initial": {k: enc(t) for k, t in initial.items()},
    "losses": losses,
    "final": {k: enc(t) for k, t in torch_to_keras(model).items()},
}
with open(OUT, "w") as f:
    json.dump(doc, f)
print(f"wrote {OUT}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
