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

from torch_gpt import GPT

vocab, tokens, context, layers, d, heads, prompt_len = map(int, sys.argv[1:8])
threads = int(sys.argv[8]) if len(sys.argv) > 8 else 1
torch.set_num_threads(threads)
torch.manual_seed(0)

model = GPT(vocab, context, layers, d, heads).eval()
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
