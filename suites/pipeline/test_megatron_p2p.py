"""megatron-core's own pipeline point-to-point code (``P2PCommunicator``, 0.16.1) at PP=2 and PP=N.

- Crossed shapes (Megatron-LM#5100, explained by PR #5271): at PP=2 a stage's previous and next
  stage are one rank. With ``variable_seq_lengths`` the shapes travel first, in one batch ordered
  send_prev, recv_prev, send_next, recv_next on both ranks, so each rank's recv_prev takes the
  peer's send_prev: the shapes cross. With ``batch_p2p_comm=False`` the tensors then travel in
  ``_p2p_ops``' even/odd order, which pairs them right: each tensor lands in a buffer of the other
  one's shape. The verdict names the crossed pair; gloo aborts the receiver when the sizes differ.
- The same exchange with fixed shapes (``variable_seq_lengths=False``): pairs right, passes.
- With ``batch_p2p_comm=True`` the tensors cross too, in the same order as their shapes: each pair
  agrees in shape, the activation arrives as the gradient. No pairing can see that; the test's own
  check of values does (a rank raises).
- Both stages send before they receive (pytorch#172668's order, here through megatron's
  ``send_forward`` / ``send_backward``, which wait for their send): a deadlock on gloo, whose send
  completes once the peer receives; fixed with the combined calls megatron has for it.
- A GPipe pass over PP=N stages (every rank one stage) with variable sequence lengths, batched or
  not: the configuration of #5100 at PP>=4 completes on gloo, every pair agrees.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist
from megatron_stages import communicator, on_cpu, site, stage_group

import pytest_nccl

HIDDEN = 8


def activation(stage: int, seq: int) -> torch.Tensor:
    return torch.full((seq, 1, HIDDEN), 10.0 + stage)


def gradient(stage: int, seq: int) -> torch.Tensor:
    return torch.full((seq, 1, HIDDEN), 20.0 + stage)


def interleaved_exchange(variable_seq_lengths: bool, batch_p2p_comm: bool) -> None:
    """One bidirectional step of the interleaved schedule at PP=2: each stage sends its activation
    (6 tokens) forward and a gradient (4 tokens, another micro-batch) backward, and receives both."""
    group = stage_group(2)
    if group is None:
        return
    stage = group.rank()
    fwd, bwd = (6, 4) if variable_seq_lengths else (6, 6)
    comm = communicator(group, variable_seq_lengths=variable_seq_lengths, batch_p2p_comm=batch_p2p_comm)
    with on_cpu():
        got_act, got_grad = comm.send_forward_backward_recv_forward_backward(  # EXCHANGE
            activation(stage, fwd), gradient(stage, bwd), recv_prev=True, recv_next=True, tensor_shape=[fwd, 1, HIDDEN])
    peer = 1 - stage
    assert got_act.flatten()[0].item() == 10.0 + peer, f"stage {stage} received {got_act.flatten()[0].item()} " \
        f"as the activation of stage {peer}"
    assert got_grad.flatten()[0].item() == 20.0 + peer


@pytest.mark.timeout(60)
def test_crossed_shape_exchange_at_pp2_is_diagnosed(expect_diagnosis):
    """"p2p pairing: rank 1's 1st send to rank 0 [6, 1, 8] was received as rank 0's 1st recv from
    rank 1 [4, 1, 8] (from megatron/.../p2p_communication.py:111 <- test_megatron_p2p.py:L; ...)" on
    0.16.1; "3rd" on 0.14 and 0.15, whose shape exchange runs on the default group."""
    expect_diagnosis(interleaved_exchange, True, False,
                     op=r"p2p pairing: rank 1's \d+\w\w send to rank 0 \[6, 1, 8\] was received as rank 0's \d+\w\w "
                        r"recv from rank 1 \[4, 1, 8\]", rank=1, site=site(sys.modules[__name__], "EXCHANGE"))


@pytest.mark.nccl(timeout=60)
def test_fixed_shapes_at_pp2_pass(rank):
    interleaved_exchange(False, False)


@pytest.mark.timeout(60)
def test_batched_crossing_is_caught_by_the_values_only(nccl_world):
    """The tensors cross with their shapes: every pair agrees, the activation is a gradient."""
    with pytest.raises(pytest_nccl.RankRaised) as info:
        nccl_world.run(interleaved_exchange, True, True)
    headline = info.value.diagnosis.headline
    assert "as the activation of stage" in headline and "p2p pairing" not in headline, headline


def send_then_receive(combined: bool) -> None:
    """Stage 0 sends micro-batch 1 forward while stage 1 sends micro-batch 0's gradient back; each
    then receives. ``combined``: megatron's send_forward_recv_backward / send_backward_recv_forward."""
    group = stage_group(2)
    if group is None:
        return
    stage = group.rank()
    shape = [6, 1, HIDDEN]  # the combined calls take a list of shapes: [shape]
    comm = communicator(group, variable_seq_lengths=False, batch_p2p_comm=True)
    with on_cpu():
        if combined:
            if stage == 0:
                got = comm.send_forward_recv_backward(activation(0, 6), [shape], is_last_stage=False)
            else:
                got = comm.send_backward_recv_forward(gradient(1, 6), [shape], is_first_stage=False)
        elif stage == 0:
            comm.send_forward(activation(0, 6), is_last_stage=False)  # SEND FIRST
            got = comm.recv_backward(shape, is_last_stage=False)
        else:
            comm.send_backward(gradient(1, 6), is_first_stage=False)  # SEND FIRST
            got = comm.recv_forward(shape, is_first_stage=False)
    assert got.flatten()[0].item() == (20.0 + 1 if stage == 0 else 10.0)


