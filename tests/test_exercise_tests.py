"""The notebooks' exercise tests reject the wrong answers a learner is likely to write.

Each case takes a graded test cell of a solution notebook (hidden tests included, as the
autograder runs it), runs it in a fresh process (a warm one, multigpu.running.warm: a fork of a
Python that imported torch and Horovod once) after a few lines that stand in for the cells above it and a WRONG answer in place
of the exercise cell, and expects it to fail with a message that starts with what to change. The same harness runs the solution's own answer and
expects it to pass, so a test cell that fails everything would show here too.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import textwrap
import time

import pytest

import test_ring
from conftest import REPO
from multigpu.running import launch, warm

NOTEBOOKS = REPO / "solutions" / "notebooks"

#: Stand-ins for the notebook cells above the exercises (imports, the mode, a single-worker Horovod).
CONTEXT = {
    "00-welcome": "",
    "01-gd-vs-sgd": """
        import numpy as np
        import torch

        from multigpu.labs.lab1 import gradient_noise, toy

        problem = toy.make_problem(2000, seed=0)
        x, y = problem.x, problem.y
        VARIANCE_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256]

        def scaled_lr(base_lr, batch_size, base_batch_size):  # Exercise 5, answered (lr_at uses it)
            return base_lr * batch_size / base_batch_size
    """,
    "02-alexnet-pipeline": """
        import torch

        from multigpu.core import data, devices, models
        from multigpu.labs.lab2 import profiling

        info = devices.detect()
        device = devices.worker_device(0, info)
        torch.set_num_threads(1)
        BATCH, IMAGE_SIZE = 64, 64
        DEVICES_FED = info.gpus if info.mode == "gpu" else 4
        root = data.ensure_dataset(train_per_class=100, val_per_class=10)
        train_set = data.JPEGFolder(root, data.train_transform(IMAGE_SIZE), split="train")
        model = models.build_model("alexnet_small", num_classes=len(train_set.classes))
        stages = profiling.time_stages(train_set, 32, BATCH, device=device)
        # what paramserver.measure_ps_scaling((1, 2, 4), {"steps": 2, "warmup": 1, "batch_size": 16}) measured
        # (rank 0's bytes, counted from the tensors it received and sent; images/s as it might measure them)
        ps_rows = [{"workers": w, "gradient_bytes": 22586920, "central_bytes": central, "images_per_s": ips,
                    "efficiency": ips / (min(w, info.devices) * 100.0)}
                   for w, central, ips in ((1, 0, 100.0), (2, 45173840, 150.0), (4, 135521520, 170.0))]
    """,
    "02b-ring-allreduce": """
        import torch
        import torch.distributed as dist

        from multigpu.labs.lab2 import ring, scaling_model

        CHECK_SIZES = (1, 7, 1001, 4099)
    """,
    "03-horovod": """
        import json
        from pathlib import Path

        import horovod.torch as hvd
        import torch
        from torch.utils.data import DistributedSampler

        from multigpu.core import data, devices, models, training

        info = devices.detect()
        WORK = Path("runs/lab3").resolve()
        WORK.mkdir(parents=True, exist_ok=True)
        hvd.init()
    """,
    "04-beyond-one-box": """
        import math

        import horovod.torch as hvd
        import torch

        from multigpu.core import data, models
        from multigpu.labs.lab2 import scaling_model
        from multigpu.labs.lab4 import costs

        hvd.init()

        def expected_spot_hours(hours, interruptions_per_hour, checkpoint_every=None):  # Exercise 6, answered
            return costs.expected_hours_with_interruptions(hours, interruptions_per_hour, checkpoint_every=checkpoint_every)
    """,
    "05-sharding-and-model-parallelism": """
        import math
        import statistics

        import horovod.torch as hvd
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        from multigpu.labs.lab5 import memory, pipeline, tensor_parallel, zero

        WORKERS, TIMEOUT = 4, 300
    """,
}


def parallel_mlp_with(old: str, new: str) -> str:
    """Lab 5's split MLP (the solution cell) with one piece replaced: a wrong answer."""
    right = cell("05-sharding-and-model-parallelism", "parallel_mlp")
    assert old in right, f"the solution's parallel_mlp has no {old!r}"
    return right.replace(old, new)


def delegation(notebook: str, exercise: str, test_id: str, answer: str) -> tuple[str, str, str, str, str]:
    """A one-line answer that hands the exercise to the course's own version of it (the package keeps
    one for the cells after the exercise): it must fail, saying to write the answer yourself."""
    name = answer.split("def ", 1)[1].split("(", 1)[0] if "def " in answer else answer.split("=", 1)[0].strip()
    return (notebook, exercise, test_id, answer, f"write {name} yourself")


def cell(notebook: str, grade_id: str) -> str:
    """The source of the cell with this nbgrader id in the solution notebook."""
    nb = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())
    found = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(found) == 1, f"{notebook}: no single cell {grade_id!r}"
    return "".join(found[0]["source"])


def amp_step_with(line: str, replacement: str) -> str:
    """Lab 2's AMP step (the solution cell) with one line replaced: a wrong answer."""
    right = cell("02-alexnet-pipeline", "amp_step")
    assert line in right, f"the solution's amp_step has no line {line!r}"
    return right.replace(line, replacement)


def solution_with(notebook: str, exercise: str, line: str, replacement: str) -> str:
    """An exercise's solution cell with one line replaced: a wrong answer."""
    right = cell(notebook, exercise)
    assert line in right, f"the solution's {exercise} has no line {line!r}"
    return right.replace(line, replacement)


def parallel_degree_with(line: str, replacement: str) -> str:
    """Lab 4's Exercise 8 (the solution cell) with one line replaced: a wrong answer."""
    right = cell("04-beyond-one-box", "model_parallel_degree")
    assert line in right, f"the solution's Exercise 8 has no line {line!r}"
    return right.replace(line, replacement)


@pytest.fixture(scope="module")
def python():
    """A warm Python (a fork of one that imported torch, Horovod and the package): a fresh
    process per case without paying the imports (multigpu.running.warm)."""
    return warm.python()


