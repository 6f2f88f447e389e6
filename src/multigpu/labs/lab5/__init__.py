"""Lab 5 (when the model does not fit one device): memory (where a step's bytes go, ZeRO's
accounting, the gradient bytes a rank holds), collectives (which of Horovod's run here, and their
times), zero (ZeRO stage 1 over Horovod's collectives, and the stages compared with data
parallelism), sharded_gradients (stage 2: each layer's gradient reduce-scattered in backward),
fully_sharded (stage 3 by hand, and torch's ``fully_shard``), tensor_parallel (Megatron's split
MLP), pipeline (GPipe and 1F1B orders, the bubble measured), checkpointing (activation
checkpointing, the sqrt(n) rule), layouts (choosing tensor, pipeline and data degrees, checked
against published runs), bytes_sent (the bytes a worker process writes to its sockets)."""
