"""The freeze LP: one planning problem built once, its budgets, its arrays and model, the HiGHS solve and
the region method."""
