"""A pipeline stage killed with -9 mid-run, through `herd launch`: the
stage it exchanges activations with is waiting on the stage wire, and the
coordinator's word that its peer was lost must end that wait at once. The
job stops within 3 s (the launcher would kill a lingering stage only after
heartbeat_timeout_s + 10 s = 15 s), in one line naming the lost stage, with
its exit code. The killed stage holds 7 of 8 layers and the head, so that
the survivor spends nearly all of each step waiting on the wire for it
(rather than in the step's all-reduce, which has failed at once all
along)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_failure_test import kill_mid_run  # noqa: E402


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    stopped = kill_mid_run(sb, "worker", 1, tag="_pp", place=" (pipeline stage 1 of replica 0)",
                           cluster='cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 pipeline_split: "0,1" '
                                   'pipeline_schedule: GPIPE heartbeat_timeout_s: 5 }',
                           edit=lambda text: text.replace("num_hidden_layers: 2", "num_hidden_layers: 8")
                           .replace("every: 5 }", "every: 0 }"))
    assert stopped < 3, f"the surviving stage lingered: the job stopped {stopped:.1f} s after the kill"
    print(f"pipeline_failure: a stage killed with -9: the job stopped in {stopped:.2f} s, naming it")


if __name__ == "__main__":
    main()
