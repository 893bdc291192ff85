"""`gpuweave mig plan` prints placements or a one-line reason; `mig apply` talks to the agent socket."""

from __future__ import annotations

import json

from gpuweave.cli import main


def test_plan_prints_start_and_size_per_instance(capsys):
    assert main(["mig", "plan", "--simulate", "dgx-h100", "--gpu", "3", "--profiles", "3g.40gb,3g.40gb"]) == 0
    out = capsys.readouterr().out
    assert "enable MIG mode (no reset)" in out
    assert "create   3g.40gb      start 0 size 4" in out
    assert "create   3g.40gb      start 4 size 4" in out
    assert "slot map:     A A A A B B B B" in out


def test_plan_on_ampere_mentions_the_single_gpu_reset(capsys):
    assert main(["mig", "plan", "--simulate", "dgx-a100", "--gpu", "0", "--profiles", "7g.80gb"]) == 0
    assert "GPU reset of this GPU only" in capsys.readouterr().out


def test_impossible_plan_is_one_line_and_non_zero(capsys):
    argv = ["mig", "plan", "--simulate", "dgx-h100", "--gpu", "3", "--current", "3g.40gb@0:busy"]
    assert main([*argv, "--profiles", "7g.80gb"]) == 2
    err = capsys.readouterr().err
    reason = "busy instance 3g.40gb at slots 0-3 blocks 7g.80gb; drain it or choose a layout around it"
    assert err.strip() == f"gpuweave mig: {reason}"
    assert "Traceback" not in err


def test_demand_and_json(capsys):
    argv = ["mig", "plan", "--simulate", "dgx-a100", "--gpu", "1", "--current", "3g.40gb@0:busy"]
    assert main([*argv, "--demand", "1g.10gb=5", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["keep"] == [{"profile": "3g.40gb", "start": 0, "size": 4, "busy": True}]
    assert [c["start"] for c in plan["create"]] == [4, 5, 6]


def test_bad_inputs_are_clear_errors(capsys):
    base = ["mig", "plan", "--simulate", "dgx-h100"]
    assert main([*base, "--gpu", "9", "--profiles", "1g.10gb"]) == 2
    assert "has no GPU 9" in capsys.readouterr().err
    assert main([*base, "--gpu", "0", "--profiles", "1g.10gb@x"]) == 2
    assert "PROFILE@START" in capsys.readouterr().err
    assert main(["mig", "plan", "--simulate", "dgx1-v100", "--gpu", "0", "--profiles", "1g.5gb"]) == 2
    assert "not MIG capable" in capsys.readouterr().err


def test_apply_without_a_running_agent_says_so(tmp_path, capsys):
    assert main(["mig", "apply", "--state-dir", str(tmp_path), "--gpu", "3", "--profiles", "1g.10gb"]) == 2
    assert "is `gpuweave node-agent` running?" in capsys.readouterr().err
