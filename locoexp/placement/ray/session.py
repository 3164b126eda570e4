"""The run's Ray under `placement=da`: connected or started for the run, stopped with it, and
nothing of it left once the driver is gone. It starts no actor (`hosts.py` does).

- A joined cluster (`placement.ray_address`): the driver connects and disconnects; the
  cluster's processes are not the run's, and nothing here touches them.
- A local cluster: one CPU per host, the object store the plan sized. Loopback: Ray turns a node
  address of 127.0.0.1 into the machine's routable address (so its gcs_server, raylet, workers
  and autoscaler monitor listen on every interface) unless it treats the machine as a one-node
  cluster, which its `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` switch selects on any platform. A
  local cluster bound to loopback sets it, no dashboard is started, and every Ray service then
  listens on 127.0.0.1 only; the trainer group's coordinator binds there too.
- The switch is set in this process's environment only while Ray starts its processes (which
  keep it: the raylet hands its environment to every worker it starts), then put back with
  Ray's constant: a later run in the same process, on a joined cluster, sees Ray's multi-node
  default (a leaked switch turned multi-node off for it).
- A local cluster has a watchdog (`watchdog.py`): once the driver ends the session, or dies
  (SIGKILL included), it stops every process of the cluster (those writing into its session
  directory), so no agent or actor of the run stays behind for Ray's minute.
"""

import contextlib
import ipaddress
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import ray

from locoexp.layout import Layout
from locoexp.placement.coordinator import CoordinatorSpec
from locoexp.placement.ray import watchdog as ray_watchdog
from locoexp.placement.ray.spec import RaySpec


@contextlib.contextmanager
def ray_session(layout: Layout, cluster: RaySpec, meet: CoordinatorSpec) -> Iterator[None]:
    """Ray for the run, connected or started, until `ray.shutdown()` (module docstring); its
    services listen on `meet.bind_address`."""
    options: dict[str, Any] = dict(
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=True
    )
    if meet.bind_address is not None:
        options["_node_ip_address"] = meet.bind_address
    try:
        if cluster.joined:
            ray.init(address=cluster.address, **options)
            yield
        else:
            _start_local(layout, cluster, meet.bind_address, options)
            node = ray._private.worker._global_node
            assert node is not None, "ray.init has started this driver's node"
            with watchdog(node.get_session_dir_path()):
                try:
                    yield
                finally:  # before the watchdog's end: it stops what Ray's shutdown left
                    ray.shutdown()
    finally:  # a start that failed half-way included
        ray.shutdown()


def _start_local(layout: Layout, cluster: RaySpec, address: str | None, options: dict) -> None:
    if cluster.object_store_bytes is not None:
        options = {**options, "object_store_memory": cluster.object_store_bytes}
    loopback = address is not None and ipaddress.ip_address(address).is_loopback
    restore = keep_ray_on_loopback() if loopback else None
    try:
        ray.init(address="local", num_cpus=layout.trainer_hosts + layout.rollout_hosts, **options)
    finally:  # already done by Ray's post-init hook, unless the start failed
        if restore is not None:
            restore()


@contextlib.contextmanager
def watchdog(session_dir: str) -> Iterator[None]:
    """A `watchdog.py` process for the local cluster of `session_dir`. When the block ends
    (after `ray.shutdown()`) it stops what is left of the cluster, waited for here; if this
    process dies, at once."""
    process = subprocess.Popen(
        # -I: the watchdog imports only the standard library and psutil, whatever the path
        [sys.executable, "-I", ray_watchdog.__file__, session_dir, str(os.getpid())],
        stdin=subprocess.PIPE,  # the driver's end: its exit or death is the watchdog's EOF
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C, or a signal to the driver's group, leaves it be
    )
    assert process.stdin is not None, "started with stdin=PIPE"
    try:
        yield
    finally:
        process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2 * ray_watchdog.GRACE_S + 10)


def keep_ray_on_loopback() -> Callable[[], None]:
    """Make the Ray started next keep node address 127.0.0.1 (module docstring): the switch in
    the environment of the processes it starts, and the constant this process read when it
    imported Ray. For that start only: both are put back once it has started (a post-init hook
    of Ray's), or by the returned function if it fails to start."""
    from ray._private import ray_constants, worker  # noqa: PLC0415

    restore_environ = _set_environ(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "0")
    constant = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False

    def restore() -> None:
        if restore in worker._post_init_hooks:
            worker._post_init_hooks.remove(restore)
            restore_environ()
            ray_constants.ENABLE_RAY_CLUSTER = constant

    worker._post_init_hooks.append(restore)
    return restore


def _set_environ(key: str, value: str) -> Callable[[], None]:
    """Set `key` in this process's environment; returns what puts it back (or removes it)."""
    previous = os.environ.get(key)
    os.environ[key] = value

    def restore() -> None:
        if previous is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = previous

    return restore
