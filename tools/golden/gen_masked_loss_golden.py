#!/usr/bin/python3
"""Golden values for the loss and metrics of a masked output (Keras's mask weighting).

Writes tests/golden/masked_loss_golden.json, which tests/train/masked_loss_test.cc compares dtrain
against. Regenerate from the repository root with Debian's python3-torch 1.13:

    /usr/bin/python3 tools/golden/gen_masked_loss_golden.py

The model is a timestep-wise tagger, Embedding(7, 4, mask_zero=True) -> Dense(5, tanh) ->
Dense(7) (logits), so the output carries the embedding's mask ids != 0 to the loss. Keras 3
(keras/src/losses/loss.py: apply_mask, reduce_weighted_values) weights the per-step losses by
mask * divide_no_nan(total, valid) and takes SUM_OVER_BATCH_SIZE, the mean over all `total`
steps: sum(loss * mask) / valid. Keras 2.12 gets the same (the container turns the mask into
the sample weight and Loss.__call__'s apply_valid_mask scales it by total / valid). The metric
(sparse categorical accuracy) is the mask-weighted mean: sum(match * mask) / sum(mask). The
math is explicit torch in float64 from float32 values; the float32 Keras formula is recorded
beside it. Also: the gradients of the masked loss with respect to every weight, and the weights
after one SGD step (learning rate 0.5) on the batch.
"""

import json
import os

import torch

SEED = 20261203
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                   "masked_loss_golden.json")
V, D, H = 7, 4, 5
LR = 0.5

gen = torch.Generator().manual_seed(SEED)


def uniform(shape, lo=-1.0, hi=1.0):
    t = torch.rand(shape, generator=gen, dtype=torch.float32) * (hi - lo) + lo
    return t.to(torch.float64)


def enc(t, dtype="float32"):
    t = t.detach()
    data = [float(v) for v in t.reshape(-1).tolist()]
    if dtype != "float32":
        data = [int(v) for v in data]
    return {"shape": list(t.shape), "dtype": dtype, "data": data}


weights = {
    "embedding": uniform((V, D)),
    "dense1_kernel": uniform((D, H)),
    "dense1_bias": uniform((H,), -0.5, 0.5),
    "dense2_kernel": uniform((H, V), -1.5, 1.5),
    "dense2_bias": uniform((V,), -0.5, 0.5),
}
for w in weights.values():
    w.requires_grad_(True)

# Right-padded rows, one with a hole (a 0 id in the middle is masked too), one fully real.
ids = torch.tensor([[3, 1, 4, 0, 0],
                    [2, 0, 5, 6, 0],
                    [1, 6, 2, 3, 5]], dtype=torch.int64)
mask = (ids != 0).to(torch.float64)


def forward(w):
    e = w["embedding"][ids]                                  # [B, T, D]
    h = torch.tanh(e @ w["dense1_kernel"] + w["dense1_bias"])  # [B, T, H]
    return h @ w["dense2_kernel"] + w["dense2_bias"]          # [B, T, V] logits


with torch.no_grad():
    logits = forward(weights)
    predicted = logits.argmax(-1)
# Labels: the prediction at every other real step (so accuracy is neither 0 nor 1), another
# class elsewhere; padded steps get labels that would be wrong, which the mask must ignore.
labels = torch.where(torch.arange(ids.numel()).reshape(ids.shape) % 2 == 0, predicted,
                     (predicted + 1) % V)

logits = forward(weights)
per_step = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                                             reduction="none").reshape(ids.shape)
valid = mask.sum()
loss = (per_step * mask).sum() / valid
loss.backward()
grads = {k: w.grad.detach().clone() for k, w in weights.items()}

with torch.no_grad():
    # Keras 3's float32 formula: mask * (total / valid), then sum / total.
    ps32, m32 = per_step.to(torch.float32), mask.to(torch.float32)
    total32 = torch.tensor(float(mask.numel()), dtype=torch.float32)
    keras_loss = ((ps32 * (m32 * (total32 / m32.sum()))).sum() / total32).to(torch.float64)
    unmasked_loss = per_step.mean()
    matches = (logits.argmax(-1) == labels).to(torch.float64)
    accuracy = (matches * mask).sum() / mask.sum()
    unmasked_accuracy = matches.mean()
    after = {k: w - LR * grads[k] for k, w in weights.items()}

doc = {
    "generator": "tools/golden/gen_masked_loss_golden.py",
    "seed": SEED,
    "vocab": V, "embed_dim": D, "hidden": H, "learning_rate": LR,
    "weights": {k: enc(w) for k, w in weights.items()},
    "ids": enc(ids, "int64"),
    "labels": enc(labels, "int64"),
    "mask": enc(mask),
    "logits": enc(logits),
    "per_step_loss": enc(per_step),
    "loss": float(loss),
    "keras_float32_loss": float(keras_loss),
    "unmasked_loss": float(unmasked_loss),
    "accuracy": float(accuracy),
    "unmasked_accuracy": float(unmasked_accuracy),
    "gradients": {k: enc(g) for k, g in grads.items()},
    "weights_after_sgd_step": {k: enc(w) for k, w in after.items()},
}
print(f"loss {float(loss):.8f} (unmasked {float(unmasked_loss):.8f}), accuracy "
      f"{float(accuracy):.6f} (unmasked {float(unmasked_accuracy):.6f})")
with open(OUT, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
