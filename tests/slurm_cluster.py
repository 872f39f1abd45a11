"""Real, private Slurm clusters for the tests: munged, slurmctld and slurmd on this machine.

SlurmCluster is one node, this host. TwoNodeCluster is two nodes on this host: each node is a network namespace
with its own address and a UTS namespace with its own hostname, joined to the others by a bridge, and runs its
own slurmd (`slurmd -N`) there, so a job's tasks on the two nodes talk over that network as they would between
two machines; slurmctld and munged run on the host.

Everything lives in one directory (configuration, munge key and socket, state, spool, logs, PID files) and
the daemons listen on free ports, so a cluster neither needs nor touches /etc/slurm, /etc/munge or a Slurm
that may already run here. Seen working on Debian 12 (Slurm 22.05.8, munge 0.5.15) as root with
proctrack/linuxproc and task/none (no cgroups needed), select/cons_tres, no accounting.

By hand (the same code the tests use), until Ctrl-C:

    python tests/slurm_cluster.py /tmp/slurm                 # one node; Ctrl-C or `kill <its pid>` stops it
    python tests/slurm_cluster.py --nodes 2 /tmp/slurm2      # two nodes, node1 and node2
    SLURM_CONF=/tmp/slurm/slurm.conf sbatch --wait ...      # in another shell
"""
import ipaddress
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "scontrol", "scancel")
NAMESPACE_TOOLS = ("ip", "nsenter", "unshare", "mount", "hostname")
OWNER = "BENCH_TEST_CLUSTER_OWNER"  # in each daemon's environment: the id of the process that started the cluster
STALE_PREFIX = "bci"  # two-node namespaces: bci<that id>-node1, ...


class NetworkRefused(RuntimeError):
    """The kernel refused a namespace, link or address of the two-node network (TwoNodeCluster)."""


def missing_reason(nodes=1):
    """Why this host cannot run the cluster, or None when it can."""
    needed = DAEMONS + CLIENTS + (NAMESPACE_TOOLS if nodes > 1 else ())
    missing = [name for name in needed if shutil.which(name, path=_search_path()) is None]
    if missing:
        return (f"Slurm not installed: {', '.join(missing)} not found "
                f"(.ci/run installs Debian's slurm-wlm, munge and iproute2 with apt-get when run as root)")
    if os.geteuid() != 0:
        return "Slurm tests need root: slurmd runs the job steps as the submitting user and must be root"
    return None


def _search_path():
    # The daemons are in /usr/sbin, which a non-login root shell does not always have on PATH.
    return os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])


def _binary(name):
    return shutil.which(name, path=_search_path())


