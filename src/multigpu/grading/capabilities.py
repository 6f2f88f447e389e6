"""What a name in a submission can reach: the capabilities the review flags
(:mod:`multigpu.grading.review_rules`), and how the review reads names (:class:`Names`).

A source's names are read with Python's :mod:`ast` (nothing is run) and resolved through its
imports: ``hvd.allreduce`` is ``horovod.torch.allreduce``, ``open`` is ``builtins.open``. The
review flags what could let a run's records differ from its work, or reach outside the run; each
table below is one capability (docs/calibration.md lists them with the rules that use them).
Everything else, the pure standard library (logging, dataclasses, math, time, itertools,
functools, collections, typing, json, random, statistics, argparse, ...), torch's computing,
functions and classes of the script's own, is the learner's business and raises no flag.
"""

from __future__ import annotations

import ast
import builtins
import sys
from collections.abc import Iterator
from dataclasses import dataclass

#: Modules (and members) by the capability they give, matched on a dotted prefix.
CAPABILITY_MODULES: dict[str, tuple[str, ...]] = {
    # other channels between processes: network, shared memory, another framework's collectives
    "channel": ("socket", "_socket", "ssl", "socketserver", "asyncio", "selectors", "select", "http", "urllib",
                "xmlrpc", "ftplib", "smtplib", "poplib", "imaplib", "telnetlib", "mmap", "fcntl", "sqlite3", "shelve",
                "dbm", "multiprocessing.shared_memory", "multiprocessing.managers", "multiprocessing.connection",
                "_posixshmem", "torch.distributed", "torch.nn.parallel.DistributedDataParallel",
                "torch.nn.parallel.distributed", "torch.from_file", "torch.UntypedStorage.from_file",
                "torch.TypedStorage.from_file", "numpy.memmap", "numpy.lib.format.open_memmap", "mpi4py",
                "os.pipe", "os.pipe2", "os.mkfifo", "os.mknod", "os.memfd_create", "os.eventfd", "os.openpty"),
    # processes and threads started
    "process": ("subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "threading", "_thread",
                "concurrent", "pty", "torch.multiprocessing", "multigpu.running", "horovod.runner", "horovod.run",
                "os.fork", "os.forkpty", "os.system", "os.popen", "os.posix_spawn", "os.posix_spawnp",
                *(f"os.{e}" for e in ("execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe",
                                      "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp",
                                      "spawnvpe"))),
    # native code the review cannot read
    "native": ("ctypes", "_ctypes", "cffi", "torch.utils.cpp_extension", "torch.ops.load_library",
               "torch.classes.load_library"),
    # signals to other processes, or handlers of its own
    "signal": ("signal", "_signal", "os.kill", "os.killpg", "os.abort", "faulthandler.register"),
    # code, or objects that can carry code, loaded from files or given as data
    "load": ("pickle", "_pickle", "cPickle", "dill", "marshal", "joblib", "runpy", "zipimport", "pkgutil",
             "imp", "code", "codeop", "torch.load", "torch.jit.load", "torch.hub", "torch.package",
             "numpy.load", "sys.path"),
    # dynamic access: what it reaches is data, not a name the review reads
    "dynamic": ("importlib", "inspect", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "operator.attrgetter",
                "operator.methodcaller", "types.FunctionType", "types.CodeType", "types.ModuleType",
                "types.MethodType", "types.new_class", "sys.modules", "sys._getframe", "sys._current_frames",
                "sys.settrace", "sys.setprofile", "sys.meta_path", "sys.path_hooks", "sys.path_importer_cache",
                "sys.addaudithook", "builtins.globals", "builtins.locals", "builtins.__import__",
                "builtins.exec", "builtins.eval", "builtins.compile", "builtins.breakpoint", "builtins.__build_class__",
                "builtins.__builtins__", "pdb", "bdb"),
    # the process's environment changed (what the launcher, Horovod and the grader set)
    "environment": ("os.putenv", "os.unsetenv", "os.chdir", "os.fchdir", "os.chroot", "os.umask", "os.setuid",
                    "os.setgid", "os.seteuid", "os.setegid", "os.setreuid", "os.setregid", "os.setresuid",
                    "os.setresgid", "os.setgroups", "os.setsid", "os.setpgid", "resource.setrlimit",
                    *(f"os.environ.{m}" for m in ("update", "setdefault", "pop", "popitem", "clear", "__setitem__",
                                                   "__delitem__", "__ior__"))),
}
#: Methods that reach a capability on whatever object has them.
CAPABILITY_METHODS: dict[str, str] = {"share_memory_": "channel", "from_file": "channel", "_share_filename_cpu_": "channel",
                                      "_share_fd_cpu_": "channel"}
