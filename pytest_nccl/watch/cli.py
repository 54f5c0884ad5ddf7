"""``pytest-nccl watch`` / ``python -m pytest_nccl watch``: run a distributed job under the watch.

    pytest-nccl watch [--timeout SECONDS] [--trace-dir DIR] [--keep-running] [--quiet] [--json FILE]
                      -- LAUNCH COMMAND...

Exit status:

- the launch command's own status when the watch reached no verdict (the job finished, or failed,
  on its own; a launcher killed by signal N gives 128+N). When its ranks did not all exit normally
  the watch still prints what their journals show (a post-mortem), without changing the status;
- 3 (``EXIT_DIAGNOSED``): a hang or desync was diagnosed while the job ran, and the watch ended it;
- 4 (``EXIT_DIAGNOSED_KEPT``): diagnosed with ``--keep-running``; the job was left running and has
  ended since (the watch waits for it);
- 2: usage error (one line on stderr); 126 / 127: the command cannot be executed / is not found;
- 128+N when the watch itself got signal N (Ctrl-C: 130); the job is ended first.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time

from ..core.states import Reason
from . import control, jobdir, present
from .monitor import Monitor

EXIT_USAGE = 2
EXIT_DIAGNOSED = 3
EXIT_DIAGNOSED_KEPT = 4
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
TERM_WAIT = 5.0            # between SIGTERM and SIGKILL when the watch ends the job
PROG = "pytest-nccl watch"
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Run a torch.distributed job with every rank's collectives "
                "traced; when it hangs or desyncs, print which rank, which collective and which line, "
                "and end it.",
                epilog="Exit: the job's own status without a verdict; 3 diagnosed and ended; 4 diagnosed "
                       "with --keep-running; 2 usage error. See docs/watch.md.")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SECONDS",
                   help="how long ranks may wait in a collective while no rank makes progress before it "
                        "is a hang (or a slow rank); default 300")
    p.add_argument("--trace-dir", metavar="DIR", help="write the trace (JSON) and the ranks' Flight "
                   "Recorder dumps here on a verdict")
    p.add_argument("--keep-running", action="store_true",
                   help="on a verdict, report but leave the job running (to attach a debugger)")
    p.add_argument("--quiet", action="store_true", help="print only the headline of a verdict")
    p.add_argument("--json", metavar="FILE", help="write the outcome as JSON (for CI)")
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
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    return args, command


def job_env(directory: str) -> dict:
    env = dict(os.environ)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = STARTUP_DIR + (os.pathsep + old if old else "")
    env[jobdir.ENV_DIR] = directory
    env[jobdir.ENV_PKG] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env[jobdir.ENV_WATCHER] = str(os.getpid())
    env[jobdir.ENV_WATCHER_HOST] = socket.gethostname()
    env.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # C++-issued collectives (DDP) become visible
    return env


def job_dir() -> str:
    directory = tempfile.mkdtemp(prefix="pytest-nccl-watch-")
    if len(directory) > 80:  # unix socket paths are short (108 bytes)
        shutil.rmtree(directory, ignore_errors=True)
        directory = tempfile.mkdtemp(prefix="pytest-nccl-watch-", dir="/tmp")
    return directory


def say(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Signals:
    """The first SIGINT/SIGTERM/SIGHUP asks the loop to end the job; a second one stops waiting."""

    def __init__(self):
        self.got = None
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.got is not None:
            raise KeyboardInterrupt
        self.got = signum


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv in (["-h"], ["--help"]):
        build_parser().print_help()
        return 0
    try:
        args, command = parse(argv)
    except UsageError as exc:
        say(f"{PROG}: error: {exc} (see {PROG} --help)")
        return EXIT_USAGE
    directory = job_dir()
    try:
        return Watch(args, command, directory).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Watch:
    def __init__(self, args, command: list, directory: str):
        self.args, self.command, self.dir = args, command, directory
        self.finding = None
        self.ended_by_watch = False
        self.trace_files: list = []

    def run(self) -> int:
        args = self.args
        control.become_subreaper()
        monitor = Monitor(self.dir, args.timeout)
        signals = _Signals()
        try:
            launcher = control.launch(self.command, job_env(self.dir))
        except FileNotFoundError:
            say(f"{PROG}: command not found: {self.command[0]}")
            return self._done(EXIT_NOT_FOUND, None)
        except PermissionError:
            say(f"{PROG}: cannot execute: {self.command[0]}")
            return self._done(EXIT_CANNOT_EXECUTE, None)
        if not args.quiet:
            say(f"{PROG}: watching {shlex.join(self.command)} (--timeout {args.timeout:g} s)")
        try:
            code = self._loop(launcher, monitor, signals)
        except KeyboardInterrupt:  # a second signal: no more waiting
            control.kill_all(launcher)
            code = 128 + (signals.got or signal.SIGINT)
        finally:
            monitor.close()
        return code

    def _loop(self, launcher, monitor: Monitor, signals: _Signals) -> int:
        next_reap = 0.0
        while True:
            if signals.got is not None:
                say(f"{PROG}: got {signal.Signals(signals.got).name}: ending the job")
                control.end(launcher, TERM_WAIT)
                return self._done(128 + signals.got, launcher.returncode)
            code = launcher.poll()
            now = time.monotonic()
            if self.finding is None:
                reason = monitor.poll(now)
                if reason in (Reason.DECIDED, Reason.TIMEOUT):
                    finding = monitor.conclude(reason, time.monotonic())
                    if self.args.keep_running:
                        self._report(finding)
                        say(f"{PROG}: --keep-running: the job goes on; the watch waits for it to end")
                    else:
                        if not self.args.quiet:
                            say(f"{PROG}: {finding.diagnosis.kind} diagnosed; ending the job (SIGTERM, "
                                f"then SIGKILL after {TERM_WAIT:g} s)")
                        control.end(launcher, TERM_WAIT)
                        self.ended_by_watch = True
                        self._report(finding)
                        return self._done(EXIT_DIAGNOSED, launcher.returncode)
            if code is not None:
                break
            if now >= next_reap:
                control.reap(launcher)
                next_reap = now + 1.0
            wake = monitor.wake_at(now) if self.finding is None else now + 0.2
            time.sleep(min(0.2, max(0.02, wake - time.monotonic())))
        job_code = status_of(launcher.returncode)
        if self.finding is not None:  # --keep-running
            code = EXIT_DIAGNOSED_KEPT
        else:
            code = job_code
            finding = monitor.after_exit(time.monotonic())
            if finding is not None:
                self._report(finding, post_mortem=job_code)
            elif monitor.referee is None and not self.args.quiet:
                say(f"{PROG}: no rank reported: none created a default process group (not a "
                    "torch.distributed job, it ended before init_process_group, or Python ran with -S, -I or -E)")
        if control.descendants():  # processes that outlived the launcher
            control.end(launcher, 2.0)
        return self._done(code, launcher.returncode)

    def _report(self, finding, post_mortem: int | None = None) -> None:
        self.finding = finding
        timeout, quiet = self.args.timeout, self.args.quiet
        head = present.headline(finding, timeout)
        if quiet:
            say(head)
        else:
            if post_mortem is not None:
                title = f"the job ended on its own (exit status {post_mortem}); its journals show"
            else:
                title = {"timeout": "stalled", "decided": "diagnosed"}.get(finding.reason, finding.reason)
                title = f"{title} ({finding.diagnosis.kind})"
            say(f"\n{'=' * 20} {PROG}: {title} {'=' * 20}")
            say(present.report_text(finding, timeout))
        present.to_absolute(finding, timeout)
        if self.args.trace_dir:
            try:
                self.trace_files = present.write_trace(self.args.trace_dir, finding, timeout)
            except OSError as exc:
                say(f"{PROG}: cannot write the trace to {self.args.trace_dir}: {exc}")
            else:
                if not quiet:
                    say(f"{PROG}: trace written to {self.trace_files[0]}")

    def _done(self, code: int, returncode) -> int:
        if self.args.json:
            text = present.summary(self.finding, exit_code=code,
                                   job_exit_code=None if returncode is None else status_of(returncode),
                                   command=self.command, timeout=self.args.timeout,
                                   ended_by_watch=self.ended_by_watch, trace_files=self.trace_files)
            try:
                with open(self.args.json, "w") as f:
                    f.write(text + "\n")
            except OSError as exc:
                say(f"{PROG}: cannot write --json {self.args.json}: {exc}")
        return code
