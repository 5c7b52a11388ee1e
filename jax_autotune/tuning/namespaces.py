"""The namespaces of the tune store, built and parsed here only.

Decisions live under ``autotune/<jax_autotune version>/<jax version>/<device
fingerprint>/matmul``, probe results under ``throughput/<jax_autotune version>/<device
fingerprint>`` (jax-independent), whole-program checks under ``programs/<jax_autotune
version>/<jax version>/<device fingerprint>``, attention decisions under ``attention/...``
likewise.

    >>> decision_namespace("cpu-AMD-EPYC-x2-mem0")                  # doctest: +SKIP
    'autotune/0.1.0/0.10.2/cpu-AMD-EPYC-x2-mem0/matmul'
    >>> DecisionNamespace.parse("autotune/0.1.0/0.10.2/cpu-x/matmul").device
    'cpu-x'
"""

from __future__ import annotations

import dataclasses

import jax

from jax_autotune._version import __version__

def _check_fingerprint(device_fingerprint: str) -> str:
    if not isinstance(device_fingerprint, str) or not device_fingerprint or "/" in device_fingerprint:
        raise ValueError("device_fingerprint: expected a non-empty string without '/', "
                         f"got {device_fingerprint!r}")
    return device_fingerprint


DECISIONS = "autotune"
THROUGHPUT = "throughput"
PROGRAMS = "programs"
ATTENTION = "attention"
_TUNER_NAME = "matmul"


@dataclasses.dataclass(frozen=True)
class DecisionNamespace:
    """The parts of a decision namespace.

        >>> DecisionNamespace.parse("autotune/0.1.0/0.10.2/cpu-x/matmul").device
        'cpu-x'
    """

    version: str
    jax_version: str
    device: str

    def __str__(self) -> str:
        return f"{DECISIONS}/{self.version}/{self.jax_version}/{self.device}/{_TUNER_NAME}"

    @classmethod
    def parse(cls, namespace: str) -> "DecisionNamespace | None":
        """The parts of ``namespace``, or None when it is not a decision namespace."""
        parts = namespace.split("/")
        if len(parts) != 5 or parts[0] != DECISIONS or parts[4] != _TUNER_NAME or not all(parts):
            return None
        return cls(parts[1], parts[2], parts[3])


def decision_namespace(device_fingerprint: str) -> str:
    """The namespace of matmul tuning decisions for this package, this jax and this device.

        >>> decision_namespace("cuda-NVIDIA_H200-139GiB")   # doctest: +SKIP
        'autotune/0.1.0/0.10.2/cuda-NVIDIA_H200-139GiB/matmul'
    """
    return str(DecisionNamespace(__version__, jax.__version__, _check_fingerprint(device_fingerprint)))


def current_decision_prefix() -> str:
    """The prefix of every decision namespace of this package and jax version."""
    return f"{DECISIONS}/{__version__}/{jax.__version__}/"


def throughput_namespace(device_fingerprint: str) -> str:
    """The namespace of a device's measured peaks and launch overhead (jax-independent).

        >>> throughput_namespace("cpu-x86_64")   # doctest: +SKIP
        'throughput/0.1.0/cpu-x86_64'
    """
    return f"{THROUGHPUT}/{__version__}/{_check_fingerprint(device_fingerprint)}"


def program_namespace(device_fingerprint: str) -> str:
    """The namespace of whole-program checks (``tuning.programs``): per package, jax and device.

        >>> program_namespace("cuda-NVIDIA_H200-139GiB")   # doctest: +SKIP
        'programs/0.1.0/0.11.2/cuda-NVIDIA_H200-139GiB'
    """
    return current_prefix(PROGRAMS) + _check_fingerprint(device_fingerprint)


def attention_namespace(device_fingerprint: str) -> str:
    """The namespace of attention decisions (``tuning.attention_decisions``): per package,
    jax and device.

        >>> attention_namespace("cuda-NVIDIA_H200-139GiB")   # doctest: +SKIP
        'attention/0.1.0/0.11.2/cuda-NVIDIA_H200-139GiB'
    """
    return current_prefix(ATTENTION) + _check_fingerprint(device_fingerprint)


def current_prefix(kind: str) -> str:
    """The prefix of this package's and jax's namespaces of ``kind`` (``PROGRAMS``, ``ATTENTION``).

        >>> current_prefix(ATTENTION)                   # doctest: +SKIP
        'attention/0.1.0/0.10.2/'
    """
    return f"{kind}/{__version__}/{jax.__version__}/"


def current_device(namespace: str, kind: str) -> str | None:
    """The device fingerprint of a namespace of ``kind`` of this package and jax; None for
    any other namespace.

        >>> current_device(attention_namespace("cpu-x"), ATTENTION)
        'cpu-x'
    """
    prefix = current_prefix(kind)
    device = namespace[len(prefix):] if namespace.startswith(prefix) else ""
    return device if device and "/" not in device else None


def kept_device(namespace: str) -> str | None:
    """The device fingerprint of a program-check or attention-decision namespace of any
    package and jax version; None for any other namespace.

        >>> kept_device("programs/0.1.0/0.10.2/cpu-x")
        'cpu-x'
    """
    parts = namespace.split("/")
    return parts[3] if len(parts) == 4 and parts[0] in (PROGRAMS, ATTENTION) and all(parts) else None

