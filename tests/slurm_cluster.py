"""A real, private, single-host Slurm cluster for the tests: munged, slurmctld and slurmd on this machine.

Everything lives in one directory (configuration, munge key and socket, state, spool, logs, PID files) and
the daemons listen on free ports, so the cluster neither needs nor touches /etc/slurm, /etc/munge or a Slurm
that may already run here. Seen working on Debian 12 (Slurm 22.05.8, munge 0.5.15) as root with
proctrack/linuxproc and task/none (no cgroups needed), select/cons_tres, one node, no accounting.

By hand (the same code the tests use), until Ctrl-C:

    python tests/slurm_cluster.py /tmp/slurm                 # Ctrl-C or `kill <its pid>` stops it
    SLURM_CONF=/tmp/slurm/slurm.conf sbatch --wait ...      # in another shell
"""
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "scontrol", "scancel")


def missing_reason():
    """Why this host cannot run the cluster, or None when it can."""
    missing = [name for name in DAEMONS + CLIENTS if shutil.which(name, path=_search_path()) is None]
    if missing:
        return (f"Slurm not installed: {', '.join(missing)} not found "
                f"(.ci/run installs Debian's slurm-wlm and munge with apt-get when run as root)")
    if os.geteuid() != 0:
        return "Slurm tests need root: slurmd runs the job steps as the submitting user and must be root"
    return None


def _search_path():
    # The daemons are in /usr/sbin, which a non-login root shell does not always have on PATH.
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin"])


def _binary(name):
    return shutil.which(name, path=_search_path())


