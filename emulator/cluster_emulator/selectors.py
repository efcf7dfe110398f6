"""Label and field selectors with the semantics of ``k8s.io/apimachinery/pkg/labels``.

Clients (and Airflow's KubernetesHook) filter pods with ``labelSelector`` strings
such as ``job-name=x,app in (a,b),!debug``; getting these exactly right matters
because a selector bug in the emulator would hide a selector bug in the provider.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ._util import LABEL_NAME, LABEL_VALUE, get_path


class SelectorError(ValueError):
    """The selector string cannot be parsed (the server answers 400 BadRequest)."""


@dataclass(frozen=True)
class Requirement:
    """One term of a label selector: ``key op values``."""

    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (missing keys satisfy ``!=`` and ``notin``)."""
        present = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("gt", "lt"):
            if not present:
                return False
            try:
                number = int(value or "")
                bound = int(self.values[0])
            except ValueError:
                return False
            return number > bound if self.op == "gt" else number < bound
        return False


@dataclass(frozen=True)
class LabelSelector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether every requirement holds for ``labels``."""
        labels = labels or {}
        return all(req.matches(labels) for req in self.requirements)

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.requirements


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise SelectorError(f"unbalanced parenthesis in selector {text!r}")
    parts.append("".join(current))
    return parts


_SET_RE = re.compile(r"^\s*(?P<key>[^\s!=<>(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")


def _check_key(key: str, text: str) -> str:
    name = key.rsplit("/", 1)[-1]
    if not key or not LABEL_NAME.match(name) or len(name) > 63:
        raise SelectorError(f"invalid label key {key!r} in selector {text!r}")
    return key


def _check_value(value: str, text: str) -> str:
    if len(value) > 63 or not LABEL_VALUE.match(value):
        raise SelectorError(f"invalid label value {value!r} in selector {text!r}")
    return value


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse a ``labelSelector`` query string (equality, inequality, set-based, exists)."""
    if text is None or not text.strip():
        return LabelSelector()
    requirements: list[Requirement] = []
    for raw in _split_top_level(text):
        term = raw.strip()
        if not term:
            raise SelectorError(f"empty term in selector {text!r}")
        match = _SET_RE.match(term)
        if match:
            values = tuple(v.strip() for v in match.group("values").split(",") if v.strip())
            for value in values:
                _check_value(value, text)
            requirements.append(Requirement(_check_key(match.group("key"), text), match.group("op"), values))
            continue
        if term.startswith("!"):
            requirements.append(Requirement(_check_key(term[1:].strip(), text), "!"))
            continue
        for token, op in (("!=", "!="), ("==", "="), ("=", "="), (">", "gt"), ("<", "lt")):
            if token in term:
                key, _, value = term.partition(token)
                key, value = key.strip(), value.strip()
                if op in ("gt", "lt"):
                    if not re.match(r"^-?\d+$", value):
                        raise SelectorError(f"invalid integer {value!r} in selector {text!r}")
                else:
                    _check_value(value, text)
                requirements.append(Requirement(_check_key(key, text), op, (value,)))
                break
        else:
            if re.search(r"\s", term):
                raise SelectorError(f"unable to parse requirement {term!r} in selector {text!r}")
            requirements.append(Requirement(_check_key(term, text), "exists"))
    return LabelSelector(tuple(requirements))


def selector_from_dict(selector: Mapping[str, Any] | None) -> LabelSelector:
    """Convert a ``metav1.LabelSelector`` (matchLabels / matchExpressions) into a selector."""
    if not selector:
        return LabelSelector()
    requirements = [Requirement(k, "=", (str(v),)) for k, v in (selector.get("matchLabels") or {}).items()]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        op = ops.get(expr.get("operator", ""))
        if op is None:
            raise SelectorError(f"unsupported operator {expr.get('operator')!r}")
        requirements.append(Requirement(expr["key"], op, tuple(expr.get("values") or ())))
    return LabelSelector(tuple(requirements))


def selector_to_string(selector: Mapping[str, Any]) -> str:
    """Render a ``metav1.LabelSelector`` as the string form (used for hpaPodSelector)."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        op = expr.get("operator")
        values = ",".join(expr.get("values") or ())
        if op == "In":
            parts.append(f"{expr['key']} in ({values})")
        elif op == "NotIn":
            parts.append(f"{expr['key']} notin ({values})")
        elif op == "Exists":
            parts.append(expr["key"])
        elif op == "DoesNotExist":
            parts.append(f"!{expr['key']}")
    return ",".join(parts)


@dataclass(frozen=True)
class FieldRequirement:
    """One ``field=value`` / ``field!=value`` term of a field selector."""

    field: str
    value: str
    negate: bool


# Field selector names that are not plain JSON paths of the object.
_FIELD_ALIASES = {"status.successful": "status.succeeded"}


def _field_value(obj: Mapping[str, Any], field: str) -> str:
    value = get_path(obj, _FIELD_ALIASES.get(field, field))
    if value is None:
        # Kubernetes treats an unset string field as "" and unset counts as 0.
        return "0" if field == "status.successful" else ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldSelector:
    """A conjunction of field requirements, resolved generically on the object's JSON."""

    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether every field requirement holds for ``obj``."""
        for req in self.requirements:
            equal = _field_value(obj, req.field) == req.value
            if equal == req.negate:
                return False
        return True

    @property
    def empty(self) -> bool:
        """True when the selector selects everything."""
        return not self.requirements

    def value_of(self, field: str) -> str | None:
        """The required value of ``field`` when the selector pins it with ``=``."""
        for req in self.requirements:
            if req.field == field and not req.negate:
                return req.value
        return None


def parse_field_selector(text: str | None) -> FieldSelector:
    """Parse a ``fieldSelector`` query string (``=``, ``==``, ``!=``; comma means AND)."""
    if text is None or not text.strip():
        return FieldSelector()
    requirements = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        for token, negate in (("!=", True), ("==", False), ("=", False)):
            if token in term:
                field, _, value = term.partition(token)
                field = field.strip()
                if not field:
                    raise SelectorError(f"invalid field selector {text!r}")
                requirements.append(FieldRequirement(field, value.strip(), negate))
                break
        else:
            raise SelectorError(f"invalid field selector: {term!r}: no operator found")
    return FieldSelector(tuple(requirements))
