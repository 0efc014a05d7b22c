"""Which folders a project may read: its ProjectFolders.

Three bounds, from the outside in (docs/operations.md, "Giving a project its
folders"):

1. CORPUS_ROOTS, the operator's setting: staff give a project only folders
   inside them (`campaign folders add`, the admin), and the setup page offers
   and accepts only project folders inside them.
2. A project's folders: on the setup page a user picks a folder (or a
   sub-folder) of a project they belong to (a superuser: of any project; order
   staff, `is_staff`, only of their own). The posted
   path is resolved (symlinks, `..`) and must lie inside a folder of the chosen
   project, compared by whole path components (/data/ab is not inside /data/a).
3. Every import and run checks again that the campaign's folder, resolved at
   that moment, lies inside a folder of its project: a folder swapped for a
   symlink after the campaign was made leads outside and is refused with a
   readable reason, as is a folder whose project folder was removed.

The operator's `campaign create` (run on the server) is trusted: the folder it
names becomes a folder of the project if none covers it, without the
CORPUS_ROOTS bound; the web path never does that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from campaigns.db.batch_statements import project_folder_paths
from campaigns.models import Campaign, Project, ProjectFolder, sees_every_project

#: How far below a project folder the setup page offers sub-folders.
BROWSE_DEPTH = 2
HOW_TO_ADD = "campaign folders add PROJECT PATH, or the admin's Projects page"


class FolderRefused(ValidationError):
    """A folder a project may not read; the message says why and what to do.

    A ValidationError, so that the setup page, the command line and the run
    and resume buttons show it as they show every other refusal."""


def real_path(path: str | os.PathLike[str]) -> str:
    """The path with every symlink and `..` resolved (the folder need not exist)."""
    return os.path.realpath(os.fspath(path))


def is_inside(path: str, folder: str) -> bool:
    """Whether the real path `path` is `folder` or lies below it, by whole
    components: /data/ab is not inside /data/a."""
    folder = folder.rstrip(os.sep) or os.sep
    if folder == os.sep:
        return path.startswith(os.sep)
    return path == folder or path.startswith(folder + os.sep)


def corpus_roots() -> list[str]:
    return [real_path(root) for root in settings.CORPUS_ROOTS]


def in_corpus_roots(path: str) -> bool:
    return any(is_inside(path, root) for root in corpus_roots())


def projects_for_user(user: Any) -> QuerySet[Project]:
    """The projects whose folders a user may use: their own; a superuser, every
    one (as they see every campaign: selectors.campaigns_for_user). Order staff
    (`is_staff`) use only the projects they are a member of."""
    if sees_every_project(user):
        return Project.objects.order_by("name")
    return Project.objects.filter(members=user).order_by("name")


def covering(*, project: Project, path: str) -> ProjectFolder | None:
    """The project's folder that `path` (a real path) lies in, if any."""
    for folder in ProjectFolder.objects.filter(project=project):
        if is_inside(path, folder.path):
            return folder
    return None


# --- staff: giving and taking folders --------------------------------------------


def folder_add(
    *, project: Project, path: str | os.PathLike[str], added_by: Any = None
) -> tuple[ProjectFolder, bool]:
    """Give the project a folder (resolved; an existing folder inside
    CORPUS_ROOTS); (the folder, whether it is new). Adding it again changes nothing."""
    return ProjectFolder.objects.get_or_create(
        project=project, path=addable(path), defaults={"added_by": added_by}
    )


def addable(path: str | os.PathLike[str]) -> str:
    """The real path of a folder staff may give a project (an existing folder
    inside CORPUS_ROOTS); FolderRefused with the reason otherwise."""
    real = real_path(path)
    if not os.path.isdir(real):
        raise FolderRefused(f"{path} is not a folder on this machine")
    if not in_corpus_roots(real):
        roots = ", ".join(corpus_roots()) or "none"
        raise FolderRefused(
            f"{real} is outside CORPUS_ROOTS ({roots}): a project's folder lies inside one "
            "of them (add its root to CORPUS_ROOTS first: docs/deployment.md)"
        )
    return real


def folder_record(*, project: Project, path: str | os.PathLike[str]) -> ProjectFolder | None:
    """The operator's `campaign create`: the folder becomes the project's unless
    one of its folders covers it already (then None). No CORPUS_ROOTS bound:
    the command line reads what the operator names."""
    real = real_path(path)
    if covering(project=project, path=real) is not None:
        return None
    return ProjectFolder.objects.create(project=project, path=real)


def other_projects_with(*, project: Project, path: str) -> list[str]:
    """Other projects whose folders overlap this real path (one inside the other):
    a folder shared between customers is worth a word to the operator."""
    names = set()
    for folder in ProjectFolder.objects.exclude(project=project).select_related("project"):
        if is_inside(path, folder.path) or is_inside(folder.path, path):
            names.add(folder.project.name)
    return sorted(names)


