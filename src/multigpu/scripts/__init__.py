"""Runnable training scripts of the course (``python -m multigpu.scripts.<name>``).

- :mod:`multigpu.scripts.train_horovod`: the reference Horovod script of Lab 3 (1..N workers).
- :mod:`multigpu.scripts.train_ddp`: the same conversion with PyTorch DDP (``torchrun``).
"""
