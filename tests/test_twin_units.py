"""The Lightning twin's own code, in this process and without a Lightning run: its launch plan under Lightning's
launcher, the variant its result records, the exit code when trainer.fit returns early, and the process group its
strategy makes."""
import datetime
import itertools
import os

import pytest
import torch

from conftest import LIGHTNING, SMALL, load_script, pretend_gpus


@pytest.fixture(scope="module")
def twin():
    return load_script(LIGHTNING, "lightning_twin_units")


@pytest.fixture
def fresh_env(monkeypatch):
    """No launcher variables; whatever the run sets in os.environ (MASTER_PORT, MASTER_ADDR) is undone after, and
    the run leaves this process's thread count alone."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_JOB_ID",
                 "SLURM_JOB_NAME"):
        monkeypatch.setenv(name, "")  # set, then removed: monkeypatch restores the variable's absence
        monkeypatch.delenv(name)
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # a CPU rank's share: not this process's


def test_global_ranks_under_lightnings_launcher_on_two_nodes(twin):
    """Lightning's launcher gives each process NODE_RANK and LOCAL_RANK: 2 nodes of 2 devices are ranks 0 to 3,
    node rank times devices plus local rank, each once."""
    args = twin.parse_arguments(["--devices", "2", "--num-nodes", "2"])
    ranks = {}
    for node, local in itertools.product(range(2), range(2)):
        env = {"NODE_RANK": str(node), "LOCAL_RANK": str(local), "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
        launch = twin.plan_launch(args, env)
        assert (launch["launcher"], launch["world_size"], launch["num_nodes"]) == ("lightning", 4, 2)
        assert (launch["local_rank"], launch["local_world_size"]) == (local, 2)
        ranks[node, local] = launch["rank"]
    assert ranks == {(0, 0): 0, (0, 1): 1, (1, 0): 2, (1, 1): 3}


@pytest.mark.parametrize("matched,cuda_graphs", list(itertools.product([False, True], repeat=2)))
def test_the_variant_records_the_side_stream_that_runs(twin, matched, cuda_graphs):
    """Several GPU processes: DDP is built on Lightning's side stream unless --lightning-matched, and --cuda-graphs
    keeps it even then (a captured all-reduce needs it); one process or the CPU has none."""
    record = twin.lightning_variant(matched, True, True, cuda_graphs)
    assert record["lightning_ddp_side_stream"] is (not matched or cuda_graphs)
    assert record["lightning_variant"] == ("matched" if matched else "stock")
    assert record["lightning_manual_optimization"] is cuda_graphs
    assert not twin.lightning_variant(matched, False, True, cuda_graphs)["lightning_ddp_side_stream"]
    assert not twin.lightning_variant(matched, True, False, cuda_graphs)["lightning_ddp_side_stream"]


@pytest.mark.parametrize("matched", [[], ["--lightning-matched"]], ids=["stock", "matched"])
def test_a_cuda_graphs_run_records_the_side_stream(twin, monkeypatch, tmp_path, fresh_env, matched):
    """What main() gives the run to record, on 2 made-up GPUs: --cuda-graphs keeps the side stream, matched or not."""
    pretend_gpus(monkeypatch, count=2)

    class Recorded(Exception):
        pass

    def run(config, *args, **kwargs):
        raise Recorded(config)

    monkeypatch.setattr(twin, "Run", run)
    with pytest.raises(Recorded) as recorded:
        twin.main(["--devices", "2", "--cuda-graphs", "--warmup-steps", "12", *matched, "--output",
                   str(tmp_path / "result.json")])
    config = recorded.value.args[0]
    assert (config["lightning_variant"], config["lightning_ddp_side_stream"], config["lightning_manual_optimization"]
            ) == ("matched" if matched else "stock", True, True)


def main_with_fit_returning_at_once(twin, monkeypatch, argv, output):
    """The twin's main on the CPU, trainer.fit returning without running a step (as when Lightning swallows an
    interrupt): (exit code, the Trainer that main built)."""
    built = []
    monkeypatch.setattr(twin.L.Trainer, "fit", lambda trainer, module, *args, **kwargs: built.append(trainer))
    code = twin.main([*SMALL, *argv, "--output", str(output)])
    assert len(built) == 1
    return code, built[0]


@pytest.mark.filterwarnings("ignore:.*(srun|LeafSpec|barebones|many workers)")
@pytest.mark.parametrize("devices", ["1", "2"])
def test_a_fit_that_returns_before_the_end_of_training_is_not_a_success(twin, monkeypatch, tmp_path, fresh_env,
                                                                         devices):
    output = tmp_path / "result.json"
    code, _ = main_with_fit_returning_at_once(twin, monkeypatch, ["--devices", devices], output)
    assert code != 0 and not output.exists()


@pytest.mark.filterwarnings("ignore:.*(srun|LeafSpec|barebones|many workers)")
@pytest.mark.parametrize("variant", [[], ["--lightning-matched"]], ids=["stock", "matched"])
def test_the_strategys_process_group_waits_for_timeout(twin, monkeypatch, tmp_path, fresh_env, variant):
    """--timeout 7 reaches the process group that Lightning's strategy makes (by default it waits 30 minutes)."""
    _, trainer = main_with_fit_returning_at_once(twin, monkeypatch, ["--devices", "2", "--timeout", "7", *variant],
                                                 tmp_path / "result.json")
    assert isinstance(trainer.strategy, twin.CurrentStreamDDPStrategy if variant else twin.DDPStrategy)
    calls = []

    class Stop(Exception):
        pass

    def init_process_group(*args, **kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    monkeypatch.setenv("MASTER_ADDR", os.environ.get("MASTER_ADDR", "127.0.0.1"))  # Lightning sets both: undone
    monkeypatch.setenv("MASTER_PORT", os.environ.get("MASTER_PORT", "29500"))
    with pytest.raises(Stop):
        trainer.strategy.setup_distributed()
    assert [call["timeout"] for call in calls] == [datetime.timedelta(seconds=7)]
