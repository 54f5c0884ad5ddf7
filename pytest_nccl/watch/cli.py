"""``pytest-nccl watch`` / ``python -m pytest_nccl watch``: run a distributed job under the watch.

    pytest-nccl watch [--timeout SECONDS] [--trace-dir DIR] [--keep-running] [--quiet] [--json FILE]
                      -- LAUNCH COMMAND...

Exit status (``outcome.exit_status``: one status per outcome, whoever ended the job first):

- 3 (``EXIT_DIAGNOSED``): a verdict: the watch diagnosed a hang, a desync or a failed rank and ended
  the job, or the job ended before the watch concluded and its journals show the failure (the
  launcher's own status is in the report and in ``--json``);
- 4 (``EXIT_DIAGNOSED_KEPT``): a verdict with ``--keep-running``; the job was left running and has
  ended since (the watch waits for it);
- the launch command's own status without a verdict (the job finished; or no process created a
  default process group; a launcher killed by signal N gives 128+N);
- 2: usage error (one line on stderr); 126 / 127: the command cannot be executed / is not found;
- 128+N when the watch itself got signal N (Ctrl-C: 130); the job is ended first.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import sys
import time

from ..core.diagnosis.wording import rank_list
from ..core.reports import CallOutcome
from ..core.states import Kind, Reason
from . import control, jobdir, present, stragglers
from .joining import JoiningProcesses, join_failures
from .monitor import Monitor
from .options import PROG, UsageError, build_parser, parse
from .outcome import (
    EXIT_DIAGNOSED,
    SELF_JUDGED,
    Action,
    Attempt,
    attempt_of,
    exit_status,
    join_failure_line,
    no_rank_line,
    on_verdict,
    peers_line,
    side_group_report,
    side_group_verdict,
    waited_for_peers,
)
from .timing import TIMING
from .worlds import OtherWorlds

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
    directory = control.job_dir()
    try:
        return Watch(args, command, directory).run()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class Watch:
    """One watched job: the launcher's attempts, one ``Monitor`` each (torchrun ``--max-restarts``
    starts a new set of ranks per attempt, in ``jobdir.attempt_dir``)."""

    def __init__(self, args, command: list, directory: str):
        self.args, self.command, self.dir = args, command, directory
        self.finding: CallOutcome | None = None  # the verdict the exit status stands for
        self.kept = False               # reported with --keep-running: the job goes on
        self.ended_by_watch = False
        self.trace_files: list = []
        self.attempt = 0                # the launcher's attempt followed (its restart count)
        self.attempt_done = False       # ... has its verdict, or ended clean: wait for the next
        self.earlier: list = []         # verdicts of earlier attempts, reported as they came
        self.joining = JoiningProcesses(jobdir.attempt_dir(self.dir, self.attempt))  # of the attempt followed
        # the attempt's default worlds beside its first (the first one's monitor: once the job started)
        self.worlds = OtherWorlds(jobdir.attempt_dir(self.dir, self.attempt), args.timeout)
        self.peers_missing = ""
        self.side_group_missing = False  # ... members of a side group that never connected: a verdict

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
            say(f"{PROG}: watching {shlex.join(self.command)} (--timeout {args.timeout:g} s)")
        self.monitor = Monitor(self.dir, args.timeout)
        try:
            code = self._loop(launcher, signals)
        except KeyboardInterrupt:  # a second signal: no more waiting
            control.kill_all(launcher)
            code = 128 + (signals.got or signal.SIGINT)
        finally:
            self.close()
        return code

    def close(self) -> None:
        self.monitor.close()
        self.worlds.close()

    # -- attempts ---------------------------------------------------------------------------------------
    def _attempt(self) -> Attempt:
        return attempt_of([f.info for f in self.monitor.ranks.values()])

    def _next_attempt(self, now: float) -> None:
        """torchrun started another attempt: what the journals of this one show, then follow that one."""
        newer = [a for a in jobdir.attempts(self.dir) if a > self.attempt
                 and any(jobdir.rank_of(n) is not None or n.startswith("joining-")
                         for n in jobdir.listdir(jobdir.attempt_dir(self.dir, a)))]
        if not newer:
            return
        if not self.attempt_done:
            finding = self.monitor.after_exit(now)
            if finding is not None:
                self._report_attempt(finding, self._attempt())
        self.monitor.close()
        self.worlds.close()
        self.attempt, self.attempt_done = max(newer), False
        self.joining = JoiningProcesses(jobdir.attempt_dir(self.dir, self.attempt))
        self.monitor = Monitor(jobdir.attempt_dir(self.dir, self.attempt), self.args.timeout)
        self.worlds = OtherWorlds(jobdir.attempt_dir(self.dir, self.attempt), self.args.timeout)
        if not self.args.quiet:
            say(f"{PROG}: following the launcher's attempt {self.attempt + 1} (restart {self.attempt})")

    def _report_attempt(self, finding, attempt: Attempt) -> None:
        self.earlier.append((attempt, finding))
        self._report(finding, title=f"{attempt.describe()} failed; the launcher restarts it")
        self.finding = None  # not the job's verdict, unless the launcher gives up (``_ended``)

    # -- the loop ---------------------------------------------------------------------------------------
    def _loop(self, launcher, signals: _Signals) -> int:
        next_reap = 0.0
        while True:
            if signals.got is not None:
                say(f"{PROG}: got {signal.Signals(signals.got).name}: ending the job")
                control.end(launcher, TIMING.job_term_wait)
                return self._done(128 + signals.got, launcher.returncode)
            code = launcher.poll()
            now = time.monotonic()
            self._next_attempt(now)
            if not self.kept and self._step(launcher, now):
                return self._done(EXIT_DIAGNOSED, launcher.returncode)
            if code is not None:
                break
            if now >= next_reap:
                control.reap(launcher)
                next_reap = now + 1.0
            control.note_shm(now)
            time.sleep(min(0.2, max(0.02, self.wake_at(now) - time.monotonic())))
        return self._ended(launcher)

    def wake_at(self, now: float) -> float:
        """When the next tick is due: the first world's referee's, while it is followed, and the others'."""
        if self.kept:
            return now + 0.2
        first = now + 0.2 if self.attempt_done else self.monitor.wake_at(now)
        return min(first, self.worlds.wake_at(now))

    def _step(self, launcher, now: float) -> bool:
        """One tick of the attempt followed; True once the watch ended the job with a verdict."""
        if self.peers_missing:
            return False
        if not self.attempt_done and self._step_first(launcher, now):
            return True
        # the other default worlds, also once the first one's ranks are done (an engine's world goes on)
        if (other := self.worlds.poll(now)) is not None:
            return self._act(launcher, other[1], world=other[0])
        return False

    def _step_first(self, launcher, now: float) -> bool:
        """The attempt's first default world (the one followed across nodes)."""
        monitor = self.monitor
        reason = monitor.poll(now)
        # on several nodes, every node's watch gives the one finding of rank 0's node
        elsewhere = monitor.decided_elsewhere()
        if elsewhere is not None or reason in (Reason.DECIDED, Reason.TIMEOUT):
            finding = elsewhere or monitor.agree(monitor.conclude(reason or Reason.DECIDED, time.monotonic()))
            if finding.diagnosis is None:
                # every rank had finished clean by the time the reports were taken: nothing to act
                # on; the launcher's own end is the job's (a loaded host's slow exit barrier)
                self.attempt_done = True
                return False
            return self._act(launcher, finding)
        if reason == Reason.COMPLETED and self._attempt().restartable:
            # every rank of an attempt that may be restarted ended: its verdict now, not at the job's end
            ended = monitor.after_exit(now)
            if ended is not None:
                self._report_attempt(ended, self._attempt())
            self.attempt_done = True
        elif self._peers_never_appeared(now):  # a side group's members are followed beside the ranks
            say(f"{PROG}: {self.peers_missing}")
            self._end_job(launcher)
            self.ended_by_watch = True
        return False

    def _act(self, launcher, finding: CallOutcome, world: str = "") -> bool:
        """A verdict on the attempt (``world``: found in a default world beside its first); True once
        the job is ended."""
        attempt = self._attempt()
        action = on_verdict(finding.diagnosis, attempt, self.args.keep_running)
        where = f" in {world}" if world else ""
        if action == Action.FOLLOW_NEXT_ATTEMPT:
            self._report_attempt(finding, attempt)
            self.attempt_done = True
        elif action == Action.KEEP_RUNNING:
            self._report(finding, where=where)
            self.finding = finding
            self.kept = True
            say(f"{PROG}: --keep-running: the job goes on; the watch waits for it to end")
        else:
            if not self.args.quiet:
                say(f"{PROG}: {finding.verdict.kind} diagnosed{where}; ending the job (SIGTERM, "
                    f"then SIGKILL after {TIMING.job_term_wait:g} s)")
            self._end_job(launcher, finding)
            self.ended_by_watch = True
            self._report(finding, where=where)
            self.finding = finding
            return True
        return False

    def _end_job(self, launcher, finding: CallOutcome | None = None) -> None:
        """End the job on a verdict (a test's job is every process the test started: ``intest``)."""
        control.end(launcher, TIMING.job_term_wait)

    def _peers_never_appeared(self, now: float) -> bool:
        waiting = waited_for_peers(self.joining.read(now), len(self.monitor.ranks), now, self.args.timeout)
        if not (waiting or self.args.quiet) and (notice := self.joining.notice(now, self.args.timeout)):
            say(f"{PROG}: {notice}")
        if waiting:
            self.peers_missing = peers_line(waiting, self.args.timeout)
            self.side_group_missing = side_group_verdict(waiting)
            if self.side_group_missing and not self.args.quiet:  # a verdict: as every verdict reads
                say(present.banner(PROG, f"diagnosed ({Kind.RENDEZVOUS}, side group)"))
                say(side_group_report(waiting, self.args.timeout))
        return bool(waiting)

    def _ended(self, launcher) -> int:
        """The launcher exited: the verdict of the attempt followed (the launcher gave up, or the job
        ended before the watch concluded), else the job's own status."""
        job_code = status_of(launcher.returncode)
        if self.kept:
            pass
        elif self.attempt_done:
            if self.earlier and self.earlier[-1][0].restart == self.attempt:  # the launcher gave up
                self.finding = self.earlier[-1][1]
                if not self.args.quiet:
                    say(f"{PROG}: the launcher ended (exit status {job_code}) after "
                        f"{self.earlier[-1][0].describe()}: that attempt's verdict stands")
            if self.finding is None and (other := self.worlds.after_exit(time.monotonic(), job_code == 0)):
                self._other_world_ended(other, job_code)  # the first world ended clean; another did not
        elif self.peers_missing:
            pass
        else:
            finding = self.monitor.after_exit(time.monotonic(), launcher_ok=job_code == 0)
            other = None if finding is not None else self.worlds.after_exit(time.monotonic(), job_code == 0)
            if finding is not None:
                finding = self.monitor.agree(finding)
                self._report(finding, title=f"the job ended on its own (exit status {job_code}); its journals show")
                self.finding = finding
            elif other is not None:
                self._other_world_ended(other, job_code)
            elif (failed := join_failures(self.joining.directory)) and not self.args.quiet:
                say(f"{PROG}: {join_failure_line(failed, self.attempt, job_code)}")
            elif self.monitor.self_judged and not self.args.quiet:
                say(f"{PROG}: {SELF_JUDGED}")
            elif self.monitor.unseen() and not self.args.quiet:  # said, never a verdict
                say(f"{PROG}: {rank_list(self.monitor.unseen())} (on another node) could not be followed to "
                    "the end: the channel to that node's watch ended; this node's ranks ended cleanly")
            elif self.monitor.referee is None and not self.earlier:
                count = [n.split("-", 1)[0] for n in jobdir.listdir(self.dir)].count
                say(f"{PROG}: {no_rank_line(count('torch'), members=count('member'))}")
        if control.descendants():  # processes that outlived the launcher
            control.end(launcher, 2.0)
        code = exit_status(verdict=self.finding is not None or self.side_group_missing, kept_running=self.kept,
                           job_status=job_code)
        return self._done(code, launcher.returncode)

    def _other_world_ended(self, other: tuple[str, CallOutcome], job_code: int) -> None:
        world, finding = other
        self._report(finding, title=f"the job ended on its own (exit status {job_code}); the journals of {world} show")
        self.finding = finding

    def _report(self, finding, title: str | None = None, where: str = "") -> None:
        timeout, quiet = self.args.timeout, self.args.quiet
        head = present.headline(finding, timeout)
        if quiet:
            say(head)
        else:
            if title is None:
                title = {Reason.TIMEOUT: "stalled", Reason.DECIDED: "diagnosed"}.get(finding.reason, finding.reason)
                title = f"{title} ({finding.diagnosis.kind}){where}"
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

    def _done(self, code: int, returncode) -> int:
        found = stragglers.of_watch(self)
        for line in [] if self.args.quiet else stragglers.lines(found):
            say(f"{PROG}: {line}")
        if not self.args.quiet and (self.finding is not None or self.side_group_missing):
            head = present.headline(self.finding) if self.finding is not None else self.peers_missing
            say(present.recap(PROG, head.removesuffix("; ending the job"), code))
        if self.args.json:
            text = present.summary(self.finding, exit_code=code,
                                   job_exit_code=None if returncode is None else status_of(returncode),
                                   command=self.command, timeout=self.args.timeout,
                                   ended_by_watch=self.ended_by_watch, trace_files=self.trace_files,
                                   restart=self.attempt, earlier=[(a.restart, f) for a, f in self.earlier],
                                   peers_missing=self.peers_missing or None, watched=self._watched(),
                                   side_group_missing=self.side_group_missing)
            text = stragglers.with_stragglers(text, found)
            try:
                with open(self.args.json, "w") as f:
                    f.write(text + "\n")
            except OSError as exc:
                say(f"{PROG}: cannot write --json {self.args.json}: {exc}")
        return code

    def _watched(self) -> dict:
        monitor = getattr(self, "monitor", None)
        return {r: sum(f.count.values()) for r, f in monitor.ranks.items()} if monitor is not None else {}
