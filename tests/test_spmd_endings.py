"""SPMD mode's endings: a rank that leaves the session (a collection difference, an exit inside a
test) and the launcher's SIGTERM that follows; each rank keeps its own exit status, and rank 0 names
the rank that died. Real torchrun runs (``spmd_support.launch``)."""

from __future__ import annotations


def test_ranks_collecting_different_tests_stop_with_one_clear_error(launch):
    run = launch("""
        import os
        import pytest

        @pytest.mark.parametrize("n", range(2 + int(os.environ["RANK"])))
        def test_p(n):
            pass
    """, "test_inner.py")
    message = ("pytest-nccl SPMD mode: every rank must collect the same tests in the same order: rank 1 "
               "collected 3 tests, rank 0 2; first difference at test #3: rank 0 '(nothing)', "
               "rank 1 'test_inner.py::test_p[2]'")
    assert message in run.report, run.text
    assert f"[pytest-nccl rank 1] {message}" in run.text  # the quiet rank says it too, once
    assert "passed" not in run.report.split("collected")[-1]
    assert run.text.count("exitcode  : 4") == 2 and run.codes == [1], run.text  # usage error on both ranks


def test_the_launchers_sigterm_after_a_ranks_session_leaves_its_exit_code_its_own(launch):
    """torchrun SIGTERMs every other rank as soon as one exits with an error; a rank whose session has
    ended by then must still exit with its own code (rank 0 then loses no usage error to the race).
    The SIGTERM is sent here by each rank to itself as its interpreter shuts down."""
    run = launch("""
        import atexit, os, signal

        atexit.register(os.kill, os.getpid(), signal.SIGTERM)

        def test_p():
            pass
    """, "test_inner.py")
    assert run.codes == [0] and "SIGTERM" not in run.text, run.text


def test_rank_process_exiting_in_a_test_is_named_by_rank_0_at_once(launch):
    run = launch("""
        import os
        import pytest, torch
        import torch.distributed as dist

        @pytest.mark.nccl
        def test_a_passes(rank):
            dist.barrier()

        @pytest.mark.nccl
        def test_b_rank_exits(rank):
            if rank == 1:
                os._exit(3)
            dist.barrier()
    """, "test_inner.py", "--nccl-timeout=60")
    # rank 0 sees rank 1's process gone (same host), or gets the launcher's SIGTERM first: either way
    # its report names the rank that died and where rank 0 waited, at once; on a loaded runner the
    # SIGTERM may come before rank 0 began test_b: it then names the rank that ended and its last test
    died = ("rank 1 ended without an exit record (killed by a signal, or os._exit) after 0 collectives in group "
            "default; rank 0 waits in barrier #1 of group default from test_inner.py:")
    between = ("the launcher stopped this rank (SIGTERM) after test_inner.py::test_a_passes; the process of "
               "rank 1 had ended")
    assert died in run.report or between in run.text, run.text
    assert "exitcode  : 3" in run.text  # torchrun's own report names the rank that exited
    # well inside --nccl-timeout=60, with room for two ranks starting torch on a loaded runner
    assert run.codes != [0] and run.elapsed < 45, (run.elapsed, run.text)


def test_a_rank_the_launcher_stops_after_a_failure_still_says_what_failed(launch):
    """The launcher's SIGTERM comes before pytest's summary: the failures that summary would have
    shown are said in a line each, on the rank that had them."""
    run = launch("""
        import os, time

        def test_a_fails():
            assert 1 + 1 == 3, "the sum is off"

        def test_b_rank_1_exits():
            if os.environ["RANK"] == "1":
                os._exit(3)
            time.sleep(60)
    """, "test_inner.py")
    assert ("the launcher stopped this rank (SIGTERM) after test_inner.py::test_a_fails; the process of rank 1 "
            "had ended") in run.text, run.text
    assert "failed here before it: test_inner.py::test_a_fails: AssertionError: the sum is off" in run.text, run.text
    assert run.codes != [0] and run.elapsed < 40, (run.elapsed, run.text)


def test_a_process_a_rank_forks_keeps_its_signals_and_never_interrupts_the_rank(launch):
    """A DataLoader worker or multiprocessing child forked by a rank inherits the rank's handlers and
    wakeup fd: its ``terminate()`` must still kill it (SIGTERM), and that SIGTERM is not the rank's."""
    run = launch("""
        import multiprocessing, time
        import pytest, torch
        import torch.distributed as dist

        def child():
            time.sleep(600)

        @pytest.mark.nccl
        def test_forks_and_terminates(rank):
            process = multiprocessing.get_context("fork").Process(target=child)
            process.start()
            time.sleep(0.5)
            process.terminate()
            process.join(timeout=30)
            assert process.exitcode == -15
            time.sleep(0.5)  # the rank's watchdog would read the child's SIGTERM from the wakeup fd here
            dist.all_reduce(torch.ones(1))

        @pytest.mark.nccl
        def test_after(rank):
            dist.barrier()
    """, "test_inner.py")
    assert "2 passed" in run.report and run.codes == [0], run.text
