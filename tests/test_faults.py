"""Faults: a rank fails fast and the launcher ends the job. Under torchrun a killed or stopped rank ends every
process; bad input stops every rank with one line; a result is written only by a run that finished, except the
"oom" result of a one-rank run. The faults are real: SIGKILL, SIGSTOP, memory that runs out."""
import contextlib
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import (LIGHTNING, NATIVE, ROOT, SMALL, clean_env, finish, free_port, launch_by_hand, read_result,
                      run_script)

LONG = [*SMALL, "--steps", "400"]
GRACE_S = 30  # torchrun's agent: SIGTERM to the other workers when one fails, SIGKILL this much later
PREVIOUS = b'{"status": "ok", "an earlier run": true}\n'


def torchrun_native(args):
    """The native script on two torchrun workers, once rank 0 measures: (torchrun's process, local rank 1's pid)."""
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(NATIVE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(), cwd=ROOT)
    seen = []
    while (line := proc.stdout.readline()) and "measuring step 1/" not in line:
        seen.append(line)
    assert line, "".join(seen) + proc.stderr.read()
    for child in pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
        if b"LOCAL_RANK=1" in pathlib.Path(f"/proc/{child}/environ").read_bytes().split(b"\0"):
            return proc, int(child)
    proc.kill()
    pytest.fail("no worker of local rank 1 under torchrun")


def test_a_killed_rank_ends_the_torchrun_job_which_names_it_and_nothing_is_written(tmp_path):
    """SIGKILL to rank 1 mid-run: the job ends non-zero within 45 s, torchrun's summary names rank 1, and the run,
    which did not finish, leaves the previous result byte for byte although --overwrite was given."""
    previous = tmp_path / "result.json"
    previous.write_bytes(PREVIOUS)
    proc, rank1 = torchrun_native([*LONG, "--output", str(previous), "--overwrite"])
    os.kill(rank1, signal.SIGKILL)
    killed = time.monotonic()
    ((code, _, err),) = finish([proc], limit_s=60)
    assert code != 0 and time.monotonic() - killed < 45, err[-3000:]
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9", err), err[-3000:]
    assert previous.read_bytes() == PREVIOUS
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.json"]  # no temporary file either


