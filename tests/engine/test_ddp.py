"""cavs.torch under DistributedDataParallel (gloo, CPU): two processes on loopback, each training on
half of every batch, end with the parameters of one process trained on the whole batches. The loss
is the MSE over the roots, each half holding as many graphs (one root each) as the other, so the
whole batch's mean is the mean of the halves' means, which DDP's averaged gradients follow."""
from __future__ import annotations

import os

import numpy as np
import pytest

import cavs
from cavs.models import child_sum
from tests.engine.helpers import E, H, V, random_tree

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import cavs.torch  # noqa: E402

STEPS, GRAPHS, WORLD = 4, 8, 2


class Regressor(torch.nn.Module):
    """The child-sum encoder and a linear head on its roots."""

    def __init__(self):
        super().__init__()
        model = child_sum.model(None, H, E, V, classes=None, seed=1, dtype="float64")
        self.encoder = cavs.torch.VertexModule(model, fusion=False, threads=1)
        torch.manual_seed(0)
        self.head = torch.nn.Linear(H, 1, dtype=torch.float64)

    def forward(self, batch):
        return self.head(self.encoder(batch)[batch.roots]).squeeze(1)


def batches():
    """STEPS batches of GRAPHS unlabelled random trees, and a target per tree."""
    rng = np.random.default_rng(7)
    out = []
    for step in range(STEPS):
        trees = [random_tree(rng, int(rng.integers(1, 12)), f"step {step} tree {i}") for i in range(GRAPHS)]
        trees = [cavs.Graph(g.children, g.tokens, np.full_like(g.labels, -1), g.name) for g in trees]
        out.append((trees, torch.as_tensor(rng.normal(size=GRAPHS))))
    return out


def train(net, rank: int = 0, world: int = 1) -> dict:
    """SGD on this rank's share of every batch; the parameters at the end."""
    model = net.module if isinstance(net, torch.nn.parallel.DistributedDataParallel) else net
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    share = GRAPHS // world
    for trees, y in batches():
        mine = slice(rank * share, (rank + 1) * share)
        batch = model.encoder.model.make_batch(trees[mine])
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(batch), y[mine]).backward()
        opt.step()
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def worker(rank: int, out: str) -> None:
    # a file store (no TCPStore server thread in rank 0, no port to race for) and gloo's pairs on
    # the loopback interface, whatever the host name resolves to
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}.store", rank=rank, world_size=WORLD)
    try:
        params = train(torch.nn.parallel.DistributedDataParallel(Regressor()), rank, WORLD)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    np.savez(f"{out}.{rank}.npz", **params)
    # the parameters are saved: leave without the interpreter's teardown, where a C++ thread of
    # gloo or the store still joinable at exit has aborted a rank ("terminate called without an
    # active exception", once in a full CI run) after its work was done
    os._exit(0)


def test_two_processes_on_halves_reach_the_parameters_of_one_on_the_whole(tmp_path):
    out = str(tmp_path / "params")
    torch.multiprocessing.spawn(worker, args=(out,), nprocs=WORLD, join=True)
    whole = train(Regressor())
    start = Regressor().state_dict()
    for rank in range(WORLD):
        with np.load(f"{out}.{rank}.npz") as got:
            assert set(got.files) == set(whole)
            for k, want in whole.items():
                assert not np.allclose(want, start[k].numpy()), f"{k} did not train"
                np.testing.assert_allclose(got[k], want, rtol=1e-10, atol=1e-13, err_msg=f"rank {rank}: {k}")
