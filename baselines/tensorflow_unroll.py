"""TensorFlow static and dynamic unrolling: the paper's static-declaration LSTM baselines.

Fixed-LSTM: the graph is statically unrolled (a Python loop over the T steps inside a
tf.function), as in TensorFlow's PTB language-model tutorial. Var-LSTM: the dynamic unroll of
tf.nn.dynamic_rnn: a tf.while_loop over the longest sentence of the batch, every sample padded
to it, state frozen past each sample's length. The recurrent steps computed on padding are part
of what the paper measures, so they are kept; the 10,000-class output layer runs only on the
real positions (`tf.boolean_mask` with `tf.sequence_mask`), as a TensorFlow user masks them.

Both run one compiled tf.function per train/infer step (forward, tf.GradientTape backward of the
mean loss, tf.clip_by_global_norm, SGD `p -= lr * g`). Tracing is timed as construct_s and
counted in timings.extra["traces"]; Var-LSTM declares an input signature with a free length, so
a new maximum length never retraces.
Tree workloads are not implemented, as in the paper (no static-graph expression of them).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from cavs import workloads
from cavs.graphs import InputError

from .base import System


def _set_threads(threads: int) -> None:
    """Intra-op threads = `threads`, inter-op 1; TF accepts this only before its first op."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        now = (tf.config.threading.get_intra_op_parallelism_threads(),
               tf.config.threading.get_inter_op_parallelism_threads())
        if now != (threads, 1):
            raise RuntimeError(f"TensorFlow already runs with intra/inter-op threads {now} in this process; "
                               f"threads={threads} needs a fresh process") from None


