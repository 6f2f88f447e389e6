"""Runnable training scripts of the course (``python -m multigpu.running.scripts.<name>``).

- :mod:`multigpu.running.scripts.train_horovod`: the reference Horovod script of Lab 3 (1..N workers).
- :mod:`multigpu.running.scripts.train_ddp`: the same conversion with PyTorch DDP (``torchrun``).
"""
