"""What the rank side loads: the tracer, the watch's start-up hook and its agent run inside every rank
of a watched job (and the tracer in every forked rank), so they import no analysis: no diagnosis, no
referee, no judge (the controller's). Checked in a fresh interpreter, as a rank starts."""

import subprocess
import sys

RANK_SIDE = ("pytest_nccl.rank.tracer", "pytest_nccl.watch.inrank.inject", "pytest_nccl.watch.inrank.sidegroups",
             "pytest_nccl.watch.inrank.agent", "pytest_nccl.watch.inrank.fold", "pytest_nccl.watch.inrank.exitrecord",
             "pytest_nccl.rank.adopted",
             "pytest_nccl.core.reports")
CONTROLLER_ONLY = ("pytest_nccl.core.diagnosis", "pytest_nccl.core.referee", "pytest_nccl.core.judge",
                   "pytest_nccl.core.call", "pytest_nccl.views")


def test_the_rank_side_loads_no_diagnosis_code():
    code = (f"import sys; import {', '.join(RANK_SIDE)}; "
            "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('pytest_nccl'))))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=120).stdout.split()
    assert set(RANK_SIDE) <= set(loaded)  # the check saw them load
    wrong = [m for m in loaded if m.startswith(CONTROLLER_ONLY)]
    assert not wrong, f"the rank side imports controller modules: {wrong}"
