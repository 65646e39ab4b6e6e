"""repro check: every check's PASS / WARN / FAIL / SKIP on hand-made facts, and the CLI on this machine with
both recipes (tiny: CPU mode, no FAIL, exit 0; AMD: GPU count FAILs, exit 1, JSON written)."""

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

import repro
from repro.readiness import checks as C
from repro.readiness.checks import FAIL, PASS, SKIP, WARN, Facts, NodeFacts
from repro.readiness.pins import expected_versions, version_matches
from repro.recipes import load_recipe

AMD = load_recipe("amd-dsv4-flash-mi308x")
TINY = load_recipe("tiny-cpu")
TB = 10**12


def amd_cluster_facts(**changes) -> Facts:
    """A healthy 3 x 8 MI308X cluster, as gather_facts would find it on its head node."""
    facts = Facts(
        ray_address="10.0.0.1:6379", ray_reachable=True,
        nodes=[NodeFacts(f"node{i}", f"10.0.0.{i + 1}", 8.0, 128.0, "AMD-Instinct-MI308X") for i in range(3)],
        accelerator="rocm", device_count=8, device_name="AMD Instinct MI308X", arch="gfx942", arch_source="torch",
        versions={"python": "3.12.13", "torch": "2.11.0+gitd0c8b1f", "rocm_torch": "7.2.53211", "cuda_torch": None,
                  "rocm": "7.2.3", "vllm": "0.25.1", "megatron-core": "0.16.0", "transformer-engine": "2.4.0",
                  "ray": "2.56.1", "transformers": "5.13.1"},
        lumenrl_path="/workspace/Lumen-RL", lumenrl_commit="b039ba2966b70e234484d6c3086e052f1227c7e1",
        rdma_devices=["rdma0", "rdma1"], rdma_source="/sys/class/infiniband",
        nccl_env={"NCCL_IB_HCA": "rdma0,rdma1", "NCCL_SOCKET_IFNAME": "eth0"},
        disk_path="/shared/runs", disk_free_bytes=20 * TB, host_ram_bytes=3 * TB, device_memory_bytes=192 * 10**9,
        shm_total_bytes=1 * TB, shm_free_bytes=900 * 10**9, model_staged=True,
    )
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def laptop_facts(**changes) -> Facts:
    facts = Facts(ray_reachable=True, ray_local_deferred=True, ray_version="2.60.0",
                  nodes=[NodeFacts("local", "127.0.0.1", 0.0, 2.0)],
                  versions={"python": "3.11.7", "torch": "2.13.0+cpu", "rocm_torch": None, "cuda_torch": None,
                            "ray": "2.60.0", "transformers": "5.24.0"},
                  disk_path="runs/tiny-cpu", disk_free_bytes=50 * 10**9, host_ram_bytes=24 * 10**9,
                  shm_total_bytes=12 * 10**9, shm_free_bytes=12 * 10**9)
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def by_name(results):
    return {r.check: r for r in results}


# -- the whole set --------------------------------------------------------------------------------------------
def test_healthy_amd_cluster_passes_everything():
    results = by_name(C.run_checks(AMD, amd_cluster_facts()))
    assert {name: r.status for name, r in results.items() if r.status != PASS} == {"cpu_bf16": SKIP}  # GPUs train
    assert results["gpu_count"].detail == "Ray reports 24 GPUs = 3 x 8"
    assert "gfx942 -> e4m3fnuz" in results["fp8_format"].detail


def test_tiny_recipe_on_a_laptop_is_cpu_mode_not_failure():
    results = C.run_checks(TINY, laptop_facts())
    statuses = by_name(results)
    assert not C.failed(results)
    for name in ("gpu_count", "accelerator", "platform", "rdma", "nccl_env"):
        assert statuses[name].status == SKIP
        assert statuses[name].detail == "CPU mode: the tiny recipe needs no accelerator"  # the status column says SKIP
    assert statuses["vllm"].status == statuses["megatron_core"].status == SKIP
    assert "CPU mode" in C.summary_line(TINY, results) and "ready" in C.summary_line(TINY, results)


