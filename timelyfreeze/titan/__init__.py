"""Where the runtime meets TorchTitan: the trainer, the ``TrainSpec`` extension points, the shims a host
without CUDA needs, torch fixes, and the one ``torchrun`` launcher."""
