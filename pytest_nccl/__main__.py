"""``python -m pytest_nccl COMMAND`` (also the ``pytest-nccl`` console script).

Commands:
  bisect   find the release of a package that broke (or fixed) a pytest selection; see
           ``python -m pytest_nccl bisect --help`` and docs/bisect.md
  matrix   run a pytest selection over many releases and world sizes; a Markdown matrix; see
           ``python -m pytest_nccl matrix --help`` and docs/bisect.md
  watch    run a distributed job with its collectives traced; diagnose and end it when it hangs
           or desyncs; see ``python -m pytest_nccl watch --help`` and docs/watch.md
"""

from __future__ import annotations

import sys

USAGE = """usage: python -m pytest_nccl bisect PACKAGE --good V --bad V [options] -- PYTEST-ARGS
       python -m pytest_nccl bisect PACKAGE --sweep --from V --to V [options] -- PYTEST-ARGS
       python -m pytest_nccl matrix PACKAGE (--from V --to V | --versions LIST) [--world N ...]
                                    --results FILE.json [--out FILE.md] [options] -- PYTEST-ARGS
       python -m pytest_nccl watch [--timeout S] [--trace-dir DIR] [--keep-running] [--quiet]
                                   [--json FILE] -- LAUNCH COMMAND...

commands:
  bisect   find the first bad (or first fixed) release of PACKAGE for a pytest selection
  matrix   run a pytest selection on many releases x world sizes; write a Markdown matrix
  watch    trace a running job's collectives; diagnose and end it when it hangs or desyncs
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bisect":
        from .bisect.cli import main as bisect_main

        return bisect_main(rest)
    if cmd == "matrix":
        from .bisect.matrix.cli import main as matrix_main

        return matrix_main(rest)
    if cmd == "watch":
        from .watch.cli import main as watch_main

        return watch_main(rest)
    sys.stderr.write(f"pytest-nccl: unknown command {cmd!r}\n\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
