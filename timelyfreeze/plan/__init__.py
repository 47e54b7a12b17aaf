"""The plan's life in a run: solving a plan from every rank's measurements, noticing when it stops matching,
and re-planning."""
