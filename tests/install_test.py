"""The installed tree runs on its own: `cmake --install` into a scratch
prefix gives bin/herd, herd-server, herd-worker whose every shared library
but the C library (and CUDA's) resolves inside the tree's lib/ (RPATH
$ORIGIN/../lib), UCX's transport modules in lib/ucx/, and a parameter-server
job launched from the tree trains, with no library loaded from the build
machine's system directories other than the C library's (what the loader
reports it loaded, with LD_DEBUG=libs, in every process, modules opened at
run time too)."""
import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

SYSTEM_OK = ("linux-vdso", "ld-linux", "libc.so", "libm.so", "libdl.so", "libpthread.so", "librt.so",
             "libresolv.so", "libutil.so")


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    prefix = sb.path("prefix")
    p = subprocess.run(["cmake", "--install", sb.build, "--prefix", prefix], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    bin_dir, lib_dir = os.path.join(prefix, "bin"), os.path.join(prefix, "lib")
    for exe in ("herd", "herd-server", "herd-worker"):
        path = os.path.join(bin_dir, exe)
        dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        assert "(RPATH)" in dyn and "$ORIGIN/../lib" in dyn, f"{exe}: no RPATH $ORIGIN/../lib:\n{dyn}"
        ldd = subprocess.run(["ldd", path], capture_output=True, text=True, env={}).stdout
        for line in ldd.splitlines():
            name = os.path.basename(line.strip().split()[0])
            if name.startswith(SYSTEM_OK):
                continue
            resolved = line.split("=>")[1].split("(")[0].strip() if "=>" in line else ""
            assert os.path.realpath(resolved).startswith(os.path.realpath(lib_dir) + os.sep), \
                f"{exe}: {name} does not resolve inside the tree: {line.strip()}"
    modules = os.listdir(os.path.join(lib_dir, "ucx"))
    assert any(m.startswith("libuct_cma") or m.startswith("libuct_posix") or m.startswith("libuct") for m in
               modules), modules

    # A PS job from the installed tree: herd launch finds its siblings.
    sb.corpus(n_bytes=20000)
    herd = os.path.join(bin_dir, "herd")
    subprocess.run([herd, "prepare", "corpus.txt", "--out", "train.bin"], cwd=sb.dir, check=True,
                   capture_output=True)
    sb.write("job.textproto", herdtest.tiny_config(
        "train.bin", steps=3, extra="cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 }"))
    # LD_DEBUG=libs: the loader names every library it initialises, in the
    # launcher and each server and worker, those opened at run time (UCX's
    # transport modules) too. ldd above shows what would resolve; this, what
    # did.
    # The processes' stderr, the loader's lines with it, goes to the
    # launcher's log: without checkpoint.dir, herd-launch-PID.log in $TMPDIR.
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "UCX_LOG_LEVEL": "error", "LD_DEBUG": "libs",
           "TMPDIR": sb.dir}
    p = subprocess.run([herd, "launch", "job.textproto"], cwd=sb.dir, capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "done: 3 steps" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    logs = glob.glob(sb.path("herd-launch-*.log"))
    assert len(logs) == 1, f"the launcher's log: {logs}"
    loaded = set(re.findall(r"calling init: (\S+)", p.stdout + p.stderr + open(logs[0]).read()))
    outside = sorted(x for x in loaded if not os.path.realpath(x).startswith(os.path.realpath(prefix) + os.sep)
                     and not os.path.basename(x).startswith(SYSTEM_OK))
    assert len(loaded) > 10 and any("/ucx/" in x for x in loaded), sorted(loaded)
    assert not outside, f"loaded from outside the tree: {outside}"
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(prefix) for f in fs)
    print(f"install: self-contained tree of {size / 2**20:.0f} MiB ({len(os.listdir(lib_dir))} entries in lib/, "
          f"{len(modules)} UCX modules); a PS job ran from it")


if __name__ == "__main__":
    main()
