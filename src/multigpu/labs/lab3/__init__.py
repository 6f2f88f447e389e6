"""Lab 3 (Horovod): record_checks (facts of a correct run)."""
