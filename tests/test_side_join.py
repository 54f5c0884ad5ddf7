"""One verdict for a vLLM group followed by two watches (issue 46): the merge of their notes and the
rest of ``core.sidejoin`` on data; then ``watch/engine/sidejoin.py`` and ``SideCalls`` in a real
TCPStore (the group's, in a process of its own), without vLLM: the first watch to decide decides
for both, the other takes it; a store that ends leaves each watch with its own notes.
The real thing (vLLM's group, TRL's client, two ``pytest-nccl watch`` commands) is
tests/test_watch_vllm.py's "two commands" tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from watch_support import free_port

from pytest_nccl.core import jobdir
from pytest_nccl.core.sidecalls import CallState, SideCall, SideVerdict, judge
from pytest_nccl.core.sidejoin import (
    SILENT_AFTER,
    Heard,
    Peer,
    Published,
    Shared,
    address,
    live_others,
    may_end,
    merge,
)

STORE = "127.0.0.1:51216"


def note(member, state=CallState.IN_CALL, seq=4, op="broadcast", since=100.0, store=STORE, world=2, **kw):
    return SideCall(pid=10 + member, store=store, world=world, member=member, state=state.value, since=since,
                    seq=seq, op=op, site=kw.pop("site", f"job.py:{member}"), **kw)


def test_the_union_is_judged_as_one_group():
    """The server's watch sees member 0 (its store named as it listens), the trainer's member 1: the
    union names the broadcast member 1 never entered, where each alone could only say 'not seen'."""
    server = [note(0, detail="[4] float32 src=1", store="0.0.0.0:51216")]
    trainer = [note(1, op="barrier")]
    assert "not seen by this watch" in judge(server, 108.0, 8).headline
    merged, alive = merge(server, {10: True}, [(Published("t", trainer, {11: True}), Peer.LIVE)])
    found = judge(merged, 108.0, 8, alive)
    assert found is not None and found.headline == (
        "member 1 never entered broadcast #4 of vLLM's weight-sync group at 127.0.0.1:51216: member 1 is in "
        "barrier #4 from job.py:1; member 0 waited 8 s (--timeout) with no progress in broadcast #4 [4] float32 "
        "src=1 from job.py:0")
    assert found.group == ("51216", 2)
    # the other way round (the trainer's watch): the same verdict
    again, alive = merge(trainer, {11: True}, [(Published("s", server, {10: True}), Peer.LIVE)])
    assert judge(again, 108.0, 8, alive) == found


def test_a_member_on_both_sides_is_its_newest_note_and_silent_or_closed_watches():
    mine = [note(0, since=100.0), note(1, op="barrier", since=105.0)]
    theirs = [note(1, op="barrier", since=107.0, site="newer.py:1"), note(0, since=100.0, site="tie.py:1")]
    merged, _ = merge(mine, {}, [(Published("w", theirs), Peer.LIVE)])
    by = {n.member: n for n in merged}
    assert by[1].site == "newer.py:1"   # the other side's note is newer: it wins
    assert by[0].site == "job.py:0"     # a tie: this watch's own
    # a watch that stopped publishing: its notes are no evidence (the member is not seen, as before)
    merged, _ = merge(mine[:1], {}, [(Published("w", theirs[:1]), Peer.SILENT)])
    assert [n.member for n in merged] == [0]
    # a watch that closed with its command: its last notes stand, its processes ended
    closed = [note(1, CallState.IDLE, 3, "barrier", since=101.0)]
    merged, alive = merge(mine[:1], {10: True}, [(Published("w", closed, {11: True}, closed=True), Peer.CLOSED)])
    assert alive == {10: True, 11: False}
    assert "member 1 is gone (its process ended) after barrier #3" in judge(merged, 200.0, 8, alive).headline
    # a pid of another host equal to one of this host's: this host's process keeps its word
    twin = [SideCall(pid=10, host="other", store=STORE, world=3, member=2, state=CallState.IN_CALL.value, since=1.0)]
    _, alive = merge(mine[:1], {10: True}, [(Published("w", twin, {10: False}), Peer.LIVE)])
    assert alive[10] is True


def test_a_watch_is_live_while_its_beat_moves_then_silent():
    heard, record = Heard(), Published("w", beat=3)
    assert heard.peer(record, 0.0) == Peer.LIVE
    assert heard.peer(record, SILENT_AFTER - 0.1) == Peer.LIVE
    assert heard.peer(record, SILENT_AFTER) == Peer.SILENT
    record.beat = 4
    assert heard.peer(record, SILENT_AFTER + 1) == Peer.LIVE
    record.closed = True
    assert heard.peer(record, 1e9) == Peer.CLOSED
    others = [(Published("a"), Peer.LIVE), (Published("b"), Peer.CLOSED), (Published("c"), Peer.SILENT)]
    assert live_others(others) == 1


def test_when_each_watch_ends_its_command_on_the_verdict():
    """The deciding watch once the live others took it; one that took it at once; the watch whose
    members host the group's store last, once no other lives; none past ``ACK_WAIT``."""
    def ends(decided_here=True, hosts_store=False, taken=0, live=1, waited=0.0):
        return may_end(decided_here=decided_here, hosts_store=hosts_store, taken=taken, live=live, waited=waited)
    assert not ends() and ends(taken=1) and ends(live=0) and ends(waited=5.0)
    assert ends(decided_here=False)
    assert not ends(hosts_store=True, taken=1) and not ends(decided_here=False, hosts_store=True)
    assert ends(hosts_store=True, live=0) and ends(decided_here=False, hosts_store=True, waited=5.0)


