"""What runs inside a step's actions: the freezing hook, the stage subclasses that see every action, the
``requires_grad`` switch, the profiler, a stage's tensors and units, and what ``torch.compile`` did (the random
selection of units is the methods': ``timelyfreeze.methods.selection``)."""
