"""Input graphs and their readers (cavs/graphs.py, cavs/readers.py): the compiled batch reader gives
exactly the line-by-line reader's graphs; every malformed line gets the line-by-line reader's error,
naming the line; bad graphs (cycles, dangling or too many children, tokens, labels and features out
of range or of the wrong kind) raise InputError naming the sample and the vertex; a data file that
is not UTF-8 or is truncated is named."""
import pickle
import re

import numpy as np
import pytest

import cavs
from cavs.graphs import Graph, InputError, make_forest
from cavs.models import child_sum
from cavs.readers import SourceLine, parse_ptb_tree, parse_ptb_trees
from tests.engine.helpers import C, E, H, V, feature_cell


def same_graph(a, b):
    return (np.array_equal(a.children, b.children) and np.array_equal(a.tokens, b.tokens)
            and np.array_equal(a.labels, b.labels) and a.name == b.name)


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_batch_reader_equals_line_reader_on_all_of_sst(split):
    vocab = cavs.datasets.sst_vocab()
    lines = cavs.datasets.load_samples("tree_lstm", split)
    fast_batches = 0
    for i in range(0, len(lines), 64):
        batch = lines[i:i + 64]
        names = [line.origin for line in batch]
        graphs = parse_ptb_trees(batch, vocab, names)
        if graphs is None:      # only batches with a line outside the plain form (e.g. "\xa0")
            assert any("\xa0" in line for line in batch)
            continue
        fast_batches += 1
        for line, g in zip(batch, graphs):
            assert same_graph(g, parse_ptb_tree(line, vocab, line.origin)[0]), line.origin
    assert fast_batches >= len(lines) // 64 - 3


@pytest.mark.parametrize("line", [
    "(3 (2 8 1\\/2) (2 b))",                 # a word of two tokens, joined by one space
    "(3 (2 A)   (4 (2 is)  (4 GOOD) ) )",      # extra spaces, upper case (lower-cased)
    "(3 (2   a) (2 b))",                       # spaces before a word: line by line
    "(2 single)",                            # one vertex
    "(1 (2 a))",                             # one child
    "(3 (2 8\xa01\\/2) (2 b))",              # a non-breaking space: line by line
    "(3 (2 a)\n(2 b))",                       # a line break inside a sample: line by line
    "(3 (2 a\tb) (2 b))",                     # a tab: line by line
    "(3 (2 a ) (2 b)) ",                       # spaces after a word and after the root
    "(3 (2 ΟΔΟΣ) (2 İs))",                     # lower case by Python's rules (final sigma, dotted I)
])
def test_batch_reader_on_edge_cases(line):
    vocab = {"a": 1, "b": 2, "is": 3, "good": 4, "8 1\\/2": 5, "single": 6}
    batch = ["(1 (2 a) (3 b))", line, "(4 (0 is) (2 good))"]
    want = [parse_ptb_tree(x, vocab, f"s{i}")[0] for i, x in enumerate(batch)]
    got = parse_ptb_trees(batch, vocab, ["s0", "s1", "s2"])
    if any(declined in line for declined in ("\xa0", "   a", "\n", "\t")):
        assert got is None
    else:
        assert all(same_graph(g, w) for g, w in zip(got, want))


MALFORMED_TREES = [
    ("(3 (2 a) (2 b)", "unbalanced brackets"),
    ("(3 (2 a) (2 b)))", "unexpected ')'"),
    ("(3 (2 a) (2 b) (2 c))", "has 3 children"),
    ("(x (2 a) (2 b))", "is not an integer"),
    ("(3 (2 a) (7 b))", "label 7"),
    ("(13 (2 a) (2 b))", "label 13"),
    ("(3 word (2 a))", "mixes words and subtrees"),
    ("(3 (2 a) word)", "mixes words and subtrees"),
    ("(3 (2 a)) (2 b)", "text after the root"),
    ("word (3 (2 a))", "outside any bracket"),
    ("(3 (2 a) ())", "not followed by a label"),
    ("(3 (2 a) (2))", "neither word nor children"),
    ("", "empty line"),
]


