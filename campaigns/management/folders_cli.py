"""`campaign folders add PROJECT PATH | list [PROJECT] | remove PROJECT PATH`:
the folders a project's members may make campaigns over (docs/operations.md,
"Giving a project its folders"; the rules are campaigns/intake/project_folders.py)."""

from __future__ import annotations

import json
import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from campaigns.intake import project_folders
from campaigns.models import Project, ProjectFolder


def add_parsers(sub: Any) -> None:
    folders = sub.add_parser(
        "folders",
        help="the folders a project's members may make campaigns over (add, list, remove)",
    )
    actions = folders.add_subparsers(dest="folders_action", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add", help="give a project a folder (and all below it); it must lie in CORPUS_ROOTS"
    )
    add.add_argument("project")
    add.add_argument("path")
    add.add_argument(
        "--create-project", action="store_true", help="make the project if there is none"
    )
    add.add_argument("--as", dest="user", default=None, help="who adds it (a username)")
    listing = actions.add_parser("list", help="every project's folders, or one project's")
    listing.add_argument("project", nargs="?")
    listing.add_argument("--json", action="store_true")
    remove = actions.add_parser(
        "remove", help="take a folder from a project (its campaigns there stop reading it)"
    )
    remove.add_argument("project")
    remove.add_argument("path")


class FolderCommands:
    """The folders subcommand's handlers, mixed into the `campaign` command."""

    stdout: Any

    def _folders(self, *, folders_action: str, **options: Any) -> None:
        if folders_action == "add":
            self._folder_add(**options)
        elif folders_action == "list":
            self._folder_list(**options)
        else:
            self._folder_remove(**options)

    def _folder_add(
        self, *, project: str, path: str, create_project: bool, user: str | None, **_: Any
    ) -> None:
        if create_project:
            owner, made = Project.objects.get_or_create(name=project)
            if made:
                self.stdout.write(f"made project {project} (its members: the admin's Projects)")
        else:
            owner = _project(project)
        added_by = None
        if user is not None:
            added_by = get_user_model().objects.filter(username=user).first()
            if added_by is None:
                raise CommandError(f"no user named {user!r}")
        folder, created = project_folders.folder_add(project=owner, path=path, added_by=added_by)
        if not created:
            self.stdout.write(f"{folder.path} is a folder of project {owner.name} already")
            return
        given = "" if folder.path == os.path.normpath(path) else f" (given as {path})"
        self.stdout.write(
            f"project {owner.name} may read {folder.path}{given} and everything below it"
        )
        if shared := project_folders.other_projects_with(project=owner, path=folder.path):
            self.stdout.write(
                f"note: project{'s' if len(shared) > 1 else ''} {', '.join(shared)} "
                "also read this folder or one inside or around it"
            )

    def _folder_list(self, *, project: str | None, json: bool, **_: Any) -> None:
        folders = ProjectFolder.objects.select_related("project", "added_by").order_by(
            "project__name", "path"
        )
        if project is not None:
            folders = folders.filter(project=_project(project))
        rows = [_row(folder) for folder in folders]
        if json:
            self.stdout.write(_dumps(rows))
            return
        if not rows:
            self.stdout.write("no project has a folder (campaign folders add PROJECT PATH)")
        for row in rows:
            notes = [f"added by {row['added_by'] or 'the command line'} {row['created_at'][:10]}"]
            if not row["exists"]:
                notes.append("not there")
            if not row["in_corpus_roots"]:
                notes.append("outside CORPUS_ROOTS: not offered on the setup page")
            self.stdout.write(f"{row['project']:<24} {row['path']}  ({'; '.join(notes)})")

    def _folder_remove(self, *, project: str, path: str, **_: Any) -> None:
        owner = _project(project)
        removal = project_folders.folder_remove(project=owner, path=path)
        for removed in removal.removed:
            self.stdout.write(f"project {owner.name} no longer reads {removed}")
        if removal.stranded:
            n = len(removal.stranded)
            self.stdout.write(
                f"{n} campaign{'s' if n != 1 else ''} of {owner.name} now lie outside its "
                f"folders; their imports and runs are refused until a folder covers them "
                f"again: {', '.join(removal.stranded)}"
            )


def _project(name: str) -> Project:
    project = Project.objects.filter(name=name).first()
    if project is None:
        names = ", ".join(Project.objects.order_by("name").values_list("name", flat=True))
        raise CommandError(
            f"no project named {name!r} (projects: {names or 'none'}; folders add "
            "--create-project makes one)"
        )
    return project


def _row(folder: ProjectFolder) -> dict[str, Any]:
    return {
        "project": folder.project.name,
        "path": folder.path,
        "added_by": folder.added_by.get_username() if folder.added_by else None,
        "created_at": folder.created_at.isoformat(),
        "exists": os.path.isdir(folder.path),
        "in_corpus_roots": project_folders.in_corpus_roots(folder.path),
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
