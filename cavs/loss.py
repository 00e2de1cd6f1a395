"""The loss outside F: softmax cross-entropy of `h Wout + bout` on the pushed outputs of the
labelled vertices, summed over the batch (WORKLOADS.md), and its gradient, in one batched call."""
from __future__ import annotations

# On the CPU the softmax runs over blocks of rows that fit in the core's L2 cache (2 MiB on the
# reference VM): its six elementwise passes then read the cache, not memory. For the language
# models (10,000 classes, ~1,400 rows per batch) this made Var-LSTM training about 10% faster;
# the GPU takes all rows in one block.
CPU_BLOCK_BYTES = 1 << 20


def softmax_cross_entropy(be, h, w, b, labels, want_grad: bool, scale: float = 1.0):
    """Returns (scale * loss, dh, dW, db) with the gradients of the scaled loss; the gradients
    are None when want_grad is False."""
    xp = be.xp
    n, classes = h.shape[0], w.shape[1]
    logits = xp.empty((n, classes), dtype=h.dtype)
    be.gemm(logits, h, w)
    block = n if be.device != "cpu" else max(1, CPU_BLOCK_BYTES // (classes * h.dtype.itemsize))
    rows = xp.arange(min(block, n))
    loss = 0.0
    db = xp.zeros_like(b) if want_grad else None
    for a in range(0, n, block):
        z, y = logits[a:a + block], labels[a:a + block]
        r = rows[:len(y)]
        z += b
        z -= z.max(axis=1, keepdims=True)
        picked = z[r, y]
        # exp(-60) / 10^4 classes is still a normal float32: without this floor, probabilities
        # of hopeless classes become denormals, which make the CPU's matmuls on them ~10x
        # slower (what flush-to-zero avoids in TensorFlow). Those probabilities change by < 1e-26.
        xp.maximum(z, -60.0, out=z)
        xp.exp(z, out=z)
        total = z.sum(axis=1)
        loss += float((xp.log(total) - picked).sum())
        if want_grad:
            z /= total[:, None]                # softmax probabilities
            z[r, y] -= 1.0                     # d loss / d logits
            if scale != 1.0:
                z *= scale
            db += z.sum(axis=0)
    loss *= scale
    if not want_grad:
        return loss, None, None, None
    dh = xp.empty_like(h)
    dw = xp.empty_like(w)
    be.gemm(dh, logits, w.T)
    be.gemm(dw, h.T, logits)
    return loss, dh, dw, db


def softmax(be, h, w, b):
    """Row-wise softmax of `h W + b` (predictions), with the same max shift as the loss."""
    xp = be.xp
    z = xp.empty((h.shape[0], w.shape[1]), dtype=h.dtype)
    be.gemm(z, h, w)
    z += b
    z -= z.max(axis=1, keepdims=True)
    xp.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z