@pytest.mark.parametrize("line,message", MALFORMED_TREES)
def test_batch_of_trees_with_one_bad_line_names_it(line, message):
    """The bad line sits between good ones; the error names its file and line."""
    good = [SourceLine("(1 (2 a) (3 b))", "train.txt:1"), SourceLine("(4 (0 is) (2 good))", "train.txt:3")]
    batch = [good[0], SourceLine(line, "train.txt:2"), good[1]]
    with pytest.raises(InputError, match=f"train.txt:2: .*{re.escape(message)}"):
        cavs.workloads.to_graphs("tree_lstm", batch)
    assert len(cavs.workloads.to_graphs("tree_lstm", good)) == 2


@pytest.mark.parametrize("line,message", MALFORMED_TREES)
def test_malformed_tree_names_the_line(line, message):
    """Through the engine's own entry point (test_batch_of_trees_with_one_bad_line_names_it: the same lines in a batch)."""
    model = cavs.models.build("tree_lstm", hidden=4)
    sample = cavs.readers.SourceLine(line, "train.txt:42")
    with pytest.raises(cavs.InputError, match=f"train.txt:42.*{re.escape(message)}"):
        model.make_batch([sample])


def test_a_data_file_that_is_not_utf8_or_is_truncated_is_named(tmp_path):
    """The data sets' files (cavs/models/datasets.py): each line knows its file and line; a byte that
    is not UTF-8 names the line, a truncated .gz its file, never a bare UnicodeDecodeError or EOFError."""
    import gzip
    from cavs.models import datasets
    (tmp_path / "ok.txt").write_bytes(b"a b\r\nc\n")
    assert [(line, line.origin) for line in datasets._lines(tmp_path / "ok.txt")] == \
        [("a b", "ok.txt:1"), ("c", "ok.txt:2")]
    (tmp_path / "bad.txt").write_bytes(b"a b\nc d\nfine \xff\xfe\n")
    with pytest.raises(InputError, match=r"bad.txt, line 3: not UTF-8 text \(byte 6 of the line is 0xff\)"):
        datasets._lines(tmp_path / "bad.txt")
    words = " ".join(str(i) for i in range(20000)).encode()
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(words)[:2000])
    with pytest.raises(InputError, match=r"cut.txt.gz: unreadable \(Compressed file ended"):
        datasets._lines(tmp_path / "cut.txt")


def test_errors_name_sample_and_vertex():
    model = cavs.models.build("tree_fc", hidden=4, leaves=4)
    cyclic = Graph(np.array([[-1, -1], [0, 2], [1, -1]]), np.array([1, -1, -1]), np.array([-1, -1, 0]), "sample 3")
    fine = Graph(np.array([[-1, -1], [-1, -1], [0, 1]]), np.array([1, 2, -1]), np.array([-1, -1, 0]), "sample 2")
    with pytest.raises(cavs.InputError, match="sample 3: the graph has a cycle; vertex 1"):
        make_forest([fine, cyclic], 2)
    out_of_range = Graph(np.array([[-1, -1], [0, 5]]), np.array([1, -1]), np.array([-1, 0]), "sample 0")
    with pytest.raises(cavs.InputError, match="sample 0: vertex 1 child 1 is 5, out of range"):
        make_forest([out_of_range], 2)
    ternary = Graph(np.array([[-1, -1, -1], [-1, -1, -1], [-1, -1, -1], [0, 1, 2]]),
                    np.array([1, 1, 1, -1]), np.array([-1, -1, -1, 0]), "sample 7")
    with pytest.raises(cavs.InputError, match="sample 7: vertex 3 has 3 children, more than .* arity 2"):
        make_forest([ternary], 2)
    with pytest.raises(cavs.InputError, match="empty batch"):
        model.make_batch([])
    with pytest.raises(cavs.InputError, match="sample 1: token 2 is 99999"):
        cavs.models.build("var_lstm", hidden=4).make_batch([[1, 2, 3], [4, 5, 99999, 6]])


