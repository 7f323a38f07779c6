"""Regions (cluster.diloco): the job's servers and workers split into
regions, each a synchronous parameter-server job with its own inner
AdamW, joined every H steps by DiLoCo's outer step (the regions'
pseudo-gradients summed server to server, Nesterov on their mean), on the
tiny model, 30 steps, through `herd launch`:

* 2 regions of 2 workers, H = 5, without clipping: a rerun bitwise the
  same; with 2 servers a region rather than 1 bitwise the same (the outer
  step is elementwise and each region's sums are in rank order, so the
  shard cut changes nothing); it learns: its last five losses' mean below
  its first five's by more than half the drop synchronous PS on the same
  global batch makes;
* with clipping (each region's norm over its own servers) it runs, and
  H = 1 with lr 1 and no momentum (the mean of the regions' AdamW steps
  every step) stays within 5% of synchronous PS's losses;
* stopped at step 12 (between outer steps) and --resume: bitwise the
  straight run (each region's replica and the outer weights and momentum
  in the checkpoint); its shard files (region 0's replica) go on as one
  process;
* bad inputs, one line each before any process starts: regions not
  dividing the servers or the workers, H < 1, regions in all-reduce
  mode."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_equivalence_test import metrics  # noqa: E402

STEPS = 30


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()

    def job(name, cluster, clip=0.0, ckpt="", every=0):
        text = herdtest.tiny_config("train.bin", steps=STEPS, metrics=name + ".jsonl", extra=cluster, ckpt=ckpt,
                                    every=every)
        text = text.replace("clip_norm: 1.0", f"clip_norm: {clip}")
        return sb.write(name + ".textproto", text)

    def regions(servers, workers=4, R=2, H=5, more=""):
        return (f"cluster {{ sync: PARAMETER_SERVER servers: {servers} workers: {workers} "
                f"diloco {{ regions: {R} every: {H} {more} }} }}")

    def losses(name):
        return [m["loss"] for m in metrics(sb.path(name + ".jsonl"))]

    def drop(x):
        return sum(x[:5]) / 5 - sum(x[-5:]) / 5

    sb.run("launch", job("r2", regions(2)))
    sb.run("launch", job("r2_again", regions(2)))
    assert losses("r2_again") == losses("r2"), "2 regions, rerun"
    sb.run("launch", job("r2s4", regions(4)))
    assert losses("r2s4") == losses("r2"), "2 regions of 2 servers against 2 regions of 1"
    sb.run("launch", job("sync", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 }"))
    assert drop(losses("r2")) > 0.5 * drop(losses("sync")), (losses("r2"), losses("sync"))
    print(f"2 regions, H=5: a rerun and 2 servers a region bitwise the same; its loss dropped "
          f"{drop(losses('r2')):.3f} against synchronous PS's {drop(losses('sync')):.3f}")

    sb.run("launch", job("r2_clip", regions(2), clip=1.0))
    sb.run("launch", job("r2_mean", regions(2, H=1, more="outer_lr: 1 outer_momentum: 0"), clip=1.0))
    sb.run("launch", job("sync_clip", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 }", clip=1.0))
    w = herdtest.within(losses("r2_mean"), losses("sync_clip"), "H=1, lr 1, no momentum against PS", 0.05)
    print(f"with clipping: H=1, lr 1, no momentum within {w:.2g} of synchronous PS")

    sb.run("launch", job("stop", regions(2), ckpt="stop", every=6), "--stop-at", "12")
    sb.run("launch", job("stop", regions(2), ckpt="stop", every=6), "--resume")
    assert losses("stop") == losses("r2"), "2 regions stopped at 12 and resumed"
    one_from = sb.write("one_from.textproto", open(job("one_from", "", ckpt="one_from")).read().replace(
        "batch_size: 4", "batch_size: 16"))  # the same global batch in one process
    herdtest.resume_from(sb, "one_from", one_from, "stop/step_00000012")
    assert len(losses("one_from")) == STEPS - 12, "the regions' checkpoint as one process"
    print("stopped at 12 (between outer steps) and resumed bitwise; its shard files go on as one process")

    bad = [("three_servers", regions(3), "cluster.diloco.regions"),
           ("three_workers", regions(2, workers=3), "cluster.diloco.regions"),
           ("h0", regions(2, H=0), "cluster.diloco.every"),
           ("allreduce", "cluster { sync: ALLREDUCE workers: 4 diloco { regions: 2 } }", "cluster.diloco.regions")]
    herdtest.refused_before_start(sb, [(name, job(name, cluster), says) for name, cluster, says in bad])
    print("bad inputs: one line each, nothing started")


if __name__ == "__main__":
    main()