def run_test_cell(python: list[str], notebook: str, test_id: str, answer: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``answer`` then the test cell ``test_id`` of ``notebook`` in a fresh process."""
    script = tmp_path / "exercise.py"
    script.write_text("\n".join([textwrap.dedent(CONTEXT[notebook]), textwrap.dedent(answer),
                                 cell(notebook, test_id)]))
    try:
        return subprocess.run([*python, str(script)], cwd=tmp_path, env=launch.worker_env(), capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -9, e.stdout or "", (e.stderr or "") + "\n(killed after 300 s)")


def solution(notebook: str, exercise_id: str) -> str:
    return cell(notebook, exercise_id)


# (notebook, exercise cell, its test cell, a wrong answer, how the failure message must start)
WRONG = [
    ("00-welcome", "mean_rank", "test_mean_rank", """
        def mean_rank():
            import horovod.torch as hvd

            hvd.init()
            return (hvd.size() - 1) / 2  # the right number, no all-reduce
     """, "average with hvd.allreduce"),
    ("00-welcome", "mean_rank", "test_mean_rank", """
        def mean_rank():
            import horovod.torch as hvd
            import torch

            hvd.init()
            return hvd.allreduce(torch.tensor([hvd.rank()]), op=hvd.Average, name="mean_rank").item()
     """, "average a float tensor"),
    ("01-gd-vs-sgd", "converged", "test_converged", """
        def converged(previous_loss, loss, tol=1e-3):
            if not (np.isfinite(previous_loss) and np.isfinite(loss)):
                return False
            if loss == previous_loss:
                return True
            return loss != 0 and abs(previous_loss - loss) / abs(loss) < tol  # relative to the current loss
     """, "divide the change by the PREVIOUS loss"),
    ("01-gd-vs-sgd", "gradient_variance", "test_gradient_variance", """
        def gradient_variance(theta, x, y, batch_size, trials, rng):
            full = toy.gradient(theta, x, y)
            total = 0.0
            for _ in range(trials):
                idx = rng.choice(len(x), size=batch_size, replace=False)  # without replacement
                diff = toy.gradient(theta, x[idx], y[idx]) - full
                total += float(diff @ diff)
            return total / trials
     """, "draw the indices WITH replacement"),
    ("01-gd-vs-sgd", "gradient_variance", "test_gradient_variance", """
        def gradient_variance(theta, x, y, batch_size, trials, rng):
            full = toy.gradient(theta, x, y)
            total = 0.0
            for _ in range(trials):
                idx = rng.permutation(len(x))[:batch_size]  # a shuffled prefix: without replacement
                diff = toy.gradient(theta, x[idx], y[idx]) - full
                total += float(diff @ diff)
            return total / trials
     """, "draw the indices WITH replacement"),
    ("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        def trust_ratio(weight, grad, eta, weight_decay):
            return eta * float(grad.norm()) / (float(weight.norm()) + 1e-12)  # upside down
     """, "divide eta x |w| by |g|"),
    ("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        def trust_ratio(weight, grad, eta, weight_decay):
            w, g = float(weight.norm()), float(grad.norm())
            return 1.0 if w == 0 or g == 0 else eta * w / g  # weight decay left out
     """, "add weight_decay x |w| to |g| in the denominator"),
    ("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        def trust_ratio(weight, grad, eta, weight_decay):
            w = float(weight.norm())
            return eta * w / (float(grad.norm()) + weight_decay * w)  # no edge cases
     """, "return 1.0 when the weights are all zero"),
    ("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        def trust_ratio(weight, grad, eta, weight_decay):
            w = float(weight.norm())
            if w == 0:
                return 1.0
            return eta * w / (float(grad.norm()) + weight_decay * w)  # a zero gradient divides by zero
     """, "return 1.0 when |g| + weight_decay |w| is zero"),
    ("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        def trust_ratio(weight, grad, eta, weight_decay):
            if weight.ndim < 2:
                w = float(weight.norm())
                d = float(grad.norm()) + weight_decay * w
                return 1.0 if w == 0 or d == 0 else eta * w / d
            w, g = weight.reshape(weight.shape[0], -1).norm(dim=1), grad.reshape(grad.shape[0], -1).norm(dim=1)
            d = g + weight_decay * w  # a matrix or kernel: one ratio per row (output channel), then their mean
            r = torch.where((w > 0) & (d > 0), eta * w / d.clamp_min(1e-30), torch.ones_like(w))
            return float(r.mean())
     """, "use the norm of the whole layer"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            model.zero_grad()
            total = 0.0
            for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
                loss = loss_fn(model(x), y)  # a sum of mean losses, not their weighted mean
                loss.backward()
                total += loss.item()
            return total / micro_batches
     """, "scale each micro-batch's loss by its share of the batch"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            total = 0.0
            for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
                model.zero_grad()  # inside the loop: each micro-batch wipes the one before
                loss = loss_fn(model(x), y) * len(x) / len(inputs)
                loss.backward()
                total += loss.item()
            return total
     """, "the gradient holds only the last micro-batch"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            model.zero_grad()
            losses = [loss_fn(model(x), y) * len(x) / len(inputs)
                      for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches))]
            losses[-1].backward()  # only the last micro-batch's gradient
            return float(sum(loss.item() for loss in losses))
     """, "the gradient holds only the last micro-batch"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            model.zero_grad()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            total = 0.0
            for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
                loss = loss_fn(model(x), y) * len(x) / len(inputs)
                loss.backward()
                optimizer.step()  # a step per micro-batch
                total += loss.item()
            return total
     """, "do not change the weights"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            model.zero_grad()
            total = 0.0
            for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
                loss = loss_fn(model(x), y) / micro_batches  # 1 / k also where the pieces differ in size
                loss.backward()
                total += loss.item()
            return total
     """, "the accumulated gradient must equal one batch's"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            total = 0.0  # .grad never cleared: the old gradient is added to
            for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
                loss = loss_fn(model(x), y) * len(x) / len(inputs)
                loss.backward()
                total += loss.item()
            return total
     """, "the accumulated gradient must equal one batch's"),
    ("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            model.zero_grad()
            loss = sum(loss_fn(model(x), y) * len(x) / len(inputs)  # one backward: every graph kept until then
                       for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)))
            loss.backward()
            return loss.item()
     """, "call backward on each micro-batch before the next one's forward"),
    ("02-alexnet-pipeline", "make_fast_loader", "test_fast_loader_keeps_up", """
        def make_fast_loader(dataset):
            return data.make_loader(dataset, batch_size=1, shuffle=True)  # keeps up with a CPU model, one image at a time
     """, "batch the images"),
    ("02-alexnet-pipeline", "make_fast_loader", "test_fast_loader_keeps_up", """
        def make_fast_loader(dataset):
            return data.make_loader(dataset, batch_size=2, shuffle=True)  # batched, and still fast enough for a CPU model
     """, "batch the images as the model takes them, batch_size=BATCH"),
    # Lab 2's AMP step with one line changed, each the way a learner might
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    with torch.autocast(images.device.type, dtype=dtype):", "    if True:  # no autocast"),
     "run the forward pass under torch.autocast"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    optimizer.zero_grad(set_to_none=True)\n",
                   "    optimizer.zero_grad(set_to_none=True)\n    model.to(dtype)  # the whole model in half precision\n"),
     "keep the weights in float32"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    scaler.scale(loss).backward()", "    loss.backward()  # not scaled"),
     "scale the loss for backward: scaler.scale(loss).backward()"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    scaler.step(optimizer)", "    optimizer.step()  # past the scaler"),
     "step with scaler.step(optimizer)"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    optimizer.zero_grad(set_to_none=True)\n", ""), "zero the gradients at the start of the step"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    scaler.update()\n", ""), "call scaler.update() after the step"),
    ("02-alexnet-pipeline", "amp_step", "test_amp_step",
     amp_step_with("    return loss.detach()", "    return scaler.scale(loss).detach()"), "return the loss itself"),
    ("02b-ring-allreduce", "ring_allreduce", "test_ring_allreduce",
     inspect.getsource(test_ring.direct_allreduce) + "\nring_allreduce = direct_allreduce\n",
     "send only to your right neighbour"),
    ("02b-ring-allreduce", "sharded_ps_time", "test_sharded_ps_time", """
        def sharded_ps_time(nbytes, workers, servers, link):
            if workers <= 1:
                return 0.0
            return 2 * (link.latency_s + workers * nbytes / servers / link.bandwidth)  # its own slice too
     """, "count the other workers' slices only"),
    ("02b-ring-allreduce", "sharded_ps_time", "test_sharded_ps_time", """
        def sharded_ps_time(nbytes, workers, servers, link):
            if workers <= 1:
                return 0.0
            return 2 * (link.latency_s + (workers - 1) * nbytes / link.bandwidth)  # as if one server
     """, "divide the gradient among the servers"),
    ("02b-ring-allreduce", "sharded_ps_time", "test_sharded_ps_time", """
        def sharded_ps_time(nbytes, workers, servers, link):
            if workers <= 1:
                return 0.0
            return link.latency_s + (workers - 1) * nbytes / servers / link.bandwidth  # the push only
     """, "count both phases, push and pull"),
    ("02b-ring-allreduce", "hierarchical_time", "test_hierarchical_time", """
        def hierarchical_time(nbytes, nodes, gpus_per_node, intra, inter):
            n = nodes * gpus_per_node  # one flat ring over every GPU, at the network's speed
            return 2 * (n - 1) * (inter.latency_s + nbytes / n / inter.bandwidth)
     """, "within a server count 2 (g-1) steps"),
    ("02b-ring-allreduce", "hierarchical_time", "test_hierarchical_time", """
        def hierarchical_time(nbytes, nodes, gpus_per_node, intra, inter):
            g, n = gpus_per_node, nodes  # as if each GPU had a network card of its own
            within = 2 * (g - 1) * (intra.latency_s + nbytes / g / intra.bandwidth)
            return within + 2 * (n - 1) * (inter.latency_s + nbytes / (g * n) / inter.bandwidth)
     """, "add both phases; across servers the g GPUs share one card"),
    ("03-horovod", "ex4-lr", "test-ex4-lr", """
        def lr_schedule(base_lr, warmup_epochs):
            return lambda epoch: base_lr * hvd.size()  # no warm-up: right at one worker
     """, "grow the rate linearly"),
    ("03-horovod", "ex4-lr", "test-ex4-lr", """
        def lr_schedule(base_lr, warmup_epochs):
            return lambda epoch: base_lr  # not scaled: right at one worker
     """, "grow the rate linearly"),
    ("03-horovod", "ex6-broadcast", "test-ex6-broadcast", """
        def broadcast_state(model, optimizer):
            pass  # hvd.broadcast_optimizer_state(optimizer, root_rank=0) in a comment
     """, "broadcast rank 0's weights"),
    ("03-horovod", "ex6-broadcast", "test-ex6-broadcast", """
        def broadcast_state(model, optimizer):
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            # hvd.broadcast_optimizer_state(optimizer, root_rank=0)
     """, "also broadcast the optimizer state"),
    ("03-horovod", "ex7-average", "test-ex7-average", """
        def average_metric(value, name):
            return float(value)  # right at one worker
     """, "average over the workers"),
    ("03-horovod", "ex1-init", "test-ex1-init", """
        def init_horovod():
            hvd.init()
            return 0, 1, 0  # what this notebook's single worker sees
     """, "return (hvd.rank(), hvd.size(), hvd.local_rank()) after hvd.init()"),
    ("03-horovod", "ex3-sampler", "test-ex3-sampler", """
        def make_train_loader(dataset, batch_size, seed=0):
            sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=0, shuffle=True, seed=seed)
            return data.make_loader(dataset, batch_size, sampler=sampler, seed=seed), sampler  # rank 0's shard everywhere
     """, "num_replicas=hvd.size(), rank=hvd.rank()"),
    ("03-horovod", "ex3-sampler", "test-ex3-sampler", """
        def make_train_loader(dataset, batch_size, seed=0):
            sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=True,
                                         seed=seed + hvd.rank())  # each rank its own shuffle: shards overlap
            return data.make_loader(dataset, batch_size, sampler=sampler, seed=seed), sampler
     """, "give both workers the same seed"),
    ("03-horovod", "ex5-optimizer", "test-ex5-optimizer", """
        def distribute_optimizer(optimizer, model, fp16=False):
            compression = hvd.Compression.fp16 if fp16 else hvd.Compression.none
            return hvd.DistributedOptimizer(optimizer, compression=compression)  # no named_parameters
     """, "pass named_parameters=model.named_parameters()"),
    ("03-horovod", "ex8-checkpoint", "test-ex8-checkpoint", """
        def save_checkpoint(model, optimizer, epoch, path):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
            return True  # every rank writes
     """, "save on rank 0 only (if hvd.rank() == 0)"),
    ("03-horovod", "ex9-record", "test-ex9-record", """
        def save_record(record, directory):
            if hvd.rank() != 0:
                return None  # Exercise 8's habit: only rank 0 writes
            path = Path(directory) / f"rank{hvd.rank()}.json"
            path.write_text(json.dumps(record))
            return path
     """, "write a record on every rank"),
    ("03-horovod", "ex9-record", "test-ex9-record", """
        def save_record(record, directory):
            path = Path(directory) / "record.json"  # one file for all ranks
            path.write_text(json.dumps(record))
            return path
     """, "write to Path(directory) / f\"rank{hvd.rank()}.json\""),
    ("04-beyond-one-box", "predict_step", "test_predict_step", """
        def predict_step_s(compute_s, grad_bytes, workers, rate_bps):
            if rate_bps is None or workers == 1:
                return compute_s
            return compute_s + workers * 2 * (workers - 1) / workers * grad_bytes / rate_bps  # bytes over bits/s
     """, "multiply the bytes by 8"),
    ("04-beyond-one-box", "predict_step", "test_predict_step", """
        def predict_step_s(compute_s, grad_bytes, workers, rate_bps):
            if rate_bps is None or workers == 1:
                return compute_s
            return compute_s + 2 * (workers - 1) / workers * grad_bytes * 8 / rate_bps  # one worker's bytes
     """, "count every worker's bytes"),
    ("04-beyond-one-box", "hostfile", "test_hostfile", """
        HOSTFILE = "node1:4\\nnode2:4\\n"  # -H's syntax in a host file
        HOSTFILE_COMMAND = "horovodrun -np 8 --hostfile hosts.txt --network-interface eth0 --hierarchical-allreduce python train.py"
     """, "write one '<host> slots=<n>' line per machine"),
    ("04-beyond-one-box", "hostfile", "test_hostfile", """
        HOSTFILE = "node1 slots=4\\nnode2 slots=4\\n"
        HOSTFILE_COMMAND = "horovodrun -np 8 --hostfile hosts.txt --network-interface eth0 python train.py"
     """, "add --hierarchical-allreduce"),
    ("04-beyond-one-box", "one_box", "test_one_box", """
        ONE_BOX_COMMAND = "horovodrun -np 4 -H localhost:4 python -m multigpu.running.scripts.train_horovod"
     """, "name 2 hosts, one per machine"),
    ("04-beyond-one-box", "make_state", "test_make_state", """
        def make_state(model, optimizer, sampler):
            return hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
     """, "hold the sampler too"),
    ("04-beyond-one-box", "make_state", "test_make_state", """
        def make_state(model, optimizer, sampler):
            return hvd.elastic.TorchState(model=model, sampler=sampler, epoch=0)
     """, "hold the optimizer too"),
    ("04-beyond-one-box", "make_state", "test_make_state", """
        def make_state(model, optimizer, sampler):
            return hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler)
     """, "hold the epoch too"),
    ("04-beyond-one-box", "best_commit_every", "test_best_commit_every", """
        def best_commit_every(step_s, commit_s, interruptions_per_hour):
            return 1  # never lose more than a step
     """, "commit less often"),
    ("04-beyond-one-box", "best_commit_every", "test_best_commit_every", """
        def best_commit_every(step_s, commit_s, interruptions_per_hour):
            return max(1, round(math.sqrt(2 * commit_s / interruptions_per_hour) / step_s))  # per hour taken as per second
     """, "divide the rate by 3600"),
    ("04-beyond-one-box", "best_commit_every", "test_best_commit_every", """
        def best_commit_every(step_s, commit_s, interruptions_per_hour):
            return max(1, round(math.sqrt(2 * commit_s / (interruptions_per_hour / 3600)) / step_s))  # the nearest whole k
     """, "compare the overhead of the whole numbers on both sides"),
    ("04-beyond-one-box", "expected_spot_hours", "test_expected_spot_hours", """
        def expected_spot_hours(hours, interruptions_per_hour, checkpoint_every=None):
            return hours * (1 + interruptions_per_hour * hours / 2)  # each interruption loses half the job
     """, "use (exp(r T) - 1) / r"),
    ("04-beyond-one-box", "expected_spot_hours", "test_expected_spot_hours", """
        def expected_spot_hours(hours, interruptions_per_hour, checkpoint_every=None):
            r = interruptions_per_hour
            return hours if r == 0 else math.expm1(r * hours) / r  # the checkpoints forgotten
     """, "count T / tau segments"),
    ("04-beyond-one-box", "cheapest_plan", "test_cheapest_plan", """
        def cheapest_plan(one_gpu_hours, efficiency, deadline_hours, on_demand, spot, interruptions_per_hour,
                          checkpoint_every, gpus_per_instance, gpus=(1, 2, 4, 8, 16, 32, 64)):
            fitting = [(n * on_demand * one_gpu_hours / (n * efficiency(n)), n) for n in gpus
                       if one_gpu_hours / (n * efficiency(n)) <= deadline_hours]
            return (min(fitting)[1], "on demand") if fitting else None  # spot forgotten
     """, "compare every GPU count, on demand and spot"),
    ("04-beyond-one-box", "cheapest_plan", "test_cheapest_plan", """
        def cheapest_plan(one_gpu_hours, efficiency, deadline_hours, on_demand, spot, interruptions_per_hour,
                          checkpoint_every, gpus_per_instance, gpus=(1, 2, 4, 8, 16, 32, 64)):
            plans = []
            for n in gpus:
                hours = one_gpu_hours / (n * efficiency(n))
                plans.append((n * on_demand * hours, n, "on demand"))
                rate = interruptions_per_hour * math.ceil(n / gpus_per_instance)
                plans.append((n * spot * expected_spot_hours(hours, rate, checkpoint_every), n, "spot"))
            return min(plans)[1:]  # the deadline forgotten
     """, "return None when no option finishes in time"),
    ("04-beyond-one-box", "cheapest_plan", "test_cheapest_plan", """
        def cheapest_plan(one_gpu_hours, efficiency, deadline_hours, on_demand, spot, interruptions_per_hour,
                          checkpoint_every, gpus_per_instance, gpus=(1, 2, 4, 8, 16, 32, 64)):
            plans = []
            for n in gpus:
                hours = one_gpu_hours / (n * efficiency(n))
                plans.append((n * on_demand * hours, hours, n, "on demand"))
                spot_hours = expected_spot_hours(hours, interruptions_per_hour, checkpoint_every)  # the rate of one instance
                plans.append((n * spot * spot_hours, spot_hours, n, "spot"))
            fitting = [p for p in plans if p[1] <= deadline_hours]
            return min(fitting)[2:] if fitting else None
     """, "multiply the interruption rate by the instances the job runs on"),
    ("04-beyond-one-box", "cheapest_plan", "test_cheapest_plan", """
        def cheapest_plan(one_gpu_hours, efficiency, deadline_hours, on_demand, spot, interruptions_per_hour,
                          checkpoint_every, gpus_per_instance, gpus=(1, 2, 4, 8, 16, 32, 64)):
            plans = []
            for n in gpus:
                hours = one_gpu_hours / (n * efficiency(n))
                plans.append((n * on_demand * hours, hours, n, "on demand"))
                spot_hours = expected_spot_hours(hours, interruptions_per_hour * n, checkpoint_every)  # every GPU an instance
                plans.append((n * spot * spot_hours, spot_hours, n, "spot"))
            fitting = [p for p in plans if p[1] <= deadline_hours]
            return min(fitting)[2:] if fitting else None
     """, "compare every option that meets the deadline"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn", """
        from multigpu.labs.lab3 import syncbn

        def to_sync_batchnorm(module):
            for name, child in module.named_children():
                if isinstance(child, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)):
                    sync = syncbn.SyncBatchNorm(child.num_features)  # the default eps and momentum
                    sync.load_state_dict(child.state_dict())
                    setattr(module, name, sync)
                else:
                    to_sync_batchnorm(child)
            return module
     """, "pass the layer's eps and momentum"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn",
     solution_with("03-horovod", "ex10-syncbn", "        sync.train(module.training)  # a layer in evaluation mode stays in it\n", ""),
     "keep each layer's mode"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn",
     solution_with("03-horovod", "ex10-syncbn", "            new.requires_grad_(old.requires_grad)  # a frozen layer stays frozen\n",
                   "            pass\n"),
     "keep frozen layers frozen"),
    ("03-horovod", "ex8-checkpoint", "test-ex8-checkpoint", """
        def save_checkpoint(model, optimizer, epoch, path):
            if hvd.rank() != 0:
                return False
            torch.save({"model": model, "optimizer": None, "epoch": epoch}, path)  # the objects, no optimizer
            return True
     """, "save the state_dict()s, not the objects"),
    ("03-horovod", "ex8-checkpoint", "test-ex8-checkpoint", """
        def save_checkpoint(model, optimizer, epoch, path):
            if hvd.rank() != 0:
                return False
            torch.save({"model": model.state_dict(), "optimizer": None, "epoch": epoch}, path)  # the weights only
            return True
     """, "save model.state_dict() and optimizer.state_dict()"),
    ("03-horovod", "ex8-checkpoint", "test-ex8-checkpoint", """
        def save_checkpoint(model, optimizer, epoch, path):
            if hvd.rank() != 0:
                return False
            torch.save(model.state_dict(), path)  # the weights alone, not a dict of the three
            return True
     """, "save a dict with model, optimizer and epoch"),
    ("03-horovod", "ex8-checkpoint", "test-ex8-checkpoint", """
        def save_checkpoint(model, optimizer, epoch, path):
            if hvd.rank() != 0:
                return False
            fresh = type(optimizer)(model.parameters(), **optimizer.defaults)  # a new optimizer: no momentum yet
            torch.save({"model": model.state_dict(), "optimizer": fresh.state_dict(), "epoch": epoch}, path)
            return True
     """, "save optimizer.state_dict() as it is after the steps"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn", """
        from multigpu.labs.lab3 import syncbn

        def to_sync_batchnorm(module):
            for name, child in module.named_children():  # the top level only
                if isinstance(child, torch.nn.BatchNorm2d):
                    sync = syncbn.SyncBatchNorm(child.num_features)
                    sync.load_state_dict(child.state_dict())
                    setattr(module, name, sync)
            return module
     """, "replace the BatchNorms inside nested blocks too"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn", """
        from multigpu.labs.lab3 import syncbn

        def to_sync_batchnorm(module):
            for name, child in module.named_children():
                if isinstance(child, torch.nn.BatchNorm2d):
                    setattr(module, name, syncbn.SyncBatchNorm(child.num_features))  # a fresh layer: state lost
                else:
                    to_sync_batchnorm(child)
            return module
     """, "copy each BatchNorm's weights and running statistics"),
    ("03-horovod", "ex10-syncbn", "test-ex10-syncbn", """
        from multigpu.labs.lab3 import syncbn

        def to_sync_batchnorm(module):
            for name, child in module.named_children():
                if isinstance(child, torch.nn.BatchNorm2d):
                    sync = hvd.SyncBatchNorm(child.num_features)  # Horovod's own: GPU tensors only
                    sync.load_state_dict(child.state_dict())
                    setattr(module, name, sync)
                else:
                    to_sync_batchnorm(child)
            return module
     """, "replace each BatchNorm by a syncbn.SyncBatchNorm"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree",
     parallel_degree_with("    state = 4 * OPTIMIZER_STATES[optimizer]\n", "    return 2  # the fp16 weights only\n"),
     "count what training keeps per parameter, not only the float16 weights"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree",
     parallel_degree_with("    state = 4 * OPTIMIZER_STATES[optimizer]\n", "    return 2 + 2 + 4 + 4 + 4  # the worked example, always\n"),
     "count the optimizer's own state"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree",
     parallel_degree_with("    state = 4 * OPTIMIZER_STATES[optimizer]\n", "    state = 8  # Adam's two moments for every optimizer\n"),
     "count the optimizer's own state"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree",
     parallel_degree_with("    return 4 + 4 + state", "    return 2 + 2 + 4 + 4 + 4 + state  # float16 copies and a master copy in float32 too"),
     "in float32 the weight is the only copy"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree",
     parallel_degree_with("        return 2 + 2 + 4 + state", "        return 2 + 2 + state  # no float32 master weight"),
     "count every copy mixed-precision Adam keeps per parameter"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree", parallel_degree_with(
        "    k = 1\n    while parameters * bytes_per_parameter / k + activation_bytes > memory_bytes:\n        k *= 2\n    return k",
        "    return math.ceil(parameters * bytes_per_parameter / (memory_bytes - activation_bytes))  # 5 GPUs"),
     "round up to a power of two"),
    ("04-beyond-one-box", "model_parallel_degree", "test_model_parallel_degree", parallel_degree_with(
        "    while parameters * bytes_per_parameter / k + activation_bytes > memory_bytes:",
        "    while parameters * bytes_per_parameter / k > memory_bytes:  # the activations forgotten"),
     "fit each GPU's share plus activation_bytes"),
    ("05-sharding-and-model-parallelism", "bytes_per_device", "test_bytes_per_device", """
        def bytes_per_device(parameters, stage, workers, optimizer="mixed adam"):
            n = workers  # 2 + 2 + 12 whatever the optimizer
            return parameters * {0: 16, 1: 4 + 12 / n, 2: 2 + 14 / n, 3: 16 / n}[stage]
     """, "look up the optimizer's (w, g, k) in memory.OPTIMIZER_BYTES"),
    ("05-sharding-and-model-parallelism", "bytes_per_device", "test_bytes_per_device", """
        def bytes_per_device(parameters, stage, workers, optimizer="mixed adam"):
            w, g, k = memory.OPTIMIZER_BYTES[optimizer]
            if stage == 0:
                return parameters * (w + g + k)
            if stage == 3:
                return parameters * (w + g + k) / workers
            return parameters * (w + (g + k) / workers)  # stages 1 and 2 alike: the gradients sharded at stage 1
     """, "at stage 1 divide only the optimizer state by workers"),
    ("05-sharding-and-model-parallelism", "bytes_per_device", "test_bytes_per_device", """
        def bytes_per_device(parameters, stage, workers, optimizer="mixed adam"):
            w, g, k = memory.OPTIMIZER_BYTES[optimizer]
            n = workers  # stage 3 taken for stage 2: the weights left whole
            return parameters * {0: w + g + k, 1: w + g + k / n, 2: w + (g + k) / n, 3: w + (g + k) / n}[stage]
     """, "at stage 3 divide everything by workers, the weights too"),
    ("05-sharding-and-model-parallelism", "sharded_step", "test_sharded_step", """
        def sharded_step(flat_params, flat_grad, shard, optimizer):
            shard.grad = hvd.reducescatter(flat_grad, op=hvd.Sum, name="zero.gradient")  # summed, not averaged
            optimizer.step()
            flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))
     """, "average the gradient over the workers before the step"),
    ("05-sharding-and-model-parallelism", "sharded_step", "test_sharded_step", """
        def sharded_step(flat_params, flat_grad, shard, optimizer):
            s = shard.numel()  # every rank's own gradient, never reduced
            shard.grad = flat_grad[hvd.rank() * s:(hvd.rank() + 1) * s].clone()
            optimizer.step()
            flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))
     """, "average the gradient over the workers before the step"),
    ("05-sharding-and-model-parallelism", "sharded_step", "test_sharded_step", """
        def sharded_step(flat_params, flat_grad, shard, optimizer):
            shard.grad = hvd.reducescatter(flat_grad, op=hvd.Average, name="zero.gradient")
            optimizer.step()
            s = shard.numel()  # only this rank's slice of the weights updated
            flat_params[hvd.rank() * s:(hvd.rank() + 1) * s].copy_(shard.detach())
     """, "all-gather the updated shards into flat_params"),
    ("05-sharding-and-model-parallelism", "sharded_step", "test_sharded_step", """
        def sharded_step(flat_params, flat_grad, shard, optimizer):
            s = shard.numel()  # an all-reduce of the whole gradient for one slice of it
            full = hvd.allreduce(flat_grad, op=hvd.Average, name="zero.gradient")
            shard.grad = full[hvd.rank() * s:(hvd.rank() + 1) * s].clone()
            optimizer.step()
            flat_params.copy_(hvd.allgather(shard.detach(), name="zero.weights"))
     """, "reduce-scatter the gradient (hvd.reducescatter) rather than all-reduce it"),
    ("05-sharding-and-model-parallelism", "parallel_mlp", "test_parallel_mlp",
     parallel_mlp_with("    return ReduceFromParallel.apply(F.linear(h, w2)) + b2",
                       "    return ReduceFromParallel.apply(F.linear(h, w2, b2))  # b2 inside the sum"),
     "add b2 once, after the all-reduce"),
    ("05-sharding-and-model-parallelism", "parallel_mlp", "test_parallel_mlp",
     parallel_mlp_with("        x = x.clone()\n        dist.all_reduce(x)\n        return x",
                       "        return x.clone()  # the partial outputs never summed"),
     "all-reduce the row-parallel layer's partial outputs"),
    ("05-sharding-and-model-parallelism", "parallel_mlp", "test_parallel_mlp",
     parallel_mlp_with("        grad = grad.clone()\n        dist.all_reduce(grad)\n        return grad",
                       "        return grad  # each worker's partial gradient of x"),
     "all-reduce the input's gradient in CopyToParallel's backward"),
    ("05-sharding-and-model-parallelism", "parallel_mlp", "test_parallel_mlp",
     parallel_mlp_with("    def backward(ctx, grad):\n        ### BEGIN SOLUTION\n        return grad",
                       "    def backward(ctx, grad):\n        grad = grad.clone()\n        dist.all_reduce(grad)  # g's backward summing what is already whole\n        return grad"),
     "pass the gradient through ReduceFromParallel's backward unchanged"),
    ("05-sharding-and-model-parallelism", "one_f_one_b", "test_one_f_one_b", """
        def one_f_one_b(stage, stages, micro_batches):
            return pipeline.gpipe_order(stage, stages, micro_batches)  # all forwards, then all backwards
     """, "start with"),
    ("05-sharding-and-model-parallelism", "one_f_one_b", "test_one_f_one_b", """
        def one_f_one_b(stage, stages, micro_batches):
            warmup = min(stages - 1, micro_batches)  # the same warm-up on every stage
            order = [("F", i) for i in range(warmup)]
            for i in range(micro_batches - warmup):
                order += [("B", i), ("F", warmup + i)]
            return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]
     """, "start with"),
    ("05-sharding-and-model-parallelism", "one_f_one_b", "test_one_f_one_b", """
        def one_f_one_b(stage, stages, micro_batches):
            warmup = min(stages - stage - 1, micro_batches)  # one forward short (the last stage would start with B0)
            order = [("F", i) for i in range(warmup)]
            for i in range(micro_batches - warmup):
                order += [("B", i), ("F", warmup + i)]
            return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]
     """, "start with 4 forwards"),
    ("05-sharding-and-model-parallelism", "one_f_one_b", "test_one_f_one_b", """
        def one_f_one_b(stage, stages, micro_batches):
            warmup = min(stages - stage, micro_batches)
            order = [("F", i) for i in range(warmup)]
            for i in range(micro_batches - warmup):
                order += [("B", i), ("F", warmup + i)]
            return order  # the cool-down forgotten
     """, "run every micro-batch's forward and backward exactly once"),
    # Every exercise whose answer the package holds too: the one-line delegation to it (31 of the 40 exercises
    # of notebooks 00-05; mean_rank, make_fast_loader, amp_step, efficiency, hostfile, one_box, make_state,
    # best_commit_every and model_parallel_degree have no version in the package to call)
    delegation("01-gd-vs-sgd", "sgd_epoch", "test_sgd_epoch", """
        def sgd_epoch(theta, x, y, batch_size, lr, rng):
            return toy.sgd_epoch(theta, x, y, batch_size, lr, rng)
     """),
    delegation("01-gd-vs-sgd", "converged", "test_converged", """
        def converged(previous_loss, loss, tol=1e-3):
            return toy.converged(previous_loss, loss, tol)
     """),
    delegation("01-gd-vs-sgd", "gradient_variance", "test_gradient_variance", """
        def gradient_variance(theta, x, y, batch_size, trials, rng):
            return gradient_noise.gradient_variance(theta, x, y, batch_size, trials, rng)
     """),
    delegation("01-gd-vs-sgd", "noise_scale", "test_noise_scale", """
        def noise_scale(per_example_grads):
            return gradient_noise.noise_scale(per_example_grads)
     """),
    delegation("01-gd-vs-sgd", "scaled_lr", "test_scaled_lr", """
        from multigpu.core import schedules

        def scaled_lr(base_lr, batch_size, base_batch_size):
            return schedules.scaled_lr(base_lr, batch_size, base_batch_size)
     """),
    delegation("01-gd-vs-sgd", "lr_at", "test_lr_at", """
        from multigpu.core import schedules

        def lr_at(epoch, base_lr, batch_size, base_batch_size, warmup_epochs):
            return schedules.lr_at(epoch, base_lr, batch_size, base_batch_size, warmup_epochs)
     """),
    delegation("01-gd-vs-sgd", "trust_ratio", "test_trust_ratio", """
        from multigpu.labs.lab1 import large_batch

        def trust_ratio(weight, grad, eta, weight_decay):
            return large_batch.trust_ratio(weight, grad, eta, weight_decay)
     """),
    delegation("01-gd-vs-sgd", "accumulate", "test_accumulate", """
        from multigpu.labs.lab1 import accumulation

        def accumulate(model, loss_fn, inputs, targets, micro_batches):
            return accumulation.accumulate(model, loss_fn, inputs, targets, micro_batches)
     """),
    delegation("02-alexnet-pipeline", "pipeline_rate", "test_pipeline_rate", """
        def pipeline_rate(stage_rates):
            return profiling.serial_rate(stage_rates)
     """),
    delegation("02-alexnet-pipeline", "central_bytes", "test_central_bytes", """
        from multigpu.labs.lab2 import scaling_model

        def central_bytes(gradient_bytes, workers):
            return scaling_model.ps_central_bytes(gradient_bytes, workers)
     """),
    delegation("02b-ring-allreduce", "ring_allreduce", "test_ring_allreduce", """
        def ring_allreduce(tensor):
            return ring.ring_allreduce(tensor)
     """),
    delegation("02b-ring-allreduce", "ring_time", "test_ring_time", """
        def ring_time(nbytes, workers, latency_s, bandwidth):
            return scaling_model.ring_allreduce_time(nbytes, workers, scaling_model.Link("mine", latency_s, bandwidth))
     """),
    delegation("02b-ring-allreduce", "sharded_ps_time", "test_sharded_ps_time", """
        def sharded_ps_time(nbytes, workers, servers, link):
            return scaling_model.ps_time(nbytes, workers, link, servers=servers)
     """),
    delegation("02b-ring-allreduce", "hierarchical_time", "test_hierarchical_time", """
        def hierarchical_time(nbytes, nodes, gpus_per_node, intra, inter):
            return scaling_model.hierarchical_allreduce_time(nbytes, nodes, gpus_per_node, intra, inter)
     """),
    *(delegation("03-horovod", exercise, test_id, f"""
        from multigpu.running.scripts import train_horovod

        def {name}(*args, **kwargs):
            return train_horovod.{name}(*args, **kwargs)
     """) for exercise, test_id, name in [
        ("ex1-init", "test-ex1-init", "init_horovod"), ("ex2-device", "test-ex2-device", "worker_device"),
        ("ex3-sampler", "test-ex3-sampler", "make_train_loader"), ("ex4-lr", "test-ex4-lr", "lr_schedule"),
        ("ex5-optimizer", "test-ex5-optimizer", "distribute_optimizer"),
        ("ex6-broadcast", "test-ex6-broadcast", "broadcast_state"), ("ex7-average", "test-ex7-average", "average_metric"),
        ("ex8-checkpoint", "test-ex8-checkpoint", "save_checkpoint"), ("ex9-record", "test-ex9-record", "save_record")]),
    delegation("03-horovod", "ex10-syncbn", "test-ex10-syncbn", """
        from multigpu.labs.lab3 import syncbn

        def to_sync_batchnorm(module):
            return syncbn.convert(module)
     """),
    delegation("04-beyond-one-box", "predict_step", "test_predict_step", """
        from multigpu.labs.lab4 import links

        def predict_step_s(compute_s, grad_bytes, workers, rate_bps):
            return compute_s if rate_bps is None or workers == 1 else compute_s + links.predicted_allreduce_s(grad_bytes, workers, rate_bps)
     """),
    delegation("04-beyond-one-box", "expected_spot_hours", "test_expected_spot_hours", """
        from multigpu.labs.lab4 import costs

        def expected_spot_hours(hours, interruptions_per_hour, checkpoint_every=None):
            return costs.expected_hours_with_interruptions(hours, interruptions_per_hour, checkpoint_every=checkpoint_every)
     """),
    delegation("04-beyond-one-box", "cheapest_plan", "test_cheapest_plan", """
        from multigpu.labs.lab4 import costs

        def cheapest_plan(one_gpu_hours, efficiency, deadline_hours, on_demand, spot, interruptions_per_hour,
                          checkpoint_every, gpus_per_instance, gpus=(1, 2, 4, 8, 16, 32, 64)):
            best = costs.cheapest_within([o for o in costs.options(
                one_gpu_hours, efficiency, gpus, on_demand=on_demand, spot=spot, interruptions_per_hour=interruptions_per_hour,
                gpus_per_instance=gpus_per_instance, checkpoint_every=checkpoint_every) if o.label != "spot, restart from zero"],
                deadline_hours)
            return best and (best.gpus, "on demand" if best.label == "on demand" else "spot")
     """),
    delegation("05-sharding-and-model-parallelism", "bytes_per_device", "test_bytes_per_device", """
        def bytes_per_device(parameters, stage, workers, optimizer="mixed adam"):
            return memory.zero_bytes(parameters, stage, workers, optimizer)
     """),
    delegation("05-sharding-and-model-parallelism", "sharded_step", "test_sharded_step", """
        def sharded_step(flat_params, flat_grad, shard, optimizer):
            zero.sharded_step(flat_params, flat_grad, shard, optimizer)
     """),
    delegation("05-sharding-and-model-parallelism", "parallel_mlp", "test_parallel_mlp", """
        parallel_mlp = tensor_parallel.parallel_mlp
     """),
    delegation("05-sharding-and-model-parallelism", "one_f_one_b", "test_one_f_one_b", """
        def one_f_one_b(stage, stages, micro_batches):
            return pipeline.one_f_one_b_order(stage, stages, micro_batches)
     """),
]


@pytest.mark.slow
@pytest.mark.parametrize("notebook, exercise, test_id, answer, fix", WRONG,
                         ids=[f"{w[0]}:{w[2]}:{i}" for i, w in enumerate(WRONG)])
def test_a_wrong_answer_fails_with_what_to_change_first(notebook, exercise, test_id, answer, fix, python, tmp_path):
    ran = run_test_cell(python, notebook, test_id, answer, tmp_path)
    assert ran.returncode != 0, f"the wrong answer passed {test_id}:\n{answer}\n{ran.stdout[-2000:]}"
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(f"AssertionError: {fix}"), f"{test_id}: expected a failure starting {fix!r}, got:\n{ran.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("notebook, exercise, test_id", sorted({w[:3] for w in WRONG}))
def test_the_solutions_answer_passes_the_same_harness(notebook, exercise, test_id, python, tmp_path):
    ran = run_test_cell(python, notebook, test_id, solution(notebook, exercise), tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]


def exercises() -> list[tuple[str, str, str]]:
    """Every exercise of the labs, with its test cell: (notebook, exercise id, the first graded test
    cell after it)."""
    found = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        cells = [c["metadata"].get("nbgrader", {}) for c in json.loads(path.read_text())["cells"]]
        for i, meta in enumerate(cells):
            if meta.get("solution"):
                test = next(m["grade_id"] for m in cells[i + 1:] if m.get("grade") and not m.get("solution"))
                found.append((path.stem, meta["grade_id"], test))
    return found


def released(notebook: str, grade_id: str) -> str:
    """The cell as learners get it (the learner copy in notebooks/, made by make release)."""
    nb = json.loads((REPO / "notebooks" / f"{notebook}.ipynb").read_text())
    return "".join(next(c["source"] for c in nb["cells"]
                        if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id))


def test_every_exercise_has_its_test_cell_and_a_blank_stub():
    found = exercises()
    assert len(found) == len({(n, e) for n, e, _ in found}) >= 40
    for notebook, exercise, _ in found:
        assert "raise NotImplementedError()" in released(notebook, exercise), f"{notebook}:{exercise} is not blank"


@pytest.mark.slow
@pytest.mark.parametrize("notebook, exercise, test_id", exercises(), ids=[f"{n}:{e}" for n, e, _ in exercises()])
def test_the_released_stub_fails_its_test_cell_and_hangs_nothing(notebook, exercise, test_id, python, tmp_path):
    """A learner's blank copy, one exercise at a time: the stub as released, then its test cell with
    the hidden tests, as autograde runs it, scores zero (the cell fails on the stub or on an assert)
    well within the harness's time limit."""
    start = time.monotonic()
    ran = run_test_cell(python, notebook, test_id, released(notebook, exercise), tmp_path)
    assert ran.returncode not in (0, -9), f"{notebook}:{exercise}: the blank stub passed or hung:\n{ran.stderr[-2000:]}"
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(("NotImplementedError", "AssertionError")), f"{notebook}:{exercise}: {ran.stderr[-3000:]}"
    assert time.monotonic() - start < 120
