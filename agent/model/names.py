"""Syntax checks for names, label keys/values and port names, as Kubernetes and Calico define them.

Role: small pure predicates used by the parsers in `agent.model` (and by the Kubernetes
conversion, which relies on them to embed keys and values in selector text safely).

Rules (from Kubernetes' `validation` package, which Calico's validator reuses):
- DNS-1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters (namespaces, tiers).
- DNS-1123 subdomain: labels joined by `.`, at most 253 characters (most resource names).
- qualified name (label keys, annotation keys): `[prefix/]name`, prefix a DNS-1123 subdomain,
  name `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?` of at most 63 characters.
- label value: empty, or like a qualified name's name part (at most 63 characters).
- port name (IANA service name): at most 15 characters of `[a-z0-9-]`, at least one letter,
  no leading, trailing or doubled `-`.
- interface name: Linux's rules (1-15 bytes, not `.` or `..`, no `/`, `:` or whitespace),
  within Calico's character set `[A-Za-z0-9_.-]`.

Every pattern must match the WHOLE text (`re.fullmatch`): with `re.match` and `^...$`, `$`
also matches before a trailing newline, so `peer1\n` would pass as a name and then break
every generated file it is written into (bird.conf, iptables-restore input).

The checks are cached (label keys, values and port names repeat across thousands of pods).

Invariant that the Kubernetes conversion relies on: every valid label key matches the
selector language's key syntax `[A-Za-z0-9_./-]+`, and no valid label value contains a quote,
so keys and values that passed these checks can be written into selector text verbatim.
"""

from __future__ import annotations

import functools
import re

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# Used with fullmatch only (module docstring).
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME_PART_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_PORT_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")
_INTERFACE_NAME_RE = re.compile(r"[a-zA-Z0-9_.-]{1,15}")  # ASCII: 15 characters = 15 bytes

DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
PORT_NAME_MAX = 15


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX and bool(_DNS_LABEL_RE.fullmatch(text))


def is_dns_subdomain(text: str) -> bool:
    return len(text) <= DNS_SUBDOMAIN_MAX and bool(_DNS_SUBDOMAIN_RE.fullmatch(text))


@functools.lru_cache(maxsize=16384)
def qualified_name_problem(key: str) -> str | None:
    """Why `key` is not a valid label/annotation key, or None when it is."""
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' is empty"
    if slash and not is_dns_subdomain(prefix):
        return f"prefix {prefix!r} is not a DNS subdomain (lower case letters, digits, '-', '.')"
    if not name:
        return "the name part is empty"
    if len(name) > QUALIFIED_NAME_MAX:
        return f"the name part is longer than {QUALIFIED_NAME_MAX} characters"
    if not _QUALIFIED_NAME_PART_RE.fullmatch(name):
        return ("the name part must be letters, digits, '-', '_' or '.', starting and ending "
                "with a letter or digit")
    return None


# a small cache: the values that repeat (app, tier, namespace...) stay in it; unique ones
# (pod-template-hash, per-pod ids) never hit, and a 16,384-entry cache of them cost ~100
# bytes per endpoint up to 1.7 MB
@functools.lru_cache(maxsize=1024)
def label_value_problem(value: str) -> str | None:
    """Why `value` is not a valid label value, or None when it is."""
    if value == "":
        return None
    if len(value) > LABEL_VALUE_MAX:
        return f"longer than {LABEL_VALUE_MAX} characters"
    if not _QUALIFIED_NAME_PART_RE.fullmatch(value):
        return ("must be letters, digits, '-', '_' or '.', starting and ending with a letter "
                "or digit")
    return None


@functools.lru_cache(maxsize=4096)
def is_port_name(text: str) -> bool:
    return (
        len(text) <= PORT_NAME_MAX
        and bool(_PORT_NAME_RE.fullmatch(text))
        and "--" not in text
        and any(c.isalpha() for c in text)
    )


def is_interface_name(text: str) -> bool:
    """A name Linux accepts for a network interface (dev_valid_name) in Calico's characters."""
    return bool(_INTERFACE_NAME_RE.fullmatch(text)) and text not in (".", "..")


def is_decimal(text: str) -> bool:
    """True for ASCII digit strings only (`str.isdigit` also accepts '²' and friends)."""
    return text.isascii() and text.isdigit()
