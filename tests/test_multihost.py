"""Multi-host behaviour with real processes joined by jax.distributed (gloo on CPU)."""

import numpy as np
import pytest

from locoexp.placement.launch import free_port, launch_local_processes
from locoexp.testing import multihost

pytestmark = pytest.mark.slow  # real processes


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def one_step_results(tmp_path_factory):
    out = {}
    for hosts in (1, 2):
        folder = tmp_path_factory.mktemp(f"hosts{hosts}")
        code = launch_local_processes(
            multihost.train_one_step, (str(folder),), num_processes=hosts, devices_per_process=1
        )
        assert code == 0
        out[hosts] = [_load(folder / f"train_{p}.npz") for p in range(hosts)]
    return out


def test_two_hosts_give_the_loss_and_parameters_of_one_host(one_step_results):
    one, two = one_step_results[1][0], one_step_results[2]
    np.testing.assert_allclose(two[0]["loss"], one["loss"], rtol=1e-5, atol=1e-6)
    for name, value in one.items():
        np.testing.assert_allclose(two[0][name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_every_host_holds_the_same_published_parameters(one_step_results):
    first, second = one_step_results[2]
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def test_after_publication_each_host_engine_samples_with_the_new_weights(tmp_path):
    code = launch_local_processes(
        multihost.publish_then_sample, (str(tmp_path),), num_processes=2, devices_per_process=1
    )
    assert code == 0
    for host in range(2):
        result = _load(tmp_path / f"publish_{host}.npz")
        mask = result["mask"] > 0
        assert mask.sum() > 0
        np.testing.assert_allclose(result["trainer"][mask], result["engine"][mask], atol=2e-5)


def test_the_coordinator_listens_on_hardware_coordinator_port(tmp_path):
    port = free_port()
    code = launch_local_processes(
        multihost.listening_ports,
        (str(tmp_path),),
        num_processes=2,
        devices_per_process=1,
        coordinator_port=port,
    )
    assert code == 0
    assert port in _load(tmp_path / "ports_0.npz")["ports"]


def test_a_failing_host_stops_the_others_and_the_launcher_reports_it(tmp_path):
    code = launch_local_processes(
        multihost.fail_on_host_one, (str(tmp_path),), num_processes=2, devices_per_process=1
    )
    assert code != 0
    assert not (tmp_path / "host0_finished").exists()
