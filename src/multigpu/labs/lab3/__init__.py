"""Lab 3 (Horovod): record_checks (facts of a correct run), syncbn (BatchNorm over the workers' global batch), backward_passes (gradient accumulation with one all-reduce per optimizer step)."""
