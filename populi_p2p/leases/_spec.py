"""`TaskSpec`: what to run and on what, immutable, content-addressed, signed.

The task id is the hash of the canonical msgpack encoding of the spec, so two replicas
that hold the same id hold the same spec (a forged spec cannot reuse an id), and the
spec part of the lease lattice never conflicts. The accepting node signs the encoding;
signing and verifying are callables passed in, so this package needs no key types.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
import msgpack

#: Signs bytes with the local node's key (e.g. `identity.sign` with a context string).
Signer = Callable[[bytes], bytes]
#: `verify(node_id, data, signature) -> bool`: checks a signature by `node_id`.
Verifier = Callable[[str, bytes, bytes], bool]

#: Hex characters of a task id (blake2b-128): collisions need 2**64 submissions.
TASK_ID_CHARS = 32
SPEC_VERSION = 1
#: Named bounds on a spec; each keeps one entry (and one delta) small.
COMMAND_ARGS_MAX = 64
COMMAND_BYTES_MAX = 4096
ENV_ENTRIES_MAX = 64
ENV_BYTES_MAX = 4096
LABELS_MAX = 32
LABEL_CHARS_MAX = 64
NODE_ID_CHARS_MAX = 128
GPU_COUNT_MAX = 64
TIMEOUT_MAX = 30 * 86400.0
RETRY_LIMIT_MAX = 8
#: Members of a task's replica set (the granters of its epochs) at most.
REPLICAS_MAX = 7
SIZE_MAX = 1 << 50  # bytes; anything larger is a typo, not a machine
#: Blob inputs of one task at most (model files, `submit --input` files).
INPUTS_MAX = 64
#: An input's name: what the task sees it as (a file name, no path).
INPUT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: Outputs one task declares at most (`submit --output PATH`).
OUTPUTS_MAX = 16
#: An output's path: relative to the work dir, components of [A-Za-z0-9._-], no `..`.
_OUTPUT_PART = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}"
OUTPUT_PATH = re.compile(rf"{_OUTPUT_PART}(/{_OUTPUT_PART}){{0,7}}")
OUTPUT_PATH_CHARS_MAX = 128
#: Replicas of one deployment at most.
DEPLOY_REPLICAS_MAX = 64
#: Characters of a deployment's name (the model id clients ask for) at most.
DEPLOY_NAME_CHARS_MAX = 128
#: Largest context length a deployment may ask of its engine.
DEPLOY_CTX_MAX = 1 << 24

SPEC_CONTEXT = b"populi-lease-spec\x00"

#: Why a new spec asking for VRAM but no GPUs is refused (VRAM is per GPU, so with no
#: GPUs it would be silently ignored), and how to fix it.
VRAM_WITHOUT_GPUS = "--vram needs --gpus N (the VRAM is per GPU); add --gpus 1"


class TaskKind(enum.Enum):
    """The kind of work; a node can be degraded for one kind and fine for another."""

    INFERENCE = "inference"
    TRAINING = "training"
    AGENT = "agent"
    BATCH = "batch"


def _labels(value: Any) -> frozenset[str]:
    return frozenset(value)


def _node_ids(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _env(value: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(value.items()))


@attrs.frozen
class Requirements:
    """What a node must offer to run the task (Layer A/B capacity and Layer C labels)."""

    gpu_count: int = 0
    vram_per_gpu: int = 0  # bytes
    compute_capability_min: tuple[int, int] = (0, 0)
    cpu_cores: float = 0.0
    ram: int = 0  # bytes
    labels_required: frozenset[str] = attrs.field(default=frozenset(), converter=_labels)
    labels_preferred: frozenset[str] = attrs.field(default=frozenset(), converter=_labels)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.gpu_count <= GPU_COUNT_MAX:
            raise ValueError(f"gpu_count must be in 0..{GPU_COUNT_MAX}, got {self.gpu_count}")
        for name in ("vram_per_gpu", "ram"):
            v = getattr(self, name)
            if not 0 <= v <= SIZE_MAX:
                raise ValueError(f"{name} must be a size in 0..{SIZE_MAX} bytes, got {v}")
        if not 0 <= self.cpu_cores <= 4096:
            raise ValueError(f"cpu_cores must be in 0..4096, got {self.cpu_cores}")
        cc = self.compute_capability_min
        if len(cc) != 2 or min(cc) < 0 or max(cc) > 99:
            raise ValueError(f"compute_capability_min must be (major, minor) in 0..99, got {cc}")
        for name in ("labels_required", "labels_preferred"):
            labels = getattr(self, name)
            if len(labels) > LABELS_MAX:
                raise ValueError(f"{name}: at most {LABELS_MAX} labels, got {len(labels)}")
            for label in labels:
                if not isinstance(label, str) or not 0 < len(label) <= LABEL_CHARS_MAX:
                    raise ValueError(f"{name}: each label is 1..{LABEL_CHARS_MAX} characters")


@attrs.frozen
class BlobInput:
    """A blob the task needs before it starts, named in the signed spec by its hash:
    the owner fetches it from any holder and checks the hash (docs/models.md)."""

    name: str  # what the task sees it as (`INPUT_NAME`)
    sha256: str  # 64 lower-case hex characters
    size: int  # bytes
    #: The blob is a tar of a directory (`submit --input DIR`): the owner extracts it
    #: into a directory `name`. Encoded as a fourth element only when true.
    unpack: bool = False

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not INPUT_NAME.fullmatch(self.name):
            raise ValueError(f"input name {self.name!r}: 1..64 of [A-Za-z0-9._-], no path")
        if not isinstance(self.sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"input {self.name}: sha256 must be 64 lower-case hex characters")
        if type(self.size) is not int or not 0 <= self.size <= SIZE_MAX:
            raise ValueError(f"input {self.name}: size must be 0..{SIZE_MAX} bytes")
        if not isinstance(self.unpack, bool):
            raise ValueError(f"input {self.name}: unpack must be true or false")

    def to_wire(self) -> list[Any]:
        return [self.name, self.sha256, self.size, *([True] if self.unpack else [])]

    @classmethod
    def from_wire(cls, raw: Any) -> BlobInput:
        if not isinstance(raw, list) or len(raw) not in (3, 4):
            raise ValueError("bad input layout")
        if len(raw) == 4 and raw[3] is not True:
            raise ValueError("unpack is encoded only when true")  # one spec, one encoding
        return cls(*raw)


@attrs.frozen
class Deployment:
    """What makes a task a replica of a deployed model (`populi-node deploy`): the
    owner runs the engine on the input named ``model`` and advertises it as `name`."""

    name: str  # the model id clients ask for
    index: int  # this replica, 0..replicas-1
    replicas: int  # how many the deployment has
    ctx: int = 0  # context length asked of the engine (0: its default)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= DEPLOY_NAME_CHARS_MAX:
            raise ValueError(f"deployment name: 1..{DEPLOY_NAME_CHARS_MAX} characters")
        if any(ch.isspace() or not ch.isprintable() for ch in self.name):
            raise ValueError("deployment name: no spaces or control characters")
        if type(self.replicas) is not int or not 0 < self.replicas <= DEPLOY_REPLICAS_MAX:
            raise ValueError(f"replicas must be 1..{DEPLOY_REPLICAS_MAX}")
        if type(self.index) is not int or not 0 <= self.index < self.replicas:
            raise ValueError(f"replica index must be 0..{self.replicas - 1}")
        if type(self.ctx) is not int or not 0 <= self.ctx <= DEPLOY_CTX_MAX:
            raise ValueError(f"ctx must be 0..{DEPLOY_CTX_MAX} tokens")

    def to_wire(self) -> list[Any]:
        return [self.name, self.index, self.replicas, self.ctx]

    @classmethod
    def from_wire(cls, raw: Any) -> Deployment:
        if not isinstance(raw, list) or len(raw) != 4:
            raise ValueError("bad deployment layout")
        return cls(*raw)


def _inputs(value: Iterable[BlobInput]) -> tuple[BlobInput, ...]:
    return tuple(sorted(value, key=lambda i: i.name))


def check_output_path(path: Any) -> str:
    """`path` if it names an output the owner may collect: relative to the work dir,
    plain components, no `..` (one line otherwise)."""
    if (
        not isinstance(path, str)
        or len(path) > OUTPUT_PATH_CHARS_MAX
        or not OUTPUT_PATH.fullmatch(path)
        or any(part in (".", "..") for part in path.split("/"))
    ):
        raise ValueError(
            f"output {path!r}: a path relative to the work dir, at most"
            f" {OUTPUT_PATH_CHARS_MAX} characters of [A-Za-z0-9._-/], no '..'"
        )
    return path


def _outputs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(set(value)))


@attrs.frozen
class TaskSpec:
    """An immutable task: kind, requirements, command and limits, and who accepted it.

    Construction validates every field against the named bounds above and raises a
    one-line `ValueError`, so a spec that exists is a spec that fits in a delta.
    """

    kind: TaskKind
    requirements: Requirements
    command: tuple[str, ...] = attrs.field(converter=tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_env)
    timeout: float = 3600.0  # seconds of run time before the owner kills it
    retry_limit: int = 2  # failed attempts tolerated before the task is failed for good
    submitted_by: str = ""  # node id of the accepting node (the spec's signer)
    submitted_at: float = 0.0  # realtime; informational only, never used for ordering
    #: Run without network (a fresh network namespace), or do not start. Encoded as a
    #: tenth wire element only when True, so specs without it keep their ids.
    no_network: bool = False
    #: The members that grant this task's epochs (`LeaseAgent`), chosen by the accepting
    #: node. Encoded as an eleventh element only when set (after `no_network`, then
    #: always present), so specs without it keep their ids.
    replicas: tuple[str, ...] = attrs.field(default=(), converter=_node_ids)
    #: Blobs fetched before the start (sorted by name). With `deployment`, encoded as
    #: the twelfth and thirteenth elements only when either is set (`_tail`).
    inputs: tuple[BlobInput, ...] = attrs.field(default=(), converter=_inputs)
    #: Set on the replicas of a deployed model (`populi-node deploy`).
    deployment: Deployment | None = None
    #: Paths (relative to the work dir) the owner stores as blobs when the task ends
    #: (`submit --output`), sorted. Encoded as a fourteenth element only when set.
    outputs: tuple[str, ...] = attrs.field(default=(), converter=_outputs)
    #: Checkpoints (docs/artifacts.md): None, off; 0.0, snapshots when the task asks
    #: and on a handoff; > 0, also every that many seconds (`submit --checkpoint-every`).
    #: Encoded as a fifteenth element only when set (the outputs then always present).
    checkpoint_every: float | None = None

    def input(self, name: str) -> BlobInput | None:
        return next((i for i in self.inputs if i.name == name), None)

    def __attrs_post_init__(self) -> None:
        if len(self.inputs) > INPUTS_MAX:
            raise ValueError(f"at most {INPUTS_MAX} inputs, got {len(self.inputs)}")
        if not all(isinstance(i, BlobInput) for i in self.inputs):
            raise ValueError("inputs must be BlobInput values")
        if len({i.name for i in self.inputs}) != len(self.inputs):
            raise ValueError("two inputs have the same name")
        if len(self.outputs) > OUTPUTS_MAX:
            raise ValueError(f"at most {OUTPUTS_MAX} outputs, got {len(self.outputs)}")
        for path in self.outputs:
            check_output_path(path)
        if self.deployment is not None and self.input("model") is None:
            raise ValueError("a deployment needs an input named model")
        if len(self.replicas) > REPLICAS_MAX or len(set(self.replicas)) != len(self.replicas):
            raise ValueError(f"replicas: at most {REPLICAS_MAX} distinct node ids")
        if not all(isinstance(r, str) and 0 < len(r) <= NODE_ID_CHARS_MAX for r in self.replicas):
            raise ValueError(f"replicas: each is a node id of 1..{NODE_ID_CHARS_MAX} chars")
        if not self.command:
            raise ValueError("command is empty: give at least the program to run")
        if len(self.command) > COMMAND_ARGS_MAX:
            raise ValueError(f"command has {len(self.command)} args, at most {COMMAND_ARGS_MAX}")
        if sum(len(a.encode()) for a in self.command) > COMMAND_BYTES_MAX:
            raise ValueError(f"command is longer than {COMMAND_BYTES_MAX} bytes")
        if not all(isinstance(a, str) for a in self.command):
            raise ValueError("command arguments must be strings")
        if len(self.env) > ENV_ENTRIES_MAX:
            raise ValueError(f"env has {len(self.env)} entries, at most {ENV_ENTRIES_MAX}")
        if sum(len(k.encode()) + len(v.encode()) for k, v in self.env.items()) > ENV_BYTES_MAX:
            raise ValueError(f"env is larger than {ENV_BYTES_MAX} bytes")
        if not all(isinstance(k, str) and k and isinstance(v, str) for k, v in self.env.items()):
            raise ValueError("env must map non-empty strings to strings")
        if not 0 < self.timeout <= TIMEOUT_MAX:
            raise ValueError(f"timeout must be in (0, {TIMEOUT_MAX}] seconds, got {self.timeout}")
        if not 0 <= self.retry_limit <= RETRY_LIMIT_MAX:
            raise ValueError(f"retry_limit must be in 0..{RETRY_LIMIT_MAX}")
        if not isinstance(self.no_network, bool):
            raise ValueError("no_network must be true or false")
        if not 0 < len(self.submitted_by) <= NODE_ID_CHARS_MAX:
            raise ValueError(f"submitted_by must be a node id of 1..{NODE_ID_CHARS_MAX} chars")
        every = self.checkpoint_every
        if every is not None and (type(every) is not float or not 0 <= every <= TIMEOUT_MAX):
            raise ValueError(f"checkpoint_every must be 0..{TIMEOUT_MAX:.0f} s (0: on request)")

    def to_wire(self) -> list[Any]:
        """The canonical layout: a fixed array, version first, labels and env sorted;
        ``no_network`` appended only when set (older specs keep their bytes and ids)."""
        r = self.requirements
        return [
            SPEC_VERSION,
            self.kind.value,
            [
                r.gpu_count,
                r.vram_per_gpu,
                list(r.compute_capability_min),
                float(r.cpu_cores),
                r.ram,
                sorted(r.labels_required),
                sorted(r.labels_preferred),
            ],
            list(self.command),
            [[k, v] for k, v in sorted(self.env.items())],
            float(self.timeout),
            self.retry_limit,
            self.submitted_by,
            float(self.submitted_at),
            *self._tail(),
        ]

    def _tail(self) -> list[Any]:
        if self.outputs or self.checkpoint_every is not None:
            deployment = None if self.deployment is None else self.deployment.to_wire()
            blobs = [i.to_wire() for i in self.inputs]
            tail = [self.no_network, list(self.replicas), blobs, deployment, list(self.outputs)]
            every = self.checkpoint_every
            return tail if every is None else [*tail, float(every)]
        if self.inputs or self.deployment is not None:
            deployment = None if self.deployment is None else self.deployment.to_wire()
            blobs = [i.to_wire() for i in self.inputs]
            return [self.no_network, list(self.replicas), blobs, deployment]
        if self.replicas:
            return [self.no_network, list(self.replicas)]
        return [True] if self.no_network else []

    @classmethod
    def from_wire(cls, raw: Any) -> TaskSpec:
        """Rebuild from `to_wire`'s layout; any mismatch raises `ValueError`/`TypeError`."""
        if (
            not isinstance(raw, list)
            or len(raw) not in (9, 10, 11, 13, 14, 15)
            or raw[0] != SPEC_VERSION
        ):
            raise ValueError("not a version-1 task spec")
        if len(raw) == 10 and raw[9] is not True:
            raise ValueError("no_network is encoded only when true")  # one spec, one encoding
        replicas: list[Any] = []
        if len(raw) >= 11:
            replicas = raw[10]
            if not isinstance(raw[9], bool) or not isinstance(replicas, list):
                raise ValueError("bad replicas layout")
            if len(raw) == 11 and not replicas:
                raise ValueError("bad replicas layout")
        inputs, deployment = _inputs_from_wire(raw)
        _, kind, req, command, env, timeout, retry, by, at = raw[:9]
        if not isinstance(req, list) or len(req) != 7:
            raise ValueError("bad requirements layout")
        gpus, vram, cc, cpu, ram, lreq, lpref = req
        for v in (gpus, vram, ram, retry):
            if type(v) is not int:
                raise ValueError("integer field is not an int")
        if not (isinstance(cc, list) and len(cc) == 2 and all(type(c) is int for c in cc)):
            raise ValueError("bad compute capability")
        if not all(isinstance(x, list) for x in (lreq, lpref, command, env)):
            raise ValueError("bad list field")
        if not all(isinstance(p, list) and len(p) == 2 for p in env):
            raise ValueError("bad env layout")
        if not all(isinstance(x, int | float) for x in (cpu, timeout, at)) or not isinstance(
            by, str
        ):
            raise ValueError("bad scalar field")
        return cls(
            kind=TaskKind(kind),
            requirements=Requirements(gpus, vram, (cc[0], cc[1]), float(cpu), ram, lreq, lpref),
            command=tuple(command),
            env={k: v for k, v in env},
            timeout=float(timeout),
            retry_limit=retry,
            submitted_by=by,
            submitted_at=float(at),
            no_network=raw[9] is True if len(raw) > 9 else False,
            replicas=tuple(replicas),
            inputs=inputs,
            deployment=deployment,
            outputs=_outputs_from_wire(raw),
            checkpoint_every=_checkpoint_from_wire(raw),
        )

    def canonical(self) -> bytes:
        """One spec, one byte string: the input of the task id and of the signature."""
        return msgpack.packb(self.to_wire(), use_bin_type=True)  # type: ignore[no-any-return]

    def task_id(self) -> str:
        """The content hash of the canonical spec (blake2b-128, hex)."""
        return task_id_of(self.canonical())

    def sign(self, sign: Signer) -> bytes:
        """The accepting node's signature over the canonical spec."""
        return sign(SPEC_CONTEXT + self.canonical())

    def verify(self, signature: bytes, verify: Verifier) -> bool:
        """True when `signature` is `submitted_by`'s over this spec."""
        return verify(self.submitted_by, SPEC_CONTEXT + self.canonical(), signature)


