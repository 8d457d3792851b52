"""Roles placed on a two-node Ray cluster (``ray.cluster_utils.Cluster``): disaggregated, colocated, too big."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from skyrl_train.backends.config import BackendConfig  # noqa: E402
from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig  # noqa: E402
from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402
from skyrl_train.ray_cluster import Placement, RoleSpec  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Any]:
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _roles_on_nodes(model_dir: Path, mode: str) -> tuple[list[str], list[str]]:
    """Node ids of two training ranks and two engines, placed as ``mode`` says."""
    placement = Placement([RoleSpec("policy", 2, 1.0), RoleSpec("engines", 2, 1.0)], mode)  # type: ignore[arg-type]
    config = BackendConfig(str(model_dir), gradient_checkpointing=False)
    policy = FSDPBackend(
        config,
        WorkerGroupConfig(num_workers=2, num_cpus_per_worker=1.0),
        actor_options=[placement.options("policy", i) for i in range(2)],
    )
    engines = EngineGroup(
        "local",
        str(model_dir),
        2,
        num_cpus_per_engine=1.0,
        actor_options=[placement.options("engines", i) for i in range(2)],
    )
    try:
        policy_nodes = ray.get([worker.node_id.remote() for worker in policy.workers])
        engine_nodes = ray.get([engine.node_id.remote() for engine in engines.engines])
        return policy_nodes, engine_nodes
    finally:
        policy.close()
        asyncio.run(engines.close())
        placement.remove()


def test_disaggregated_roles_get_nodes_of_their_own(two_nodes: Any, tiny_model_dir: Path) -> None:
    policy_nodes, engine_nodes = _roles_on_nodes(tiny_model_dir, "disaggregate")
    assert len(set(policy_nodes)) == 1  # each role packed onto one node
    assert len(set(engine_nodes)) == 1
    assert set(policy_nodes) != set(engine_nodes)


def test_colocated_roles_share_each_bundle(two_nodes: Any, tiny_model_dir: Path) -> None:
    policy_nodes, engine_nodes = _roles_on_nodes(tiny_model_dir, "colocate")
    assert policy_nodes == engine_nodes  # rank i and engine i in bundle i, on one node
    assert len(set(policy_nodes)) == 2  # a bundle of 2 CPUs fills a node: the two bundles use both nodes


def test_bundles_no_node_can_hold_fail_with_what_was_asked(two_nodes: Any) -> None:
    with pytest.raises(RuntimeError, match=r"could not place .*policy: 2 × \(1.5 CPU.*engines: 2 × \(1 CPU"):
        Placement([RoleSpec("policy", 2, 1.5), RoleSpec("engines", 2, 1.0)], "colocate", timeout_s=3)
    assert ray.util.placement_group_table() == {} or all(
        group["state"] == "REMOVED" for group in ray.util.placement_group_table().values()
    )