def test_amd_recipe_on_a_laptop_fails_the_gpu_count_clearly():
    facts = laptop_facts(ray_reachable=False, ray_local_deferred=False, nodes=[],
                         ray_error="no Ray cluster found on this machine")
    results = by_name(C.run_checks(AMD, facts))
    assert results["ray"].status == FAIL and "no Ray cluster found" in results["ray"].detail
    assert results["gpu_count"].status == FAIL
    assert results["gpu_count"].detail.startswith("0 of 24 GPUs") and \
        "`ray status` should report 24 GPUs" in results["gpu_count"].detail
    assert results["accelerator"].status == FAIL and "no ROCm GPU visible" in results["accelerator"].detail


# -- one check at a time --------------------------------------------------------------------------------------
def test_gpu_count():
    assert C.check_gpu_count(AMD, amd_cluster_facts()).status == PASS
    two_nodes = amd_cluster_facts(nodes=amd_cluster_facts().nodes[:2])
    short = C.check_gpu_count(AMD, two_nodes)
    assert short.status == FAIL and short.detail == "Ray reports 16 GPUs, the recipe needs 24 (3 nodes x 8)"
    assert "ray start --address" in short.fix
    extra = amd_cluster_facts(nodes=amd_cluster_facts().nodes + [NodeFacts("n4", "10.0.0.4", 8.0, 128.0)])
    assert C.check_gpu_count(AMD, extra).status == WARN
    assert C.check_gpu_count(TINY, laptop_facts()).status == SKIP


def test_nodes_need_full_gpu_nodes():
    uneven = amd_cluster_facts(nodes=[NodeFacts("a", "1", 8.0, 64.0), NodeFacts("b", "2", 8.0, 64.0),
                                      NodeFacts("c", "3", 4.0, 64.0), NodeFacts("d", "4", 4.0, 64.0)])
    assert C.check_gpu_count(AMD, uneven).status == PASS  # 24 GPUs in total...
    result = C.check_nodes(AMD, uneven)
    # ...but not 3 whole nodes
    assert result.status == FAIL and result.detail.startswith("2 node(s) with >= 8 GPUs, the recipe needs 3")
    assert C.check_nodes(TINY, laptop_facts()).status == PASS
    assert C.check_nodes(TINY, laptop_facts(nodes=[NodeFacts("local", "127.0.0.1", 0.0, 1.0)])).status == FAIL


def test_accelerator_kind_and_arch():
    assert C.check_accelerator(AMD, amd_cluster_facts()).status == PASS
    nvidia = amd_cluster_facts(accelerator="cuda", arch="sm_90", device_name="NVIDIA H200")
    result = C.check_accelerator(AMD, nvidia)
    assert result.status == FAIL and "expects ROCm" in result.detail and "cluster.accelerator: cuda" in result.fix
    assert C.check_accelerator(AMD, amd_cluster_facts(arch="gfx950")).status == WARN


@pytest.mark.parametrize("accelerator, arch, expected", [
    ("rocm", "gfx942", "e4m3fnuz"), ("rocm", "gfx942:sramecc+:xnack-", "e4m3fnuz"), ("rocm", "gfx950", "e4m3fn"),
    ("cuda", "sm_90", "e4m3fn"), ("rocm", None, None), ("none", None, None),
])
def test_fp8_format_per_architecture(accelerator, arch, expected):
    assert C.fp8_format_for(accelerator, arch) == expected


def test_fp8_format_against_the_recipe():
    assert C.check_fp8_format(AMD, amd_cluster_facts()).status == PASS  # auto
    fn = load_recipe("amd-dsv4-flash-mi308x", ["rollout.fp8_format=e4m3fn"])
    wrong = C.check_fp8_format(fn, amd_cluster_facts())
    assert wrong.status == FAIL and "computes in e4m3fnuz" in wrong.detail and "auto" in wrong.fix
    assert C.check_fp8_format(fn, amd_cluster_facts(arch="gfx950")).status == PASS
    assert C.check_fp8_format(AMD, amd_cluster_facts(arch=None)).status == WARN  # GPU seen, arch unreadable
    bf16 = load_recipe("amd-dsv4-flash-mi308x", ["rollout.weight_format=bf16"])
    assert C.check_fp8_format(bf16, amd_cluster_facts()).status == SKIP
    assert "CPU mode" in C.check_fp8_format(TINY, laptop_facts()).detail


