"""Figures and tables of the paper's evaluation, drawn from results/*.csv only (never from a live run):
`python -m plots EXPERIMENT --results DIR` writes DIR/<experiment>.png/.pdf or DIR/<table>.md/.csv."""