def test_a_stopped_rank_ends_the_torchrun_job_within_the_timeout_and_the_grace(tmp_path):
    """SIGSTOP to rank 1: rank 0's collective gives up at --timeout and torchrun's summary names it as the failure;
    torchrun's agent then ends the stopped rank (SIGKILL after its grace). Rank 0 failed: the previous result stays
    byte for byte."""
    previous = tmp_path / "result.json"
    previous.write_bytes(PREVIOUS)
    proc, rank1 = torchrun_native([*LONG, "--timeout", "5", "--output", str(previous), "--overwrite"])
    os.kill(rank1, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        ((code, _, err),) = finish([proc], limit_s=5 + GRACE_S + 60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank1, signal.SIGKILL)
    elapsed = time.monotonic() - stopped
    assert code != 0 and elapsed < 5 + GRACE_S + 10, (elapsed, err[-3000:])
    assert re.search(r"rank\s*: 0 \(local_rank: 0\)\s+exitcode\s*: 1\b", err), err[-3000:]
    assert previous.read_bytes() == PREVIOUS
    assert sorted(path.name for path in tmp_path.iterdir()) == ["result.json"]


def test_bad_input_on_two_ranks_is_one_line_from_each_and_leaves_the_previous_output(tmp_path):
    """Each rank checks the same rules before anything starts: an existing --output is refused by both at once,
    not after a wait for the other, and the file stays byte for byte."""
    previous = tmp_path / "taken.json"
    previous.write_bytes(PREVIOUS)
    started = time.monotonic()
    # a rank that waited for the other would wait its whole --timeout (60 s here, which leaves room for two torch
    # imports on a loaded two-core machine)
    outputs = finish(launch_by_hand(NATIVE, [*SMALL, "--output", str(previous)], timeout=60))
    assert time.monotonic() - started < 60, "no rank may wait for the other"
    for code, _, err in outputs:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and "exists: pass --overwrite" in lines[0], err
    assert previous.read_bytes() == PREVIOUS
    assert sorted(path.name for path in tmp_path.iterdir()) == ["taken.json"]


@pytest.mark.parametrize("script", [NATIVE, LIGHTNING], ids=["native", "lightning"])
def test_a_one_rank_run_out_of_memory_writes_its_oom_result_with_exit_code_4(tmp_path, script):
    """Images far too large for the machine's memory: a real out-of-memory on the CPU. Batch sweeps look for the
    largest batch that fits in these results."""
    output = tmp_path / "oom.json"
    proc = run_script(script, [*SMALL, "--image-size", "100000", "--output", str(output)])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = read_result(output)
    failure = result["failure"]
    assert result["status"] == "oom" and (failure["kind"], failure["rank"]) == ("oom", 0)
    assert "allocate" in failure["message"] and failure["batch_size_per_device"] == 4
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "oom: " in lines[0] and "Traceback" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------- the meeting: bounded by --timeout
MEET_S = 4  # --timeout of the meeting tests
STARTUP_S = 40  # two torch imports on a loaded two-core machine


def silent_listener():
    """A port that accepts connections and never answers, as a stale process holding the master's port does."""
    server, held = socket.create_server(("127.0.0.1", 0)), []

    def accept():
        with contextlib.suppress(OSError):  # closed
            while True:
                held.append(server.accept()[0])
    threading.Thread(target=accept, daemon=True).start()
    return server


def env_rank(rank, world, port, output, timeout=MEET_S):
    env = clean_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([sys.executable, str(NATIVE), *SMALL, "--timeout", str(timeout), "--output", str(output)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


@pytest.mark.parametrize("master", ["silent", "absent"])
def test_a_rank_whose_master_never_answers_ends_within_the_timeout_in_one_line(tmp_path, master):
    """Rank 1 alone, env-launched: a port that accepts and never answers (torch waits for ever), or nothing there
    (torch gives up at --timeout with a C++ stack, then tries again)."""
    with contextlib.closing(silent_listener()) if master == "silent" else contextlib.nullcontext() as server:
        port = server.getsockname()[1] if server else free_port()
        started = time.monotonic()
        ((code, _, err),) = finish([env_rank(1, 2, port, tmp_path / "r.json")], limit_s=MEET_S + STARTUP_S)
    lines = [line for line in err.splitlines() if line.strip()]
    assert time.monotonic() - started < MEET_S + STARTUP_S, err[-2000:]
    assert code == 1 and len(lines) == 1 and "error on rank 1" in lines[0], (code, err[-3000:])
    assert not list(tmp_path.iterdir())


def test_ranks_that_disagree_on_the_world_size_end_within_the_timeout(tmp_path):
    """WORLD_SIZE 2 and 3: each rank ends within --timeout after its start-up (they took five times as long). A rank
    whose master ended first ends at once, with torch's own report before its one line."""
    port, timeout = free_port(), 15
    started = time.monotonic()
    ranks = [env_rank(0, 2, port, tmp_path / "r.json", timeout), env_rank(1, 3, port, tmp_path / "r.json", timeout)]
    outputs = finish(ranks, limit_s=120)
    assert time.monotonic() - started < timeout + STARTUP_S, [err[-2000:] for _, _, err in outputs]
    for code, _, err in outputs:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 1 and "Traceback" not in err and "error on rank" in lines[-1], (code, err[-3000:])
    assert not list(tmp_path.iterdir())


def test_the_twins_child_ends_within_the_timeout_when_its_master_died(tmp_path):
    """Lightning's launcher (rank 0) killed once it started its child: the orphan, which Lightning's observer died
    with, reaches no master and ends by itself within --timeout, in one line."""
    log = tmp_path / "log"
    with open(log, "w") as stream:
        rank0 = subprocess.Popen([sys.executable, str(LIGHTNING), *SMALL, "--devices", "2", "--timeout", str(MEET_S),
                                  "--output", str(tmp_path / "r.json")], env=clean_env(), stdout=stream,
                                 stderr=subprocess.STDOUT, cwd=ROOT)
    child, started = None, time.monotonic()
    while child is None and rank0.poll() is None and time.monotonic() - started < 120:
        for pid in pathlib.Path(f"/proc/{rank0.pid}/task/{rank0.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                if b"LOCAL_RANK=1" in pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    child = int(pid)
        time.sleep(0.01)
    rank0.kill()
    rank0.wait()
    assert child, log.read_text()[-2000:]
    killed = time.monotonic()
    while time.monotonic() - killed < MEET_S + STARTUP_S and b"State:\tZ" not in (
            pathlib.Path(f"/proc/{child}/status").read_bytes() if os.path.exists(f"/proc/{child}") else b"State:\tZ"):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert time.monotonic() - killed < MEET_S + STARTUP_S, lines[-20:]
    assert len(lines) == 1 and "error on rank 1" in lines[0], lines[-20:]


# ---------------------------------------------------------------------------- the twin's own launcher and signals
@pytest.mark.parametrize("signalled", ["sigterm-rank0", "sigterm-child", "ctrl-c"])
def test_the_twin_under_its_own_launcher_answers_a_signal_as_the_readme_says(tmp_path, signalled):
    """Stock Lightning, measured: SIGTERM to rank 0 reaches its child too, both stop after the step: 143, no line
    from rank 0 (the child's collective may fail first, with its traceback); or the child ends first and rank 0's
    collective fails: 1. SIGTERM to the child stops it after its step (143), or its handler's broadcast aborts it in
    gloo; rank 0's next collective then fails (gloo: at once or after --timeout; NCCL: after --timeout): 1, with each
    rank's traceback. Ctrl-C (SIGINT to the launcher's process group): Lightning kills its child, then the twin says
    so in one line: 130. Nothing is written."""
    output = tmp_path / "r.json"
    # SIGINT's default action restored: a shell's background job (a CI runner's, say) starts with it ignored
    rank0 = subprocess.Popen([sys.executable, str(LIGHTNING), *LONG, "--devices", "2", "--timeout", "20", "--output",
                              str(output)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(),
                             cwd=ROOT, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while (line := rank0.stdout.readline()) and "measuring step 1/" not in line:
        pass
    child = next(int(pid) for pid in pathlib.Path(f"/proc/{rank0.pid}/task/{rank0.pid}/children").read_text().split()
                 if b"LOCAL_RANK=1" in pathlib.Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    if signalled == "ctrl-c":  # a terminal's Ctrl-C: SIGINT to the launcher's process group
        os.killpg(rank0.pid, signal.SIGINT)
    else:
        os.kill(rank0.pid if signalled == "sigterm-rank0" else child, signal.SIGTERM)
    signalled_at = time.monotonic()
    try:
        # Lightning's teardown after the signal may itself wait out a collective's --timeout (20 s) first
        ((code, _, err),) = finish([rank0], limit_s=2 * 20 + GRACE_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(rank0.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip()]
    # SIGTERM to rank 0: Lightning forwards it, and the child may end first, failing rank 0's collective (1)
    assert code in {"sigterm-rank0": (143, 1), "sigterm-child": (1,), "ctrl-c": (130,)}[signalled], err[-3000:]
    assert time.monotonic() - signalled_at < 2 * 20 + GRACE_S, err[-3000:]
    if signalled == "ctrl-c":  # rank 0's one line (and the child's, where it ended first)
        assert "Traceback" not in err and 1 <= len(lines) <= 2, err[-3000:]
    assert not output.exists()
