"""The freezing runtime of one rank: the sequence of calls in a step, what the trainer hands it, the
collectives over the pipeline and the job, the per-step gather, and the state saved in checkpoints."""