def test_what_crosses_the_store_reads_back():
    record = Published("h-1-ab", [note(0, error="")], {10: False}, beat=7)
    text = record.encode()
    assert '"error"' not in text and '"a":false' in text and len(text) < 200, text  # defaults left out
    assert Published.decode(text) == record
    shared = Shared("h-1-ab", SideVerdict("head", "head\n\nreport", ("51216", 2)))
    assert Shared.decode(shared.encode()) == shared
    assert Shared.decode("-") is None and Published.decode(b"\x00") is None and Published.decode('{"w":1}') is None
    assert address([note(0, store="0.0.0.0:7")]) == ("127.0.0.1", 7)
    assert address([note(0, store="0.0.0.0:7"), note(1, store="node3:7")]) == ("node3", 7)
    assert address([note(0, store="[::]:7")]) == ("::1", 7) and address([note(0, store="[::1]:7")]) == ("::1", 7)
    assert address([note(0, store="")]) is None


# -- the engine's side, in a real store ------------------------------------------------------------------

STORE_HOST = """
import datetime, sys, time, torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False, use_libuv=False,
                      timeout=datetime.timedelta(seconds=30))
print("up", flush=True)
time.sleep(120)
"""


def write_note(directory, member: int, port: int, store: str, **kw) -> None:
    pid = os.getpid()
    n = SideCall(pid=pid, start=jobdir.process_start(pid), host=__import__("socket").gethostname(),
                 store=f"{store}:{port}", world=2, member=member, since=time.time() - 100, **kw)
    jobdir.write_json(os.path.join(directory, f"sidecall-{pid}-{member}.json"), n.to_dict())


def until(condition, wait: float = 30.0):
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if (value := condition()):
            return value
        time.sleep(0.05)
    raise AssertionError("not within the wait")


def meet(tmp_path, port: int):
    """The server's watch (member 0 in broadcast #4) and the trainer's (member 1 in barrier #4), once
    each reads the other's note in the group's store (no verdict with --timeout far away)."""
    from pytest_nccl.watch.engine.sidecalls import SideCalls

    (tmp_path / "server").mkdir()
    (tmp_path / "trainer").mkdir()
    write_note(tmp_path / "server", 0, port, "0.0.0.0", state="in-call", seq=4, op="broadcast", site="serve.py:1")
    write_note(tmp_path / "trainer", 1, port, "127.0.0.1", state="in-call", seq=4, op="barrier", site="train.py:2")
    server, trainer = SideCalls(str(tmp_path / "server")), SideCalls(str(tmp_path / "trainer"))
    until(lambda: server.verdict(1e9) is None and trainer.verdict(1e9) is None
          and len(server.found) == 2 and len(trainer.found) == 2)
    return server, trainer


def store_host(port: int) -> subprocess.Popen:
    host = subprocess.Popen([sys.executable, "-c", STORE_HOST, str(port)], stdout=subprocess.PIPE, text=True)
    assert host.stdout is not None and host.stdout.readline().strip() == "up"
    return host


def closed(*sides) -> None:
    for side in sides:
        side.close()
        assert side.join.thread is not None and not side.join.thread.is_alive()


def test_two_watches_meet_in_the_groups_store_and_give_one_verdict(tmp_path):
    port = free_port()
    host = store_host(port)
    try:
        server, trainer = meet(tmp_path, port)
        found: dict = {}

        def trainer_ends():
            server_said = server.verdict(8)
            assert server_said is None, "the store's host ends its command last"
            return trainer.verdict(8)
        found["trainer"] = until(trainer_ends, 15.0)
        trainer.close()  # its command ended: the server's watch, the store's host, ends its own now
        t0 = time.monotonic()
        found["server"] = until(lambda: server.verdict(8), 15.0)
        assert time.monotonic() - t0 < 3.0  # not at ACK_WAIT
        assert found["server"] == found["trainer"], found
        assert found["server"].headline.startswith("member 1 never entered broadcast #4 of vLLM's weight-sync "
                                                   "group at 127.0.0.1:"), found
        # both may have decided at once: the first one's verdict in the store stands, the other took it
        assert [side.held.decided_here for side in (server, trainer) if side.held].count(True) == 1
    finally:
        host.kill()
        host.wait()
    closed(server, trainer)


def test_a_store_that_ends_leaves_each_watch_with_its_own_notes(tmp_path):
    """No extra noise, no evidence: the watches judge as if they had never met."""
    port = free_port()
    host = store_host(port)
    try:
        server, trainer = meet(tmp_path, port)
    finally:
        host.kill()  # its host process ended (the server's worker 0)
        host.wait()
    until(lambda: server.verdict(1e9) is None and trainer.verdict(1e9) is None
          and len(server.found) == 1 and len(trainer.found) == 1, 15.0)
    assert "not seen by this watch" in trainer.verdict(8).headline  # as without the join
    closed(server, trainer)