def _versions(**changes) -> Facts:
    return amd_cluster_facts(versions={**amd_cluster_facts().versions, **changes})


def test_versions_come_from_the_recipe_not_the_laptop():
    assert expected_versions(AMD) == {"python": "3.12", "torch": "2.11.0", "rocm": "7.2", "vllm": "0.25.1",
                                      "ray": "2.56.1", "transformers": "5.13.1", "megatron-core": None, "lumenrl": None,
                                      "transformer-engine": None}
    assert expected_versions(TINY)["torch"] == "2.13.0" and expected_versions(TINY)["rocm"] is None
    assert version_matches("2.11.0+gitd0c8b1f", "2.11.0") and version_matches("3.12.13", "3.12")
    assert version_matches("7.2.3", "7.2") and not version_matches("2.11.0", "2.1") and \
        not version_matches("7.1", "7.2")
    # AMD's image (ROCm torch 2.11, Python 3.12, Ray 2.56.1) passes; the laptop's versions would only WARN
    results = by_name(C.run_checks(AMD, amd_cluster_facts()))
    for row in ("python", "rocm", "torch", "ray_version", "transformers", "vllm", "megatron_core", "lumenrl"):
        assert results[row].status == PASS, results[row]
    assert results["torch"].detail == "torch 2.11.0+gitd0c8b1f (ROCm build) = 2.11.0"
    laptop_torch = C.check_torch(AMD, _versions(torch="2.13.0+rocm7.2"))
    assert laptop_torch.status == WARN and \
        laptop_torch.detail == "torch 2.13.0+rocm7.2, the recipe's cluster runs 2.11.0"
    assert C.check_python(AMD, _versions(python="3.11.7")).status == WARN
    assert C.check_ray_version(AMD, _versions(ray="2.60.0")).status == WARN
    assert C.check_transformers(AMD, _versions(transformers="5.24.0")).status == WARN
    assert C.check_transformers(AMD, _versions(transformers=None)).status == FAIL
    # the recipe decides: a cluster that runs torch 2.13 states it, and the same facts pass
    newer = load_recipe("amd-dsv4-flash-mi308x", ['cluster.versions.torch="2.13.0"'])
    assert C.check_torch(newer, _versions(torch="2.13.0+rocm7.2")).status == PASS


def test_platform_and_backend_versions():
    assert C.check_platform(AMD, _versions(rocm="6.4.1")).status == WARN
    assert C.check_platform(AMD, _versions(rocm=None, rocm_torch=None)).status == FAIL
    cpu_torch = C.check_torch(AMD, _versions(torch="2.13.0+cpu", rocm_torch=None))
    assert cpu_torch.status == FAIL and "CPU build" in cpu_torch.detail and "torch 2.11.0" in cpu_torch.fix
    assert C.check_torch(TINY, laptop_facts()).status == PASS
    assert C.check_vllm(AMD, _versions(vllm="0.24.0")).status == WARN
    missing = C.check_vllm(AMD, _versions(vllm=None))
    assert missing.status == FAIL and "vllm 0.25.1" in missing.fix
    assert C.check_megatron(AMD, _versions(**{"megatron-core": None})).status == FAIL
    # megatron's precision-aware optimizer (AMD: offloaded, BF16 moments) cannot be configured without TE
    missing_te = C.check_transformer_engine(AMD, _versions(**{"transformer-engine": None}))
    assert missing_te.status == FAIL and "precision-aware optimizer" in missing_te.detail
    no_te = load_recipe("amd-dsv4-flash-mi308x",
                        ["actor.optimizer_cpu_offload=false", "actor.optimizer_moment_dtype=fp32"])
    assert C.check_transformer_engine(no_te, _versions(**{"transformer-engine": None})).status == SKIP
    assert "recipe: any version" in C.check_megatron(AMD, amd_cluster_facts()).detail


