#!/usr/bin/python3
"""PyTorch peer of bench/lm_generate.sh: greedy generation with the char-level GPT of
bench/torch_lm_tokens.py (same blocks, nn.MultiheadAttention, causal mask), untrained (the speed
does not depend on the weights), as the naive loop without a key/value cache: every new token
runs the model over the whole window (the last CONTEXT tokens). One thread. Prints
`tokens_per_second T` over the tokens after the first two, from the process CPU time (as
bench/lm_generate.sh measures dtrain), so that a shared machine does not skew it.

Usage: torch_lm_generate.py VOCAB TOKENS CONTEXT LAYERS D_MODEL HEADS PROMPT_LEN [THREADS]
"""
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

vocab, tokens, context, layers, d, heads, prompt_len = map(int, sys.argv[1:8])
threads = int(sys.argv[8]) if len(sys.argv) > 8 else 1
torch.set_num_threads(threads)
torch.manual_seed(0)


# The model of bench/torch_lm_tokens.py (kept in step with it).
class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        a = self.ln1(x)
        h, _ = self.attn(a, a, a, attn_mask=mask, need_weights=False)
        x = x + h
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block() for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        h = self.tok(x) + self.pos.weight[:t]
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln_f(h))


model = GPT().eval()
ids = torch.randint(0, vocab, (1, prompt_len))
times = []
with torch.no_grad():
    for _ in range(tokens):
        t0 = time.process_time()
        logits = model(ids[:, -context:])
        nxt = logits[0, -1].argmax().view(1, 1)
        ids = torch.cat([ids, nxt], dim=1)
        times.append(time.process_time() - t0)
print(f"tokens_per_second {(len(times) - 2) / sum(times[2:]):.1f}")
