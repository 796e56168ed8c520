"""The PyTorch GPT of the LM benchmarks (bench/torch_lm_tokens.py, bench/torch_lm_generate.py):
the same model as dtrain's nn::GPT — token and learned position embeddings, pre-norm blocks
(LayerNorm, nn.MultiheadAttention with a causal mask, LayerNorm, Linear(4d), exact GELU,
Linear(d)), a final LayerNorm and a Linear head to the vocabulary."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
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
    def __init__(self, vocab_size, context, layers, d, heads):
        super().__init__()
        self.tok = nn.Embedding(vocab_size, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab_size)

    def forward(self, x):
        t = x.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        h = self.tok(x) + self.pos.weight[:t]
        for b in self.blocks:
            h = b(h, mask)
        return self.head(self.ln_f(h))
