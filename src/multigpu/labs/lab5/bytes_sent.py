"""The bytes a worker process hands to the kernel to write, read from ``/proc/self/io``.

Over Gloo (Horovod's ``--gloo`` controller, or ``torch.distributed``'s gloo backend) every byte a
collective sends goes through a TCP socket with ``write``/``writev``, and Linux counts it in the
process's ``wchar`` (all threads together, Horovod's background thread included). The difference
of two readings around a step is therefore what the step sent, measured by the kernel rather than
counted from the tensors the code meant to send: a collective that sends more than its textbook
share (torch's gloo ``reduce_scatter_tensor`` sends what a whole all-reduce does) shows up here.

Two limits: over MPI on one machine the workers share memory and write nothing (``wchar`` stays
put: use Gloo to measure), and anything else the process writes in between (a print, a file)
counts too, so a measured block must not print. Where ``/proc/self/io`` does not exist (not
Linux), :func:`available` says so and :func:`written` returns 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

IO = Path("/proc/self/io")


def available() -> bool:
    """Whether this system reports the bytes a process writes (Linux's ``/proc/self/io``)."""
    return IO.exists()


def written() -> int:
    """Bytes this process has handed to ``write``-like system calls so far (0 where not reported)."""
    if not available():
        return 0
    for line in IO.read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


@contextmanager
def counting() -> Iterator[Callable[[], int]]:
    """``with counting() as sent: ...; sent()`` is the bytes written inside the block."""
    start = written()
    end: list[int] = []
    try:
        yield lambda: (end[0] if end else written()) - start
    finally:
        end.append(written())
