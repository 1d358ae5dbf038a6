"""accelerando: one PyTorch script on CPU, GPUs, many machines; Accelerate's API, a smaller inside."""

__version__ = "0.1.0"
