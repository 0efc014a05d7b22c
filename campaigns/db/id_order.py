"""Unit ids in byte order: the id prefix search as a range of the (campaign, uid) index.

A prefix search listed in import order (pk) made PostgreSQL guess how far along
the campaign's pk index the first matches lie; when the ids it asked for sat
late in the import (`docs/09…` in a million units), it read most of the
campaign for one page (bench/RESULTS.md, "A fast machine, the id prefix plan,
a lighter page (2026-11-30)"). Read in id order, the matches sit together in unit_uid_unique and a
page is a range read of 51 entries wherever they lie.

Byte order is what that index holds on PostgreSQL (varchar_pattern_ops, whose
operators are ~<~, ~>=~ …) and what SQLite's BINARY collation compares, so
both databases agree on the order, and the prefix match is case-sensitive on
both (SQLite's LIKE is not).
"""

from __future__ import annotations

from django.db.models import F, Lookup, OrderBy, Q

# Comparison operators: PostgreSQL's pattern operators (the index's own), SQLite's plain ones.
_OPERATORS = {
    "postgresql": {"<": "~<~", "<=": "~<=~", ">=": "~>=~", ">": "~>~"},
    "sqlite": {"<": "<", "<=": "<=", ">=": ">=", ">": ">"},
}


class _ByteCompare(Lookup):
    """uid <op> value in byte order (Django's own lookups use the column's collation)."""

    lookup_name = "byte_compare"

    def __init__(self, op: str, value: str):
        super().__init__(F("uid"), value)
        self.op = op

    def as_sql(self, compiler, connection):
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        operator = _OPERATORS[connection.vendor][self.op]
        return f"{lhs} {operator} {rhs}", [*lhs_params, *rhs_params]


def compare(op: str, uid: str) -> Q:
    """Units whose id is `op` (<, <=, >=, >) `uid` in byte order."""
    return Q(_ByteCompare(op, uid))


class InIdOrder(OrderBy):
    """ORDER BY uid in byte order, with the sort operator PostgreSQL needs to
    read unit_uid_unique in order instead of sorting the matches.

    `USING ~<~` takes no ASC/DESC, which Django looks for in every ORDER BY
    term, so the pk follows as a tie-break that never breaks a tie (ids are
    unique in a campaign) and PostgreSQL's incremental sort passes through.
    """

    def __init__(self, *, descending: bool = False):
        super().__init__(F("uid"), descending=descending)
        self.tie_break = F("pk")

    def get_source_expressions(self):
        return [self.expression, self.tie_break]

    def set_source_expressions(self, exprs):
        self.expression, self.tie_break = exprs

    def as_sql(self, compiler, connection, template=None, **extra_context):
        uid, uid_params = compiler.compile(self.expression)
        pk, pk_params = compiler.compile(self.tie_break)
        direction = "DESC" if self.descending else "ASC"
        if connection.vendor == "postgresql":
            uid = f"{uid} USING {'~>~' if self.descending else '~<~'}"
        else:
            uid = f"{uid} {direction}"
        return f"{uid}, {pk} {direction}", [*uid_params, *pk_params]


def prefix_range(prefix: str) -> Q:
    """Ids that start with `prefix`: [prefix, the next string of its length)."""
    condition = compare(">=", prefix)
    upper = _next_string(prefix)
    if upper is not None:
        condition &= compare("<", upper)
    return condition


_MAX = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)  # not encodable in UTF-8: no id holds them


def _next_string(prefix: str) -> str | None:
    """The smallest string above every string that starts with `prefix`, in
    code point order (which is UTF-8's byte order); None when there is none."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop()) + 1
        if last in _SURROGATES:
            last = _SURROGATES.stop
        if last <= _MAX:
            return "".join(chars) + chr(last)
    return None
