"""Lab 1 (gradient descent vs SGD): toy, gradient_noise, batching, large_batch (LARS), scaling_rule (the linear-scaling experiment)."""