#: Why each capability is flagged, in one line (the review's message after what was found).
WHY: dict[str, str] = {
    "channel": "another channel between processes: what moves through it is not what Horovod's records show",
    "process": "starts a process or thread: work the grader does not launch or watch",
    "native": "native code: what it does is not in the source the review reads",
    "signal": "signals: reaches other processes, or runs code where the review cannot place it",
    "load": "code or objects loaded from files or data: not in the source the review reads",
    "dynamic": "dynamic access: what it reaches is data, not a name the review reads",
    "environment": "changes the process's environment, which the launcher, Horovod and the grader set",
}
#: Packages a conversion may import besides the standard library (their parts in the tables
#: above excepted): what the course runs on. ``horovod`` means ``horovod.torch``.
ENVIRONMENT_PACKAGES = ("torch", "horovod.torch", "numpy", "PIL", "multigpu.core", "tqdm")

#: Horovod's training API as its documentation teaches a conversion (horovod.torch): start, who am
#: I, the optimizer that averages the gradients, the broadcasts of the initial state (and of a
#: decision: ``broadcast_object``), metrics averaged or gathered, synchronised BatchNorm, an end for
#: uneven ranks (``join``), the build's facts. Collectives are further checked where they are used
#: (:func:`multigpu.grading.review_rules.out_of_place`). Anything else of Horovod is flagged.
HOROVOD_API = frozenset(
    [f"call:horovod.torch.{n}" for n in (
        "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "cross_rank", "cross_size",
        "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object", "broadcast",
        "broadcast_", "allreduce", "allreduce_", "allgather", "allgather_object", "join", "barrier", "SyncBatchNorm",
        "mpi_built", "gloo_built", "nccl_built", "cuda_built", "rocm_built", "mpi_enabled", "gloo_enabled",
        "mpi_threads_supported", "Compression.fp16.compress", "Compression.fp16.decompress")]
    + [f"value:horovod.torch.{n}" for n in ("Average", "Sum", "Min", "Max", "Product", "Adasum", "Compression",
                                             "Compression.none", "Compression.fp16", "SyncBatchNorm")])
#: Horovod's collectives by name (``hvd.<name>``); DistributedOptimizer calls them inside Horovod.
COLLECTIVES = frozenset(
    f"{base}{suffix}" for base in ("allreduce", "grouped_allreduce", "allgather", "grouped_allgather", "reducescatter",
                                   "grouped_reducescatter", "alltoall", "broadcast", "sparse_allreduce")
    for suffix in ("", "_", "_async", "_async_"))
#: Collectives that move the model's weights.
WEIGHT_BROADCASTS = frozenset({"broadcast_parameters", "broadcast_optimizer_state"})
#: Collectives that move whatever they are given: weights only where that is model-like.
OBJECT_BROADCASTS = frozenset({"broadcast_object", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_"})
#: Names in a collective's argument (or in what its loop iterates over) that make a tensor like the model's.
MODEL_LIKE = frozenset({"grad", "parameters", "named_parameters", "state_dict", "zeros_like", "ones_like",
                        "empty_like", "full_like", "rand_like", "randn_like", "shape", "data", "weight", "bias",
                        "param_groups", "buffers"})

#: Methods of the DistributedOptimizer that open a window between the all-reduce and the step.
STEP_WINDOW = frozenset({"synchronize", "skip_synchronize"})
#: Methods that register code autograd runs on gradients.
GRADIENT_HOOKS = frozenset({"register_hook", "register_post_accumulate_grad_hook", "register_full_backward_hook",
                            "register_backward_hook", "register_full_backward_pre_hook", "register_comm_hook",
                            "register_multi_grad_hook", "register_module_full_backward_hook",
                            "register_module_backward_hook"})
#: torch.optim's optimizers (a step of one not wrapped in hvd.DistributedOptimizer is a local step).
OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "LBFGS",
                        "NAdam", "RAdam", "SparseAdam", "Adafactor", "Muon"})
#: The course's data generator: how the grader makes its held-out set (with a secret seed).
GENERATORS = frozenset({"ensure_dataset", "generate_dataset", "image_rng", "render_image"})

#: Attributes of the interpreter that only name or describe (the rest reach around the names: flagged).
SAFE_DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__module__", "__class__", "__version__",
                          "__file__", "__annotations__", "__len__", "__iter__", "__next__", "__enter__", "__exit__",
                          "__call__", "__getitem__", "__setitem__", "__contains__", "__repr__", "__str__", "__eq__",
                          "__lt__", "__hash__", "__post_init__", "__main__", "__future__"})