@dataclass
class Removal:
    removed: list[str] = field(default_factory=list)
    # The project's campaigns whose folder no folder of the project covers now:
    # their imports and runs are refused until one does.
    stranded: list[str] = field(default_factory=list)


def folder_remove(*, project: Project, path: str | os.PathLike[str]) -> Removal:
    """Take a folder from the project: as stored, or as the path given resolves."""
    given = os.path.normpath(os.fspath(path))
    folders = ProjectFolder.objects.filter(project=project, path__in={given, real_path(path)})
    removal = Removal(removed=sorted(folders.values_list("path", flat=True)))
    if not removal.removed:
        kept = ", ".join(project.folders.values_list("path", flat=True)) or "none"
        raise FolderRefused(
            f"{path} is not a folder of project {project.name} (its folders: {kept})"
        )
    folders.delete()
    removal.stranded = [
        campaign.name
        for campaign in Campaign.objects.filter(project=project).order_by("name")
        if campaign_folder_refusal(campaign) is not None
    ]
    return removal


# --- the setup page ----------------------------------------------------------------


@dataclass
class Browsable:
    """A project's folders as the setup page offers them."""

    project: Project
    folders: list[Path]


def browsable_folders(user: Any) -> list[Browsable]:
    """The folders the setup page offers the user: those of their projects that
    lie inside CORPUS_ROOTS, each with its sub-folders BROWSE_DEPTH levels down
    (hidden ones and symlinks leading out of the project folder left out)."""
    offered = []
    projects = projects_for_user(user).prefetch_related("folders")
    for project in projects:
        found: list[Path] = []
        for folder in project.folders.all():
            if in_corpus_roots(folder.path) and os.path.isdir(folder.path):
                found.extend(_below(folder.path))
        if found:
            offered.append(Browsable(project, found))
    return offered


def _below(top: str) -> list[Path]:
    found = [Path(top)]
    for dirpath, dirnames, _files in os.walk(top):
        depth = len(Path(dirpath).relative_to(top).parts)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not d.startswith(".") and is_inside(real_path(os.path.join(dirpath, d)), top)
        )
        found.extend(Path(dirpath) / d for d in dirnames)
        if depth >= BROWSE_DEPTH - 1:
            dirnames[:] = []  # offered, not walked into
    return found


def folder_for_user(*, user: Any, project: Project, path: str | os.PathLike[str]) -> Path:
    """The real path of a folder a web user asks to read, if they may: inside
    a folder (within CORPUS_ROOTS) of a project of theirs. FolderRefused otherwise."""
    if not projects_for_user(user).filter(pk=project.pk).exists():
        raise FolderRefused(f"project {project.name} is not one of yours")
    real = real_path(path)
    folders = [f for f in project.folders.values_list("path", flat=True) if in_corpus_roots(f)]
    if not any(is_inside(real, folder) for folder in folders):
        raise FolderRefused(
            f"{path} is not inside a folder of project {project.name}: choose one of the "
            "folders offered (an operator gives a project its folders)"
        )
    if not os.path.isdir(real):
        raise FolderRefused(f"input folder not found: {path}")
    return Path(real)


# --- every import and run ---------------------------------------------------------


def campaign_folder_refusal(campaign: Campaign, *, real: str | None = None) -> str | None:
    """Why nothing may be read from the campaign's folder now, or None: its real
    path at this moment must lie inside a folder of its project. `real`: that
    path as the caller resolved it already (the worker, from the folder it
    opened and then reads through), else resolved here."""
    if real is None:
        real = real_path(campaign.input_root)
    # Written out: the worker asks before every batch.
    if any(is_inside(real, path) for path in project_folder_paths(campaign.project_id)):
        return None
    project = Project.objects.filter(pk=campaign.project_id).values_list("name", flat=True).first()
    if real != os.path.normpath(campaign.input_root):
        return (
            f"the campaign's folder {campaign.input_root} now leads to {real}, outside the "
            f"folders of project {project} (a symbolic link replaced it or a folder above "
            "it): nothing is read from it until the folder is restored, or an operator "
            f"gives the project that folder ({HOW_TO_ADD})"
        )
    return (
        f"the campaign's folder {campaign.input_root} is not inside a folder of project "
        f"{project} (the folder was taken from the project): nothing is read from it until "
        f"an operator gives the project that folder again ({HOW_TO_ADD})"
    )


def campaign_folder_check(campaign: Campaign) -> None:
    """FolderRefused when nothing may be read from the campaign's folder now."""
    refusal = campaign_folder_refusal(campaign)
    if refusal is not None:
        raise FolderRefused(refusal)
