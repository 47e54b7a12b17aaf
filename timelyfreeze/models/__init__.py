"""Pretrained models beyond TorchTitan's own: their flavors and the conversions that bring their weights to
TorchTitan's HF load path (``smollm2``: SmolLM2-135M-Instruct from a GGUF file, ``gguf_llama``)."""
