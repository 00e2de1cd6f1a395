"""Reading SST trees: the vectorized batch reader gives exactly the line-by-line reader's graphs,
and every malformed line still gets the line-by-line reader's error, naming the line."""
import re

import numpy as np
import pytest

import cavs
from cavs.graphs import InputError
from cavs.readers import SourceLine, parse_ptb_tree, parse_ptb_trees


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
])
def test_batch_reader_on_edge_cases(line):
    vocab = {"a": 1, "b": 2, "is": 3, "good": 4, "8 1\\/2": 5, "single": 6}
    batch = ["(1 (2 a) (3 b))", line, "(4 (0 is) (2 good))"]
    want = [parse_ptb_tree(x, vocab, f"s{i}")[0] for i, x in enumerate(batch)]
    got = parse_ptb_trees(batch, vocab, ["s0", "s1", "s2"])
    if "\xa0" in line or "   a" in line:
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
