"""Which TPU VM software version ("runtime") a training run gets, from the accelerator type and TensorFlow.

`choose_runtime` decides it from a table, RUNTIMES, in which every entry names the documents it comes
from (docs/internals.md has them). On Keras' JAX backend there are no TPU servers to match: every host
gets the docs' base image for its generation (the table's single-host row), with jax[tpu] on top.
"""

import dataclasses
import re

from train import install_lines
from train.config import JAX, TENSORFLOW

# The newest tensorflow-tpu on the registry (no 2.21 exists): the one the [tpu] extra installs.
TENSORFLOW_TPU_VERSION = install_lines.TENSORFLOW_TPU_VERSION

RUNTIMES_DOC = "https://cloud.google.com/tpu/docs/runtimes"
HARNESS_REPO = "GoogleCloudPlatform/ml-auto-solutions"
HARNESS_DAG = f"{HARNESS_REPO}:dags/solutions_team/solutionsteam_tf_release_supported.py"
HARNESS_COMMON = f"{HARNESS_REPO}:dags/solutions_team/configs/tensorflow/common.py"


@dataclasses.dataclass(frozen=True)
class Generation:
    """A TPU generation as its accelerator types name it."""

    name: str  # v4, v5e, v5p, v6e, ...
    prefix: str  # how accelerator types start: v4, v5litepod, v5p, v6e
    cores_per_unit: int  # 2: the type's number counts TensorCores (two a chip); 1: it counts chips
    chips_per_host: int
    doc: str


GENERATIONS = {
    generation.prefix: generation
    for generation in (
        Generation("v2", "v2", 2, 4, "https://cloud.google.com/tpu/docs/v2"),
        Generation("v3", "v3", 2, 4, "https://cloud.google.com/tpu/docs/v3"),
        Generation("v4", "v4", 2, 4, "https://cloud.google.com/tpu/docs/v4"),
        Generation("v5e", "v5litepod", 1, 8, "https://cloud.google.com/tpu/docs/v5e"),
        Generation("v5p", "v5p", 2, 4, "https://cloud.google.com/tpu/docs/v5p"),
        Generation("v6e", "v6e", 1, 8, "https://cloud.google.com/tpu/docs/v6e"),
    )
}
EXAMPLE_TYPES = ("v4-8", "v4-32", "v5litepod-8", "v5litepod-16", "v5p-8", "v5p-32", "v6e-8", "v6e-16")


