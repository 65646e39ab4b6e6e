"""benchmarks/device_check.py on this CPU machine: every check runs and says SKIP or PASS (the GPU ones SKIP with
their reason), the table and $OUT/device_check.json come out, and the runner turns a raising check into a FAIL
that makes the exit code 1 without hiding the checks after it."""

import importlib.util
import json
import re
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location(
    "device_check", Path(__file__).resolve().parents[1] / "benchmarks" / "device_check.py")
device_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(device_check)


def test_on_this_cpu_every_check_passes_or_skips_and_the_report_goes_to_out(tmp_path, monkeypatch, capsys):
    if torch.cuda.is_available():
        return  # on a GPU machine the checks run for real: python benchmarks/device_check.py
    monkeypatch.setenv("OUT", str(tmp_path))
    assert device_check.main([]) == 0
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert list(report) == ["repro_check", "launch", "resume", "vllm_engine_sync", "megatron_trainer_step",
                            "megatron_offloaded_optimizer_step", "megatron_dist_checkpoint"]
    assert {r["status"] for r in report.values()} <= {"PASS", "SKIP"}
    assert report["repro_check"]["status"] == "PASS"  # informational: `repro check` ran and wrote its rows
    # the launches need vLLM and megatron-core (absent from the main venv), then a GPU (or --cpu-dry-run)
    for name in ("launch", "resume", "vllm_engine_sync"):
        assert report[name]["status"] == "SKIP" and report[name]["detail"].startswith("not installed here: vllm")
    for name in ("megatron_trainer_step", "megatron_offloaded_optimizer_step", "megatron_dist_checkpoint"):
        assert report[name]["detail"] == "megatron-core is not installed"
    table = capsys.readouterr().out
    assert re.search(r"^check +status +seconds +detail$", table, re.M)
    assert re.search(r"^launch +SKIP +[0-9.]+  not installed here: vllm, megatron.core$", table, re.M)


def test_a_raising_check_is_a_fail_with_its_error_and_the_rest_still_run(tmp_path, monkeypatch):
    def broken():
        raise RuntimeError("no such device")

    ran = []
    named = [("first", lambda: ("PASS", "fine")), ("broken", broken), ("odd", lambda: ("MAYBE", "?")),
             ("last", lambda: ran.append(1) or ("SKIP", "nothing to do"))]
    report = device_check.run_checks(named)
    assert [(n, r["status"]) for n, r in report.items()] == [
        ("first", "PASS"), ("broken", "FAIL"), ("odd", "FAIL"), ("last", "SKIP")]
    assert report["broken"]["detail"] == "RuntimeError: no such device" and ran == [1]
    assert report["odd"]["detail"] == "the check answered 'MAYBE', not PASS/FAIL/SKIP: ?"
    monkeypatch.setattr(device_check, "checks", lambda out, deadline, cpu_dry_run=False: named)
    assert device_check.main(["--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "device_check.json").read_text())["broken"]["status"] == "FAIL"