def test_a_vertex_of_many_children_costs_its_edges_and_edges_batch_as_slots_do():
    """from_children keeps the edges: a star of 50,000 vertices batches and steps without the
    50,000 x 49,999 slot array (20 GB) the dense form would be; a batch mixing graphs given as
    slot arrays and as edges is the batch of the same graphs all given as slot arrays."""
    n = 50_000
    star = cavs.Graph.from_children([[] for _ in range(n - 1)] + [list(range(n - 1))],
                                    tokens=np.arange(n) % V, labels=np.arange(n) % C, name="star")
    model = child_sum.model(None, 4, E, V, classes=C)
    batch = model.make_batch([star])
    assert not star.given_slots and star._children is None and star.arity == n - 1
    assert len(batch.forest.edge_child) == n - 1 and batch.forest.level.max() == 1
    assert np.isfinite(cavs.Engine(model, fusion=False).step(batch))
    assert star._children is None                       # nothing built the slot array
    small = cavs.Graph.from_children([[], [0], [0, 1]])
    assert not small.children.flags.writeable           # built from the edges: an edit would not reach them
    again = pickle.loads(pickle.dumps(small))
    assert again._children is None and again.children.tolist() == small.children.tolist()
    lists = [[[], [0], [0, 1]], [[1, 2], [], [1], []], [[]], [[1], [], [0, 1]]]
    as_edges = [cavs.Graph.from_children(c, name=f"e{i}") for i, c in enumerate(lists)]
    as_slots = [Graph(g.children.copy(), g.tokens, g.labels, g.name) for g in as_edges]
    assert all(g.given_slots for g in as_slots)
    for arity in (None, 2):
        want = make_forest(as_slots, arity)
        for mixed in ([as_slots[0], as_edges[1], as_slots[2], as_edges[3]], as_edges):
            got = make_forest(mixed, arity)
            for field in ("edge_parent", "edge_child", "edge_slot", "level", "offsets"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=f"{field} {arity}")
            assert got.width == want.width


def test_a_split_limit_or_splice_that_cannot_be_is_named():
    """A typo in a split read as a missing data file; limit=-1 dropped the last sample in silence."""
    for call, said in ((lambda: cavs.datasets.sst_lines("trainn"), "unknown SST split 'trainn'; choose one of "
                                                                   "train, dev, test"),
                       (lambda: cavs.datasets.ptb_sentences("dev"), "unknown PTB split 'dev'; choose one of train, "
                                                                    "valid, test"),
                       (lambda: cavs.datasets.load_samples("tree_lstm", limit=-1), "limit must be a whole number "
                                                                                   "of at least 1"),
                       (lambda: cavs.datasets.load_samples("tree_lstm", limit="5"), "limit must be"),
                       (lambda: cavs.datasets.sst_nary_trees(limit=2, splice=2), r"splice must be a probability")):
        with pytest.raises(ValueError, match=said):
            call()
    assert len(cavs.datasets.load_samples("tree_lstm", "dev", limit=3)) == 3
    with pytest.raises(ValueError, match="hidden must be a whole number of at least 1, got 0"):
        cavs.models.build("tree_lstm", hidden=0)       # it said "state ... got 0", the model's 2h


def test_parent_array_reader():
    g = cavs.graphs.from_parent_array([2, 2, -1, 0], name="p")
    assert g.children.tolist() == [[3, -1], [-1, -1], [0, 1], [-1, -1]]
    with pytest.raises(cavs.InputError, match="p: vertex 1 has parent 9"):
        cavs.graphs.from_parent_array([-1, 9], name="p")
    with pytest.raises(cavs.InputError, match="cycle"):
        cavs.graphs.from_parent_array([1, 0, -1], name="p")


