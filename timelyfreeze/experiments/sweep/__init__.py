"""Sweeps: a grid of jobs run one at a time with resume, their results rows, the comparison report and its
plots, time to accuracy."""
