"""torch.nn.LSTM over a batch of sequences: cuDNN's fused LSTM on a GPU, PyTorch's own on a CPU.

The paper's "Cavs vs cuDNN" point of reference for the chain workloads. The whole batch runs as
one LSTM call (Var-LSTM through pack_padded_sequence, so padding costs nothing and gets no
gradient); embedding, output layer and the batch's mean cross-entropy are as in docs/workloads.md.

Our cell has gates i, f, o, u in x Wx + h Wh + b; nn.LSTM has i, f, g(=u), o in
x W_ih^T + b_ih + h W_hh^T + b_hh. So W_ih = Wx^T and W_hh = Wh^T with gate blocks reordered,
b_ih = b reordered, and b_hh is a frozen zero: were it trainable, both biases would receive b's
gradient and one SGD step would move their sum twice as far as the spec's single b.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cavs.graphs import InputError
from .pytorch_sample import TorchSystem, mean_cross_entropy, read_batch


def _torch_gate_order(hidden: int) -> np.ndarray:
    """Columns of our (i, f, o, u) gate layout in PyTorch's order (i, f, u, o)."""
    i, f, o, u = (np.arange(k * hidden, (k + 1) * hidden) for k in range(4))
    return np.concatenate([i, f, u, o])


@dataclass
class SequenceBatch:
    used_rows: torch.Tensor  # the embedding rows the batch reads
    tokens: torch.Tensor    # (T, B) time-major, positions in used_rows, padded with 0
    targets: torch.Tensor   # (T, B) padded with 0
    lengths: torch.Tensor   # (B,) on the CPU, as pack_padded_sequence wants
    num_samples: int


class CudnnLstmSystem(TorchSystem):
    name = "cudnn"
    workloads = ("fixed_lstm", "var_lstm")

    def __init__(self, workload: str, **kwargs):
        self.lstm = None   # set_params (called by the base constructor) builds it on first use
        super().__init__(workload, **kwargs)
        self.timings.extra["kernel"] = self.kernel()

    def kernel(self) -> str:
        """Which LSTM implementation torch dispatches to for this configuration (torch 2.13):
        cuDNN on a GPU; on a CPU oneDNN for dense float32 input, ATen's own loop otherwise
        (float64, or packed variable-length input). tests/test_baselines_torch.py checks this."""
        if self.torch_device.type == "cuda":
            return "cudnn" if torch.backends.cudnn.enabled else "aten-cuda"
        dense = self.workload == "fixed_lstm"
        onednn = dense and self.torch_dtype == torch.float32 and torch.backends.mkldnn.enabled
        return "onednn" if onednn else "aten-cpu"

    # ------------------------------------------------------------ parameters

    def set_params(self, params: dict[str, np.ndarray]) -> None:
        self.check_params(params)
        h = self.hidden
        if self.lstm is None:
            self.lstm = torch.nn.LSTM(self.sizes.embed, h, num_layers=1).to(self.torch_device, self.torch_dtype)
        perm = _torch_gate_order(h)
        with torch.no_grad():
            self.lstm.weight_ih_l0.copy_(self.tensor(params["Wx"][:, perm].T))
            self.lstm.weight_hh_l0.copy_(self.tensor(params["Wh"][:, perm].T))
            self.lstm.bias_ih_l0.copy_(self.tensor(params["b"][perm]))
            self.lstm.bias_hh_l0.zero_()
        train = self.mode == "train"
        for w in (self.lstm.weight_ih_l0, self.lstm.weight_hh_l0, self.lstm.bias_ih_l0):
            w.requires_grad_(train)
        self.lstm.bias_hh_l0.requires_grad_(False)
        self.params = {k: self.tensor(params[k]).clone().requires_grad_(train and k != "emb")
                       for k in ("emb", "Wout", "bout")}   # the table: updated row-wise by step()

    def get_params(self) -> dict[str, np.ndarray]:
        back = np.argsort(_torch_gate_order(self.hidden))
        host = lambda t: t.detach().cpu().numpy()   # noqa: E731
        out = super().get_params()
        out["Wx"] = host(self.lstm.weight_ih_l0).T[:, back].copy()
        out["Wh"] = host(self.lstm.weight_hh_l0).T[:, back].copy()
        # the bias the cell applies is the sum (b_hh stays zero, but report what actually runs)
        out["b"] = host(self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0)[back].copy()
        return out

    def trainable(self) -> list[torch.Tensor]:
        return [*super().trainable(), self.lstm.weight_ih_l0, self.lstm.weight_hh_l0, self.lstm.bias_ih_l0]

    # ------------------------------------------------------------ batches

    def prepare(self, samples: list) -> SequenceBatch:
        with self.timings.timing("construct_s"):
            graphs, _ = read_batch(self.workload, samples, arity=1)
            lengths = np.array([g.num_vertices for g in graphs], dtype=np.int64)
            if self.workload == "fixed_lstm" and (lengths != lengths[0]).any():
                b = int(np.flatnonzero(lengths != lengths[0])[0])
                raise InputError(f"{graphs[b].name}: fixed_lstm sample of length {lengths[b]}, "
                                 f"but the batch's first is {lengths[0]} long")
            tokens = np.zeros((lengths.max(), len(graphs)), dtype=np.int64)
            targets = np.zeros_like(tokens)
            for b, g in enumerate(graphs):
                tokens[:len(g.tokens), b] = g.tokens
                targets[:len(g.labels), b] = g.labels
            pad = np.arange(tokens.shape[0])[:, None] >= lengths[None, :]
            rows, (local,) = self.used_rows(np.where(pad, -1, tokens))
            batch = SequenceBatch(rows, self.index(np.where(pad, 0, local)), self.index(targets),
                                  torch.from_numpy(lengths), len(graphs))
        return batch

    def loss(self, batch: SequenceBatch, emb: torch.Tensor) -> torch.Tensor:
        x = emb[batch.tokens]                                     # (T, B, E)
        if self.workload == "fixed_lstm":                         # every sequence is T long: no packing
            h, _ = self.lstm(x)
            return mean_cross_entropy(self.params, h.reshape(-1, self.hidden), batch.targets.reshape(-1))
        # packing drops the padded steps; packing the targets the same way lines them up with h
        h, _ = self.lstm(pack_padded_sequence(x, batch.lengths, enforce_sorted=False))
        targets = pack_padded_sequence(batch.targets, batch.lengths, enforce_sorted=False).data
        return mean_cross_entropy(self.params, h.data, targets)
