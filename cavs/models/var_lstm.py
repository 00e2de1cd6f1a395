"""LSTM language model, one PTB sentence per chain: the Fixed-LSTM cell on chains of any length."""
from . import fixed_lstm

cell = fixed_lstm.cell


def model(hidden: int, **common):
    return fixed_lstm.model(hidden, workload="var_lstm", **common)
