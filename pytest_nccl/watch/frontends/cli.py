"""``pytest-nccl watch`` / ``python -m pytest_nccl watch``: run a distributed job under the watch.

    pytest-nccl watch [--timeout SECONDS] [--trace-dir DIR] [--keep-running] [--quiet] [--json FILE]
                      [--progress SECONDS] -- LAUNCH COMMAND...

Exit status (``outcome.exit_status``: one status per outcome, whoever ended the job first):

- 3 (``EXIT_DIAGNOSED``): a verdict: the watch diagnosed a hang, a desync or a failed rank and ended
  the job, or the job ended before the watch concluded and its journals show the failure (the
  launcher's own status is in the report and in ``--json``);
- 4 (``EXIT_DIAGNOSED_KEPT``): a verdict with ``--keep-running``; the job was left running and has
  ended since (the watch waits for it);
- the launch command's own status without a verdict (the job finished; or no process created a
  default process group; a launcher killed by signal N gives 128+N);
- 2: usage error (one line on stderr); 126 / 127: the command cannot be executed / is not found;
- 128+N when the watch itself got signal N (Ctrl-C: 130; SIGTERM: 143; SIGHUP: 129): it says where each
  rank was (the report of the referee's conclusion then), and ends the job. SIGUSR1 says where each
  rank is and the job goes on (``pytest-nccl where`` sends it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

from ...core import jobdir
from ...core.reports import CallOutcome
from ...core.states import Reason
from ..engine import control, present, stragglers, where
from ..engine.job import Ended, Engine
from ..engine.outcome import EXIT_DIAGNOSED, exit_status
from ..timing import TIMING
from . import ci
from .options import PROG, UsageError, build_parser, parse

EXIT_USAGE = 2
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127
def say(text: str) -> None:
    sys.stdout.flush()
    sys.stderr.write(text.rstrip("\n") + "\n")
    sys.stderr.flush()


def status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class _Signals:
    """The first SIGINT/SIGTERM/SIGHUP asks the loop to say where each rank is, then end the job; a
    second one stops waiting. SIGUSR1 asks where each rank is, the job untouched."""

    def __init__(self):
        self.got = None
        self.asked = False
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._handle)
        signal.signal(signal.SIGUSR1, self._ask)

    def _handle(self, signum, frame):
        if self.got is not None:
            raise KeyboardInterrupt
        self.got = signum

    def _ask(self, signum, frame):
        self.asked = True


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
    directory = control.job_dir()
    try:
        return Watch(args, command, directory).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Watch:
    """The command: launches the job, follows it with an ``Engine`` (this is its ``FrontEnd``: the
    terminal's report, the launcher's process group ended), and answers with the exit status and
    ``--json``."""

    def __init__(self, args, command: list, directory: str):
        self.args, self.command, self.dir = args, command, directory
        self.engine: Engine | None = None  # once the launch command started
        self.launcher: subprocess.Popen | None = None
        self.trace_files: list = []
        self.interrupted: CallOutcome | None = None  # where the ranks were when a signal ended the watch

    def run(self) -> int:
        control.become_subreaper()
        guardian = control.guard(self.dir)  # ends the job if this watch is killed (SIGKILL)
        try:
            return self._run()
        finally:  # a job still running here (the watch failed): the guardian ends it
            guardian.done(clean=not control.descendants())

    def _run(self) -> int:
        args = self.args
        signals = _Signals()
        try:
            launcher = control.launch(self.command, control.job_env(self.dir))
        except FileNotFoundError:
            say(f"{PROG}: command not found: {self.command[0]}")
            return self._done(EXIT_NOT_FOUND, None)
        except PermissionError:
            say(f"{PROG}: cannot execute: {self.command[0]}")
            return self._done(EXIT_CANNOT_EXECUTE, None)
        if not args.quiet:
            say(f"{PROG}: watching {shlex.join(self.command)} (--timeout {args.timeout:g} s; "
                f"where each rank is: kill -USR1 {os.getpid()})")
        jobdir.write_text(jobdir.where_pid(self.dir), str(os.getpid()))
        self.launcher = launcher
        engine = self.engine = Engine(self.dir, self, timeout=args.timeout, quiet=args.quiet,
                                      keep_running=args.keep_running)
        try:
            code = self._loop(engine, launcher, signals)
        except KeyboardInterrupt:  # a second signal: no more waiting
            control.kill_all(launcher)
            code = 128 + (signals.got or signal.SIGINT)
        finally:
            engine.close()
        return code

    def _loop(self, engine: Engine, launcher, signals: _Signals) -> int:
        next_reap = 0.0
        every = self.args.progress
        started = time.monotonic()
        next_progress = started + every if every else float("inf")
        while True:
            if signals.got is not None:
                return self._interrupted(engine, launcher, signals.got)
            if signals.asked:
                signals.asked = False
                self._where(engine)
            code = launcher.poll()
            now = time.monotonic()
            if now >= next_progress:
                next_progress = now + every
                say(f"{PROG}: {where.progress_line(engine.places(stacks=False)[0], now - started)}")
            if engine.tick(now):
                return self._done(EXIT_DIAGNOSED, launcher.returncode)
            if code is not None:
                break
            if now >= next_reap:
                control.reap(launcher)
                next_reap = now + 1.0
            control.note_shm(now)
            time.sleep(min(0.2, max(0.02, engine.wake_at(now) - time.monotonic())))
        return self._ended(engine, launcher)

    def _interrupted(self, engine: Engine, launcher, signum: int) -> int:
        """Another hand ends the watch (Ctrl-C, a scheduler's SIGTERM, SIGHUP): where each rank was,
        then the job ended, with the status the signal gives (128+N)."""
        name = signal.Signals(signum).name
        say(f"{PROG}: got {name}: where each rank is, then the job ends")
        self.interrupted = engine.interrupt(name)
        if self.interrupted is not None:
            self.report(self.interrupted, title=f"interrupted by {name}")
        control.end(launcher, TIMING.job_term_wait)
        return self._done(128 + signum, launcher.returncode)

    def _where(self, engine: Engine) -> None:
        """SIGUSR1: where each rank is, said and written for ``pytest-nccl where``; the job goes on."""
        text = "\n".join(where.lines(*engine.places()))
        say(f"{PROG}: {text}")
        try:
            jobdir.write_text(jobdir.where_answer(self.dir), text + "\n")
        except OSError as exc:
            say(f"{PROG}: cannot write {jobdir.where_answer(self.dir)}: {exc}")

    def _ended(self, engine: Engine, launcher) -> int:
        """The launcher exited: the engine's verdict of the attempt followed (the launcher gave up, or
        the job ended before the watch concluded), else the job's own status."""
        job_code = status_of(launcher.returncode)
        ending = engine.conclude(job_code)
        if ending.how == Ended.GAVE_UP and ending.attempt is not None:
            if not self.args.quiet:
                say(f"{PROG}: the launcher ended (exit status {job_code}) after "
                    f"{ending.attempt.describe()}: that attempt's verdict stands")
        elif ending.how == Ended.JOURNALS and ending.finding is not None:
            self.report(ending.finding, title=f"the job ended on its own (exit status {job_code}); its journals show")
        elif ending.how == Ended.OTHER_WORLD and ending.finding is not None:
            self.report(ending.finding, title=f"the job ended on its own (exit status {job_code}); the journals of "
                                              f"{ending.world} show")
        elif ending.how == Ended.NOTHING and (line := engine.remark(job_code)):
            say(line)
        if control.descendants():  # processes that outlived the launcher
            control.end(launcher, 2.0)
        code = exit_status(verdict=engine.finding is not None or engine.side_group_missing,
                           kept_running=engine.kept, job_status=job_code)
        return self._done(code, launcher.returncode)

    # -- the engine's front-end (``engine.FrontEnd``) ----------------------------------------------------
    def say(self, text: str) -> None:
        say(text)

    def end_job(self, finding: CallOutcome | None) -> None:
        assert self.launcher is not None  # the engine follows a launched job
        control.end(self.launcher, TIMING.job_term_wait)

    def report(self, finding: CallOutcome, title: str | None = None, where: str = "") -> None:
        timeout, quiet = self.args.timeout, self.args.quiet
        head = present.headline(finding, timeout)
        if quiet:
            say(head)
        else:
            if title is None:
                title = {Reason.TIMEOUT: "stalled", Reason.DECIDED: "diagnosed"}.get(finding.reason, finding.reason)
                title = f"{title} ({finding.verdict.kind}){where}"
            say(present.banner(PROG, title))
            say(present.report_text(finding, timeout))
        present.to_absolute(finding, timeout)
        if self.args.trace_dir:
            try:
                written = present.write_trace(self.args.trace_dir, finding, lambda text: say(f"{PROG}: {text}"))
            except OSError as exc:
                say(f"{PROG}: cannot write the trace to {self.args.trace_dir}: {exc}")
            else:
                self.trace_files = written + self.trace_files  # the last verdict's first
                if not quiet:
                    say(f"{PROG}: trace written to {written[0]}")

    # -- the answer -------------------------------------------------------------------------------------
    def _done(self, code: int, returncode) -> int:
        engine = self.engine  # None: the launch command did not start, nothing was followed
        finding = engine.finding if engine is not None else None
        finding = finding or self.interrupted
        peers_missing = engine.peers_missing if engine is not None else ""
        side_group_missing = engine is not None and engine.side_group_missing
        watched = engine.watched() if engine is not None else {}
        found = stragglers.of_job(engine.attempt_dir, list(watched)) if engine is not None and watched else []
        for line in [] if self.args.quiet else stragglers.lines(found):
            say(f"{PROG}: {line}")
        if not self.args.quiet and (finding is not None or side_group_missing):
            head = present.headline(finding) if finding is not None else peers_missing
            say(present.recap(PROG, head, code, interrupted=finding is not None and finding is self.interrupted))
        ci.verdict(finding, code, self.trace_files, self.args.github)  # GitHub Actions (--github)
        if self.args.json:
            text = present.summary(finding, exit_code=code,
                                   job_exit_code=None if returncode is None else status_of(returncode),
                                   command=self.command, timeout=self.args.timeout,
                                   ended_by_watch=engine is not None and engine.ended_by_watch,
                                   trace_files=self.trace_files, restart=engine.attempt if engine is not None else 0,
                                   earlier=[(a.restart, f) for a, f in engine.earlier] if engine is not None else [],
                                   peers_missing=peers_missing or None, watched=watched,
                                   side_group_missing=side_group_missing)
            text = stragglers.with_stragglers(text, found)
            try:
                with open(self.args.json, "w") as f:
                    f.write(text + "\n")
            except OSError as exc:
                say(f"{PROG}: cannot write --json {self.args.json}: {exc}")
        return code
