"""Training data that ships with the repository: the embedded offline corpus, and a fixed multi-epoch set
with sample ids."""
