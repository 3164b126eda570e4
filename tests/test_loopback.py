"""Every socket a local run listens on is on loopback (README, "Security"): the listening sockets
of a 2-host `co` run, listed with psutil over the run's own process tree while it runs. A `da`
run's (its Ray daemons and actors) are checked on test_da_survival's stopped and resumed runs."""

import pytest
from cli_runs import assert_loopback_only


@pytest.mark.slow
@pytest.mark.xdist_group("two_host_co_run")  # the killed and resumed run of test_resume_run
def test_a_two_host_co_run_listens_on_loopback_only(two_host_co_run):
    assert_loopback_only(two_host_co_run.sockets)
