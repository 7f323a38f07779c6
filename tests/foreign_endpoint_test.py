"""Only the job can talk to its data plane. A parameter-server job (S=2
W=2) started by hand runs while a foreign UCX endpoint (tests/tools/
foreign_node), which learned every member's UCX address by relaying the
control plane, sends well-formed pushes of gradients and pulls of weights
that claim to come from worker 0 but carry another token's key, to every
server and worker, all through training:

* every data-plane listener of the job's processes is on loopback (a job
  on one machine), not on the host's other interfaces;
* every member dropped the foreign messages (counted in its run summary)
  and said so in one line, not one per message;
* the job ends well and its final checkpoint is byte for byte the same
  job's undisturbed run's."""
import glob
import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS = 300
TOKEN = "foreign-endpoint-test-token-0123456789"
DROP_LINE = "without this job's data-plane key"


def tcp_listeners(pid):
    """The addresses (text) of the TCP sockets process `pid` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    out = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        with open(f"/proc/{pid}/net/{table}") as f:
            rows = [line.split() for line in f.readlines()[1:]]
        for row in rows:
            if row[3] != "0A" or row[9] not in inodes:  # 0A: LISTEN
                continue
            hex_ip = row[1].split(":")[0]
            raw = b"".join(bytes.fromhex(hex_ip[i:i + 8])[::-1] for i in range(0, len(hex_ip), 8))
            out.append(socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, raw))
    return out


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, ckpt="ckpt", every=STEPS, metrics="metrics.jsonl",
                                extra="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }").replace(
                                    "sample_tokens: 0", 'sample_tokens: 0 summary_dir: "summary"')
    runs = {}
    for name in ("straight", "attacked"):
        os.makedirs(sb.path(name))
        sb.write(os.path.join(name, "job.textproto"), text)
        runs[name] = sb.path(name)
    env = dict(os.environ, OMP_NUM_THREADS="1", HERD_JOB_TOKEN=TOKEN)
    subprocess.run([sb.herd, "launch", "job.textproto"], cwd=runs["straight"], check=True, capture_output=True, env=env)

    work = runs["attacked"]
    coordinator = f"127.0.0.1:{herdtest.free_port()}"
    relay_port = herdtest.free_port()
    procs = {}

    def start(key, argv):
        out = open(os.path.join(work, key + ".out"), "w")
        procs[key] = subprocess.Popen(argv, cwd=work, stdout=out, stderr=subprocess.STDOUT, env=env)

    start("coordinator", [sb.herd, "coordinator", "job.textproto", "--listen", coordinator])
    start("foreign", [os.path.join(sb.build, "tests", "foreign_node"), "--listen", str(relay_port), "--coordinator",
                      coordinator, "--members", "4", "--token", "another job's token", "--seconds", "120"])
    time.sleep(0.2)
    for role in ("server", "worker"):
        for rank in range(2):
            start(f"{role}{rank}", [os.path.join(sb.build, "herd-" + role), "job.textproto", "--rank", str(rank),
                                    "--coordinator", f"127.0.0.1:{relay_port}"])
    herdtest.wait_for_step(os.path.join(work, "metrics.jsonl"), 20, "attacked")
    listeners = {k: tcp_listeners(p.pid) for k, p in procs.items() if k[:-1] in ("server", "worker")}
    for key, p in procs.items():
        assert p.wait(timeout=300) == 0, f"{key} exited {p.returncode}:\n" + \
            open(os.path.join(work, key + ".out")).read()[-3000:]

    # The data plane listens where the control plane does: on loopback.
    for key, addresses in listeners.items():
        assert addresses and all(x.startswith("127.") or x == "::1" for x in addresses), \
            f"{key} listens beyond loopback: {addresses}"
    print(f"ok  data-plane listeners on loopback only: {listeners}")

    final = f"ckpt/step_{STEPS:08d}"
    want = herdtest.snapshot(os.path.join(runs["straight"], final))
    got = herdtest.snapshot(os.path.join(work, final))
    assert got == want, "the attacked job's final checkpoint differs from the undisturbed run's: " + \
        str({k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)})
    print(f"ok  step {STEPS} checkpoint ({len(got)} files) identical to the undisturbed run's")

    foreign = json.loads(open(os.path.join(work, "foreign.out")).read().strip().splitlines()[-1])
    assert foreign["reached"] == 3 and foreign["requests"] > 0, foreign
    print(f"ok  {foreign['requests']} foreign requests over {foreign['rounds']} rounds")
    summaries = sorted(glob.glob(os.path.join(work, "summary", "*.json")))
    assert len(summaries) == 4, summaries
    for path in summaries:
        summary = json.load(open(path))
        key = f"{summary['role']}{summary['rank']}"
        reports = open(os.path.join(work, key + ".out")).read().count(DROP_LINE)
        dropped = summary["unauthenticated_dropped"]
        if key == "worker0":  # whom the foreign endpoint claims to be: it sends nothing there
            assert dropped == 0 and reports == 0, f"{key}: dropped {dropped}, reported {reports} times"
            continue
        assert dropped > 0 and reports == 1, f"{key}: dropped {dropped}, reported {reports} times"
        print(f"ok  {key}: dropped {dropped} foreign messages, said so once")


if __name__ == "__main__":
    main()
