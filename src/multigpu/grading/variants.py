"""Cheating and broken conversions, made from the reference by a small table of edits.

Each variant is the reference solution (``solutions/assessments/train.py``) with a few lines
changed, so it stays in step with the reference; :func:`write` fails loudly when an edit no longer
applies. The tests and ``multigpu calibrate`` grade the same variants.

=====================  =====================================================  ==================
variant                what it does                                            must fail
=====================  =====================================================  ==================
``never_averaged``     each rank trains alone on its shard (no                 identical, sharded
                       DistributedOptimizer) and broadcasts rank 0's weights
                       just before every save: identical checkpoints
``all_data_each_rank`` every rank trains on ALL the data (gradients averaged)   throughput
                       but reports a disjoint quarter of the indices
``straggler``          rank 1 sleeps 1 s every step                            throughput
``rank0_saves_only``   Lab 3's habit: only rank 0 saves a checkpoint           workers
=====================  =====================================================  ==================
"""

from __future__ import annotations

from pathlib import Path

SAVE = "        save_checkpoint(args.checkpoint_dir, model, epoch, rank, trained_on)"
DISTRIBUTE = "    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())\n"
LOADER = "    train_loader = data.make_loader(train_set, args.batch_size, sampler=sampler)"
RECORD = "            trained_on.extend(index.tolist())"
STEP = "            optimizer.step()\n"

#: variant -> {old text of the reference: new text}
EDITS: dict[str, dict[str, str]] = {
    "never_averaged": {
        DISTRIBUTE: "",
        SAVE: "        hvd.broadcast_parameters(model.state_dict(), root_rank=0)\n" + SAVE,
    },
    "all_data_each_rank": {
        LOADER: "    train_loader = data.make_loader(train_set, args.batch_size, shuffle=True)",
        RECORD: "            trained_on.extend(i for i in index.tolist() if i % workers == rank)",
    },
    "straggler": {
        STEP: STEP + "            if rank == 1:\n                __import__('time').sleep(1.0)\n",
    },
    "rank0_saves_only": {
        SAVE: "        if rank == 0:\n    " + SAVE,
    },
}

#: variant -> the criterion it must fail
MUST_FAIL: dict[str, str] = {
    "never_averaged": "identical",
    "all_data_each_rank": "throughput",
    "straggler": "throughput",
    "rank0_saves_only": "workers",
}


def write(name: str, reference: Path, dest: Path) -> Path:
    """Write variant ``name`` of ``reference`` to ``dest`` (a file path); returns ``dest``."""
    source = Path(reference).read_text()
    for old, new in EDITS[name].items():
        if old not in source:
            raise ValueError(f"variant {name}: the reference no longer contains {old.strip()!r}: update the edit")
        source = source.replace(old, new)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.startswith('"""'):  # say so in the docstring (a second one would break `from __future__`)
        source = f'"""BROKEN VARIANT {name} (multigpu.grading.variants) of the ' + source[3:]
    dest.write_text(source)
    return dest
