"""The timing model read off a trace's monitoring windows: node-weight estimators, cross-rank delays, the
gaps between a rank's actions, jitter, machine speed and noise, drift of a running plan, measured spans."""