def test_lumenrl_is_reported_and_required_only_when_the_recipe_names_a_commit():
    found = C.check_lumenrl(AMD, amd_cluster_facts())
    assert found.status == PASS
    assert found.detail == "LumenRL at /workspace/Lumen-RL, commit b039ba2966b70e234484d6c3086e052f1227c7e1"
    absent = amd_cluster_facts(lumenrl_path=None, lumenrl_commit=None)
    assert C.check_lumenrl(AMD, absent).status == SKIP
    pinned = load_recipe("amd-dsv4-flash-mi308x", ['cluster.versions.lumenrl="b039ba2"'])
    assert C.check_lumenrl(pinned, amd_cluster_facts()).status == PASS
    assert C.check_lumenrl(pinned, amd_cluster_facts(lumenrl_commit="0123abc")).status == WARN
    assert C.check_lumenrl(pinned, absent).status == FAIL
    no_record = C.check_lumenrl(AMD, amd_cluster_facts(lumenrl_commit=None))
    assert no_record.status == PASS and "commit unknown" in no_record.detail


def test_lumenrl_facts_from_a_checkout(tmp_path, monkeypatch):
    """gather_facts finds LumenRL without importing it and reads the commit of its own checkout."""
    from repro.readiness import facts as F

    checkout = tmp_path / "Lumen-RL"
    (checkout / "lumenrl").mkdir(parents=True)
    (checkout / "lumenrl" / "__init__.py").write_text("raise ImportError('must not be imported by repro check')\n")
    git = ["git", "-C", str(checkout), "-c", "user.email=t@t", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    monkeypatch.syspath_prepend(str(checkout))
    assert F._lumenrl() == (str(checkout), head)
    shutil.rmtree(checkout / ".git")  # an image copy: the build recorded the commit instead
    record = tmp_path / "SOURCE_VERSIONS"
    record.write_text("LumenRL=1234abcd\nLumen=ffff\n")
    monkeypatch.setattr(F, "IMAGE_SOURCE_VERSIONS", record)
    assert F._lumenrl() == (str(checkout), "1234abcd")


def test_rdma_and_rccl_variables():
    assert C.check_rdma(AMD, amd_cluster_facts(rdma_devices=[], rdma_source=None)).status == WARN
    unset = C.check_nccl_env(AMD, amd_cluster_facts(nccl_env={}))
    assert unset.status == WARN and "NCCL_IB_HCA (e.g. rdma0,rdma1)" in unset.detail and \
        "NCCL_SOCKET_IFNAME" in unset.detail
    typo = C.check_nccl_env(AMD, amd_cluster_facts(nccl_env={"NCCL_IB_HCA": "mlx5_0", "NCCL_SOCKET_IFNAME": "eth0"}))
    assert typo.status == FAIL and "mlx5_0" in typo.detail
    port = C.check_nccl_env(AMD, amd_cluster_facts(nccl_env={"NCCL_IB_HCA": "=rdma0:1", "NCCL_SOCKET_IFNAME": "eth0"}))
    assert port.status == PASS
    assert C.check_rdma(TINY, laptop_facts()).status == SKIP


def test_disk_for_checkpoints():
    from repro.run.run_dir import checkpoint_bytes

    need = checkpoint_bytes(AMD) * 3  # keep_last 2 + 1 being written: 284e9 x 14 B x 3 = 11.9 TB
    assert need == 284_000_000_000 * 14 * 3
    assert C.check_disk(AMD, amd_cluster_facts(disk_free_bytes=need - 1)).status == FAIL
    assert C.check_disk(AMD, amd_cluster_facts(disk_free_bytes=need + 1)).status == WARN
    assert C.check_disk(AMD, amd_cluster_facts(disk_free_bytes=2 * need)).status == PASS
    assert C.check_disk(AMD, amd_cluster_facts(disk_free_bytes=None)).status == WARN


def test_host_ram_for_the_offloaded_optimizer():
    from repro.readiness.memory_budget import memory_budget

    per_node = C.optimizer_bytes_per_node(AMD)
    # the dry run's budget: trainer node 0 holds stages 0 and 1 (4 ranks each), 16 host bytes per owned parameter
    assert per_node == max(memory_budget(AMD).node_host) == memory_budget(AMD).node_host[0]
    assert 2.3e12 < per_node < 2.35e12
    assert C.check_host_ram(AMD, amd_cluster_facts(host_ram_bytes=per_node - 1)).status == FAIL
    assert C.check_host_ram(AMD, amd_cluster_facts(host_ram_bytes=int(per_node / 0.9))).status == WARN
    assert C.check_host_ram(AMD, amd_cluster_facts(host_ram_bytes=3 * TB)).status == PASS
    no_offload = load_recipe("amd-dsv4-flash-mi308x", ["actor.optimizer_cpu_offload=false"])
    assert C.check_host_ram(no_offload, amd_cluster_facts()).status == SKIP
    assert C.check_host_ram(TINY, laptop_facts()).status == PASS


def test_dev_shm_for_staging_and_weight_sync():
    staged = C.check_shm(AMD, amd_cluster_facts())
    assert staged.status == PASS and "2 weight-sync buckets 4.3 GB" in staged.detail
    assert C.check_shm(AMD, amd_cluster_facts(model_staged=False)).status == PASS  # 900 GB free holds 568 GB
    unstaged = C.check_shm(AMD, amd_cluster_facts(model_staged=False, shm_free_bytes=500 * 10**9))
    assert unstaged.status == FAIL and "the BF16 model to stage 568.0 GB" in unstaged.detail and \
        "--shm-size" in unstaged.fix
    assert C.check_shm(AMD, amd_cluster_facts(shm_total_bytes=None, shm_free_bytes=None)).status == WARN
    assert C.check_shm(TINY, laptop_facts(shm_free_bytes=100 * 10**6)).status == FAIL  # Ray's 512 MiB store


def test_table_and_json(tmp_path):
    results = C.run_checks(AMD, amd_cluster_facts(nccl_env={}))
    table = C.format_table(results)
    assert table.splitlines()[0].split() == ["check", "status", "detail"]
    assert "fix: export them on every node" in table
    path = C.write_json(results, tmp_path / "sub" / "check.json")
    rows = json.loads(path.read_text())
    assert [set(r) for r in rows] == [{"check", "status", "detail", "fix"}] * len(C.CHECKS)


# -- the CLI on this machine ------------------------------------------------------------------------------------
# `repro check` through repro.cli.main (registering the command if cli.py does not list it yet)
CLI = ("import sys; from repro import cli; "
       "cli.COMMANDS.setdefault('check', ('repro.commands.check', 'cluster readiness')); sys.exit(cli.main())")


def _cli(tmp_path, recipe, *extra, env=None):
    out = tmp_path / f"{recipe}.json"
    done = subprocess.run([sys.executable, "-c", CLI, "check", "--recipe", recipe, "--json", str(out),
                           "--run-dir", str(tmp_path / "run"), *extra],
                          capture_output=True, text=True, timeout=300, cwd=repro.REPO_DIR,
                          env={**os.environ, **(env or {})})
    return done, json.loads(out.read_text())


def test_cli_tiny_recipe_is_cpu_mode_and_exits_0(tmp_path):
    done, rows = _cli(tmp_path, "tiny-cpu")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU mode" in done.stdout.splitlines()[0]
    assert not [r for r in rows if r["status"] == FAIL]
    assert {r["check"]: r["status"] for r in rows}["gpu_count"] == SKIP


def test_cli_amd_recipe_fails_gpu_count_and_exits_1(tmp_path):
    # a dead address via RAY_ADDRESS, as 'auto' resolves it: deterministic even if someone's Ray runs here
    done, rows = _cli(tmp_path, "amd-dsv4-flash-mi308x", env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert done.returncode == 1, done.stdout + done.stderr
    status = {r["check"]: r for r in rows}
    assert status["ray"]["status"] == FAIL and "127.0.0.1:1" in status["ray"]["detail"]
    assert status["gpu_count"]["status"] == FAIL and status["gpu_count"]["detail"].startswith("0 of 24 GPUs")
    assert "Traceback" not in done.stderr
    assert re.search(r"\ngpu_count +FAIL +0 of 24 GPUs", done.stdout)
