"""Lab 4 (beyond one box): links (emulated network links), multinode, elastic, costs."""
