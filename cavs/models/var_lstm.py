"""LSTM language model, one sentence per chain: the same cell as Fixed-LSTM on chains of any length."""
from .fixed_lstm import cell

__all__ = ["cell"]
