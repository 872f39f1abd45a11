"""Runs that die in ordinary ways end promptly, with one line and a result saying what happened. The faults are
real: a signal, a killed or stopped process, memory that runs out, a host that does not exist, a port taken."""
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import (LIGHTNING, NATIVE, OSS, ROOT, SMALL, clean_env, finish, free_port, launch_by_hand, launch_env,
                      read_result)


def wait_for_line(proc, text, limit_s=180):
    deadline, seen = time.monotonic() + limit_s, []
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


# SIGINT: tests/test_lightning.py's Ctrl-C; SIGUSR1: tests/test_multinode.py's, sent by Slurm to a two-node job.
@pytest.mark.parametrize("script,signum", [(NATIVE, signal.SIGTERM), (LIGHTNING, signal.SIGHUP), (OSS, signal.SIGTERM)],
                         ids=["native-TERM", "lightning-HUP", "oss-TERM"])
def test_signal_stops_after_the_current_step_with_the_steps_so_far(tmp_path, script, signum):
    output = tmp_path / "interrupted.json"
    procs = launch_by_hand(script, [*LONG, *script_args(script), "--output", str(output)])
    wait_for_line(procs[0], "measuring step 1/200")
    for proc in procs:  # as Slurm and a closed terminal do: every task
        proc.send_signal(signum)
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