class TensorflowSystem(System):
    name = "tensorflow"
    blas = "onednn (tensorflow)"
    workloads = ("fixed_lstm", "var_lstm")

    def __init__(self, workload, **kwargs):
        super().__init__(workload, **kwargs)
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype!r}")
        _set_threads(self.threads)
        self.tf_dtype = tf.as_dtype(self.dtype)
        sizes = workloads.sizes(self.workload, self.hidden, embed=self.embed)
        self.shapes = workloads.param_shapes(self.workload, sizes)
        init = workloads.init_params(self.workload, self.hidden, self.seed, self.dtype, embed=self.embed)
        self.vars = {name: tf.Variable(value, name=name) for name, value in init.items()}
        self.timings.extra.update(threads=self.threads, traces=0)
        if self.workload == "var_lstm":
            spec = [tf.TensorSpec([None, None], tf.int32)] * 2 + [tf.TensorSpec([None], tf.int32)]
            self._fn = tf.function(self._train if self.mode == "train" else self._loss, input_signature=spec)
        else:   # the unrolled graph depends on T, so each new (batch, T) shape is a new trace
            self._fn = tf.function(self._train if self.mode == "train" else self._loss)

    # ------------------------------------------------------------ parameters

    def set_params(self, params):
        for name, var in self.vars.items():
            value = np.asarray(params[name])
            if value.shape != self.shapes[name]:
                raise ValueError(f"parameter {name}: shape {value.shape}, expected {self.shapes[name]}")
            var.assign(value.astype(self.dtype))

    def get_params(self):
        return {name: var.numpy() for name, var in self.vars.items()}

    # ------------------------------------------------------------ batches

    def prepare(self, samples):
        """Pads token ids and targets to the batch's longest sample: (ids, targets, lengths)."""
        with self.timings.timing("construct_s"):
            if not samples:
                raise InputError("empty batch: no samples were given")
            graphs = workloads.to_graphs(self.workload, samples)
            lengths = np.array([g.num_vertices for g in graphs], dtype=np.int32)
            if self.workload == "fixed_lstm" and (lengths != lengths[0]).any():
                i = int(np.flatnonzero(lengths != lengths[0])[0])
                raise InputError(f"{graphs[i].name}: {lengths[i]} steps; a fixed_lstm batch needs "
                                 f"equal lengths ({lengths[0]} in {graphs[0].name})")
            ids = np.zeros((len(graphs), lengths.max()), dtype=np.int32)
            targets = np.zeros_like(ids)
            for i, g in enumerate(graphs):
                ids[i, :lengths[i]], targets[i, :lengths[i]] = g.tokens, g.labels
        return ids, targets, lengths

    def step(self, batch) -> float:
        args = [tf.constant(a) for a in batch]
        with self.timings.timing("construct_s"):
            fn = self._fn.get_concrete_function(*args)   # traces only for a new signature
        with self.timings.timing("compute_s"):
            loss = float(fn(*args))
        self.timings.samples += len(batch[2])
        self.timings.steps += 1
        return loss

    # ------------------------------------------------------------ the model (traced)

    def _cell(self, x, h, c):
        g = x @ self.vars["Wx"] + h @ self.vars["Wh"] + self.vars["b"]
        i, f, o, u = tf.split(g, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(u)
        return tf.sigmoid(o) * tf.tanh(c), c

    def _loss(self, ids, targets, lengths):
        extra = self.timings.extra                 # Python runs here only while tracing
        extra["traces"] = extra.get("traces", 0) + 1
        # time-major (T, B, E) inputs, split into steps once (tf.unstack, a TensorArray in the loop)
        # as the PTB tutorial and Keras do: the gradient of `xs[t]` would be a full (T, B, E) tensor
        xs = tf.transpose(tf.gather(self.vars["emb"], ids), [1, 0, 2])
        zeros = tf.zeros([tf.shape(ids)[0], self.hidden], self.tf_dtype)
        if self.workload == "fixed_lstm":
            h, c, outputs = zeros, zeros, []
            for x in tf.unstack(xs, num=ids.shape[1]):    # static unroll: T copies of the cell
                h, c = self._cell(x, h, c)
                outputs.append(h)
            outputs = tf.stack(outputs, axis=1)
        else:
            steps = tf.shape(ids)[1]
            inputs = tf.TensorArray(self.tf_dtype, size=steps).unstack(xs)

            def body(t, h, c, out):
                h_new, c_new = self._cell(inputs.read(t), h, c)
                live = (t < lengths)[:, None]       # freeze the state past each sample's end
                h, c = tf.where(live, h_new, h), tf.where(live, c_new, c)
                return t + 1, h, c, out.write(t, h)

            out = tf.TensorArray(self.tf_dtype, size=steps)
            _, _, _, out = tf.while_loop(lambda t, *_: t < steps, body, (0, zeros, zeros, out))
            outputs = tf.transpose(out.stack(), [1, 0, 2])
        if self.workload == "fixed_lstm":          # every position is real
            h, targets = tf.reshape(outputs, [-1, self.hidden]), tf.reshape(targets, [-1])
        else:   # the output layer only on real positions: drop the padded rows first
            real = tf.sequence_mask(lengths, tf.shape(ids)[1])
            h, targets = tf.boolean_mask(outputs, real), tf.boolean_mask(targets, real)
        logits = h @ self.vars["Wout"] + self.vars["bout"]
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        return tf.reduce_mean(ce)                  # the mean over predicted tokens

    def _train(self, ids, targets, lengths):
        variables = list(self.vars.values())
        with tf.GradientTape() as tape:
            loss = self._loss(ids, targets, lengths)
        grads = []
        for grad in tape.gradient(loss, variables):
            if isinstance(grad, tf.IndexedSlices):
                # the embedding's gradient has one row per lookup; a token used twice must count
                # once in the global norm, with its rows summed (the dense gradient's row)
                rows, slot = tf.unique(grad.indices)
                grad = tf.IndexedSlices(tf.math.unsorted_segment_sum(grad.values, slot, tf.size(rows)),
                                        rows, grad.dense_shape)
            grads.append(grad)
        grads, _ = tf.clip_by_global_norm(grads, workloads.CLIP_NORM)
        lr = tf.constant(workloads.LEARNING_RATE, self.tf_dtype)
        for var, grad in zip(variables, grads):
            if isinstance(grad, tf.IndexedSlices):  # embedding rows: update only the rows used
                var.scatter_sub(tf.IndexedSlices(lr * grad.values, grad.indices))
            else:
                var.assign_sub(lr * grad)
        return loss
