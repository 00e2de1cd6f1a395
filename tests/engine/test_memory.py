"""Dynamic tensors and the message ops (cavs/memory.py): only gather, scatter, pull and push move
memory, and exactly the bytes of the rows they move."""
import cavs
from tests.conftest import backend_name


def test_only_message_ops_move_memory():
    """Tree-FC, two complete trees of 4 leaves, h = 3, float64: exact bytes per message op."""
    model = cavs.models.build("tree_fc", hidden=3, seed=0, dtype="float64", leaves=4)
    engine = cavs.Engine(model, backend=backend_name())
    batch = model.make_batch(cavs.datasets.tree_fc_samples(2, leaves=4, seed=1))
    engine.loss_and_grads(batch)
    row = 3 * 8
    internal = 2 * 3                               # 3 internal vertices per tree
    assert set(engine.counters.bytes_moved) == {"gather", "scatter", "pull", "push"}
    assert engine.counters.bytes_moved["gather"] == 2 * internal * row      # two children each
    assert engine.counters.bytes_moved["scatter"] == 2 * internal * row     # their gradients back
    assert engine.counters.bytes_moved["pull"] == 2 * 4 * row               # leaf embeddings in
    # out: the two roots' pushed rows to the loss, and the 8 leaves' d(pull) to the embedding
    assert engine.counters.bytes_moved["push"] == 2 * row + 8 * row
