"""The exit statuses of ``pytest-nccl bisect`` (and of a sweep), named once (docs/bisect.md's table)."""

EXIT_FOUND = 0              # bisect: first bad / first fixed found; sweep: no release is bad
EXIT_AMBIGUOUS = 1          # bisect: found, untested releases beside it; sweep: a release is bad
EXIT_USAGE = 2
EXIT_BOUNDS = 3             # a bound does not behave as given
EXIT_INDEX = 4              # the release list could not be had
EXIT_NOTHING_TESTABLE = 5   # sweep: no release could be tested
EXIT_ENVIRONMENT = 6        # this interpreter cannot build the envs
EXIT_INTERRUPTED = 130      # Ctrl-C or SIGTERM