@dataclasses.dataclass(frozen=True)
class TpuType:
    """An accelerator type resolved: its generation, chips and hosts."""

    name: str
    generation: Generation
    chips: int

    @property
    def hosts(self) -> int:
        return -(-self.chips // self.generation.chips_per_host)

    @property
    def multi_host(self) -> bool:
        """Whether the slice spans several TPU VMs (TensorFlow then drives it from worker 0, pipelines/tpu/launch.py)."""
        return self.chips > self.generation.chips_per_host


def _unknown_type(accelerator_type: str, why: str) -> ValueError:
    return ValueError(
        f"--accelerator-type {accelerator_type!r}: {why}. Known TPU types are "
        f"{', '.join(prefix + '-N' for prefix in GENERATIONS)}, for example {', '.join(EXAMPLE_TYPES)}"
    )


def parse_accelerator_type(accelerator_type: str) -> TpuType:
    """v4-32 -> TpuType(v4, 16 chips, 4 hosts); ValueError listing the known types otherwise."""
    match = re.fullmatch(r"(v\d+[a-z]*)-(\d+)", accelerator_type.strip().lower())
    if not match:
        raise _unknown_type(accelerator_type, "not a TPU type")
    prefix, number = match.group(1), int(match.group(2))
    generation = GENERATIONS.get(prefix)
    if generation is None:
        raise _unknown_type(accelerator_type, f"unknown TPU generation {prefix!r}")
    if number < 1 or number % generation.cores_per_unit:
        raise _unknown_type(
            accelerator_type, f"{prefix} types count TensorCores, two a chip, so the number must be even"
        )
    return TpuType(name=accelerator_type, generation=generation, chips=number // generation.cores_per_unit)


@dataclasses.dataclass(frozen=True)
class RuntimeEntry:
    """One row of the runtime table: the `--version` to create the TPU VM with, and why."""

    version: str
    sources: tuple[str, ...]
    note: str
    tensorflow_preinstalled: bool = False  # every row is a base image: the launch installs tensorflow-tpu


_TF = TENSORFLOW_TPU_VERSION


def _installed_on(version, image, pod, *sources, extra=""):
    """An entry for a runtime without TensorFlow: `image` says whose image it is; tensorflow-tpu goes on top."""
    note = f"the docs name no tpu-vm-tf-{_TF} image, so {image}, with tensorflow-tpu {_TF} installed on top"
    if pod:
        note += (
            f"; each worker's TPU server (the tpu-runtime service) is moved to grpc_tpu_worker:tf-{_TF}-pjrt, the "
            "client's TensorFlow, as the harness's set_up_pjrt does"
        )
    return RuntimeEntry(version, sources, note + extra)


def _runtime_table() -> dict[tuple[str, str, bool], RuntimeEntry]:
    """(TensorFlow version, generation, multi-host) -> the runtime."""
    table = {}
    for generation in ("v2", "v3", "v4"):
        table[(_TF, generation, False)] = _installed_on(
            "tpu-ubuntu2204-base",
            f"the docs' base image for {generation} ('v4 and older')",
            False,
            RUNTIMES_DOC,
        )
    for generation in ("v2", "v3", "v4"):
        table[(_TF, generation, True)] = _installed_on(
            "v2-alpha-tpuv5",
            f"for a {generation} slice the image Google's TPU harness runs its TensorFlow v4-32 release test on "
            "(the docs do not say that tpu-ubuntu2204-base has the tpu-runtime service a slice's TPU servers need)",
            True, HARNESS_DAG, HARNESS_COMMON,
        )  # fmt: skip
    # From v5e on, the docs' base image of the generation: (its --version, the harness's single-host and slice
    # runs on it, if any).
    for generation, (version, *harness_runs) in {
        "v5e": ("v2-alpha-tpuv5-lite", "v5e-4", "v5e-16 slice"),
        "v5p": ("v2-alpha-tpuv5", "v5p-8", "v5p-32 slice"),
        "v6e": ("v2-alpha-tpuv6e", None, None),
    }.items():
        for pod, run in zip((False, True), harness_runs, strict=True):
            table[(_TF, generation, pod)] = _installed_on(
                version,
                f"the docs' base image for {generation}" + (f" (also the harness's {run})" if run else ""),
                pod, RUNTIMES_DOC, *([HARNESS_DAG] if run else []), *([HARNESS_COMMON] if pod else []),
                extra="; the harness runs no TensorFlow test on v6e, so this pairing of the docs' image and the "
                "harness's slice procedure is unverified on v6e hardware" if generation == "v6e" and pod else "",
            )  # fmt: skip
    return table


RUNTIMES = _runtime_table()


@dataclasses.dataclass(frozen=True)
class RuntimeChoice:
    """What a training run on `tpu` gets: the runtime, the TensorFlow, and where that comes from."""

    tpu: TpuType
    tensorflow_version: str
    runtime_version: str
    entry: RuntimeEntry | None  # None: the user gave --runtime-version
    backend: str = TENSORFLOW

    @property
    def software(self) -> str:
        """What trains on the TPU: tensorflow-tpu X, or jax[tpu] X."""
        if self.backend == JAX:
            return f"jax[tpu] {install_lines.JAX_VERSION}"
        return f"tensorflow-tpu {self.tensorflow_version}"

    def describe(self) -> str:
        hosts = f"{self.tpu.hosts} hosts, multi-host" if self.tpu.multi_host else "single host"
        why = (
            f"{self.entry.note} ({'; '.join(self.entry.sources)})"
            if self.entry
            else "given by --runtime-version"
        )
        return (
            f"{self.tpu.name}: {self.tpu.generation.name}, {self.tpu.chips} chips, {hosts}; runtime "
            f"{self.runtime_version} for {self.software}: {why}"
        )


def choose_runtime(
    accelerator_type: str,
    tensorflow_version: str = TENSORFLOW_TPU_VERSION,
    override: str | None = None,
    backend: str = TENSORFLOW,
) -> RuntimeChoice:
    """The runtime for `accelerator_type` and `tensorflow_version` from RUNTIMES (or `override`); ValueError
    for an accelerator type or TensorFlow version the table has no row for."""
    tpu = parse_accelerator_type(accelerator_type)
    if override:
        return RuntimeChoice(tpu, tensorflow_version, override, entry=None, backend=backend)
    if backend == JAX:
        # The single-host row is the docs' base image for the generation; a slice needs nothing else on JAX.
        base = RUNTIMES[(TENSORFLOW_TPU_VERSION, tpu.generation.name, False)]
        entry = RuntimeEntry(
            base.version,
            sources=(RUNTIMES_DOC,),
            note=f"the docs' base image for {tpu.generation.name}, on every host; the launch installs jax[tpu] "
            f"{install_lines.JAX_VERSION} on top, in a uv-managed Python {install_lines.JAX_PYTHON} (the image has "
            "3.10)",
        )
        return RuntimeChoice(tpu, tensorflow_version, entry.version, entry, backend=JAX)
    entry = RUNTIMES.get((tensorflow_version, tpu.generation.name, tpu.multi_host))
    if entry is None:
        known = sorted({tf for tf, _, _ in RUNTIMES})
        raise ValueError(
            f"no TPU runtime known for tensorflow-tpu {tensorflow_version} on {tpu.generation.name} "
            f"({'multi-host' if tpu.multi_host else 'single host'}); the table (pipelines/tpu/runtime.py) covers "
            f"tensorflow-tpu {', '.join(known)}. Pass --runtime-version to choose one yourself"
        )
    return RuntimeChoice(tpu, tensorflow_version, entry.version, entry)
