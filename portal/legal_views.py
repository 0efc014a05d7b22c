"""The operator's pages: terms, refund policy, contact. Their texts come from
settings (OPERATOR_*), so an operator changes them without touching templates."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

log = logging.getLogger(__name__)

# A policy is a few pages of text, never more: a larger file is not one.
MAX_BYTES = 200_000


@dataclass(frozen=True)
class Block:
    heading: str = ""
    text: str = ""


def read_blocks(path: str) -> list[Block] | None:
    """Plain text: paragraphs separated by blank lines, a paragraph starting
    "# " a heading. None when the file cannot be read (the page says whom to
    write to instead; check portal.E008 names the file)."""
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES} bytes")
        content = raw.decode("utf-8")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        log.error("operator text %s not shown: %s", path, exc)
        return None
    blocks = []
    for paragraph in content.replace("\r\n", "\n").split("\n\n"):
        paragraph = paragraph.strip()
        if paragraph.startswith("# "):
            heading, _, rest = paragraph.partition("\n")
            blocks.append(Block(heading=heading[2:].strip()))
            paragraph = rest.strip()
        if paragraph:
            blocks.append(Block(text=paragraph))
    return blocks


def _policy(request: HttpRequest, *, title: str, path: str) -> HttpResponse:
    context = {"title": title, "blocks": read_blocks(path)}
    return render(request, "legal/policy.html", context)


def terms(request: HttpRequest) -> HttpResponse:
    return _policy(request, title="Terms of service", path=settings.OPERATOR_TERMS_FILE)


def refunds(request: HttpRequest) -> HttpResponse:
    return _policy(request, title="Refund policy", path=settings.OPERATOR_REFUNDS_FILE)


def contact(request: HttpRequest) -> HttpResponse:
    return render(request, "legal/contact.html")
