"""Training data that ships with the repository: the embedded offline corpus, a fixed multi-epoch set with
sample ids, the instruction pairs and their held-out multiple-choice task, and which loader a dataset name gets."""
