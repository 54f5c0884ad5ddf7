"""``pytest-nccl COMMAND`` (also ``python -m pytest_nccl COMMAND``): one parser, one program name.

Commands:
  explain  the verdict on a job from the Flight Recorder dumps it left behind (docs/explain.md)
  bisect   find the release of a package that broke (or fixed) a pytest selection (docs/bisect.md)
  matrix   run a pytest selection over many releases and world sizes; a Markdown matrix (docs/bisect.md)
  watch    run a distributed job with its collectives traced; diagnose and end it when it hangs or
           desyncs (docs/watch.md)
  where    ask a running watch where each rank of its job is; the job goes on (docs/watch.md)

The program name in usage and error lines is the one the user typed: ``pytest-nccl``, or
``python -m pytest_nccl`` when run that way. bisect's and matrix's arguments are subcommand parsers
of this parser; watch and where read their own (everything after the command goes to it).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from .usage import EXIT_USAGE, Parser, UsageError, report

EXIT_CODES = """exit status:
  0    done (bisect: found; sweep: no release bad; matrix: ran, red cells are results)
  1    bisect: found but ambiguous (untested releases next to it); sweep: a release is bad;
       where: no running watch found, or one did not answer
  2    usage error (any command)
  3    bisect: a bound does not behave as given; watch: a hang or desync diagnosed, job ended;
       explain: a rank diverges (0: none does)
  4    bisect, matrix: the release list could not be had; watch: diagnosed with --keep-running
  5    sweep: no release could be tested
  6    bisect, matrix: this interpreter cannot build release envs (torch not installed, or
       --installer uv without uv)
  130  interrupted (watch: 128+N for signal N, after saying where each rank was)
watch exits with the job's own status when it reaches no verdict (docs/watch.md)."""
COMMANDS = {
    "explain": "the verdict on a job from the Flight Recorder dumps it left behind",
    "bisect": "find the first bad (or first fixed) release of PACKAGE for a pytest selection",
    "matrix": "run a pytest selection on many releases x world sizes; write a Markdown matrix",
    "watch": "trace a running job's collectives; diagnose and end it when it hangs or desyncs",
    "where": "ask a running watch where each rank of its job is (the job goes on)",
}


def program_name(argv0: str | None = None) -> str:
    """``python -m pytest_nccl`` when run as a module (argv[0] is this file), else ``pytest-nccl``."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    return "python -m pytest_nccl" if os.path.basename(argv0) == "__main__.py" else "pytest-nccl"


def version() -> str:
    from . import __version__
    return f"pytest-nccl {__version__}"


def build_parser(prog: str) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The parser and its subcommand parsers (bisect's and matrix's arguments are declared by their
    modules, on these parsers)."""
    from .bisect import cli as bisect_cli
    from .bisect.matrix import cli as matrix_cli

    parser = Parser(
        prog=prog, description="pytest-nccl's commands. The pytest plugin itself needs none: "
                               "`pytest --nccl-world=2` (see README).",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    subs: dict[str, argparse.ArgumentParser] = {}
    for name, module in (("bisect", bisect_cli), ("matrix", matrix_cli)):
        subs[name] = sub.add_parser(name, help=COMMANDS[name], description=module.DESCRIPTION,
                                    epilog=module.EPILOG)
        module.add_arguments(subs[name])
    sub.add_parser("explain", help=COMMANDS["explain"], add_help=False)
    sub.add_parser("watch", help=COMMANDS["watch"], add_help=False)
    sub.add_parser("where", help=COMMANDS["where"], add_help=False)
    return parser, subs


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or program_name()
    if argv[:1] == ["watch"]:  # watch reads its own arguments (watch/frontends/cli.py)
        from .watch.frontends.cli import main as watch_main

        return watch_main(argv[1:])
    if argv[:1] == ["explain"]:  # ... and explain (explain/cli.py)
        from .explain.cli import main as explain_main

        return explain_main(argv[1:], prog=f"{prog} explain")
    if argv[:1] == ["where"]:  # ... and so does where (watch/frontends/where.py)
        from .watch.frontends.where import main as where_main

        return where_main(argv[1:])
    from .bisect import cli as bisect_cli
    from .bisect.matrix import cli as matrix_cli

    own, pytest_args = bisect_cli.split_argv(argv)
    parser, subs = build_parser(prog)
    try:
        ns, unknown = parser.parse_known_args(own)
        if ns.command is None:
            parser.error(f"unrecognized arguments: {' '.join(unknown)}" if unknown
                         else f"give a command: {', '.join(COMMANDS)}")
        if unknown:  # said by the command they were given to, as its own parser would
            subs[ns.command].error(f"unrecognized arguments: {' '.join(unknown)}")
        if ns.command == "bisect":
            ns = bisect_cli.check_args(subs["bisect"], ns, pytest_args)
        else:
            ns = matrix_cli.check_args(subs["matrix"], ns, pytest_args, argv[1:])
    except UsageError as e:  # of the program or of a command: one line, under the command's name
        return report(e, prog)
    except SystemExit as e:  # argparse: --help and --version
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    return (bisect_cli if ns.command == "bisect" else matrix_cli).run_command(ns)


if __name__ == "__main__":
    sys.exit(main())
