"""Background checkpoints (parameter-server mode, checkpoint.background):
servers write a snapshot of their range while training goes on, and a
checkpoint becomes loadable only when every part has been written.

* A kill during a background write: 5 trials in which a server is killed
  with SIGKILL while its shard file is being written (the test waits for
  the writer's temporary file to appear and kills the process it names).
  Every step directory that has a manifest then verifies (each part's
  size and CRC-32, computed here from the files), the one being written
  has none, and --resume continues from the newest complete one to the
  end.
* Background and in-place checkpoints write the same bytes: a run with
  checkpoint.background false and one with true leave identical step
  directories."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS = 24
# ~6M parameters: a shard file of tens of megabytes, written while two
# workers keep both cores busy (the writer runs at idle priority).
MODEL = """model { vocab_size: 256 hidden_size: 384 intermediate_size: 1024 num_hidden_layers: 4
        num_attention_heads: 6 num_key_value_heads: 2 }"""


def config_text(sb, background):
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, ckpt="ckpt", every=2, metrics="metrics.jsonl",
                                extra="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }")
    text = re.sub(r"model \{[^}]*\}", MODEL, text)
    return text.replace('every: 2 }', f'every: 2 background: {"true" if background else "false"} }}')


def verify(step_dir):
    """Raises unless every part the manifest lists has its size and CRC."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        manifest = json.load(f)
    for part in manifest["parts"]:
        with open(os.path.join(step_dir, part["file"]), "rb") as f:
            data = f.read()
        assert len(data) == part["bytes"] and zlib.crc32(data) == part["crc32"], \
            f"{step_dir}/{part['file']}: does not match its manifest"


def run_dir(sb, name, background=True):
    d = sb.path(name)
    os.makedirs(d)
    with open(os.path.join(d, "job.textproto"), "w") as f:
        f.write(config_text(sb, background))
    return d


def herd(sb, workdir, *args):
    return subprocess.run([sb.herd, "launch", "job.textproto", *args], cwd=workdir, capture_output=True, text=True,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def kill_during_write(sb, trial):
    d = run_dir(sb, f"kill{trial}")
    p = subprocess.Popen([sb.herd, "launch", "job.textproto"], cwd=d, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=dict(os.environ, OMP_NUM_THREADS="1"))
    ckpt = os.path.join(d, "ckpt")
    victim = None
    deadline = time.time() + 120
    # Past the first checkpoints, at a trial-dependent one.
    first_step = 4 + 4 * trial
    while victim is None and p.poll() is None and time.time() < deadline:
        steps = [s for s in os.listdir(ckpt) if re.fullmatch(r"step_\d+", s)] if os.path.isdir(ckpt) else []
        for step_dir in sorted(steps):
            if int(step_dir[5:]) < first_step:
                continue
            try:
                names = os.listdir(os.path.join(ckpt, step_dir))
            except FileNotFoundError:
                continue
            for name in names:
                m = re.fullmatch(r"shard_\d+\.bin\.tmp\.(\d+)", name)
                if m:
                    victim = (step_dir, int(m.group(1)))
                    break
            if victim:
                break
    assert victim, f"trial {trial}: never saw a shard being written (launch exited {p.poll()})"
    step_dir, pid = victim
    os.kill(pid, signal.SIGKILL)
    assert p.wait(timeout=120) != 0, f"trial {trial}: the job finished although a server was killed"
    complete = [s for s in sorted(os.listdir(ckpt)) if os.path.exists(os.path.join(ckpt, s, "manifest.json"))]
    assert complete, f"trial {trial}: no complete checkpoint before step {first_step}"
    assert step_dir not in complete, f"trial {trial}: {step_dir} has a manifest although its shard was being written"
    for s in complete:
        verify(os.path.join(ckpt, s))
    r = herd(sb, d, "--resume")
    assert r.returncode == 0, f"trial {trial}: --resume failed:\n{r.stderr[-3000:]}"
    assert f"resumed from ckpt/{complete[-1]}" in r.stdout, r.stdout[-2000:]
    verify(os.path.join(ckpt, f"step_{STEPS:08d}"))
    return f"killed server pid {pid} while writing {step_dir}: {len(complete)} complete checkpoints verify, " \
           f"resumed from {complete[-1]} to step {STEPS}"


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    for trial in range(5):
        print(f"ok  trial {trial}: {kill_during_write(sb, trial)}", flush=True)

    snapshots = {}
    for background in (False, True):
        d = run_dir(sb, f"whole_{background}", background)
        r = herd(sb, d)
        assert r.returncode == 0, r.stderr[-3000:]
        snapshots[background] = {s: herdtest.snapshot(os.path.join(d, "ckpt", s))
                                 for s in os.listdir(os.path.join(d, "ckpt")) if s.startswith("step_")}
    # The configs differ in checkpoint.background alone, and so do their
    # copies and the manifests' entries for them.
    def parts(snap):
        return {(s, f): h for s, files in snap.items() for f, h in files.items()
                if f not in ("config.textproto", "manifest.json")}
    assert parts(snapshots[False]) == parts(snapshots[True]), "background checkpoints differ from in-place ones"
    print(f"ok  {len(snapshots[True])} checkpoints written in the background are byte for byte the in-place ones")


if __name__ == "__main__":
    main()
