"""The command line of ``pytest-nccl watch``: its options, declared and checked in one place (a bad
one is one line and exit 2, ``cli.main``, as for every command: ``pytest_nccl.usage``)."""

from __future__ import annotations

import argparse

from ...usage import Parser, UsageError
from ...views.github import GithubMode
from ..engine.present import PROG

__all__ = ["PROG", "UsageError", "build_parser", "parse"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Run a torch.distributed job with every rank's collectives "
                "traced; when it hangs or desyncs, print which rank, which collective and which line, "
                "and end it.",
                epilog="Exit: 3 a verdict (whether the watch or the launcher ended the job); 4 a verdict with "
                       "--keep-running; else the job's own status; 2 usage error. See docs/watch.md.")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long ranks may wait in a collective while no rank makes progress before it "
                        "is a hang (or a slow rank), and in init_process_group for peers; default 300")
    p.add_argument("--trace-dir", metavar="DIR", help="write the trace (JSON), the ranks' Flight "
                   "Recorder dumps, a Perfetto trace (.trace.json) and the swimlane page (.html) here on a verdict")
    p.add_argument("--keep-running", action="store_true",
                   help="on a verdict, report but leave the job running (to attach a debugger)")
    p.add_argument("--quiet", action="store_true", help="print only the headline of a verdict")
    p.add_argument("--json", metavar="FILE", help="write the outcome as JSON (for CI)")
    p.add_argument("--progress", type=float, default=0.0, metavar="SECONDS",
                   help="print a one-line progress every SECONDS (collectives per rank, the slowest rank, "
                        "the longest wait), so that a CI log never sits silent; default off")
    p.add_argument("--github", choices=[str(m) for m in GithubMode], default=GithubMode.AUTO,
                   type=str.lower, metavar="auto|on|off", help="GitHub Actions: the verdict as an error "
                   "annotation at its call site and in the job summary: auto (the default: when GITHUB_ACTIONS=true / "
                   "GITHUB_STEP_SUMMARY is set), on, or off")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the launch command, after --")
    return p


def parse(argv: list) -> tuple[argparse.Namespace, list]:
    if "--" in argv:
        at = argv.index("--")
        options, command = argv[:at], argv[at + 1:]
        args = build_parser().parse_args(options)
        if args.command:
            raise UsageError(f"unexpected {args.command[0]!r} before --")
    else:
        args = build_parser().parse_args(argv)
        command = args.command
    if not command:
        raise UsageError("no command to watch: give it after --, e.g. "
                         "pytest-nccl watch --timeout 300 -- torchrun --nproc-per-node 4 train.py")
    if args.progress < 0:
        raise UsageError(f"--progress must be a number of seconds >= 0 (0: off), not {args.progress:g}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    return args, command
