"""Timing traces (``timelyfreeze-trace/1``): the metadata, loading and checking a trace, and synthetic traces
for planning without a GPU."""