def _free_port():
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _node_line():
    """This host as slurmd sees it (`slurmd -C`): its name and its hardware fields, so that a configured node
    matches the real one and is not drained."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, check=True, timeout=30).stdout
    line = next(line for line in out.splitlines() if line.startswith("NodeName="))
    fields = dict(item.split("=", 1) for item in line.split())
    hostname = fields.pop("NodeName")
    return hostname, " ".join(f"{key}={value}" for key, value in fields.items() if key != "UpTime")


def _alive(pid):
    """True while the process exists and is not a zombie (a daemon's parent, init, may reap it late)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class SlurmCluster:
    """One node, this host."""

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
        self.daemons = DAEMONS
        # `sbatch --wait` polls after 2 s, then 4x longer each time up to 32 s, but only while that stays below half
        # of MinJobAge (so that it cannot miss a purged job): 5 keeps it polling every 2 s instead of finishing a
        # 30 s job after 42 s. Finished jobs are purged 5-60 s after they end; the tests look at once.
        self.min_job_age = 5

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
        (self.dir / "state").mkdir(mode=0o700, exist_ok=True)
        key = self.dir / "munge.key"
        if not key.exists():
            with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as stream:
                stream.write(os.urandom(1024))  # munge's own mungekey writes 1024 random bytes too
        if not self.socket_dir_file.exists() or not pathlib.Path(self.socket_dir_file.read_text()).is_dir():
            socket_dir = tempfile.mkdtemp(prefix="munge-")
            os.chmod(socket_dir, 0o755)
            self.socket_dir_file.write_text(socket_dir)
        self.hostname, hardware = _node_line()
        self.conf.write_text(f"""\
# Written by tests/slurm_cluster.py: a private cluster for the CI tests.
ClusterName=benchci
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Our own munged, not the system's /run/munge socket.
AuthInfo=socket={self.munge_socket}
StateSaveLocation={self.dir / 'state'}
SlurmctldPidFile={self.pid_file('slurmctld')}
SlurmctldLogFile={self.log_file('slurmctld')}
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
# GPUs are a known resource type, so `--gpus-per-node=0` is understood.
GresTypes=gpu
ReturnToService=2
# How long a finished job stays listed (with its exit code) before it is purged; see min_job_age.
MinJobAge={self.min_job_age}
{self.nodes_config(hardware)}""")
        (self.dir / "plugstack.conf").write_text("")
        # slurmd counts a GPU per device file it can stat; plain files stand in for /dev/nvidiaN.
        lines = []
        for index in range(self.fake_gpus):
            (self.dir / f"fake-nvidia{index}").touch()
            lines.append(f"Name=gpu File={self.dir / f'fake-nvidia{index}'}\n")
        (self.dir / "gres.conf").write_text("".join(lines))

    def nodes_config(self, hardware):
        """The controller, slurmd's files and the nodes: here one node, this host, in the host's network."""
        gres = f" Gres=gpu:{self.fake_gpus}" if self.fake_gpus else ""
        (self.dir / "spool").mkdir(mode=0o700, exist_ok=True)
        return f"""\
SlurmctldHost={self.hostname}
SlurmdSpoolDir={self.dir / 'spool'}
SlurmdPidFile={self.pid_file('slurmd')}
SlurmdLogFile={self.log_file('slurmd')}
NodeName={self.hostname} {hardware}{gres} State=UNKNOWN
PartitionName=debug Nodes={self.hostname} Default=YES MaxTime=INFINITE State=UP
"""

    def commands(self):
        """Each daemon's command line, in the order they start."""
        return {
            "munged": [_binary("munged"), "--foreground", f"--socket={self.munge_socket}",
                       f"--key-file={self.dir / 'munge.key'}", f"--pid-file={self.pid_file('munged')}",
                       f"--log-file={self.log_file('munged')}", f"--seed-file={self.dir / 'munged.seed'}"],
            # -c: a fresh cluster, no state to recover.
            "slurmctld": [_binary("slurmctld"), "-D", "-c", "-f", str(self.conf)],
            "slurmd": [_binary("slurmd"), "-D", "-f", str(self.conf)],
        }

    def start(self, timeout=60):
        """Start munged, slurmctld and slurmd and wait until the node is idle.

        The daemons run in the foreground as children of this process (-F/-D) and still write their PID
        files: stop() signals the PID from the file and then reaps the child, so no zombie is left behind
        even where PID 1 does not reap orphans (as in some containers).
        """
        try:
            remove_stale_clusters()
            self.prepare()
            self.write_config()
            # The daemons carry this process's id: a later run can tell the leftovers of one killed before stop().
            env, commands = {**self.env(), OWNER: str(os.getpid())}, self.commands()
            for daemon in self.daemons:
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

    def prepare(self):
        """What the daemons need before they start (TwoNodeCluster: the nodes' network)."""

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
            if state == "idle":  # one line: every node is idle
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Slurm nodes are not idle after {timeout} s (sinfo: {state!r}){self._log_tails()}")

    def read_pid(self, daemon):
        try:
            return int(self.pid_file(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, timeout=20):
        """Cancel what is left, then stop slurmd, slurmctld and munged by the PIDs in their PID files."""
        if self.read_pid("slurmctld") and self.conf.exists():
            subprocess.run(["scancel", "--partition=debug"], capture_output=True, env=self.env(), timeout=30)
        for daemon in reversed(self.daemons):
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
        self.teardown()

    def teardown(self):
        """What stop() removes after the daemons (TwoNodeCluster: the nodes' network)."""

    def _log_tails(self, lines=15):
        text = ""
        for daemon in self.daemons:
            log = self.log_file(daemon)
            if log.exists():
                tail = log.read_text(errors="replace").splitlines()[-lines:]
                text += f"\n--- {log} (last {len(tail)} lines)\n" + "\n".join(tail)
        return text


class TwoNodeCluster(SlurmCluster):
    """Two nodes, node1 and node2, on this host.

    Each node is a network namespace (its own address, on a bridge that lives in a third namespace, the switch)
    entered together with a UTS namespace (its own hostname) and a mount namespace (its own /etc/hosts, which
    names the controller and both nodes), and its own slurmd runs there (`slurmd -N node1`, a spool, PID file and
    log per node). Job steps run inside their node's namespaces. munged and slurmctld run on the host, which
    reaches the switch through a link of its own. The bridge is not in the host's network namespace, so the
    host's firewall (Docker's FORWARD rules, br_netfilter) never sees the traffic between the nodes.
    """

    NODES = ("node1", "node2")

    def __init__(self, directory):
        super().__init__(directory, fake_gpus=0)
        # Names carry this process's id, so that a second test run beside this one never collides with it and a
        # later run can tell the leftovers of a killed one (remove_stale_clusters()).
        self.tag = f"{STALE_PREFIX}{os.getpid()}"
        self.namespaces = {node: f"{self.tag}-{node}" for node in self.NODES}
        self.switch = f"{self.tag}-switch"
        self.daemons = ("munged", "slurmctld", *(f"slurmd-{node}" for node in self.NODES))
        self.network = None
        self.made = []  # namespaces and links made so far, for teardown()
        # The tests submit every two-node job at once and look at each one's end when they come to it, minutes later.
        self.min_job_age = 600

    def addresses(self):
        """The host's (controller's) address and each node's."""
        hosts = list(self.network.hosts())
        return hosts[0], {node: hosts[9 + index] for index, node in enumerate(self.NODES, 1)}

    def prepare(self):
        self.network = _free_subnet()
        host, nodes = self.addresses()
        prefix = self.network.prefixlen
        self._ip("netns", "add", self.switch)
        self.made.append(("netns", self.switch))
        self._ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        self._ip("-n", self.switch, "link", "set", "br0", "up")
        self._ip("link", "add", f"{self.tag}h", "type", "veth", "peer", "name", "uplink", "netns", self.switch)
        self.made.append(("link", f"{self.tag}h"))
        self._ip("-n", self.switch, "link", "set", "uplink", "master", "br0", "up")
        self._ip("addr", "add", f"{host}/{prefix}", "dev", f"{self.tag}h")
        self._ip("link", "set", f"{self.tag}h", "up")
        for index, node in enumerate(self.NODES, 1):
            namespace = self.namespaces[node]
            self._ip("netns", "add", namespace)
            self.made.append(("netns", namespace))
            self._ip("-n", self.switch, "link", "add", f"port{index}", "type", "veth", "peer", "name", "eth0",
                     "netns", namespace)
            self._ip("-n", self.switch, "link", "set", f"port{index}", "master", "br0", "up")
            self._ip("-n", namespace, "addr", "add", f"{nodes[node]}/{prefix}", "dev", "eth0")
            self._ip("-n", namespace, "link", "set", "eth0", "up")
            self._ip("-n", namespace, "link", "set", "lo", "up")

    def _ip(self, *args):
        proc = subprocess.run([_binary("ip"), *args], capture_output=True, text=True, timeout=30)
        if proc.returncode:
            raise NetworkRefused(f"the kernel refused the two-node network: `ip {' '.join(args)}`: "
                               f"{proc.stderr.strip() or proc.stdout.strip()}")

    def nodes_config(self, hardware):
        host, nodes = self.addresses()
        # The nodes' own /etc/hosts: the controller and both nodes, so that each name resolves the same on every
        # node (MASTER_ADDR=node1, gloo's own address from the hostname); the host's /etc/hosts stays as it is.
        (self.dir / "hosts").write_text(f"127.0.0.1 localhost\n{host} {self.hostname}\n" +
                                        "".join(f"{address} {node}\n" for node, address in nodes.items()))
        for node in self.NODES:
            (self.dir / f"spool-{node}").mkdir(mode=0o700, exist_ok=True)
        node_lines = "".join(f"NodeName={node} NodeAddr={address} NodeHostname={node} {hardware} State=UNKNOWN\n"
                             for node, address in nodes.items())
        # %n: the node's name, so that each slurmd has its own files. The controller's address is the host's end
        # of the link to the switch, which both the host's clients and the nodes reach.
        return f"""\
SlurmctldHost={self.hostname}({host})
SlurmdSpoolDir={self.dir / 'spool-%n'}
SlurmdPidFile={self.dir / 'slurmd-%n.pid'}
SlurmdLogFile={self.dir / 'slurmd-%n.log'}
{node_lines}PartitionName=debug Nodes={','.join(self.NODES)} Default=YES MaxTime=INFINITE State=UP
"""

    def commands(self):
        commands = super().commands()
        del commands["slurmd"]
        for node in self.NODES:
            # nsenter enters the node's network (not `ip netns exec`, which mounts a /sys without the cgroup tree
            # that slurmd reads); unshare gives it a hostname and an /etc/hosts of its own; each execs the next,
            # so the PID that Popen knows is slurmd's.
            commands[f"slurmd-{node}"] = [
                _binary("nsenter"), f"--net=/run/netns/{self.namespaces[node]}", _binary("unshare"), "--uts", "--mount",
                "sh", "-c", 'mount --bind "$1" /etc/hosts && hostname "$2" && exec "$3" -D -N "$2" -f "$4"',
                "sh", str(self.dir / "hosts"), node, _binary("slurmd"), str(self.conf)]
        return commands

    def node_pids(self, node):
        """The processes inside a node's network namespace (its slurmd, job steps and tasks)."""
        proc = subprocess.run([_binary("ip"), "netns", "pids", self.namespaces[node]], capture_output=True,
                              text=True, timeout=30)
        return [int(pid) for pid in proc.stdout.split()]

    def teardown(self):
        # A namespace lives on while a process is in it: whatever the stopped slurmd left behind goes first.
        for node in self.NODES:
            if ("netns", self.namespaces[node]) in self.made:
                _kill_all(self.node_pids(node))
        for kind, name in reversed(self.made):
            command = ["netns", "delete", name] if kind == "netns" else ["link", "delete", name]
            subprocess.run([_binary("ip"), *command], capture_output=True, timeout=30)
        self.made = []




def _kill_all(pids, timeout=10):
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def remove_stale_clusters():
    """What a test run killed before its cluster's stop() left behind: the daemons that carry the id of a process
    that is gone (OWNER), and the two-node namespaces named after one, with what still runs inside them (the
    host's link goes with the switch's namespace)."""
    stale = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone
            continue
        owner = next((item.split(b"=", 1)[1] for item in environ if item.startswith(OWNER.encode() + b"=")), None)
        if owner and owner.isdigit() and int(owner) != os.getpid() and not _alive(int(owner)):
            stale.append(int(entry.name))
    _kill_all(stale)
    if _binary("ip") is None:
        return
    listed = subprocess.run([_binary("ip"), "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for namespace, owner in re.findall(rf"^({STALE_PREFIX}(\d+)-\S+)", listed, flags=re.MULTILINE):
        if int(owner) != os.getpid() and not _alive(int(owner)):
            pids = subprocess.run([_binary("ip"), "netns", "pids", namespace], capture_output=True, text=True,
                                  timeout=30).stdout.split()
            _kill_all([int(pid) for pid in pids])
            subprocess.run([_binary("ip"), "netns", "delete", namespace], capture_output=True, timeout=30)


def _free_subnet():
    """A /24 in 10.0.0.0/8 that no address or route of this host overlaps, chosen from this process's id."""
    taken = subprocess.run([_binary("ip"), "-4", "-o", "addr", "show"], capture_output=True, text=True,
                           timeout=30).stdout
    taken += subprocess.run([_binary("ip"), "-4", "route", "show", "table", "all"], capture_output=True, text=True,
                            timeout=30).stdout
    used = [ipaddress.ip_network(text, strict=False)
            for text in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", taken)]
    for offset in range(256 * 200):
        index = (os.getpid() + offset) % (256 * 200)
        candidate = ipaddress.ip_network(f"10.{40 + index // 256}.{index % 256}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError("no free /24 in 10.40.0.0-10.239.255.0 for the two-node network")


def main(argv):
    nodes = 1
    if argv[:1] == ["--nodes"] and len(argv) == 3 and argv[1] in ("1", "2"):
        nodes, argv = int(argv[1]), argv[2:]
    if len(argv) != 1:
        sys.exit("usage: python tests/slurm_cluster.py [--nodes 2] DIRECTORY   (runs the cluster until Ctrl-C)")
    reason = missing_reason(nodes)
    if reason:
        sys.exit(reason)

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    # Ctrl-C, or `kill <pid>` when started in the background (where SIGINT is ignored), stops the cluster.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    cluster = TwoNodeCluster(argv[0]) if nodes == 2 else SlurmCluster(argv[0])
    try:
        cluster.start()
        print(f"Slurm is up; in another shell: export SLURM_CONF={cluster.conf}\n"
              f"Ctrl-C (or kill {os.getpid()}) stops it.", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
