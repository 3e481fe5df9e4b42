"""The ledger's conditional writes as data: conditions, updates and their results (pure, no I/O).

A condition is a small tree (``Absent``, ``Compare``, ``AllOf``, ``AnyOf``) built from the named fragments in
``CONDITIONS``. The same tree renders to a DynamoDB ConditionExpression (``render``) and is evaluated against an
item in memory (``holds``), with DynamoDB's rules: a comparison with a missing attribute, a missing value or
values of different kinds is false; ``attribute_not_exists`` holds for an item that does not exist. An
``Update`` likewise renders to an UpdateExpression and applies to an item in memory. So the DynamoDB store and
the in-memory store (``worker.idempotency.memory``) run one set of rules, written once.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    ">": operator.gt,
    "<=": operator.le,
}


@dataclass(frozen=True)
class Absent:
    """``attribute_not_exists(#attribute)``."""

    attribute: str

    @property
    def text(self) -> str:
        return f"attribute_not_exists(#{self.attribute})"

    def render(self) -> str:
        return f"({self.text})"

    def holds(self, item: Mapping[str, object] | None, values: Mapping[str, object]) -> bool:
        return item is None or self.attribute not in item


@dataclass(frozen=True)
class Compare:
    """``#attribute <op> :value`` with ``op`` one of ``=``, ``>``, ``<=``."""

    attribute: str
    op: str
    value: str

    def __post_init__(self) -> None:
        if self.op not in _OPERATORS:
            raise ValueError(f"unsupported comparison {self.op!r}")

    @property
    def text(self) -> str:
        return f"#{self.attribute} {self.op} :{self.value}"

    def render(self) -> str:
        return f"({self.text})"

    def holds(self, item: Mapping[str, object] | None, values: Mapping[str, object]) -> bool:
        if item is None or self.attribute not in item:
            return False
        left, right = item[self.attribute], values[self.value]
        if _kind(left) != _kind(right) or _kind(left) is None:
            return False  # DynamoDB: comparing a string with a number (or a null) is false, never an error
        if self.op != "=" and _kind(left) == "bool":
            return False
        return bool(_OPERATORS[self.op](left, right))


@dataclass(frozen=True)
class AllOf:
    parts: tuple[Condition, ...]

    def render(self) -> str:
        return "(" + " AND ".join(part.render() for part in self.parts) + ")"

    def holds(self, item: Mapping[str, object] | None, values: Mapping[str, object]) -> bool:
        return all(part.holds(item, values) for part in self.parts)


@dataclass(frozen=True)
class AnyOf:
    parts: tuple[Condition, ...]

    def render(self) -> str:
        return "(" + " OR ".join(part.render() for part in self.parts) + ")"

    def holds(self, item: Mapping[str, object] | None, values: Mapping[str, object]) -> bool:
        return any(part.holds(item, values) for part in self.parts)


Condition = Union[Absent, Compare, AllOf, AnyOf]  # noqa: UP007 - a runtime alias, used before the classes above

#: Named condition fragments. ``#name`` stands for the attribute ``name``; ``:value`` for a value.
CONDITIONS: dict[str, Absent | Compare] = {
    "absent": Absent("key"),
    "unexpired": Compare("expiration", ">", "now_s"),
    "same_payload": Compare("payload_hash", "=", "payload_hash"),
    "lease_lapsed": Compare("lease_expires_at_ms", "<=", "now_ms"),
    "in_progress": Compare("status", "=", "in_progress"),
    "failed": Compare("status", "=", "failed"),
    "owner_is_me": Compare("owner", "=", "owner"),
    "token_is_mine": Compare("token", "=", "token"),
    "token_unchanged": Compare("token", "=", "seen_token"),
    "updated_at_unchanged": Compare("updated_at", "=", "seen_updated_at"),
}


def cond(name: str) -> Absent | Compare:
    """One named fragment."""
    return CONDITIONS[name]


def _part(part: str | Condition) -> Condition:
    return cond(part) if isinstance(part, str) else part


def all_of(*parts: str | Condition) -> AllOf:
    """Fragments (by name) or composed conditions, all of which must hold."""
    return AllOf(tuple(_part(part) for part in parts))


def any_of(*parts: str | Condition) -> AnyOf:
    """Fragments (by name) or composed conditions, one of which must hold."""
    return AnyOf(tuple(_part(part) for part in parts))


def _kind(value: object) -> str | None:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return None


@dataclass(frozen=True)
class WriteResult:
    """Outcome of a conditional write: ``ok`` and the item after it (ok, when asked) or before it (not ok)."""

    ok: bool
    item: dict[str, object] | None


@dataclass(frozen=True)
class Update:
    """The parts of an UpdateItem, by attribute name."""

    assign: Mapping[str, object]
    increment: Sequence[str] = ()
    keep_if_present: Mapping[str, object] | None = None
    remove: Sequence[str] = ()

    def expression(self) -> tuple[str, dict[str, object]]:
        clauses = [f"#{name} = :set_{name}" for name in self.assign]
        values: dict[str, object] = {f"set_{name}": value for name, value in self.assign.items()}
        for name in self.increment:
            clauses.append(f"#{name} = if_not_exists(#{name}, :zero) + :one")
            values.update(zero=0, one=1)
        for name, value in (self.keep_if_present or {}).items():
            clauses.append(f"#{name} = if_not_exists(#{name}, :keep_{name})")
            values[f"keep_{name}"] = value
        text = "SET " + ", ".join(clauses)
        if self.remove:
            text += " REMOVE " + ", ".join(f"#{name}" for name in self.remove)
        return text, values

    def apply(self, item: Mapping[str, object] | None, *, key_attribute: str, key: str) -> dict[str, object]:
        """The item after this update, as DynamoDB computes it (an absent item starts with just its key)."""
        new: dict[str, object] = dict(item) if item is not None else {key_attribute: key}
        new.update(self.assign)
        for name in self.increment:
            current = new.get(name, 0)
            if not isinstance(current, int | float) or isinstance(current, bool):
                raise ValueError(f"cannot increment the non-number attribute {name!r}")
            new[name] = current + 1
        for name, value in (self.keep_if_present or {}).items():
            new.setdefault(name, value)
        for name in self.remove:
            new.pop(name, None)
        return new
