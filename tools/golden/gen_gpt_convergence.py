#!/usr/bin/python3
"""PyTorch's validation loss for the budgeted convergence test of dtrain's char GPT.

tests/train/gpt_convergence_test.cc trains nn::GPT on the same data for the same steps and
asserts a validation loss under a threshold derived from the number this prints (both are
stated in the test). Run (from the repository root, Debian's python3-torch 1.13, fortunes
installed):

    /usr/bin/python3 tools/golden/gen_gpt_convergence.py

Data, as the test builds it: the fortunes corpus as data::fortunes::load_text() concatenates it
(the text files of /usr/share/games/fortunes sorted by name, .dat/.u8/hidden files and
directories skipped, a newline appended to a file that lacks one), its first 100000 bytes cut
back to the last newline; a character vocabulary (sorted code points); the first 90% of the ids
cut into windows of 33 tokens every 32 (x = 32 tokens, y = the next 32), the rest likewise for
validation. Model: GPT vocab V, context 32, 2 blocks, d_model 32, 2 heads, dropout 0, GPT-2's
pre-norm block, LayerNorm epsilon 1e-5, exact GELU; initialized as dtrain does (embeddings
N(0, 0.02), kernels glorot uniform, biases 0, LayerNorm 1/0; the draws differ from dtrain's).
Training: 150 steps of batches of 16 windows in order (no shuffle), Keras's AdamW
(learning_rate 3e-3, weight_decay 0.004, epsilon 1e-7 added to sqrt(v)), global_clipnorm 1.0.
The validation loss is the mean token cross-entropy over every validation window.
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
torch.manual_seed(0)

DIR = "/usr/share/games/fortunes"
names = sorted(n for n in os.listdir(DIR)
               if not n.startswith(".") and not n.endswith(".dat") and not n.endswith(".u8")
               and os.path.isfile(os.path.join(DIR, n)))
text = b""
for n in names:
    with open(os.path.join(DIR, n), "rb") as f:
        data = f.read()
    text += data
    if data and not data.endswith(b"\n"):
        text += b"\n"
text = text[:100000]
text = text[:text.rindex(b"\n") + 1].decode("utf-8")
vocab = sorted(set(text))
ids = torch.tensor([vocab.index(c) for c in text], dtype=torch.long)
V, T, D, LAYERS, HEADS, BATCH, STEPS = len(vocab), 32, 32, 2, 2, 16, 150
LR, WD, B1, B2, EPS, CLIP = 3e-3, 0.004, 0.9, 0.999, 1e-7, 1.0
split = ids.numel() - math.floor(ids.numel() * 0.1)


def windows(a, b):
    n = (b - a - 1) // T
    x = torch.stack([ids[a + i * T:a + i * T + T] for i in range(n)])
    y = torch.stack([ids[a + i * T + 1:a + i * T + T + 1] for i in range(n)])
    return x, y


x_train, y_train = windows(0, split)
x_val, y_val = windows(split, ids.numel())


def glorot_(w, fan_in, fan_out):
    with torch.no_grad():
        w.uniform_(-math.sqrt(6 / (fan_in + fan_out)), math.sqrt(6 / (fan_in + fan_out)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D, eps=1e-5)
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True)
        self.ln2 = nn.LayerNorm(D, eps=1e-5)
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)
        # Glorot uniform over the Linear fans (Keras's fans of the rank-3 attention kernels
        # differ, so the attention init scale is close to dtrain's, not equal: this sets the
        # reference loss, not a bitwise comparison).
        for j in range(3):
            glorot_(self.attn.in_proj_weight[j * D:(j + 1) * D], D, D)
        glorot_(self.attn.out_proj.weight, D, D)
        glorot_(self.up.weight, D, 4 * D)
        glorot_(self.down.weight, 4 * D, D)
        for b in (self.attn.in_proj_bias, self.attn.out_proj.bias, self.up.bias, self.down.bias):
            nn.init.zeros_(b)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        a = self.ln1(x)
        h, _ = self.attn(a, a, a, attn_mask=mask, need_weights=False)
        x = x + h
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(V, D)
        self.pos = nn.Embedding(T, D)
        nn.init.normal_(self.tok.weight, 0, 0.02)
        nn.init.normal_(self.pos.weight, 0, 0.02)
        self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D, eps=1e-5)
        self.head = nn.Linear(D, V)
        glorot_(self.head.weight, D, V)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids):
        h = self.tok(ids) + self.pos.weight[:ids.shape[1]]
        for b in self.blocks:
            h = b(h)
        return self.head(self.ln_f(h))


model = GPT()
params = list(model.parameters())
m = [torch.zeros_like(p) for p in params]
v = [torch.zeros_like(p) for p in params]
for step in range(STEPS):
    x = x_train[step * BATCH:(step + 1) * BATCH]
    y = y_train[step * BATCH:(step + 1) * BATCH]
    loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
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
with torch.no_grad():
    val = F.cross_entropy(model(x_val).reshape(-1, V), y_val.reshape(-1)).item()
# Printed on 2026-12-01: vocabulary 99, 2812 training and 312 validation windows; after 150
# steps: last training loss 2.7423, validation loss 2.9379.
print(f"vocabulary {V}, {x_train.shape[0]} training and {x_val.shape[0]} validation windows; "
      f"after {STEPS} steps: last training loss {loss.item():.4f}, validation loss {val:.4f}")
