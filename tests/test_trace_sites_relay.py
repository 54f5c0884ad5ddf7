"""A relaying library's frames (transformers' model code around an FSDP all-gather) ride on top of
a call site chain: the chain still reaches the code that called the model, and the headline names
that code ("verl/workers/actor/dp_actor.py:352 ..., via transformers"), as on verl 0.7.1's actor."""

from __future__ import annotations

import sys

from pytest_nccl.core.sites import headline_site, relay_package
from pytest_nccl.rank.trace_sites import SITE_DEPTH, call_site

_NESTING = 2 * SITE_DEPTH  # more relay files than a chain holds of the user's


def _relay_module(index: int, inner):
    """A function compiled as if from site-packages/transformers/m<index>.py that calls ``inner``."""
    namespace: dict = {"inner": inner}
    source = "def forward():\n    return inner()\n"
    exec(compile(source, f"/v/lib/python3.11/site-packages/transformers/m{index}.py", "exec"), namespace)
    return namespace["forward"]


def _site_through_relays() -> str:
    innermost = _relay_module(0, lambda: call_site(sys._getframe(1)))
    for index in range(1, _NESTING):
        innermost = _relay_module(index, innermost)
    return _callers_line(innermost)


def _callers_line(model):
    return model()  # the line the headline must name


def test_relay_frames_do_not_use_up_the_chain():
    site = _site_through_relays()
    frames = site.split(" <- ")
    assert sum(1 for f in frames if relay_package(f)) == _NESTING, site
    assert any(__file__ in f for f in frames), site
    headline = headline_site(site)
    assert headline.startswith("tests/test_trace_sites_relay.py:") or __file__ in headline, headline
    assert headline.endswith(", via transformers"), headline


def test_relay_package_reads_the_path():
    assert relay_package("/v/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py") == \
        "transformers"
    assert relay_package("/v/lib/python3.11/site-packages/accelerate/utils/operations.py") == "accelerate"
    assert relay_package("/v/lib/python3.11/site-packages/verl/workers/actor/dp_actor.py") == ""
    assert relay_package("/home/me/transformers/modeling.py") == ""  # a checkout of one's own is the user's