@pytest.mark.timeout(60)
def test_both_stages_sending_first_is_diagnosed(expect_diagnosis):
    """"p2p deadlock: both ranks send first: rank 0 waits in isend(dst=1, tag=0) in group pg1[0,1]
    from megatron/.../p2p_communication.py:47 <- test_megatron_p2p.py:L, which rank 1 never receives;
    rank 1 waits in isend(dst=0, tag=0) ..."."""
    expect_diagnosis(send_then_receive, False, op=r"p2p deadlock: .*send first: rank 0 waits in isend\(dst=1",
                     rank=0, site=site(sys.modules[__name__], "SEND FIRST"))


@pytest.mark.nccl(timeout=60)
def test_combined_send_and_receive_pass(rank):
    send_then_receive(True)


@pytest.mark.nccl(timeout=60)
@pytest.mark.parametrize("batch_p2p_comm", [True, False], ids=["batched", "p2p-ops"])
def test_gpipe_over_every_rank_with_variable_lengths_passes(rank, batch_p2p_comm):
    """PP = the world: each micro-batch another length; activations forward, gradients back."""
    world = dist.get_world_size()
    group = stage_group(world)
    stage, last = group.rank(), world - 1
    comm = communicator(group, variable_seq_lengths=True, batch_p2p_comm=batch_p2p_comm)
    seqs = [3, 5, 4]
    with on_cpu():
        for seq in seqs:
            x = torch.zeros(seq, 1, HIDDEN) if stage == 0 else comm.recv_forward([1, 1, HIDDEN], is_first_stage=False)
            assert tuple(x.shape) == (seq, 1, HIDDEN) and x.flatten()[0].item() == sum(range(stage))
            if stage != last:
                comm.send_forward(x + stage, is_last_stage=False)
        for seq in seqs:
            g = torch.ones(seq, 1, HIDDEN) if stage == last else comm.recv_backward([1, 1, HIDDEN], is_last_stage=False)
            assert tuple(g.shape) == (seq, 1, HIDDEN) and g.flatten()[0].item() == 1 + last - stage
            if stage != 0:
                comm.send_backward(g + 1, is_first_stage=False)
