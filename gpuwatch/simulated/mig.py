"""MIG on a simulated GPU: the H100 80GB's GPU instance profiles, the layout a test or scenario gives a GPU, and the
live state of its GPU instances, compute instances and the jobs running in them.

The numbers are an H100 80GB HBM3's as its driver lists them (`nvidia-smi mig -lgip` / `-lgipp` on that GPU: profile
IDs 19/20/15/14/9/5/0, 16/16/26/32/60/64/132 SMs, 9.75/9.75/19.62/19.62/39.50/39.50/79.25 GiB, placements
{0..6}:1, {0,2,4,6}:2, {0,2,4}:2, {0,4}:4, {0}:4, {0}:8; NVIDIA's MIG user guide, "Supported MIG Profiles", gives the
same profile names and instance counts for the H100). The profile *enum* each answers to (the `profile` argument of
nvmlDeviceGetGpuInstanceProfileInfo) is nvml.h's NVML_GPU_INSTANCE_PROFILE_* (go-nvml gen/nvml/nvml.h, NVML 13.3.29,
lines 12496-12529): 1_SLICE 0x0, 2_SLICE 0x1, 3_SLICE 0x2, 4_SLICE 0x3, 7_SLICE 0x4, 1_SLICE_REV1 (+me) 0x7,
1_SLICE_REV2 (twice the memory) 0x9.

What the simulation decides where no source says (docs/simulation.md, "MIG"): GPU instance IDs follow the memory
slice a placement starts at (4-slice at 4 -> 1, at 0 -> 2; 2-slice at 4/6/0/2 -> 3/4/5/6; 1-slice at 4,5,6,7,0,1,2,3
-> 7..14; the whole GPU -> 0), as an A100 numbered `4g.20gb` at 0:4, `2g.10gb` at 4:2 and `1g.5gb` at 6:1 with IDs 2,
3 and 9; a compute instance of c slices inside a GPU instance has c x 16 SMs (one H100 slice's) unless it spans the
whole GPU instance; a job uses 90 % of its GPU instance's memory.
"""

from __future__ import annotations

import hashlib
import uuid as uuid_module
from dataclasses import dataclass, field, replace

from gpuwatch.simulated import nvml_constants as c

MIB = 1 << 20
MAX_MIG_DEVICES = 7  # an H100's seven compute slices: at most seven MIG devices (nvmlDeviceGetMaxMigDeviceCount)
MEMORY_SLICES = 8
SMS_PER_SLICE = 16  # an H100 1g instance's SMs
JOB_MEMORY_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """One line of `nvidia-smi mig -lgip`: nvmlGpuInstanceProfileInfo_t's fields, and where it can be placed."""

    profile: int  # NVML_GPU_INSTANCE_PROFILE_*: what nvmlDeviceGetGpuInstanceProfileInfo takes
    id: int  # the profile ID: what nvmlDeviceGetGpuInstances and nvmlGpuInstanceInfo_t.profileId use
    name: str  # without nvidia-smi's "MIG " prefix
    slices: int  # compute (GPU) slices: sliceCount
    instance_count: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpegs: int
    ofas: int
    memory_mib: int
    memory_slices: int  # the placement's size
    placements: tuple[int, ...]  # the memory slices a placement may start at

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


