"""Lab 3 (Horovod): record_checks (facts of a correct run), syncbn (BatchNorm over the workers' global batch)."""
