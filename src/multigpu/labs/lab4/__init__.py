"""Lab 4 (beyond one box): links (emulated network links), multinode, elastic, costs, parallelism (data against model parallelism)."""
