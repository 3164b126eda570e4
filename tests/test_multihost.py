"""Multi-host behaviour with real processes joined by jax.distributed (gloo on CPU)."""

import numpy as np
import pytest
from support import multihost

from locoexp.placement.launch import free_port, launch_local_processes

pytestmark = pytest.mark.slow  # real processes


def _load(path):
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """`multihost.step_publish_sample` on 1 and 2 hosts (the coordinator on a chosen port):
    host -> [what each process wrote], and the port."""
    out, port = {}, free_port()
    for hosts in (1, 2):
        folder = tmp_path_factory.mktemp(f"hosts{hosts}")
        code = launch_local_processes(
            multihost.step_publish_sample,
            (str(folder),),
            num_processes=hosts,
            devices_per_process=1,
            coordinator_port=port if hosts == 2 else 0,
        )
        assert code == 0
        out[hosts] = [
            {kind: _load(folder / f"{kind}_{p}.npz") for kind in ("train", "publish", "ports")}
            for p in range(hosts)
        ]
    return out, port


def test_two_hosts_give_the_loss_and_parameters_of_one_host(results):
    by_hosts, _ = results
    one, two = by_hosts[1][0]["train"], by_hosts[2][0]["train"]
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5, atol=1e-6)
    for name, value in one.items():
        np.testing.assert_allclose(two[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_every_host_holds_the_same_published_parameters(results):
    first, second = (host["train"] for host in results[0][2])
    for name in first:
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)


def test_after_publication_each_host_engine_samples_with_the_new_weights(results):
    for host in results[0][2]:
        result = host["publish"]
        mask = result["mask"] > 0
        assert mask.sum() > 0
        np.testing.assert_allclose(result["trainer"][mask], result["engine"][mask], atol=2e-5)


def test_the_coordinator_listens_on_hardware_coordinator_port(results):
    by_hosts, port = results
    assert port in by_hosts[2][0]["ports"]["ports"]


def test_a_failing_host_stops_the_others_and_the_launcher_reports_it(tmp_path):
    code = launch_local_processes(
        multihost.fail_on_host_one, (str(tmp_path),), num_processes=2, devices_per_process=1
    )
    assert code != 0
    assert not (tmp_path / "host0_finished").exists()