#: Attributes of frames, generators and tracebacks: a way to any function's variables.
FRAME_ATTRIBUTES = frozenset({"f_globals", "f_locals", "f_back", "f_builtins", "f_code", "gi_frame", "cr_frame",
                              "ag_frame", "tb_frame", "tb_next"})
#: Words of Horovod's timeline (the grader's evidence) in a string or a name.
TIMELINE_WORDS = ("timeline", "negotiate_allreduce", "start_time_since_epoch")
#: Module globals every script has (not builtins, not imports).
MODULE_GLOBALS = frozenset({"__name__", "__file__", "__doc__"})


def capability(qualified: str) -> str:
    """The capability a fully qualified name reaches ("" for none): its longest prefix in the tables."""
    best, kind = -1, ""
    for k, prefixes in CAPABILITY_MODULES.items():
        for p in prefixes:
            if (qualified == p or qualified.startswith(p + ".")) and len(p) > best:
                best, kind = len(p), k
    return kind


def outside_environment(module: str) -> bool:
    """A module neither of the standard library nor of :data:`ENVIRONMENT_PACKAGES` (a library the
    review does not read, or a file beside the script)."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return False
    if top == "horovod":
        return not (module == "horovod" or module.startswith("horovod.torch"))
    if top == "multigpu":
        return not (module == "multigpu" or module.startswith("multigpu.core"))
    return top not in {p.split(".")[0] for p in ENVIRONMENT_PACKAGES}


@dataclass(frozen=True)
class Use:
    """One use of a qualified name: ``kind`` is ``import``, ``call`` or ``value``."""

    kind: str
    name: str
    node: ast.AST


def dotted(node: ast.AST) -> tuple[str, ...]:
    """``("torch", "optim", "SGD")`` for that attribute chain on a name (() for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return tuple(reversed(parts))
    return ()


class Names:
    """The names of one parsed source: what its imports bind, what it defines and binds itself,
    each node's parent, and (:meth:`uses`) every use of a module's member or a builtin."""

    def __init__(self, tree: ast.AST):
        self.tree = tree
        self.aliases: dict[str, str] = {}
        self.modules: set[str] = set()  # names bound by `import x` (a module, not a member)
        self.defined: set[str] = set()
        assigned: set[str] = set()
        self.parent: dict[int, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[id(child)] = node
            if isinstance(node, ast.Import):
                for a in node.names:
                    bound = a.asname or a.name.split(".")[0]
                    self.aliases[bound] = a.name if a.asname else a.name.split(".")[0]
                    self.modules.add(bound)
            elif isinstance(node, ast.ImportFrom) and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                assigned.add(node.id)
            elif isinstance(node, ast.arg):
                assigned.add(node.arg)
        #: names the script binds itself (variables, parameters): they shadow builtins
        self.variables = assigned - set(self.aliases) - self.defined

    def qualified(self, node: ast.AST) -> str:
        """The full name of a module member (``horovod.torch.allreduce``) or builtin
        (``builtins.len``) that ``node`` names; "" for anything else (a variable, an object's
        attribute, a function of the script)."""
        parts = dotted(node)
        if not parts:
            return ""
        root = parts[0]
        if root in self.aliases:
            return ".".join((self.aliases[root], *parts[1:]))
        if root not in self.variables and root not in self.defined and root not in MODULE_GLOBALS \
                and hasattr(builtins, root):
            return ".".join(("builtins", *parts))
        return ""

    def up(self, node: ast.AST) -> ast.AST | None:
        return self.parent.get(id(node))

    def called(self, node: ast.AST) -> bool:
        """``node`` is what a call calls."""
        up = self.up(node)
        return isinstance(up, ast.Call) and up.func is node

    def inner(self, node: ast.AST) -> bool:
        """Part of a longer attribute chain: judged with the whole."""
        up = self.up(node)
        return isinstance(up, ast.Attribute) and up.value is node

    def uses(self) -> Iterator[Use]:
        """Every import, and every call or value of a qualified name (a whole attribute chain once)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                yield from (Use("import", a.name, node) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                yield from (Use("import", f"{base}.{a.name}", node) for a in node.names)
            elif isinstance(node, (ast.Name, ast.Attribute)) and isinstance(node.ctx, ast.Load) and not self.inner(node):
                q, call = self.qualified(node), self.up(node)
                if q and isinstance(call, ast.Call) and call.func is node:
                    yield Use("call", q, call)
                elif q:
                    yield Use("value", q, node)
