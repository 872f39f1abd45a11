"""Runs that die in ordinary ways end promptly, with one line and a result saying what happened."""
import signal
import time

import pytest

from conftest import LIGHTNING, NATIVE, OSS, SMALL, finish, launch_by_hand, read_result


def wait_for_line(proc, text, limit_s=180):
    deadline = time.monotonic() + limit_s
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"never printed {text!r}: {''.join(seen)}")


LONG = [*SMALL, "--steps", "200"]


def script_args(script):
    """The sharding benchmark runs one strategy here (its --strategy all writes one file per strategy)."""
    return ["--strategy", "zero1"] if script == OSS else []


@pytest.mark.parametrize("script,signum", [(NATIVE, signal.SIGTERM), (NATIVE, signal.SIGINT),
                                           (LIGHTNING, signal.SIGTERM), (OSS, signal.SIGTERM)],
                         ids=["native-TERM", "native-INT", "lightning-TERM", "oss-TERM"])
def test_signal_stops_after_the_current_step_with_the_steps_so_far(tmp_path, script, signum):
    output = tmp_path / "interrupted.json"
    procs = launch_by_hand(script, [*LONG, *script_args(script), "--output", str(output)])
    wait_for_line(procs[0], "measuring step 1/200")
    if signum == signal.SIGTERM:  # Slurm signals every task; Ctrl-C may reach only one rank
        for proc in procs:
            proc.send_signal(signum)
    else:
        procs[0].send_signal(signum)
    started = time.monotonic()
    outputs = finish(procs)
    assert time.monotonic() - started < 60
    assert [code for code, _, _ in outputs] == [128 + signum] * 2, outputs
    result = read_result(output)
    assert result["status"] == "interrupted" and result["failure"]["signal"] == signum.name
    timed = result["throughput"]["timed_steps"]
    assert 1 <= timed < 200
    assert [len(times) for times in result["step_times_ms_per_rank"]] == [timed, timed]
    assert result["checks"]["parameters_synchronized"] is True
    assert "Traceback" not in outputs[0][2] + outputs[1][2]


@pytest.mark.parametrize("script", [NATIVE, LIGHTNING, OSS], ids=["native", "lightning", "oss"])
def test_a_killed_rank_ends_the_run_with_an_error_result(tmp_path, script):
    output = tmp_path / "dead.json"
    procs = launch_by_hand(script, [*LONG, *script_args(script), "--output", str(output)], timeout=30)
    wait_for_line(procs[0], "measuring step 1/200")
    procs[1].kill()
    started = time.monotonic()
    (code, out, err), _ = finish(procs)
    assert time.monotonic() - started < 30, "the survivor must not wait for the collective timeout"
    assert code == 1
    result = read_result(output)
    assert result["status"] == "error" and result["failure"]["message"]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    assert all(proc.poll() is not None for proc in procs)


@pytest.mark.parametrize("script,fault_rank", [(NATIVE, 0), (NATIVE, 1), (LIGHTNING, 1), (OSS, 1)],
                         ids=["native-rank0", "native-rank1", "lightning-rank1", "oss-rank1"])
def test_out_of_memory_gives_status_oom_with_memory_figures(tmp_path, script, fault_rank):
    output = tmp_path / "oom.json"
    procs = launch_by_hand(script, [*SMALL, *script_args(script), "--inject-fault", "oom",
                                    "--inject-fault-rank", str(fault_rank), "--inject-fault-step", "3",
                                    "--output", str(output)], timeout=30)
    outputs = finish(procs)
    assert outputs[fault_rank][0] == 4, outputs  # the rank that ran out of memory exits with 4
    assert all(code != 0 for code, _, _ in outputs)
    result = read_result(output)
    assert result["status"] == "oom"
    failure = result["failure"]
    assert failure["kind"] == "oom" and failure["rank"] == fault_rank and "out of memory" in failure["message"]
    assert failure["batch_size_per_device"] == 4
    stderr = outputs[0][2] + outputs[1][2]
    assert "Traceback" not in stderr
    assert len([line for line in outputs[0][2].splitlines() if line.strip()]) == 1  # one line from rank 0


def test_a_crashing_rank_is_named_by_rank_zero(tmp_path):
    output = tmp_path / "crash.json"
    procs = launch_by_hand(NATIVE, [*SMALL, "--inject-fault", "crash", "--inject-fault-rank", "1",
                                    "--inject-fault-step", "3", "--output", str(output)], timeout=30)
    (code, _, err), (code1, _, _) = finish(procs)
    assert code == 1 and code1 == 1
    assert read_result(output)["status"] == "error"
    assert "Traceback" not in err