def _inputs_from_wire(raw: list[Any]) -> tuple[list[BlobInput], Deployment | None]:
    """The twelfth and thirteenth elements: present only when one of them (or the
    outputs) is set."""
    if len(raw) < 13:
        return [], None
    blobs, deployment = raw[11], raw[12]
    if not isinstance(blobs, list) or len(blobs) > INPUTS_MAX:
        raise ValueError("bad inputs layout")
    if not blobs and deployment is None and len(raw) == 13:
        raise ValueError("inputs and deployment are encoded only when set")
    inputs = [BlobInput.from_wire(b) for b in blobs]
    names = [b.name for b in inputs]
    if names != sorted(names):
        raise ValueError("inputs are encoded sorted by name")  # one spec, one encoding
    return inputs, None if deployment is None else Deployment.from_wire(deployment)


def _outputs_from_wire(raw: list[Any]) -> tuple[str, ...]:
    """The fourteenth element: the declared outputs, present only when set (or when a
    fifteenth element follows: then possibly empty)."""
    if len(raw) < 14:
        return ()
    paths = raw[13]
    if not isinstance(paths, list) or (len(raw) == 14 and not paths) or len(paths) > OUTPUTS_MAX:
        raise ValueError("bad outputs layout")
    if paths != sorted(set(paths)) or not all(isinstance(p, str) for p in paths):
        raise ValueError("outputs are encoded sorted, once each")  # one spec, one encoding
    return tuple(check_output_path(p) for p in paths)


def _checkpoint_from_wire(raw: list[Any]) -> float | None:
    """The fifteenth element: seconds between checkpoints, present only when set."""
    if len(raw) < 15:
        return None
    if not isinstance(raw[14], float):
        raise ValueError("checkpoint_every is encoded as a float")  # one spec, one encoding
    return float(raw[14])


def check_new_requirements(req: Requirements) -> None:
    """The rules a *new* submission must follow beyond what `Requirements` accepts.

    Kept out of `Requirements` itself, so that specs already stored or gossiping (from
    nodes that accepted them before the rule) still decode; the CLI and the API's
    `spec_from` call it before anything is stored.

    Raises:
        ValueError: one line saying what is wrong and how to fix it.
    """
    if req.vram_per_gpu > 0 and req.gpu_count == 0:
        raise ValueError(VRAM_WITHOUT_GPUS)


def task_id_of(canonical: bytes) -> str:
    return hashlib.blake2b(canonical, digest_size=TASK_ID_CHARS // 2).hexdigest()
