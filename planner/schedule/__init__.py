"""What a schedule is, without torch: action names, each rank's order of actions in torch's schedules, and
the batch DAG with its longest path."""
