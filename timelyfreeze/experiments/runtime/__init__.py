"""The runtime benchmark: repeated jobs of the embedded default, their analysis and tables, the overhead
trainer and the span figures."""
