"""What a run writes for its user (``docs/run-outputs.md``): the metrics rows and ``metrics.jsonl``, the
end-of-run summary and the timeline PNG."""
