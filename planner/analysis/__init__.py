"""Studies of finished runs that only the experiments use: where a measured batch's time goes, and what the
plan's placement buys over uniform freezing."""