def test_bad_graphs_raise_input_error_naming_graph_and_vertex():
    model = child_sum.model(2, H, E, V, classes=C)
    cases = [
        (lambda: model.make_batch([cavs.Graph.from_children([[], [], [], [0, 1, 2]], name="too wide")]),
         r"too wide: vertex 3 has 3 children, more than .*arity 2"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [2], [1]], name="loop")]),
         r"loop: .*cycle.* vertex [12]\b"),
        (lambda: cavs.Graph.from_children([[], [0, 5]], name="dangling"),
         r"dangling: vertex 1 child 1 is 5, out of range"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [0]], labels=[-1, C], name="big label")]),
         rf"big label: vertex 1 has label {C}, outside 0..{C - 1}"),
        (lambda: model.make_batch([cavs.Graph.from_children([[], [0]], tokens=[V, -1], name="big token")]),
         rf"big token: vertex 0 has token {V}, outside the vocabulary 0..{V - 1}"),
        (lambda: cavs.Graph.from_parents([1, -1, 7], name="parents"), r"parents: vertex 2"),
        (lambda: cavs.Graph.from_parents([2.5, 2, -1], name="half"), r"half: vertex 0 has parent 2.5, not an integer"),
        (lambda: cavs.Graph.from_parents([[2], [2], [-1]], name="column"),
         r"column: parents must be a flat list, one entry per vertex; got shape \(3, 1\)"),
        (lambda: cavs.Graph.from_children([[], [0]], tokens=[[1], [2]], name="nested"),
         r"nested: tokens must be a flat list, one entry per vertex; got shape \(2, 1\)"),
        # Graph(...) itself converts nothing: a float token would be truncated, a list fail deep inside
        (lambda: model.make_batch([cavs.Graph(np.array([[-1, -1]]), np.array([1.5]), np.array([0]), "floats")]),
         r"floats: tokens must be an integer NumPy array, got float64 \(Graph.from_children"),
        (lambda: model.make_batch([cavs.Graph([[-1, -1]], [1], [0], "lists")]),
         r"lists: children must be an integer NumPy array, got list"),
    ]
    for make, pattern in cases:
        with pytest.raises(cavs.InputError, match=pattern):
            make()
    # the second graph of a batch is named, with its own vertex numbers
    good = cavs.Graph.from_children([[], [0]], tokens=[1, 2], labels=[0, 1], name="fine")
    with pytest.raises(cavs.InputError, match=r"second: vertex 0 has token 10"):
        model.make_batch([good, cavs.Graph.from_children([[]], tokens=[V], name="second")])


def test_fractional_tokens_and_labels_raise_input_error():
    with pytest.raises(cavs.InputError, match=r"fractional: vertex 0"):
        cavs.Graph.from_children([[]], tokens=[1.7], labels=[2.9], name="fractional")


def test_features_given_to_a_model_without_inputs_raise_input_error():
    model = cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4,
                       embedding=(V, 3), classes=2)
    g = cavs.Graph.from_children([[], [0]], tokens=[1, 2], features=np.zeros((2, 3)), labels=[0, 1], name="extra")
    with pytest.raises(cavs.InputError, match=r"extra: the graph has features, but the model reads none"):
        model.make_batch([g])


def test_features_of_the_wrong_width_or_beside_tokens_raise_input_error():
    model = cavs.Model(feature_cell, {"W": (3, 4), "U": (4, 4), "b": (4,)}, arity=2, state=4, inputs=3, classes=2)
    g = cavs.Graph.from_children([[], [0]], features=np.zeros((2, 4)), labels=[0, 1], name="wide features")
    with pytest.raises(cavs.InputError, match=r"wide features: .*3 features per vertex.*\(2, 4\)"):
        model.make_batch([g])
    with pytest.raises(cavs.InputError, match="no features"):
        model.make_batch([cavs.Graph.from_children([[], [0]], labels=[0, 1], name="no features")])
    both = cavs.Graph.from_children([[], [0]], tokens=[-1, 4], features=np.zeros((2, 3)), labels=[0, 1], name="both")
    with pytest.raises(cavs.InputError, match=r"both: vertex 1 has token 4, but the model reads features \(inputs=3\)"):
        model.make_batch([both])


def test_edge_levels_are_longest_paths_and_minus_one_on_or_above_a_cycle():
    """graphs.edge_levels (compiled Kahn) against the definition: a vertex without children is at
    level 0, any other one above its highest child; a vertex that never gets a level (on a cycle,
    or above one) is -1. Random edge lists with repeated edges, with and without cycles."""
    from cavs.graphs import edge_levels
    rng = np.random.default_rng(0)
    for trial in range(200):
        n = int(rng.integers(1, 40))
        edges = int(rng.integers(0, 3 * n))
        parent, child = rng.integers(0, n, edges), rng.integers(0, n, edges)
        if trial % 2:                                   # acyclic: every child before its parent
            keep = child < parent
            parent, child = parent[keep], child[keep]
        want = [-1] * n
        for _ in range(n + 1):                          # relax until nothing changes
            for v in range(n):
                kids = child[parent == v]
                if len(kids) == 0:
                    want[v] = 0
                elif all(want[k] >= 0 for k in kids):
                    want[v] = 1 + max(want[k] for k in kids)
        np.testing.assert_array_equal(edge_levels(n, parent, child), want, err_msg=f"trial {trial}")