# nvidia-smi mig -lgip on an H100 80GB HBM3 (Memory GiB x 1024 = MiB: 9.75 -> 9984, 19.62 -> 20096, 39.50 -> 40448,
# 79.25 -> 81152), -lgipp for the placements.
# NVML_GPU_INSTANCE_PROFILE_<suffix>, ID, name, slices, instances, SMs, CE, DEC, ENC, JPEG, OFA, MiB, memory slices,
# placements.
_H100_80GB_ROWS = (
    ("1_SLICE", 19, "1g.10gb", 1, 7, 16, 1, 1, 0, 1, 0, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
    ("1_SLICE_REV1", 20, "1g.10gb+me", 1, 1, 16, 1, 1, 0, 1, 1, 9984, 1, (0, 1, 2, 3, 4, 5, 6)),
    ("1_SLICE_REV2", 15, "1g.20gb", 1, 4, 26, 1, 1, 0, 1, 0, 20096, 2, (0, 2, 4, 6)),
    ("2_SLICE", 14, "2g.20gb", 2, 3, 32, 2, 2, 0, 2, 0, 20096, 2, (0, 2, 4)),
    ("3_SLICE", 9, "3g.40gb", 3, 2, 60, 3, 3, 0, 3, 0, 40448, 4, (0, 4)),
    ("4_SLICE", 5, "4g.40gb", 4, 1, 64, 4, 4, 0, 4, 0, 40448, 4, (0,)),
    ("7_SLICE", 0, "7g.80gb", 7, 1, 132, 8, 7, 0, 7, 1, 81152, 8, (0,)),
)
H100_80GB_PROFILES: tuple[GpuInstanceProfile, ...] = tuple(
    GpuInstanceProfile(getattr(c, f"NVML_GPU_INSTANCE_PROFILE_{row[0]}"), *row[1:]) for row in _H100_80GB_ROWS
)
PROFILES_BY_NAME = {p.name: p for p in H100_80GB_PROFILES}
PROFILES_BY_ENUM = {p.profile: p for p in H100_80GB_PROFILES}
PROFILES_BY_ID = {p.id: p for p in H100_80GB_PROFILES}

# GPU instance ID by (placement size, start): see the module's docstring.
_GI_IDS: dict[tuple[int, int], int] = {
    (8, 0): 0,
    (4, 4): 1,
    (4, 0): 2,
    **{(2, start): gi for start, gi in zip((4, 6, 0, 2), (3, 4, 5, 6), strict=True)},
    **{(1, start): gi for start, gi in zip((4, 5, 6, 7, 0, 1, 2, 3), range(7, 15), strict=True)},
}

# Compute instance profiles (NVML_COMPUTE_INSTANCE_PROFILE_*, nvml.h lines 12645-12654) by compute slice count.
CI_PROFILE_BY_SLICES = {
    1: c.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: c.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: c.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: c.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    7: c.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
}


@dataclass(frozen=True, slots=True)
class MigInstanceSpec:
    """One GPU instance a layout asks for: its profile by name (`3g.40gb`), optionally its placement and ID (else
    the first free placement and the ID it gives), its compute instances by compute slice count (None: one over the
    whole GPU instance) and the workload of a job running in its first compute instance (an activity.py profile:
    busy, training, ...; None: no process)."""

    profile: str
    start: int | None = None
    gpu_instance_id: int | None = None
    compute_slices: tuple[int, ...] | None = None
    job: str | None = None


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A GPU's MIG mode and instances. `enabled` is the current mode; `pending` the mode after the next GPU reset
    (None: the same). A GPU whose current mode is disabled has no instances, whatever `instances` says."""

    instances: tuple[MigInstanceSpec, ...] = ()
    enabled: bool = True
    pending: bool | None = None


# The scenario `mig`: one GPU split into a 3g.40gb and two 2g.20gb instances, a job in the 3g.40gb. The two
# 2g.20gb take memory slices 0-3 (placements {0,2,4}), the 3g.40gb 4-7 (placements {0,4}).
SCENARIO_LAYOUT = MigLayout(
    (
        MigInstanceSpec("3g.40gb", start=4, job="training"),
        MigInstanceSpec("2g.20gb", start=0),
        MigInstanceSpec("2g.20gb", start=2),
    )
)


@dataclass(frozen=True, slots=True)
class ComputeInstance:
    id: int  # unique within its GPU instance, from 0
    slices: int
    start: int  # its first compute slice within the GPU instance
    serial: int  # which creation: a MIG device's UUID is new when its instance is created anew
    job: str | None = None  # the workload of the process running in it
    job_since: float = 0.0  # node seconds when the job started
    pid: int = 0


@dataclass(frozen=True, slots=True)
class GpuInstance:
    id: int
    profile: GpuInstanceProfile
    start: int  # memory slice its placement starts at
    serial: int
    compute_instances: tuple[ComputeInstance, ...] = ()


@dataclass(frozen=True, slots=True)
class MigDevice:
    """A MIG device: one compute instance of one GPU instance (nvml.h line 13337: "A MIG device handle is an NVML
    abstraction which maps to a MIG compute instance"), with its index under its parent."""

    gpu: int
    index: int
    gpu_instance: GpuInstance
    compute_instance: ComputeInstance
    uuid: str

    @property
    def key(self) -> tuple[int, int, int]:
        """What identifies it for its lifetime: its GPU and the creation serials of its two instances."""
        return (self.gpu, self.gpu_instance.serial, self.compute_instance.serial)

    @property
    def multiprocessors(self) -> int:
        gi = self.gpu_instance
        return compute_multiprocessors(gi, self.compute_instance.slices)

    @property
    def name(self) -> str:
        """The profile as nvidia-smi names a MIG device: `3g.40gb`, or `1c.3g.40gb` for a compute instance of one
        slice of a 3g.40gb."""
        gi = self.gpu_instance
        slices = self.compute_instance.slices
        return gi.profile.name if slices == gi.profile.slices else f"{slices}c.{gi.profile.name}"


def compute_multiprocessors(gi: GpuInstance, slices: int) -> int:
    return gi.profile.multiprocessors if slices == gi.profile.slices else slices * SMS_PER_SLICE


@dataclass(slots=True)
class MigState:
    """One GPU's MIG mode and instances as they are now (mutated under the node's lock)."""

    enabled: bool
    pending: bool
    instances: dict[int, GpuInstance] = field(default_factory=dict)
    serial: int = 0

    def next_serial(self) -> int:
        self.serial += 1
        return self.serial


@dataclass(frozen=True, slots=True)
class MigView:
    """A snapshot of one GPU's MIG state: its modes and its GPU instances by ID."""

    enabled: bool
    pending: bool
    instances: tuple[GpuInstance, ...]

    def gpu_instance(self, gi_id: int) -> GpuInstance | None:
        return next((gi for gi in self.instances if gi.id == gi_id), None)


def mig_uuid(seed: int, gpu: int, gi: GpuInstance, ci: ComputeInstance) -> str:
    """A MIG device's UUID, `MIG-` and a UUID (nvml.h line 5170: "globally unique UUIDs ... immutable for the lifetime
    of a MIG device"): derived from the creations of its instances, so an instance created anew has a new one."""
    digest = hashlib.sha256(f"gpuwatch-sim-mig:{seed}:{gpu}:{gi.id}:{gi.serial}:{ci.id}:{ci.serial}".encode()).digest()
    return "MIG-" + str(uuid_module.UUID(bytes=digest[:16]))


def devices(seed: int, gpu: int, view: MigView | None) -> tuple[MigDevice, ...]:
    """The GPU's MIG devices in index order: by GPU instance ID, then compute instance ID, indices 0..n-1."""
    if view is None or not view.enabled:
        return ()
    pairs = [(gi, ci) for gi in sorted(view.instances, key=lambda g: g.id) for ci in gi.compute_instances]
    return tuple(MigDevice(gpu, i, gi, ci, mig_uuid(seed, gpu, gi, ci)) for i, (gi, ci) in enumerate(pairs))


def new_state(layout: MigLayout) -> MigState:
    """A GPU's MIG state from its layout, instances validated as the driver would create them one by one."""
    pending = layout.enabled if layout.pending is None else layout.pending
    state = MigState(enabled=layout.enabled, pending=pending)
    if layout.enabled:
        for spec in layout.instances:
            create(state, spec, now=0.0, pid=0)
    return state


def create(state: MigState, spec: MigInstanceSpec, *, now: float, pid: int) -> GpuInstance:
    """Create a GPU instance (and its compute instances) in `state`; ValueError naming what is wrong when the driver
    would refuse it (nvml.h nvmlDeviceCreateGpuInstanceWithPlacement, line 12992: INSUFFICIENT_RESOURCES)."""
    if not state.enabled:
        raise ValueError(
            "MIG mode is disabled on this GPU: enable it (MigLayout(enabled=True)) before creating instances"
        )
    profile = PROFILES_BY_NAME.get(spec.profile)
    if profile is None:
        raise ValueError(f"unknown MIG profile {spec.profile!r}; an H100 80GB has {', '.join(PROFILES_BY_NAME)}")
    used = {slot for gi in state.instances.values() for slot in _memory_slots(gi.profile, gi.start)}
    same = sum(1 for gi in state.instances.values() if gi.profile.id == profile.id)
    if same >= profile.instance_count:
        raise ValueError(f"{spec.profile}: at most {profile.instance_count} on one GPU")
    if sum(gi.profile.slices for gi in state.instances.values()) + profile.slices > MAX_MIG_DEVICES:
        raise ValueError(f"{spec.profile}: not enough free compute slices left on the GPU")
    starts = profile.placements if spec.start is None else (spec.start,)
    if spec.start is not None and spec.start not in profile.placements:
        raise ValueError(
            f"{spec.profile} cannot start at memory slice {spec.start}; its placements: {profile.placements}"
        )
    start = next((s for s in starts if not used & _memory_slots(profile, s)), None)
    if start is None:
        raise ValueError(f"{spec.profile}: no free placement (memory slices taken: {sorted(used)})")
    gi_id = _GI_IDS[(profile.memory_slices, start)] if spec.gpu_instance_id is None else spec.gpu_instance_id
    if gi_id in state.instances:
        raise ValueError(f"GPU instance ID {gi_id} is already taken")
    slices = spec.compute_slices or (profile.slices,)
    if sum(slices) > profile.slices or any(s not in CI_PROFILE_BY_SLICES or s > profile.slices for s in slices):
        raise ValueError(f"compute instances of {slices} slices do not fit a {spec.profile} ({profile.slices} slices)")
    cis: list[ComputeInstance] = []
    offset = 0
    for ci_id, count in enumerate(slices):
        job = spec.job if ci_id == 0 else None
        cis.append(ComputeInstance(ci_id, count, offset, state.next_serial(), job, now, pid if job else 0))
        offset += count
    gi = GpuInstance(gi_id, profile, start, state.next_serial(), tuple(cis))
    state.instances[gi_id] = gi
    return gi


def destroy(state: MigState, gi_id: int) -> None:
    """Destroy a GPU instance and its compute instances; ValueError when it has none of that ID or a process runs in
    it (nvml.h nvmlGpuInstanceDestroy, line 13010: NVML_ERROR_IN_USE "if processes ... are active")."""
    gi = state.instances.get(gi_id)
    if gi is None:
        raise ValueError(f"no GPU instance {gi_id} (there are {sorted(state.instances)})")
    if any(ci.job for ci in gi.compute_instances):
        raise ValueError(f"GPU instance {gi_id} is in use: a process runs in it (end its job first)")
    del state.instances[gi_id]


def set_job(state: MigState, gi_id: int, job: str | None, *, now: float, pid: int) -> None:
    """Start (a workload name) or end (None) the job in a GPU instance's first compute instance."""
    gi = state.instances.get(gi_id)
    if gi is None:
        raise ValueError(f"no GPU instance {gi_id} (there are {sorted(state.instances)})")
    first, *rest = gi.compute_instances
    state.instances[gi_id] = replace(
        gi, compute_instances=(replace(first, job=job, job_since=now, pid=pid if job else 0), *rest)
    )


def view(state: MigState) -> MigView:
    return MigView(state.enabled, state.pending, tuple(sorted(state.instances.values(), key=lambda g: g.id)))


def _memory_slots(profile: GpuInstanceProfile, start: int) -> set[int]:
    return set(range(start, start + profile.memory_slices))
