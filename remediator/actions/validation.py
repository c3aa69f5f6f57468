"""Kubernetes name and label syntax, checked in params models before any API call.

Values reach actions from alert labels through templates, so they are hostile until proven
otherwise: anything that is not a DNS-1123 name or a Kubernetes label is rejected, never
escaped. The same checks are used at run time for values taken from the run (``ctx.node``).

Every check is a ``fullmatch``: with ``re.match``, ``$`` also matches before a final newline,
so ``"gpu-node-01\n"`` would pass as a node name and reach the API server. ``EventReason`` is a
pydantic ``pattern``, checked by pydantic-core's Rust engine, where ``$`` is the end of the text.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import pydantic

from remediator.domain import playbooks

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL = re.compile(rf"^{_LABEL}$")
DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
GPU_ID = re.compile(
    r"^(\d{1,3}|GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"
    r"|([0-9a-fA-F]{8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F])$"
)
SELECTOR = re.compile(r"^[A-Za-z0-9_./=!, ()-]{0,1024}$")
REASON = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")


def dns_subdomain(value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid DNS-1123 subdomain name")
    return value


def dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid DNS-1123 label")
    return value


def label_key(value: str) -> str:
    prefix, slash, name = value.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(f"{value[:80]!r}: the prefix must be a DNS-1123 subdomain")
    if not name or len(name) > 63 or not _NAME_PART.fullmatch(name):
        raise ValueError(
            f"{value[:80]!r} is not a valid label key (name part: up to 63 alphanumerics, "
            "'-', '_' or '.', starting and ending alphanumeric)"
        )
    return value


def label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid label value")
    return value


def gpu_id(value: str) -> str:
    if not GPU_ID.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a GPU index, UUID or PCI bus id")
    return value


def label_selector(value: str) -> str:
    if not SELECTOR.fullmatch(value):
        raise ValueError(f"{value[:80]!r} is not a valid label selector")
    return value


NodeName = Annotated[str, pydantic.AfterValidator(dns_subdomain)]
Namespace = Annotated[str, pydantic.AfterValidator(dns_label)]
PodName = Annotated[str, pydantic.AfterValidator(dns_subdomain)]
ContainerName = Annotated[str, pydantic.AfterValidator(dns_label)]
LabelKey = Annotated[str, pydantic.AfterValidator(label_key)]
LabelValue = Annotated[str, pydantic.AfterValidator(label_value)]
AnnotationValue = Annotated[str, pydantic.Field(max_length=4096)]
GpuId = Annotated[str, pydantic.AfterValidator(gpu_id)]
LabelSelector = Annotated[str, pydantic.AfterValidator(label_selector)]
EventReason = Annotated[str, pydantic.Field(pattern=REASON.pattern)]
TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


#: Marks a params field that chooses which pod or container remediator execs into:
#: ``Annotated[Namespace | None, EXEC_TARGET]``. Loading refuses a template in it.
EXEC_TARGET = pydantic.Field(json_schema_extra={playbooks.EXEC_TARGET: True})


class Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class TaintSpec(Model):
    key: LabelKey
    value: LabelValue | None = None
    effect: TaintEffect = "NoSchedule"


class TaintRef(Model):
    """Which taints to remove: by key, optionally only one effect."""

    key: LabelKey
    effect: TaintEffect | None = None
