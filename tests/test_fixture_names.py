"""The rank fixtures' names (rank, world_size, device, backend) against a user's own fixture or
parametrize argument of the same name: respected in unmarked tests, one usage line naming the
conflict in tests marked nccl (where the name means the rank's value), never silently replaced."""

CONFTEST = """
import pytest

@pytest.fixture
def device():
    return "mine"
"""

TESTS = """
import pytest

def test_own_fixture_unmarked(device):
    assert device == "mine"

@pytest.mark.parametrize("backend", ["a", "b"])
def test_own_parameter_unmarked(backend):
    assert backend in ("a", "b")

@pytest.mark.nccl(world=2)
def test_own_fixture_marked(rank, device):
    pass

@pytest.mark.nccl(world=2)
@pytest.mark.parametrize("backend", ["nccl"])
def test_own_parameter_marked(backend):
    pass

@pytest.mark.nccl(world=2)
def test_rank_fixtures(rank, world_size):
    assert world_size == 2
"""


def test_own_fixtures_and_parameters_of_rank_fixture_names(run_inner, pytester):
    pytester.makeconftest(CONFTEST)
    inner = run_inner(TESTS)
    outcomes = inner.result.parseoutcomes()
    assert outcomes == {"passed": 4, "failed": 2}, inner.text
    inner.result.stdout.fnmatch_lines(["FAILED test_inner.py::test_own_fixture_marked - pytest-nccl: *",
                                       "FAILED test_inner.py::test_own_parameter_marked[[]nccl[]] - pytest-nccl: *"])
    rest = ", and in a test marked nccl it is also pytest-nccl's rank fixture; rename yours (rank, world_size, " \
           "device, backend are the rank's in marked tests)"
    assert "pytest-nccl: 'device' is a fixture of your own" + rest in inner.section("test_own_fixture_marked")
    assert "pytest-nccl: 'backend' is a parametrize argument" + rest in inner.section("test_own_parameter_marked[nccl]")
