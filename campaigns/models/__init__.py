"""The campaigns app's models, one module per aggregate; this package imports
them all, so that Django registers them, and callers import from here
(`from campaigns.models import Unit`)."""

from __future__ import annotations

# isort: off
# In the order the models were declared in one module, so that the app
# registry lists them (and everything that walks it) in that same order.
from campaigns.models.campaign import (
    Campaign,
    ParameterVersion,
    Project,
    ProjectFolder,
    sees_every_project,
)
from campaigns.models.batch import Batch
from campaigns.models.unit import (
    IN_FLIGHT,
    INPUT_ERRORS,
    VECTOR_HASH,
    AsInIndex,
    Attempt,
    ErrorClass,
    Unit,
    UnitCount,
    UnitState,
)
from campaigns.models.reconciliation import Reconciliation
from campaigns.models.profile import Estimate, Profile
from campaigns.models.review import (
    Checkpoint,
    ReviewCount,
    ReviewDecision,
    ReviewItem,
    ReviewReasonCount,
)
from campaigns.models.training import ModelCheckpoint, Training
from campaigns.models.watch import Notification, ProjectAlerts, WorkerBeat, new_webhook_secret

# isort: on

__all__ = [
    "IN_FLIGHT",
    "INPUT_ERRORS",
    "VECTOR_HASH",
    "AsInIndex",
    "Attempt",
    "Batch",
    "Campaign",
    "Checkpoint",
    "ErrorClass",
    "Estimate",
    "ModelCheckpoint",
    "Notification",
    "ParameterVersion",
    "Profile",
    "Project",
    "ProjectAlerts",
    "ProjectFolder",
    "Reconciliation",
    "ReviewCount",
    "ReviewDecision",
    "ReviewItem",
    "ReviewReasonCount",
    "Training",
    "Unit",
    "UnitCount",
    "UnitState",
    "WorkerBeat",
    "new_webhook_secret",
    "sees_every_project",
]
