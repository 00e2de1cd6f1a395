"""cavs.torch: an engine as a `torch.nn.Module`, so that a head, a loss, an optimizer, a scheduler
or DistributedDataParallel written for PyTorch trains a Cavs vertex function end to end.

    import cavs.torch
    encoder = cavs.torch.VertexModule(model)        # model: a cavs.Model, classes=None (a pure encoder)
    head = torch.nn.Linear(model.push_width, 1)
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
    out = encoder(batch, inputs=X)                  # (batch.num_vertices, push width), rows in vertex order
    loss = F.mse_loss(head(out[batch.roots]).squeeze(1), y)
    opt.zero_grad(); loss.backward(); opt.step()

The module's parameters are the engine's arrays (the built-in head's Wout and bout excepted): on
the CPU `torch.from_numpy` shares their memory, on the GPU DLPack shares the CuPy arrays', so
torch's in-place updates (optimizers, load_state_dict, DDP's broadcast) are the engine's. The
engine's pass is one `torch.autograd.Function`: its forward is `engine.forward`, its backward
`engine.backward`, whose gradients autograd delivers to the parameters and to `inputs`.
docs/pytorch.md has the rest: what is shared when, frozen parameters, train/eval, DDP, the limits.
`import cavs` does not import this module (nor torch).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from .engine import Engine, NonFiniteError
from .model import HEAD


class VertexModule(nn.Module):
    """`model`'s vertex function as a module: `module(batch, inputs=None)` is what every vertex of
    `batch` pushed, a (batch.num_vertices, push width) tensor. `engine_options` go to cavs.Engine
    (`frozen=names` start those parameters with requires_grad False; the engine's optimizer is not
    used). `sparse=True` gives the embedding a sparse gradient over the rows the batch read, as
    nn.Embedding(sparse=True) does (for torch.optim.SGD, Adagrad, SparseAdam)."""

    def __init__(self, model, *, sparse: bool = False, **engine_options):
        super().__init__()
        if not isinstance(sparse, bool):
            raise TypeError(f"sparse must be True or False, got {sparse!r}")
        self.model, self.sparse = model, sparse
        self.engine = Engine(model, **engine_options)
        self._cupy = self.engine.backend.name == "cupy"
        self._names = [k for k in self.engine._params if k not in HEAD]
        self._arrays = {}            # name -> the engine array its parameter was last bound to
        for name in self._names:
            if hasattr(self, name):
                raise ValueError(f"parameter name {name!r} is an attribute of torch.nn.Module; rename it in the model")
            array = self.engine._params[name]
            self.register_parameter(name, nn.Parameter(self._tensor(array), requires_grad=name not in self.engine.frozen))
            self._arrays[name] = array
        self._live = None            # the token of the pass whose activations the engine holds

    def forward(self, batch, inputs=None):
        if torch._C._are_functorch_transforms_active():
            raise RuntimeError("cavs.torch.VertexModule does not run under torch.func transforms (grad, vmap, jacrev, "
                               "jvp): the engine's pass is NumPy or CuPy code that they cannot see into; take "
                               "gradients with loss.backward() or torch.autograd.grad instead")
        self._bind()
        if inputs is not None and not torch.is_tensor(inputs):
            inputs = torch.as_tensor(inputs)      # NumPy or CuPy: its memory, as a tensor autograd can save
        return _Pass.apply(self, batch, inputs, *(self._parameters[k] for k in self._names))

    def extra_repr(self) -> str:
        return f"{self.model.describe()}, {self.engine.backend.name}, {self.engine.dtype.name}"

    def _apply(self, fn, recurse=True):
        """.to(), .double(), .cuda() ...: a conversion that would move the parameters off the engine's
        dtype or device is refused before anything changes (the engine computes in its own)."""
        for name in self._names:
            p = self._parameters[name]
            q = fn(p)
            if q.dtype != p.dtype or q.device != p.device:
                raise TypeError(f"cavs.torch.VertexModule: parameter {name} is the engine's {p.dtype} array on "
                                f"{p.device}, which cannot become {q.dtype} on {q.device}; build the model with "
                                f"that dtype (cavs.Model(dtype=...)) or the engine on that device (backend=...)")
        out = super()._apply(fn, recurse)
        self._bind()
        return out

    def __getstate__(self):
        raise TypeError("a cavs.torch.VertexModule holds an engine (compiled kernels), which does not pickle: save "
                        "module.state_dict() and load it into a VertexModule built from the same model")

    # ---------------------------------------------------------------- the memory both sides use

    def _tensor(self, array) -> torch.Tensor:
        return torch.from_dlpack(array) if self._cupy else torch.from_numpy(array)

    def _array(self, tensor):
        if self._cupy:
            import cupy
            return cupy.from_dlpack(tensor.detach())
        return tensor.detach().numpy()

    def _pointer(self, array) -> int:
        return array.data.ptr if self._cupy else array.ctypes.data

    def _bind(self) -> None:
        """Makes the engine compute with each parameter's memory. In-place updates keep it shared;
        a parameter given new memory (`p.data = ...`, load_state_dict(assign=True)) re-points the
        engine to it; an array the engine was given (engine.params[name] = value) is copied into
        the parameter, which the engine then uses."""
        params = self.engine._params
        for name in self._names:
            p, array = self._parameters[name], params[name]
            replaced = array is not self._arrays[name]
            if replaced:
                with torch.no_grad():
                    p.copy_(self._tensor(array))
            if not replaced and p.data_ptr() == self._pointer(array):
                continue
            t = p.detach()
            want = self._tensor(array)
            if t.dtype != want.dtype or t.device != want.device or t.shape != want.shape or not t.is_contiguous():
                raise TypeError(f"cavs.torch.VertexModule: parameter {name} became a {t.dtype} {tuple(t.shape)} tensor "
                                f"on {t.device}; the engine computes with a contiguous {want.dtype} "
                                f"{tuple(want.shape)} one on {want.device}")
            params[name] = self._arrays[name] = self._array(t)


class _Pass(torch.autograd.Function):
    """One engine pass. The engine holds the activations of its last forward only: a backward of
    an older pass (another forward ran since, or a retained graph's second backward) runs that
    forward again first, with the same dropout masks (the generator's state is kept)."""

    @staticmethod
    def forward(ctx, module, batch, inputs, *params):
        engine = module.engine
        ctx.module, ctx.batch, ctx.train = module, batch, module.training
        ctx.rng = engine._rng.bit_generator.state
        ctx.token = module._live = object()
        # saved, so that torch refuses a backward after an in-place change of them, as for its own ops
        ctx.save_for_backward(inputs, *params)
        out = engine.forward(batch, inputs=inputs, train=ctx.train)    # a new array: no engine buffer
        return module._tensor(out)

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out):
        module, engine = ctx.module, ctx.module.engine
        inputs, *params = ctx.saved_tensors
        if not bool(torch.isfinite(d_out).all()):
            raise NonFiniteError("cavs.torch: the gradient reaching the module's outputs is not finite (an overflowed "
                                 "loss or a diverged head); nothing reached the engine's parameters. Skip such steps "
                                 "(test torch.isfinite(loss) before loss.backward()) or lower the learning rate")
        if module._live is not ctx.token or engine._forwarded is not ctx.batch:
            rng = engine._rng.bit_generator
            now, rng.state = rng.state, ctx.rng
            engine.forward(ctx.batch, inputs=inputs, train=ctx.train)
            rng.state = now
            module._live = ctx.token
        grads = engine.backward(d_out, sparse=module.sparse)
        module._live = None
        d_inputs = None
        if ctx.needs_input_grad[2]:
            d_inputs = module._tensor(grads["inputs"]).to(inputs.dtype)
        out = [None, None, d_inputs]
        for name, p, needed in zip(module._names, params, ctx.needs_input_grad[3:]):
            g = grads.get(name)          # none for the embedding when `inputs` replaced it
            if not needed or g is None:
                out.append(None)
            elif isinstance(g, tuple):   # sparse: (rows, summed values), rows distinct and sorted
                rows, values = g
                out.append(torch.sparse_coo_tensor(module._tensor(rows.copy())[None], module._tensor(values), p.shape,
                                                   is_coalesced=True, check_invariants=False))
            elif name in engine._grads:  # an accumulator the next pass zeroes: autograd may keep what it gets
                out.append(module._tensor(g.copy()))
            else:
                out.append(module._tensor(g))
        return tuple(out)
