"""Lab 5 (when the model does not fit one device): memory (where a step's bytes go, ZeRO's
accounting), zero (ZeRO stages 1 and 2 over Horovod's collectives), fully_sharded (stage 3 by
hand, and torch's ``fully_shard``), tensor_parallel (Megatron's split MLP), pipeline (GPipe and
1F1B orders, the bubble measured), checkpointing (activation checkpointing, the sqrt(n) rule),
layouts (choosing tensor, pipeline and data degrees, checked against published runs), bytes_sent
(the bytes a worker process writes to its sockets)."""
