"""A real two-node Slurm on this machine, for tests and benchmarks: one munged, one slurmctld and two slurmd
(`slurmd -N n1`, `slurmd -N n2`), all with their files in one temporary folder. Nothing is installed: the
daemons are the system's (Debian's slurm-wlm and munge, which `.ci/run` installs with apt).

Both nodes are this host (NodeHostname) reached at 127.0.0.1 (NodeAddr), each slurmd on its own port, so no
name needs /etc/hosts. No accounting, processes tracked by their parents (proctrack/linuxproc: no cgroups
needed), and a small MaxArraySize so that a test's arrays are split into several jobs."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
NODES = ("n1", "n2")


def missing_programs() -> list[str]:
    """The daemons and client commands a cluster needs that are not installed."""
    wanted = {
        "munged": ["/usr/sbin"],
        "mungekey": ["/usr/sbin"],
        "slurmctld": ["/usr/sbin"],
        "slurmd": ["/usr/sbin"],
        "sbatch": [],
        "scontrol": [],
        "squeue": [],
        "srun": [],
    }
    return [name for name, extra in wanted.items() if _which(name, extra) is None]


def _which(name: str, extra: list[str]) -> str | None:
    # the daemons are in /usr/sbin, which a user's PATH may not hold
    return shutil.which(name) or (shutil.which(name, path=os.pathsep.join(extra)) if extra else None)


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for probe in sockets:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in sockets]
    finally:
        for probe in sockets:
            probe.close()


class SlurmCluster:
    """Start with `start()`, stop with `stop()` (which cancels every job first); `env` is the environment
    the Slurm commands need (SLURM_CONF)."""

    def __init__(self, *, max_array_size: int = 4, cpus_per_node: int = 2, max_job_count: int = 2000):
        self.max_array_size = max_array_size
        self.cpus_per_node = cpus_per_node
        self.max_job_count = max_job_count
        # short: a UNIX socket path must stay under 108 bytes
        self.root = Path(tempfile.mkdtemp(prefix="vb-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def _config(self) -> str:
        ctld_port, n1_port, n2_port = _free_ports(3)
        host = socket.gethostname()
        user = getpass.getuser()
        root = self.root
        nodes = [
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus_per_node} "
            f"RealMemory=1000 State=UNKNOWN"
            for name, port in zip(NODES, (n1_port, n2_port))
        ]
        return "\n".join(
            [
                "ClusterName=videobert-test",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={ctld_port}",
                f"SlurmdPort={n1_port}",
                f"SlurmUser={user}",
                f"SlurmdUser={user}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={self.munge_socket}",
                f"StateSaveLocation={root}/state",
                f"SlurmdSpoolDir={root}/spool-%n",
                f"SlurmctldPidFile={root}/slurmctld.pid",
                f"SlurmdPidFile={root}/slurmd-%n.pid",
                f"SlurmctldLogFile={root}/log/slurmctld.log",
                f"SlurmdLogFile={root}/log/slurmd-%n.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_CPU",
                "SchedulerType=sched/backfill",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                # the node's declared CPUs and memory are taken as they are (a CI machine may have fewer)
                "SlurmdParameters=config_overrides",
                "ReturnToService=2",
                f"MaxArraySize={self.max_array_size}",
                f"MaxJobCount={self.max_job_count}",
                "SlurmctldTimeout=10",
                "SlurmdTimeout=30",
                "InactiveLimit=0",
                "MinJobAge=3600",  # finished jobs stay visible to `scontrol show job` for the tests
                "KillWait=2",  # SIGTERM, then SIGKILL 2 s later (a cancelled or timed-out task)
                "OverTimeLimit=0",
                *nodes,
                f"PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        for folder in ("munge", "state", "log", *(f"spool-{name}" for name in NODES)):
            (self.root / folder).mkdir()
        key = self.root / "munge" / "munge.key"
        subprocess.run(
            [_which("mungekey", ["/usr/sbin"]), "--create", f"--keyfile={key}"], check=True, capture_output=True
        )
        key.chmod(0o600)
        self.conf.write_text(self._config())
        log = self.root / "log"
        try:
            self._spawn(
                "munged",
                [
                    _which("munged", ["/usr/sbin"]),
                    "--foreground",
                    "--force",
                    f"--socket={self.munge_socket}",
                    f"--key-file={key}",
                    f"--log-file={log}/munged.log",
                    f"--pid-file={self.root}/munge/munged.pid",
                    f"--seed-file={self.root}/munge/munged.seed",
                ],
            )
            self._wait(lambda: self.munge_socket.exists(), timeout_s, "munged did not create its socket")
            self._spawn("slurmctld", [_which("slurmctld", ["/usr/sbin"]), "-D", "-f", str(self.conf)])
            self._wait(
                lambda: self._run("scontrol", "ping").returncode == 0,
                timeout_s,
                "slurmctld does not answer `scontrol ping`",
            )
            for name in NODES:
                self._spawn(f"slurmd-{name}", [_which("slurmd", ["/usr/sbin"]), "-D", "-N", name, "-f", str(self.conf)])
            self._wait(self.nodes_idle, timeout_s, "the nodes did not become idle")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")
        self.processes[name] = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        out.close()

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            dead = [name for name, process in self.processes.items() if process.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"slurm test cluster: {what} ({'exited: ' + ', '.join(dead) if dead else 'timeout'}); "
                    f"logs in {self.root / 'log'}:\n{self.logs()}"
                )
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted((self.root / "log").glob("*"))
        )

    def _run(self, *argv: str, check: bool = False) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=60)

    def nodes_idle(self) -> bool:
        states = self._run("sinfo", "--noheader", "--Node", "--format=%N %T").stdout.split("\n")
        found = dict(line.split() for line in states if line.strip())
        return all(found.get(name) == "idle" for name in NODES)

    def scontrol(self, *argv: str) -> str:
        result = self._run("scontrol", *argv)
        if result.returncode != 0:
            # Slurm's reason is on stderr; a bare exit status would not say it
            raise RuntimeError(f"scontrol {' '.join(argv)}: exit {result.returncode}: {result.stderr.strip()}")
        return result.stdout

    def jobs(self) -> list[str]:
        """The ids of the jobs still pending or running (array tasks as JOB_TASK)."""
        out = self._run("squeue", "--noheader", "--array", "--format=%i").stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def wait_for_jobs(self, timeout_s: float = 300) -> None:
        """Until no job is pending or running."""
        self._wait(lambda: not self.jobs(), timeout_s, "jobs still queued: " + " ".join(self.jobs()))

    def job_states(self, job_id: str) -> dict[str, str]:
        """Every task of a job (or array job) with its state, e.g. {'12_0': 'COMPLETED', ...}."""
        states = {}
        for record in self.scontrol("show", "job", "--oneliner", str(job_id)).splitlines():
            fields = dict(word.split("=", 1) for word in record.split() if "=" in word)
            task = fields.get("ArrayTaskId")
            name = f"{fields.get('ArrayJobId')}_{task}" if task else fields["JobId"]
            states[name] = fields["JobState"]
        return states

    def stop(self) -> None:
        """Cancel every job of the cluster, wait until they are gone, then stop the daemons started here."""
        if "slurmctld" in self.processes and self.processes["slurmctld"].poll() is None:
            self._run("scancel", "--full", "--user", getpass.getuser())
            try:
                self.wait_for_jobs(30)
            except RuntimeError:
                pass
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)
