"""Lab 2 and 2b (the naive pipeline, the ring): profiling, paramserver, ring, scaling_model (its tables in scaling_model_data)."""