def _free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _node_line():
    """This host as slurmd sees it (`slurmd -C`), so the configured node matches the real one and is not drained."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=30).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    fields = dict(item.split("=", 1) for item in line.split())
    return fields["NodeName"], " ".join(f"{key}={value}" for key, value in fields.items() if key != "UpTime")


def _alive(pid):
    """True while the process exists and is not a zombie (a daemon's parent, init, may reap it late)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class SlurmCluster:
    def __init__(self, directory, fake_gpus=2):
        # GPUs that are names only (plain files stand in for the device files): Slurm allocates them for
        # --gpus-per-node as for --gres=gpu:N and sets its own GPU variables (SLURM_GPUS_ON_NODE, and
        # SLURM_GPUS_PER_NODE for the former), so the batch scripts' GPU checks meet Slurm's own values;
        # nothing behind them can run CUDA.
        self.fake_gpus = fake_gpus
        self.dir = pathlib.Path(directory).resolve()
        self.conf = self.dir / "slurm.conf"
        # munged wants its socket's directory searchable by everyone (all clients must reach it) and a unix
        # socket path is at most 107 bytes: pytest's temporary directories are 0700 and long, so the socket
        # gets a short directory of its own, named in the configuration so `down` finds it again.
        self.socket_dir_file = self.dir / "munge-socket-dir"
        self.children = {}

    def env(self, base=None):
        """An environment whose Slurm clients (sbatch, srun inside the job, sinfo) talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = _search_path() if base is None else os.pathsep.join([env.get("PATH", ""), "/usr/sbin"])
        return env

    @property
    def munge_socket(self):
        return pathlib.Path(self.socket_dir_file.read_text()) / "munge.socket"

    def pid_file(self, daemon):
        return self.dir / f"{daemon}.pid"

    def log_file(self, daemon):
        return self.dir / f"{daemon}.log"

    def write_config(self):
        # munged refuses keys and sockets in directories that others may write to: keep everything 0700.
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        for sub in ("state", "spool"):
            (self.dir / sub).mkdir(mode=0o700, exist_ok=True)
        key = self.dir / "munge.key"
        if not key.exists():
            with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as stream:
                stream.write(os.urandom(1024))  # munge's own mungekey writes 1024 random bytes too
        if not self.socket_dir_file.exists():
            socket_dir = tempfile.mkdtemp(prefix="munge-")
            os.chmod(socket_dir, 0o755)
            self.socket_dir_file.write_text(socket_dir)
        hostname, node = _node_line()
        gres = f" Gres=gpu:{self.fake_gpus}" if self.fake_gpus else ""
        self.hostname = hostname
        self.conf.write_text(f"""\
# Written by tests/slurm_cluster.py: a private one-node cluster for the CI tests.
ClusterName=benchci
SlurmctldHost={hostname}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged, not the system's /run/munge socket.
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.dir / 'state'}
SlurmdSpoolDir={self.dir / 'spool'}
SlurmctldPidFile={self.pid_file('slurmctld')}
SlurmdPidFile={self.pid_file('slurmd')}
SlurmctldLogFile={self.log_file('slurmctld')}
SlurmdLogFile={self.log_file('slurmd')}
PlugStackConfig={self.dir / 'plugstack.conf'}
# No cgroups in a container: track processes through /proc, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# Schedule a submitted batch job within about a second, not up to 3 s later (batch_sched_delay's default):
# the tests submit many short jobs one after the other.
SchedulerParameters=batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
# GPUs are a known resource type, so `--gpus-per-node=0` is understood; the node has fake_gpus of them.
GresTypes=gpu
ReturnToService=2
# `sbatch --wait` polls after 2 s, then 4x longer each time up to 32 s, but only while that stays below half
# of MinJobAge (so that it cannot miss a purged job): 5 keeps it polling every 2 s instead of finishing a
# 30 s job after 42 s. Finished jobs are purged 5-60 s after they end; the tests read result files instead.
MinJobAge=5
{node}{gres} State=UNKNOWN
PartitionName=debug Nodes={hostname} Default=YES MaxTime=INFINITE State=UP
""")
        (self.dir / "plugstack.conf").write_text("")
        # slurmd counts a GPU per device file it can stat; plain files stand in for /dev/nvidiaN.
        lines = []
        for index in range(self.fake_gpus):
            (self.dir / f"fake-nvidia{index}").touch()
            lines.append(f"Name=gpu File={self.dir / f'fake-nvidia{index}'}\n")
        (self.dir / "gres.conf").write_text("".join(lines))

    def start(self, timeout=60):
        """Start munged, slurmctld and slurmd and wait until the node is idle.

        The daemons run in the foreground as children of this process (-F/-D) and still write their PID
        files: stop() signals the PID from the file and then reaps the child, so no zombie is left behind
        even where PID 1 does not reap orphans (as in some containers).
        """
        self.write_config()
        env = self.env()
        commands = {
            "munged": [_binary("munged"), "--foreground", f"--socket={self.munge_socket}",
                       f"--key-file={self.dir / 'munge.key'}", f"--pid-file={self.pid_file('munged')}",
                       f"--log-file={self.log_file('munged')}", f"--seed-file={self.dir / 'munged.seed'}"],
            # -c: a fresh cluster, no state to recover.
            "slurmctld": [_binary("slurmctld"), "-D", "-c", "-f", str(self.conf)],
            "slurmd": [_binary("slurmd"), "-D", "-f", str(self.conf)],
        }
        try:
            for daemon in DAEMONS:
                with open(self.dir / f"{daemon}.stdout", "wb") as stdout:
                    # Own session: a Ctrl-C meant for pytest must not kill the cluster before teardown.
                    self.children[daemon] = subprocess.Popen(commands[daemon], stdin=subprocess.DEVNULL,
                                                             stdout=stdout, stderr=subprocess.STDOUT, env=env,
                                                             start_new_session=True)
                self._wait_for_pid(daemon, timeout)
            self._wait_until_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_pid(self, daemon, timeout):
        deadline = time.monotonic() + timeout
        child = self.children[daemon]
        while time.monotonic() < deadline and child.poll() is None:
            if self.read_pid(daemon) == child.pid:
                return child.pid
            time.sleep(0.1)
        if child.poll() is not None:
            raise RuntimeError(f"{daemon} exited with {child.returncode} while starting{self._log_tails()}")
        raise RuntimeError(f"{daemon} did not start within {timeout} s{self._log_tails()}")

    def _wait_until_idle(self, timeout):
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            proc = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True,
                                  env=self.env(), timeout=30)
            state = proc.stdout.strip() or proc.stderr.strip()
            if state == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm node is not idle after {timeout} s (sinfo: {state!r}){self._log_tails()}")

    def read_pid(self, daemon):
        try:
            return int(self.pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, timeout=20):
        """Cancel what is left, then stop slurmd, slurmctld and munged by the PIDs in their PID files."""
        if self.read_pid("slurmctld"):
            subprocess.run(["scancel", "--partition=debug"], capture_output=True, env=self.env(), timeout=30)
        for daemon in reversed(DAEMONS):
            pid = self.read_pid(daemon)
            child = self.children.pop(daemon, None)
            if pid and _alive(pid):
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout
                while _alive(pid) and time.monotonic() < deadline and (child is None or child.poll() is None):
                    time.sleep(0.1)
                if _alive(pid) and (child is None or child.poll() is None):
                    os.kill(pid, signal.SIGKILL)
            if child is not None:
                if child.poll() is None and child.pid != pid:
                    child.kill()  # died before writing its PID file, or the file names another process
                child.wait(timeout)
        if self.socket_dir_file.exists():
            shutil.rmtree(self.socket_dir_file.read_text(), ignore_errors=True)

    def _log_tails(self, lines=15):
        text = ""
        for daemon in DAEMONS:
            log = self.log_file(daemon)
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                text += f"\n--- {log} (last {len(tail)} lines)\n" + "\n".join(tail)
        return text


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/slurm_cluster.py DIRECTORY   (runs the cluster until Ctrl-C)")
    reason = missing_reason()
    if reason:
        sys.exit(reason)
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C, or `kill <pid>` when started in the background (where SIGINT is ignored), stops the cluster.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    cluster = SlurmCluster(sys.argv[1])
    try:
        cluster.start()
        print(f"Slurm is up; in another shell: export SLURM_CONF={cluster.conf}\n"
              f"Ctrl-C (or kill {os.getpid()}) stops it.", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
