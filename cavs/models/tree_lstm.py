"""Binary Tree-LSTM (Tai et al. 2015, N = 2), as in the Cavs paper's Figure 4."""
from cavs import concat, sigmoid, tanh


def cell(v, p):
    x = v.pull()                                  # word embedding on leaves, zeros inside
    hl, cl = v.gather(0).split(2)                 # left child's state [h; c]
    hr, cr = v.gather(1).split(2)                 # right child's state
    g = x @ p.Wx + concat(hl, hr) @ p.Uh + p.b
    i, fl, fr, o, u = g.split(5)
    i, fl, fr, o, u = sigmoid(i), sigmoid(fl), sigmoid(fr), sigmoid(o), tanh(u)
    c = i * u + fl * cl + fr * cr
    h = o * tanh(c)
    v.scatter(concat(h, c))
    v.push(h)


cell.state_width = lambda hidden: 2 * hidden
