"""One-off studies: compile, Egeria's cache, the node-weight estimators, the gap model, the placement."""
