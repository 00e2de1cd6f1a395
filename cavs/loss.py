"""The loss outside F: softmax cross-entropy of `h Wout + bout` on the pushed outputs of the
labelled vertices, summed over the batch (WORKLOADS.md), and its gradient, in one batched call."""
from __future__ import annotations


def softmax_cross_entropy(be, h, w, b, labels, want_grad: bool):
    """Returns (loss, dh, dW, db); the gradients are None when want_grad is False."""
    xp = be.xp
    logits = xp.empty((h.shape[0], w.shape[1]), dtype=h.dtype)
    be.gemm(logits, h, w)
    logits += b
    logits -= logits.max(axis=1, keepdims=True)
    rows = xp.arange(len(labels))
    picked = logits[rows, labels]
    # exp(-60) / 10^4 classes is still a normal float32: without this floor, probabilities of
    # hopeless classes become denormals, which make the CPU's matmuls on them ~10x slower (what
    # flush-to-zero avoids in TensorFlow). Those probabilities change by < 1e-26.
    xp.maximum(logits, -60.0, out=logits)
    xp.exp(logits, out=logits)
    total = logits.sum(axis=1)
    loss = float((xp.log(total) - picked).sum())
    if not want_grad:
        return loss, None, None, None
    logits /= total[:, None]               # softmax probabilities
    logits[rows, labels] -= 1.0            # d loss / d logits
    dh = xp.empty_like(h)
    dw = xp.empty_like(w)
    be.gemm(dh, logits, w.T)
    be.gemm(dw, h.T, logits)
    return loss, dh, dw, logits.sum(axis=0)
