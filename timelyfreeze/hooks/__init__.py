"""What runs inside a step's actions: the freezing hook, the stage subclasses that see every action, the
``requires_grad`` switch, the profiler, the random selection of units, a stage's tensors and units, and
what ``torch.compile`` did."""
