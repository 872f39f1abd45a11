"""Two nodes without a cluster: two torchrun "node" processes on loopback, one rank each, the native script on CPU.

Each torchrun is what a user starts on each node of a multi-node job (`--nnodes 2 --node-rank N` with the
first node's address); here both nodes are this host, so the ranks meet over 127.0.0.1 and gloo.
"""
import subprocess
import sys

import pytest

from conftest import NATIVE, ROOT, SMALL, clean_env, finish, free_port, read_result


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("multinode") / "result.json"
    port = free_port()
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                               "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
                               str(NATIVE), *SMALL, "--output", str(output)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=clean_env())
             for node in (0, 1)]
    outcomes = finish(nodes, limit_s=300)
    for node, (code, out, err) in enumerate(outcomes):
        assert code == 0, f"node {node} exited {code}\n{out}\n{err}"
    return outcomes, read_result(output)


def test_two_torchrun_nodes_make_one_world(two_node_run):
    outcomes, result = two_node_run
    world = result["world"]
    assert (world["num_nodes"], world["world_size"], world["devices_per_node"]) == (2, 2, 1)
    assert world["launcher"] == "torchrun" and world["backend"] == "gloo" and world["slurm_job_id"] is None
    assert result["status"] == "ok"
    assert [rank["rank"] for rank in result["hardware"]["ranks"]] == [0, 1]
    # Only node 0 holds rank 0, which prints the report; node 1's rank stays quiet.
    assert "| ddp | 2 | 4 |" in outcomes[0][1] and "| ddp |" not in outcomes[1][1]


def test_two_torchrun_nodes_keep_parameters_synchronised(two_node_run):
    _, result = two_node_run
    checks = result["checks"]
    assert checks["parameters_synchronized"] is True and checks["parameter_max_abs_diff"] == 0.0
    assert checks["steps_run_per_rank"] == [6, 6] and checks["loss_finite"]
    assert result["config"]["global_batch_size"] == 8  # 4 per rank over both nodes