@pytest.mark.parametrize("script", [NATIVE, LIGHTNING], ids=["native", "lightning"])
def test_a_signal_while_the_ranks_meet_ends_the_run_at_once(tmp_path, script):
    """Rank 0 waits for a rank that never comes: the rendezvous waits in C++, yet SIGTERM ends it at once with an
    interrupted result, not after --timeout with an error."""
    output, port = tmp_path / "early.json", free_port()
    extra = ["--devices", "2"] if script == LIGHTNING else []
    proc = subprocess.Popen([sys.executable, str(script), *SMALL, *extra, "--output", str(output)],  # rank 0 alone
                            env=launch_env(script, 0, 2, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # rank 0 listens for the others: it is waiting in the rendezvous
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.5)
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    ((code, _, err),) = finish([proc], limit_s=30)
    assert time.monotonic() - started < 10 and code == 128 + signal.SIGTERM, err
    result = read_result(output)
    assert result["status"] == "interrupted" and "before the ranks met" in result["failure"]["message"]
    assert len([line for line in err.splitlines() if line.strip()]) == 1 and "Traceback" not in err


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


def test_a_stopped_rank_is_noticed_within_the_timeout(tmp_path):
    """A hung rank (SIGSTOP): the survivor gives up at --timeout, its wait for a peer's reason included."""
    output = tmp_path / "hung.json"
    procs = launch_by_hand(NATIVE, [*LONG, "--output", str(output)], timeout=8)
    wait_for_line(procs[0], "measuring step 1/200")
    procs[1].send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        (code, _, err), = finish(procs[:1], limit_s=60)
    finally:
        procs[1].kill()
        procs[1].wait()
    assert time.monotonic() - started < 16 and code == 1, err  # --timeout 8, a loaded machine's exit
    assert read_result(output)["status"] == "error"


@pytest.mark.parametrize("script,fault_rank", [(NATIVE, 0), (LIGHTNING, 1), (OSS, 1)],
                         ids=["native-rank0", "lightning-rank1", "oss-rank1"])
def test_out_of_memory_gives_status_oom_named_by_rank_zero(tmp_path, script, fault_rank):
    """One rank's images are far too large for the machine's memory: a real out-of-memory on the CPU, which rank 0
    names (the failing rank records its reason where the others find it)."""
    output = tmp_path / "oom.json"
    procs = launch_by_hand(script, [*SMALL, *script_args(script), "--output", str(output)], timeout=30,
                           rank_args={fault_rank: ["--image-size", "100000"]})
    outputs = finish(procs)
    assert outputs[fault_rank][0] == 4, outputs  # the rank that ran out of memory exits with 4
    assert all(code != 0 for code, _, _ in outputs)
    result = read_result(output)
    failure = result["failure"]
    assert result["status"] == "oom" and failure["kind"] == "oom" and failure["rank"] == fault_rank
    assert "allocate" in failure["message"] and failure["batch_size_per_device"] == 4
    assert "Traceback" not in outputs[0][2] + outputs[1][2]
    assert len([line for line in outputs[0][2].splitlines() if line.strip()]) == 1  # one line from rank 0


def test_a_host_that_does_not_exist_is_one_line_within_the_timeout(tmp_path):
    env = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_STEP_NUM_NODES": "1",
           "SLURM_NODEID": "0", "SLURM_JOB_ID": "4243", "SLURM_STEP_NODELIST": "nosuchhost[1-2]"}
    procs = [subprocess.Popen([sys.executable, str(NATIVE), *SMALL, "--timeout", "20", "--output",
                               str(tmp_path / "r.json")], env=clean_env(**env, SLURM_PROCID=str(r),
                                                                        SLURM_LOCALID=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT) for r in (0, 1)]
    started = time.monotonic()
    outputs = finish(procs)
    assert time.monotonic() - started < 30  # within --timeout 20, with the start-ups of a loaded machine
    for code, _, err in outputs:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "'nosuchhost1' cannot be resolved" in lines[0], err
    assert not (tmp_path / "r.json").exists()


def test_a_late_rank_does_not_trip_over_rank_zeros_error_result(tmp_path):
    """The master port is taken: rank 0 fails to listen and writes an error result; rank 1, started later, must
    not refuse to run because that file exists (only the rank that writes looks at --output)."""
    output = tmp_path / "port.json"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        rank0 = subprocess.run([sys.executable, str(NATIVE), *SMALL, "--timeout", "10", "--output", str(output)],
                               env=clean_env(**env, RANK="0", LOCAL_RANK="0"), capture_output=True, text=True,
                               cwd=ROOT, timeout=120)
        assert rank0.returncode == 1 and read_result(output)["status"] == "error", rank0.stderr
        rank1 = subprocess.Popen([sys.executable, str(NATIVE), *SMALL, "--timeout", "10", "--output", str(output)],
                                 env=clean_env(**env, RANK="1", LOCAL_RANK="1"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=ROOT)
        taken.settimeout(60)
        try:  # it went past the output check to meet the others: it connects to the master's port
            connection, _ = taken.accept()
            connection.close()
        finally:
            rank1.kill()
            _, err = rank1.communicate()
        assert rank1.returncode != 2, err


def test_a_refused_output_ends_every_rank_at_once_in_one_line(tmp_path):
    """Only rank 0 looks at --output: when it refuses it, the other ranks learn so from rank 0 when they meet, and
    the whole launch ends with exit code 2 and one line, instead of ranks waiting for a master that has gone."""
    taken = tmp_path / "taken.json"
    taken.write_text("old")
    procs = launch_by_hand(NATIVE, [*SMALL, "--output", str(taken)], timeout=60)
    started = time.monotonic()
    outputs = finish(procs)
    assert time.monotonic() - started < 40, "no rank may wait out --timeout"
    assert [code for code, _, _ in outputs] == [2, 2], outputs
    lines = [line for _, _, err in outputs for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "exists: pass --overwrite" in lines[0], lines
    assert taken.read_text() == "old"


def test_a_rank_whose_master_never_answers_ends_within_the_timeout_in_one_line():
    """A lone rank 1: nothing at the master's port, or a listener there that never answers (it hung for good)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        ports = [free_port(), silent.getsockname()[1]]
        env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "RANK": "1", "LOCAL_RANK": "1"}
        procs = [subprocess.Popen([sys.executable, str(NATIVE), *SMALL, "--timeout", "6"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env=clean_env(**env, MASTER_PORT=str(port))) for port in ports]
        outputs = finish(procs, limit_s=120)
    for code, _, err in outputs:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1 and "did not meet within --timeout 6 s" in lines[0], err
