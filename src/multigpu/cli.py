"""The ``multigpu`` command: machine info, the course data set, notebook hygiene, grading.

    multigpu info                 mode (GPU/CPU), cores, GPUs, torch and Horovod build
    multigpu data [--root DIR]    generate (once) the course's JPEG data set and say where it is
    multigpu clean-notebooks      strip outputs and volatile metadata from the course notebooks
    multigpu release [--check | --gradebook | --collect PATH | --assignments]
                                  learner copies, gradebook, collected submissions (multigpu.course.release)
    multigpu bench [ARGS]         performance figures against their targets (multigpu.course.bench)
    multigpu gpu-check [ARGS]     every path a GPU changes, run once, with a report (multigpu.course.gpucheck)
    multigpu grade / calibrate / regrade / review / similarity     the assessment's grading (multigpu.grading)
    multigpu keygen / certify / verify / revoke / publish-issuer   certificates (multigpu.credential)
    multigpu workshop VERB        a workshop on one JupyterHub (multigpu.workshop, docs/workshop.md)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def cmd_info(args: argparse.Namespace) -> int:
    from multigpu.core import devices
    from multigpu.running import launch

    info = devices.detect()
    build = devices.horovod_build()
    print(devices.describe(workers=args.workers, info=info))
    print(f"torch {info.torch_version}; collectives backend: {info.backend}")
    if build["installed"]:
        ops = [name for name in ("gloo", "nccl", "mpi") if build[name]]
        print(f"Horovod {build['version']}: PyTorch yes; operations: {', '.join(ops) or 'none'}; "
              f"horovodrun runs over {launch.horovod_controller().upper()}")
    else:
        print("Horovod: NOT installed (run 'make setup'; see README.md, 'Troubleshooting the Horovod build')")
    ok = bool(build["installed"] and build["gloo"])
    return 0 if ok else 1


def cmd_data(args: argparse.Namespace) -> int:
    from multigpu.core import data

    start = time.perf_counter()
    root = data.ensure_dataset(args.root)
    seconds = time.perf_counter() - start
    counts = {split: sum(1 for _ in (root / split).rglob("*.jpg")) for split in ("train", "val")}
    print(f"data set: {root}")
    print(f"  train: {counts['train']} JPEG files, val: {counts['val']} JPEG files ({seconds:.1f} s)")
    return 0


def cmd_clean(args: argparse.Namespace) -> int:
    from multigpu.course import hygiene

    paths = [Path(p) for p in args.paths] or hygiene.course_notebooks(Path.cwd())
    changed = [p for p in paths if hygiene.clean(p, check=args.check)]
    verb = "not clean" if args.check else "cleaned"
    for p in changed:
        print(f"{verb}: {p}")
    if args.check and changed:
        print("run 'make clean-notebooks' and commit the result", file=sys.stderr)
        return 1
    print(f"{len(paths)} notebook(s) checked, {len(changed)} {verb}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="multigpu",
        description="Helpers of the course 'Training deep learning models on multiple GPUs'.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="show the hardware mode, cores/GPUs and the Horovod build")
    p.add_argument("--workers", type=int, default=4, help="worker count for the ideal speed-up line (default 4)")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("data", help="generate the course's JPEG data set (once) and print where it is")
    p.add_argument("--root", type=Path, default=None, help="folder to write it to (default: the course cache)")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("clean-notebooks", help="strip outputs and volatile metadata from notebooks")
    p.add_argument("paths", nargs="*", help="notebooks (default: every course notebook)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if any is not clean")
    p.set_defaults(func=cmd_clean)

    # verbs whose module parses its own arguments (main() hands them over before parsing)
    sub.add_parser("release", help="learner copies from solutions/, the gradebook, collecting submissions")
    sub.add_parser("bench", help="performance figures against their targets (make bench)")
    sub.add_parser("gpu-check", help="every path a GPU changes, run once, with a report (make gpu-check)")

    from multigpu.credential import cli as credential_cli
    from multigpu.grading import cli as grading_cli

    grading_cli.register(sub)
    credential_cli.register(sub)
    return parser


#: ``multigpu VERB ARGS``: the module whose ``main(ARGS)`` runs the verb.
DELEGATED = {"release": "multigpu.course.release", "bench": "multigpu.course.bench",
             "gpu-check": "multigpu.course.gpucheck", "workshop": "multigpu.workshop.cli"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return int(importlib.import_module(DELEGATED[argv[0]]).main(argv[1:]) or 0)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
