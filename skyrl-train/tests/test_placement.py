"""Roles placed on a two-node Ray cluster (``ray.cluster_utils.Cluster``): disaggregated, colocated, too big.

Also worker groups of different sizes (``trainer.ref_num_workers``, ``trainer.critic_num_workers``): counted
per group by the cluster check, and placed either way.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e ./skyrl-train")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from skyrl_train.backends.config import BackendConfig  # noqa: E402
from skyrl_train.backends.ray_group import FSDPBackend, WorkerGroupConfig  # noqa: E402
from skyrl_train.config import TrainerConfig  # noqa: E402
from skyrl_train.inference.ray_engines import EngineGroup  # noqa: E402
from skyrl_train.ray_cluster import Placement, PlacementMode, RoleSpec, ensure_ray  # noqa: E402
from skyrl_train.run import training_actors  # noqa: E402

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


# -- worker groups of different sizes -----------------------------------------------------------------------------

UNEVEN = TrainerConfig(backend="fsdp", num_training_workers=2, ref_num_workers=1, critic_num_workers=2)


def test_each_worker_group_is_counted_with_its_own_ranks() -> None:
    trainer = TrainerConfig(backend="fsdp", num_training_workers=2, ref_num_workers=1, critic_num_workers=3)
    roles, demand = training_actors(trainer, ["policy", "ref", "critic"])
    assert [(role.name, role.count) for role in roles] == [("policy", 2), ("ref", 1), ("critic", 3)]
    assert (demand.count, demand.what) == (6, "6 training workers (policy 2, ref 1, critic 3)")
    same = TrainerConfig(backend="fsdp", num_training_workers=2)
    assert [role.count for role in training_actors(same, ["policy", "ref", "critic"])[0]] == [2, 2, 2]


def test_the_cluster_check_counts_each_groups_ranks(two_nodes: Any) -> None:
    # 4 CPUs: policy 2 + ref 1 + critic 2 ranks of 1 CPU do not fit; with a critic of 1 rank they do.
    _, demand = training_actors(UNEVEN, ["policy", "ref", "critic"])
    with pytest.raises(RuntimeError, match=r"ask Ray for 5 CPUs \(5 training workers \(policy 2, ref 1, critic 2\)"):
        ensure_ray([demand])
    _, fits = training_actors(dataclasses.replace(UNEVEN, critic_num_workers=1), ["policy", "ref", "critic"])
    assert ensure_ray([fits]) is False  # joined the running cluster, which holds the 4 ranks


def _bundles(placement: Placement, role: str) -> list[float]:
    """CPUs of each bundle of ``role``'s placement group, in bundle order."""
    bundles = ray.util.placement_group_table(placement.groups[role])["bundles"]
    return [bundles[index]["CPU"] for index in sorted(bundles)]


@pytest.mark.parametrize("mode", ["disaggregate", "colocate"])
def test_groups_of_different_sizes_are_placed(two_nodes: Any, tiny_model_dir: Path, mode: PlacementMode) -> None:
    """A policy group of 2 ranks and a reference group of 1, as trainer.ref_num_workers=1 asks."""
    roles, _ = training_actors(UNEVEN, ["policy", "ref"])
    placement = Placement(roles, mode)
    config = BackendConfig(str(tiny_model_dir), gradient_checkpointing=False)
    groups = []
    try:
        for role in roles:
            options = [placement.options(role.name, index) for index in range(role.count)]
            sizes = WorkerGroupConfig(num_workers=role.count, num_cpus_per_worker=role.cpus)
            groups.append(FSDPBackend(config, sizes, actor_options=options))
        policy_nodes, ref_nodes = (ray.get([w.node_id.remote() for w in group.workers]) for group in groups)
        if mode == "colocate":
            assert _bundles(placement, "policy") == [2.0, 1.0]  # bundle 1 holds no reference rank
            assert ref_nodes == policy_nodes[:1]  # the reference's one rank beside policy rank 0
            assert len(set(policy_nodes)) == 2  # bundle 0 (2 CPUs) fills a node
        else:
            assert (_bundles(placement, "policy"), _bundles(placement, "ref")) == ([1.0, 1.0], [1.0])
            assert len(set(policy_nodes)) == 1
            assert not set(ref_nodes) & set(policy_nodes)  # the policy's bundles fill one node
        assert [group.num_workers for group in groups] == [2, 1]
    finally:
        for group in groups:
            group.close()
        placement.remove()
