"""portal gives campaigns its rental advice through the registered advisor,
and campaigns and gpuworker import nothing of portal."""

from __future__ import annotations

import ast
from pathlib import Path

from campaigns.profiles.advice import advisor
from portal.advice import PortalAdvisor

ROOT = Path(__file__).resolve().parents[2]


def test_portal_registers_its_advisor_when_django_loads():
    assert isinstance(advisor(), PortalAdvisor)


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_campaigns_and_gpuworker_import_nothing_of_portal():
    found = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imported(path) if n.split(".")[0] == "portal"
        )
        for app in ("campaigns", "gpuworker")
        for path in (ROOT / app).rglob("*.py")
    }
    assert {path: names for path, names in found.items() if names} == {}
