"""LSTM language model over fixed-length chains (64 tokens)."""
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                  # embedding of this step's token
    h_prev, c_prev = v.gather(0).split(2)         # previous step's state (zeros at t = 0)
    i, f, o, u = (x @ p.Wx + h_prev @ p.Wh + p.b).split(4)
    c = sigmoid(f) * c_prev + sigmoid(i) * tanh(u)
    h = sigmoid(o) * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


cell.state_width = lambda hidden: 2 * hidden
