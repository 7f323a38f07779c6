"""herd under a real Slurm: a single-host cluster from Debian's packages
(munged, slurmctld, slurmd; its config, keys, state and logs in a scratch
directory, nothing of the system's changed) runs examples/slurm's batch
scripts as a user would submit them:

* herd_ps.sbatch (2 servers, 2 workers), herd_allreduce.sbatch (2
  workers), herd_pipeline.sbatch (2 pipeline stages),
  herd_tensor.sbatch (2 tensor-parallel ranks) and herd_regions.sbatch
  (2 regions of a server and 2 workers): srun starts the
  processes, herd takes ranks from SLURM_PROCID
  and SLURM_NTASKS and the coordinator from the script; the losses equal
  `herd launch`'s for the same config bitwise;
* workers that every step refuses (SLURM_NTASKS not the config's,
  SLURM_PROCID not a number): the job fails within seconds with the
  reason, not after the join timeout, and leaves nothing running;
* a PS job cancelled with scancel mid-run: every process exits, and the
  same script with --resume continues from the newest complete
  checkpoint to the same losses and final shards as an uninterrupted run.

Skipped (77) without root or without Slurm and munge installed."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import herdtest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "examples", "slurm")


class Cluster:
    """munged, slurmctld and slurmd on this host, in `root`."""

    def __init__(self, root):
        self.root = root
        self.procs = []
        self.conf = os.path.join(root, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)

    def start(self):
        r = self.root
        for d in ("state", "spool", "log"):
            os.makedirs(os.path.join(r, d))
        key = os.path.join(r, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.munge_socket = os.path.join(r, "munge.sock")
        subprocess.run(["munged", "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                        f"--log-file={r}/log/munged.log", f"--pid-file={r}/munged.pid",
                        f"--seed-file={r}/munged.seed"], check=True)
        host = socket.gethostname()
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=herdtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={herdtest.free_port()}
SlurmdPort={herdtest.free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=10
InactiveLimit=0
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs=16 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")
        for daemon in ("slurmctld", "slurmd"):
            log = open(os.path.join(r, "log", daemon + ".out"), "w")
            self.procs.append(subprocess.Popen([daemon, "-D", "-f", self.conf], stdout=log, stderr=log,
                                               env=self.env, start_new_session=True))
        deadline = time.time() + 60
        while True:
            p = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=self.env)
            if p.stdout.strip() == "idle":
                return
            if time.time() > deadline:
                raise AssertionError(f"slurm did not come up: {p.stdout} {p.stderr}\n{self.logs()}")
            time.sleep(0.5)

    def logs(self):
        out = ""
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out"):
            path = os.path.join(self.root, "log", name)
            if os.path.exists(path):
                with open(path) as f:
                    out += f"--- {name}\n" + "".join(f.readlines()[-20:])
        return out

    def stop(self):
        subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        subprocess.run(["munged", f"--socket={self.munge_socket}", "--stop"], capture_output=True)

    def sbatch(self, script, *args, cwd, env):
        p = subprocess.run(["sbatch", "--parsable", os.path.join(EXAMPLES, script), *args], cwd=cwd,
                           capture_output=True, text=True, env=dict(self.env, **env))
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().split(";")[0]

    def state(self, job):
        p = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, env=self.env)
        fields = dict(kv.split("=", 1) for kv in p.stdout.split() if "=" in kv)
        return fields.get("JobState", ""), fields.get("ExitCode", "")

    def wait(self, job, timeout=300):
        deadline = time.time() + timeout
        while True:
            state, code = self.state(job)
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", ""):
                return state, code
            assert time.time() < deadline, f"job {job} still {state} after {timeout} s\n{self.logs()}"
            time.sleep(0.3)


def metrics(path):
    """Per step, the last row written (a resumed run rewrites its steps)."""
    rows = {}
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            rows[m["step"]] = (m["step"], m["loss"], m["grad_norm"], m["lr"])
    return [rows[s] for s in sorted(rows)]


def herd_processes(marker):
    p = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split() if int(x) != os.getpid()]


def main():
    a = herdtest.parse_args()
    if os.geteuid() != 0:
        print("skipped: a Slurm cluster needs root")
        sys.exit(77)
    missing = [t for t in ("munged", "slurmctld", "slurmd", "sbatch", "scancel") if shutil.which(t) is None]
    if missing:
        print(f"skipped: not installed: {', '.join(missing)} (apt install slurmctld slurmd slurm-client munge)")
        sys.exit(77)
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    cluster = Cluster(tempfile.mkdtemp(prefix="herd_slurm_"))
    env = {"HERD_BIN": os.path.abspath(a.build)}
    try:
        cluster.start()

        def job(name, cluster_text, steps, every):
            text = herdtest.tiny_config(sb.path("train.bin"), steps=steps, ckpt=sb.path(name + "_ckpt"), every=every,
                                        metrics=sb.path(name + ".jsonl"), extra=cluster_text)
            return sb.write(name + ".textproto", text)

        # Both scripts, against herd launch on the same config.
        for name, script, cluster_text in (
                ("ps", "herd_ps.sbatch", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"),
                ("allreduce", "herd_allreduce.sbatch", "cluster { sync: ALLREDUCE workers: 2 }"),
                ("pipeline", "herd_pipeline.sbatch",
                 "cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 pipeline_schedule: GPIPE }"),
                ("tensor", "herd_tensor.sbatch", "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 }"),
                ("regions", "herd_regions.sbatch",
                 "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 diloco { regions: 2 every: 5 } }")):
            cfg = job(name, cluster_text, 20, 10)
            t0 = time.time()
            jid = cluster.sbatch(script, cfg, cwd=sb.dir, env=env)
            state, code = cluster.wait(jid)
            with open(sb.path(f"herd-{name}-{jid}.out")) as f:
                out = f.read()
            assert state == "COMPLETED" and code == "0:0", f"{name}: {state} {code}\n{out[-3000:]}"
            sb.run("launch", cfg, "--set", f"log.metrics={sb.path(name + '_launch.jsonl')}",
                   "--set", f"checkpoint.dir={sb.path(name + '_launch_ckpt')}")
            got, want = metrics(sb.path(name + ".jsonl")), metrics(sb.path(name + "_launch.jsonl"))
            assert len(got) == 20 and got == want, f"{name}: sbatch and herd launch differ\n{got}\n{want}"
            print(f"ok  sbatch {script}: 20 steps in {time.time() - t0:.1f} s, losses bitwise equal to herd launch's")

        # Processes that every step refuses: SLURM_NTASKS not the config's
        # (refused by the coordinator, which stops the job) and
        # SLURM_PROCID not a number (refused by the process itself): the
        # job fails at once with the reason, not after join_timeout_s (300
        # s), and leaves nothing running.
        cfg = job("refused", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }", 20, 0)
        for variable, value, needle in (("SLURM_NTASKS", "99", "the launcher says there are 99 workers"),
                                        ("SLURM_PROCID", "x", "SLURM_PROCID")):
            wrap = sb.path(f"bin_{variable}")
            os.makedirs(wrap)
            for name in ("herd", "herd-server"):
                os.symlink(os.path.join(env["HERD_BIN"], name), os.path.join(wrap, name))
            with open(os.path.join(wrap, "herd-worker"), "w") as f:
                f.write(f'#!/bin/sh\nexport {variable}={value}\nexec {env["HERD_BIN"]}/herd-worker "$@"\n')
            os.chmod(os.path.join(wrap, "herd-worker"), 0o755)
            t0 = time.time()
            jid = cluster.sbatch("herd_ps.sbatch", cfg, cwd=sb.dir, env={"HERD_BIN": wrap})
            state, code = cluster.wait(jid, timeout=120)
            took = time.time() - t0
            with open(sb.path(f"herd-ps-{jid}.out")) as f:
                out = f.read()
            assert state == "FAILED" and needle in out, f"{variable}={value}: {state} {code}\n{out[-3000:]}"
            assert took < 60, f"{variable}={value}: the job took {took:.0f} s to fail\n{out[-3000:]}"
            deadline = time.time() + 10
            while herd_processes(cfg) and time.time() < deadline:
                time.sleep(0.1)
            assert not herd_processes(cfg), f"processes left: {herd_processes(cfg)}"
            print(f"ok  every worker refused ({variable}={value}): the job failed in {took:.1f} s, nothing left")

        # scancel mid-run, then --resume through the same script.
        steps = 400
        cfg = job("long", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }", steps, 25)
        jid = cluster.sbatch("herd_ps.sbatch", cfg, cwd=sb.dir, env=env)
        deadline = time.time() + 120
        while not os.path.exists(sb.path("long_ckpt", "step_00000050", "manifest.json")):
            assert time.time() < deadline and cluster.state(jid)[0] in ("PENDING", "RUNNING"), \
                f"no checkpoint at step 50: {cluster.state(jid)}\n{cluster.logs()}"
            time.sleep(0.05)
        subprocess.run(["scancel", jid], env=cluster.env, check=True)
        t0 = time.time()
        state, _ = cluster.wait(jid, timeout=60)
        assert state == "CANCELLED", state
        deadline = time.time() + 20
        while herd_processes(cfg) and time.time() < deadline:
            time.sleep(0.1)
        left = herd_processes(cfg)
        assert not left, f"processes left after scancel: {left}"
        took = time.time() - t0
        done = sorted(d for d in os.listdir(sb.path("long_ckpt"))
                      if os.path.exists(sb.path("long_ckpt", d, "manifest.json")))
        assert done and done[-1] != f"step_{steps:08d}", done
        jid = cluster.sbatch("herd_ps.sbatch", cfg, "--resume", cwd=sb.dir, env=env)
        state, code = cluster.wait(jid)
        with open(sb.path(f"herd-ps-{jid}.out")) as f:
            out = f.read()
        assert state == "COMPLETED" and code == "0:0", f"resume: {state} {code}\n{out[-3000:]}"
        assert "resumed from" in out and done[-1] in out, out[-2000:]
        sb.run("launch", cfg, "--set", f"log.metrics={sb.path('long_launch.jsonl')}",
               "--set", f"checkpoint.dir={sb.path('long_launch_ckpt')}")
        got, want = metrics(sb.path("long.jsonl")), metrics(sb.path("long_launch.jsonl"))
        assert got == want, "the cancelled and resumed job's losses differ from an uninterrupted run's"
        final = f"step_{steps:08d}"
        for f in sorted(os.listdir(sb.path("long_launch_ckpt", final))):
            if f.startswith("shard_"):
                with open(sb.path("long_ckpt", final, f), "rb") as x, \
                        open(sb.path("long_launch_ckpt", final, f), "rb") as y:
                    assert x.read() == y.read(), f"{final}/{f} differs from the uninterrupted run's"
        print(f"ok  scancel at {done[-1]}+: every process gone within {took:.1f} s; --resume from {done[-1]} "
              f"ends bitwise equal to an uninterrupted run ({steps} steps, final shards)")
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
    shutil.rmtree(sb.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
