"""The freezing runtime of one rank: the sequence of calls in a step, the clocks across hosts, the per-step
gather, and the state saved in checkpoints (what the trainer hands it and the job's collectives are on the
ground floor, ``timelyfreeze.job``)."""
