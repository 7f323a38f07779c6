"""`herd plan` against measured memory: a ~110M-parameter model (vocab
32000, d768, 12 layers) trains one step with 2 servers and 1 worker; each
server's peak RSS must be within 10% of what `herd plan` printed for it
(the worker's too). Also: --mem finds a larger model for more memory, and
bad --mem values are refused with one line."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

CONFIG = """
model { vocab_size: 32000 hidden_size: 768 intermediate_size: 2048 num_hidden_layers: 12
        num_attention_heads: 12 num_key_value_heads: 12 }
train { steps: 1 batch_size: 1 seq_len: 64 seed: 7 }
data { train: "train.bin" }
log { every: 1 sample_tokens: 0 summary_dir: "summaries" }
cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 }
"""


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.corpus(n_bytes=20000)
    sb.run("prepare", "corpus.txt", "--out", "train.bin")
    cfg = sb.write("m100.textproto", CONFIG)
    plan = json.loads(sb.run("plan", cfg, "--json").stdout)
    assert 100e6 < plan["parameters"] < 120e6, plan["parameters"]
    sb.run("launch", cfg)
    peaks = {}
    for name in os.listdir(sb.path("summaries")):  # every process's end-of-run JSON
        with open(sb.path("summaries", name)) as f:
            s = json.load(f)
        peaks[f"{s['role']} {s['rank']}"] = s["peak_rss_bytes"]
    assert set(peaks) == {"server 0", "server 1", "worker 0"}, peaks
    report = []
    for proc in plan["processes"]:
        name = f"server {proc['rank']}" if proc["role"] == "server" else "worker 0"
        ratio = peaks[name] / proc["total"]
        report.append(f"{name} {peaks[name] / 2**20:.0f} MiB measured / {proc['total'] / 2**20:.0f} MiB planned")
        assert 0.9 <= ratio <= 1.1, f"{name}: measured {peaks[name]:.0f} bytes, planned {proc['total']} ({ratio:.3f})"

    small = json.loads(sb.run("plan", cfg, "--json", "--mem", "2GiB").stdout)["largest_fitting"]
    big = json.loads(sb.run("plan", cfg, "--json", "--mem", "24GiB").stdout)["largest_fitting"]
    assert small["num_hidden_layers"] < big["num_hidden_layers"], (small, big)
    for bad in ("lots", "-1GiB", "3XB"):
        r = sb.run("plan", cfg, "--mem", bad, check=False)
        assert r.returncode == 2 and r.stderr.count("herd: error:") == 1 and "--mem" in r.stderr, r.stderr
    r = sb.run("plan", cfg, "--mem", "1MiB", check=False)
    assert r.returncode != 0 and "not even one layer" in r.stderr, r.stderr
    print("ps_memory: " + "; ".join(report) + f"; 24 GiB fits {big['num_hidden_layers']} layers")


if __name__ == "__main__":
    main()
