"""Each kind of node's /proc/PID/cgroup names its workload (tests/fixtures/cgroups/README.md cites where each
manager names its cgroups: SchedMD/slurm src/plugins/cgroup/v{1,2}, kubernetes pkg/kubelet/cm, runc's systemd
driver; the file format is man 7 cgroups, "/proc/[pid]/cgroup")."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.readers.cgroup import Workload, cgroup_paths, workload_of_cgroup, workload_of_path

FIXTURES = Path(__file__).parent / "fixtures" / "cgroups"

EXPECTED = {
    "slurm-v2.cgroup": Workload("slurm_job", "4242"),
    "slurm-v2-sluid.cgroup": Workload("slurm_job", "s0KCYH2W5T0G3R"),
    "slurm-v1.cgroup": Workload("slurm_job", "4243"),
    "k8s-systemd-containerd-burstable.cgroup": Workload("k8s_pod", "7c1e2b9a-3d4f-4e6a-8b2c-9f0d1e2a3b4c"),
    "k8s-systemd-crio-guaranteed.cgroup": Workload("k8s_pod", "0a8b7c6d-5e4f-4a3b-9c2d-1e0f9a8b7c6d"),
    "k8s-cgroupfs-docker-besteffort.cgroup": Workload("k8s_pod", "74c13223-5a00-11e9-b385-42010a80018d"),
    "docker-v2-systemd.cgroup": Workload(
        "container", "docker://5b1d3c8e9f0a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c"
    ),
    "docker-v1-cgroupfs.cgroup": Workload(
        "container", "docker://9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"
    ),
    "docker-rootless-v2.cgroup": Workload(
        "container", "docker://1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f801"
    ),
    "podman-v2-systemd.cgroup": Workload(
        "container", "podman://c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3"
    ),
    "podman-v1-cgroupfs.cgroup": Workload(
        "container", "podman://d1e2f3a4b5c60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"
    ),
    "systemd-service-v2.cgroup": Workload("systemd_unit", "vllm-inference.service"),
    "systemd-run-scope-v2.cgroup": Workload("systemd_unit", "run-r0f1e2d3c4b5a69788796a5b4c3d2e1f0.scope"),
    "login-session-v2.cgroup": None,
    "hybrid-systemd-service.cgroup": Workload("systemd_unit", "train.service"),
    # A tenant's own delegated subtree (user@UID.service), named to pose as Slurm job 4242 and as the simulated
    # node's pod: the user's scope, and the process itself (#31, item 3). A user's unit is theirs, not the system's.
    "tenant-forged-slurm-v2.cgroup": Workload("systemd_unit", "user@1000.service/evil_slurmstepd.scope"),
    "tenant-forged-pod-v2.cgroup": None,
    "systemd-user-service-v2.cgroup": Workload("systemd_unit", "user@1000.service/vllm-inference.service"),
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.cgroup")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_fixture_names_its_workload(name: str) -> None:
    assert workload_of_cgroup((FIXTURES / name).read_text()) == EXPECTED[name]


def test_slurm_v1_is_found_in_the_task_cgroup_controllers_not_in_name_systemd() -> None:
    """task/cgroup places tasks in cpuset, memory, devices, freezer (cgroup_v1.c); name=systemd keeps slurmd's
    service, so the systemd line alone would name the wrong workload."""
    text = (FIXTURES / "slurm-v1.cgroup").read_text()
    systemd_only = "\n".join(line for line in text.splitlines() if "name=systemd" in line)
    assert workload_of_cgroup(systemd_only) == Workload("systemd_unit", "slurmd.service")
    assert workload_of_cgroup(text) == Workload("slurm_job", "4243")


def test_the_pod_uid_comes_back_with_dashes_from_every_qos_class_and_driver() -> None:
    """escapeSystemdCgroupName turns the UID's "-" into "_" (kubelet cgroup_manager_linux.go); kube_pod_info{uid}
    has the dashes, so the join needs them back. Guaranteed pods have no QoS level."""
    uid = "1b2c3d4e-5f60-4718-8a9b-0c1d2e3f4a5b"
    under = uid.replace("-", "_")
    for path in (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{under}.slice/crio-{'a' * 64}.scope",
        f"/kubepods.slice/kubepods-pod{under}.slice/cri-containerd-{'b' * 64}.scope",
        f"/kubepods/burstable/pod{uid}/{'c' * 64}",
        f"/kubepods/pod{uid}/{'d' * 64}",
    ):
        assert workload_of_path(path) == Workload("k8s_pod", uid), path


def test_a_pod_directory_outside_kubepods_is_not_a_pod() -> None:
    assert workload_of_path(f"/system.slice/pod{'1' * 32}") is None


def test_a_job_directory_outside_slurm_is_not_a_slurm_job() -> None:
    assert workload_of_path("/system.slice/batch.service/job_12") == Workload("systemd_unit", "batch.service")
    # slurmstepd's own processes: the scope, not a job
    assert workload_of_path("/system.slice/slurmstepd.scope/system") == Workload("systemd_unit", "slurmstepd.scope")


def test_malformed_lines_are_skipped_not_fatal() -> None:
    text = "garbage\n7:memory\n0::relative/path\n\n0::/system.slice/a.service\n"
    assert cgroup_paths(text) == ["/system.slice/a.service"]
    assert workload_of_cgroup("") is None


def test_a_path_from_another_cgroup_namespace_keeps_its_workload() -> None:
    """Read from inside a cgroup namespace, a process outside shows as ``/../..`` relative to it (cgroup-v2.rst,
    "Namespace"); the components after it still name the workload."""
    assert workload_of_path("/../../system.slice/docker-" + "e" * 64 + ".scope") == Workload(
        "container", "docker://" + "e" * 64
    )


def test_a_cgroupfs_pod_seen_from_a_private_cgroup_namespace_is_still_a_pod() -> None:
    """An agent pod with hostPID but its own cgroup namespace (Kubernetes' default on cgroup v2) reads another pod of
    the cgroupfs driver as ``/../../../burstable/pod<UID>/<id>``: the path climbs out of the agent's own container
    (kubepods/burstable/pod<agent>/<agent id>) to kubepods, which it no longer names (kernel
    Documentation/admin-guide/cgroup-v2.rst, "Namespace": paths outside the namespace root are shown relative to
    it). kubelet's cgroupfs names (pkg/kubelet/cm/cgroup_manager_linux.go) under kubepods still identify the pod;
    a guaranteed pod sits right under kubepods."""
    uid = "6f1c5d52-0a9e-4b34-9a51-2f3c1d1e0b7a"
    assert workload_of_path(f"/../../../burstable/pod{uid}/" + "c" * 64) == Workload("k8s_pod", uid)
    assert workload_of_path(f"/../../pod{uid}/" + "c" * 64) == Workload("k8s_pod", uid)
    # Not climbed out, not under kubepods: a directory that merely looks like a pod is no pod.
    assert workload_of_path(f"/machine.slice/pod{uid}") is None


# Where the daemons make their cgroups (#31, item 3). Slurm, SchedMD/slurm commit 284c3b95f08a:
# src/plugins/cgroup/v2/cgroup_v2.c lines 67-68 (DEFAULT_SYSTEM_CGSLICE "system.slice", SYSTEM_CGSCOPE "slurmstepd"),
# 436-447 (_set_int_cg_ns: "%s/%s/%s.scope" or "%s/%s/%s_%s.scope" of init_cg_path, CgroupSlice, node name),
# 1931-1937 ("/job_%u" or the SLUID), 1955 ("%s/step_%s"); cgroup/v1: src/interfaces/cgroup.c 196-198
# (CgroupPrepend "/slurm", "/slurm_%n"), src/plugins/cgroup/v1/xcgroup.c 414 ("%s/uid_%u"), 424 ("%s/job_%u").
# kubelet, kubernetes/kubernetes commit afd5df58bd7d: pkg/kubelet/cm/node_container_manager_linux.go
# (defaultNodeAllocatableCgroupName "kubepods", under the cgroup root), qos_container_manager_linux.go (besteffort and
# burstable under it, Guaranteed pods directly), cgroup_manager_linux.go (CgroupName.ToSystemd: every level a slice
# named for all its parents joined with "-", ToCgroupfs: "/" + path.Join). A user's manager gets its subtree
# delegated (systemd units/user@.service.in, Delegate=; systemd.io/CGROUP_DELEGATION: the delegatee may create
# sub-cgroups as it likes), so a name below it proves nothing.
USER = "/user.slice/user-1000.slice/user@1000.service"
UID = "7c1e2b9a-3d4f-4e6a-8b2c-9f0d1e2a3b4c"
SYSTEMD_UID = UID.replace("-", "_")
CONTAINER = "a" * 64


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # the two forgeries
        (
            f"{USER}/app.slice/evil_slurmstepd.scope/job_4242/step_0",
            Workload("systemd_unit", "user@1000.service/evil_slurmstepd.scope"),
        ),
        (f"{USER}/kubepods-pod{SYSTEMD_UID}.slice/x", None),
        # the daemon's exact names, below the user's manager
        (
            f"{USER}/app.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
            Workload("systemd_unit", "user@1000.service/slurmstepd.scope"),
        ),
        (
            f"{USER}/app.slice/slurmstepd.scope/s0KCYH2W5T0G3R/step_0/user/task_0",
            Workload("systemd_unit", "user@1000.service/slurmstepd.scope"),
        ),
        (
            f"{USER}/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0",
            Workload("systemd_unit", "user@1000.service/slurmstepd.scope"),
        ),
        (f"{USER}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/x", None),
        (
            f"{USER}/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CONTAINER}.scope",
            Workload("container", f"containerd://{CONTAINER}"),
        ),
        (
            f"{USER}/app.slice/run.service/kubepods/burstable/pod{UID}/{CONTAINER}",
            Workload("systemd_unit", "user@1000.service/run.service"),
        ),
        (f"{USER}/slurm/uid_1000/job_4242/step_0", None),  # cgroup v1's name=systemd, delegated to the user
        # a system service with Delegate=yes makes names below itself: still that service
        (
            "/system.slice/ci-runner.service/slurmstepd.scope/job_4242/step_0/user/task_0",
            Workload("systemd_unit", "ci-runner.service"),
        ),
        (
            "/system.slice/ci-runner.service/system.slice/slurmstepd.scope/job_4242/step_0",
            Workload("systemd_unit", "ci-runner.service"),
        ),
        (
            f"/system.slice/ci-runner.service/kubepods-pod{SYSTEMD_UID}.slice/x",
            Workload("systemd_unit", "ci-runner.service"),
        ),
        ("/system.slice/ci-runner.service/slurm/uid_0/job_4242/step_0", Workload("systemd_unit", "ci-runner.service")),
        ("/system.slice/ci-runner.service/vllm-inference.service", Workload("systemd_unit", "ci-runner.service")),
        # the right names at the wrong depth or under the wrong parent
        (
            "/slurmstepd.scope/job_4242/step_0",  # slurmstepd's scope is in CgroupSlice, not in the root slice
            Workload("systemd_unit", "slurmstepd.scope"),
        ),
        ("/system.slice/slurmstepd.scope/x/job_4242/step_0", Workload("systemd_unit", "slurmstepd.scope")),
        ("/uid_1000/job_4242/step_0", None),  # cgroup v1: under CgroupPrepend
        ("/other/uid_1000/job_4242/step_0", None),
        (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice", None),
        (f"/kubepods.slice/kubepods-burstable.slice/x.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice", None),
        (f"/kubepods-pod{SYSTEMD_UID}.slice", None),
        (f"/kubepods/burstable/x/pod{UID}/{CONTAINER}", None),
        (f"/system.slice/kubepods/pod{UID}", None),
        # outside the namespace: the components after the climb still start where the daemon's hierarchy is
        (
            f"/../../..{USER}/app.slice/evil_slurmstepd.scope/job_4242/step_0",
            Workload("systemd_unit", "user@1000.service/evil_slurmstepd.scope"),
        ),
        (f"/../../..{USER}/burstable/pod{UID}/{CONTAINER}", None),
        (f"/../..{USER}/kubepods-burstable-pod{SYSTEMD_UID}.slice/x", None),
        # ".." after a name is never the kernel's (it writes the climb first): no workload from it
        (f"/system.slice/x.service/../../kubepods/pod{UID}/{CONTAINER}", None),
    ],
)
def test_names_a_tenant_can_make_never_read_as_a_job_or_pod(path: str, expected: Workload | None) -> None:
    """#31 (3): a directory named like slurmstepd's or kubelet's counts only where the daemon makes it; anywhere else
    it is the unit or process it really is, so its GPU time and energy never add to someone's job or pod."""
    assert workload_of_path(path) == expected
    assert workload_of_cgroup(f"0::{path}\n") == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", Workload("slurm_job", "4242")),
        ("/system.slice/slurmstepd.scope/job_4242/step_batch/slurm", Workload("slurm_job", "4242")),
        ("/system.slice/node07_slurmstepd.scope/job_4242/step_extern/user/task_special", Workload("slurm_job", "4242")),
        ("/slurm.slice/slurmstepd.scope/s0KCYH2W5T0G3R/step_0/user/task_0", Workload("slurm_job", "s0KCYH2W5T0G3R")),
        ("/slurm/uid_1000/job_4243/step_0/task_0", Workload("slurm_job", "4243")),
        ("/slurm_node07/uid_1000/job_4243/step_0", Workload("slurm_job", "4243")),
        # climbed out of the agent's cgroup namespace, to the root or to the daemon's own levels
        ("/../../../system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", Workload("slurm_job", "4242")),
        ("/../slurmstepd.scope/job_4242/step_0/user/task_0", Workload("slurm_job", "4242")),
        (f"/../../../kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/crio-{CONTAINER}.scope", Workload("k8s_pod", UID)),
        (f"/../../kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/x", Workload("k8s_pod", UID)),
        (f"/../kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CONTAINER}.scope", Workload("k8s_pod", UID)),
        # slurmstepd's own processes, and the user's real units
        ("/system.slice/slurmstepd.scope/system", Workload("systemd_unit", "slurmstepd.scope")),
        (
            f"{USER}/app.slice/run-r0f1e2d3c4b5a6978.scope",
            Workload("systemd_unit", "user@1000.service/run-r0f1e2d3c4b5a6978.scope"),
        ),
        (f"{USER}/init.scope", None),
    ],
)
def test_the_daemons_own_paths_still_name_their_workloads(path: str, expected: Workload | None) -> None:
    """The anchoring keeps every place Slurm and kubelet really make their cgroups (sources above)."""
    assert workload_of_path(path) == expected
