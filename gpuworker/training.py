"""Fine-tuning loops: a sentence encoder on pairs, an image classifier on labels.

Both follow one discipline. The order of examples is a function of (seed,
epoch) and dropout is seeded per step, so a run resumed from a checkpoint
takes the same steps and reaches the same loss as one never interrupted. A
"step" is one optimizer step over `batch_size × accumulate` examples. Every
`checkpoint_every` steps (and at the end) the weights, the optimizer's state
and the linkage go to a checkpoint (campaigns/storage/checkpoint_files.py) with the loss
and the held-out metric of that moment.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from campaigns.storage import checkpoint_files as checkpoints
from gpuworker.memory import work_device

OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class Pair:
    anchor: str
    positive: str
    negative: str | None = None


@dataclass
class TrainParams:
    epochs: int = 1
    batch_size: int = 16
    accumulate: int = 1
    learning_rate: float = 2e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0
    seed: int = 0
    precision: str = "float32"  # float16 / bfloat16: mixed precision, CUDA only
    checkpoint_every: int = 50
    keep_last: int = 2
    max_tokens: int = 128
    scale: float = 20.0  # similarity scale of the in-batch-negatives loss

    @classmethod
    def from_params(cls, params: dict) -> TrainParams:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in params.items() if k in known})


@dataclass
class Progress:
    """What the loop reports at each checkpoint (and what a page charts)."""

    step: int
    total_steps: int
    epoch: int
    train_loss: float
    heldout: dict
    seconds: float
    folder: Path | None = None
    # This checkpoint's held-out evaluation and its write (weights, optimizer,
    # sidecar, synced): what a training estimate adds to the steps' time.
    eval_s: float = 0.0
    write_s: float = 0.0


@dataclass
class Outcome:
    steps: int
    total_steps: int
    resumed_from: int
    losses: list[float] = field(default_factory=list)
    checkpoints: list[Progress] = field(default_factory=list)
    stopped: bool = False


def autocast(device: torch.device, precision: str):
    if precision == "float32":
        return torch.autocast(device_type=device.type, enabled=False)
    if device.type != "cuda":
        raise ValueError(f"precision {precision} needs a CUDA worker; use float32 on the CPU")
    dtype = torch.float16 if precision == "float16" else torch.bfloat16
    return torch.autocast(device_type="cuda", dtype=dtype)


def order(n: int, *, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=generator).tolist()


def micro_batches(n: int, params: TrainParams, step: int) -> list[list[int]]:
    """The example indices of optimizer step `step` (0-based), one list per micro-batch."""
    per_step = params.batch_size * params.accumulate
    steps_per_epoch = math.ceil(n / per_step)
    epoch, within = divmod(step, steps_per_epoch)
    indices = order(n, seed=params.seed, epoch=epoch)[within * per_step : (within + 1) * per_step]
    return [indices[i : i + params.batch_size] for i in range(0, len(indices), params.batch_size)]


def total_steps(n: int, params: TrainParams) -> int:
    return params.epochs * math.ceil(n / (params.batch_size * params.accumulate))


class Trainer(ABC):
    """The loop; subclasses say how a micro-batch becomes a loss and what they save."""

    model: torch.nn.Module
    device: torch.device

    def __init__(self, params: TrainParams):
        self.params = params
        self.optimizer: torch.optim.Optimizer | None = None
        self.scaler: torch.amp.GradScaler | None = None

    # subclasses -------------------------------------------------------------
    @abstractmethod
    def loss(self, examples: Sequence) -> torch.Tensor: ...

    @abstractmethod
    def evaluate(self, examples: Sequence) -> dict: ...

    @abstractmethod
    def save(self, folder: Path) -> None: ...

    @abstractmethod
    def load(self, folder: Path) -> None: ...

    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    # the loop ---------------------------------------------------------------
    def _optimizer(self) -> torch.optim.Optimizer:
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(
                self.trainable(),
                lr=self.params.learning_rate,
                weight_decay=self.params.weight_decay,
            )
            if self.params.precision == "float16":
                self.scaler = torch.amp.GradScaler("cuda")
        return self.optimizer

    def _learning_rate(self, step: int) -> float:
        warmup = self.params.warmup_steps
        if warmup and step < warmup:
            return self.params.learning_rate * (step + 1) / warmup
        return self.params.learning_rate

    def train_step(self, examples: Sequence, step: int) -> float:
        """One optimizer step over the micro-batches of `step`; the mean loss."""
        optimizer = self._optimizer()
        for group in optimizer.param_groups:
            group["lr"] = self._learning_rate(step)
        self.model.train()
        optimizer.zero_grad(set_to_none=True)
        batches = micro_batches(len(examples), self.params, step)
        total = 0.0
        for i, indices in enumerate(batches):
            # Dropout from a seed of this step: a resumed run draws the same masks.
            torch.manual_seed(self.params.seed * 1_000_003 + step * 131 + i)
            with autocast(self.device, self.params.precision):
                loss = self.loss([examples[j] for j in indices]) / len(batches)
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
            else:
                loss.backward()
            total += float(loss.detach())
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()
        return total

    def save_optimizer(self, folder: Path) -> None:
        torch.save(self._optimizer().state_dict(), folder / OPTIMIZER_FILE)

    def load_optimizer(self, folder: Path) -> None:
        # weights_only: a checkpoint is data, never code to unpickle.
        state = torch.load(folder / OPTIMIZER_FILE, map_location=self.device, weights_only=True)
        self._optimizer().load_state_dict(state)

    def run(
        self,
        examples: Sequence,
        heldout: Sequence,
        *,
        root: Path,
        linkage: dict,
        resume: bool = True,
        stop: Callable[[int], bool] | None = None,
        on_checkpoint: Callable[[Progress], None] | None = None,
        accept: Callable[[Path, dict], list[str]] | None = None,
    ) -> Outcome:
        """Train to the end (or until `stop(step)` says so), checkpointing as it goes.

        With resume, the last whole checkpoint under `root` that `accept`
        (folder, sidecar -> what contradicts it) finds nothing against is the
        start: its weights, its optimizer state and its step.
        """
        if not examples:
            raise ValueError("no training examples (all held out, or none imported)")
        n_total = total_steps(len(examples), self.params)
        start = 0
        found = checkpoints.latest_whole(root, accept) if resume else None
        if found is not None:
            folder, sidecar = found
            self.load(folder)
            self.load_optimizer(folder)
            start = int(sidecar["step"])
        outcome = Outcome(steps=start, total_steps=n_total, resumed_from=start)
        started = time.perf_counter()
        running: list[float] = []
        best: tuple[float, int] | None = None
        for step in range(start, n_total):
            loss = self.train_step(examples, step)
            running.append(loss)
            outcome.losses.append(loss)
            outcome.steps = step + 1
            done = step + 1
            # A stop keeps the step it ends on: resume starts right after it.
            stopping = stop is not None and stop(done)
            if stopping or done % self.params.checkpoint_every == 0 or done == n_total:
                evaluating = time.perf_counter()
                heldout_metrics = self.evaluate(heldout) if heldout else {}
                eval_s = time.perf_counter() - evaluating
                train_loss = sum(running) / len(running)
                running = []
                progress = Progress(
                    step=done,
                    total_steps=n_total,
                    epoch=step // max(1, n_total // self.params.epochs),
                    train_loss=train_loss,
                    heldout=heldout_metrics,
                    seconds=time.perf_counter() - started,
                    eval_s=eval_s,
                )

                def save(folder: Path) -> None:
                    self.save(folder)
                    self.save_optimizer(folder)

                metrics = {"train_loss": train_loss, **heldout_metrics}
                writing = time.perf_counter()
                progress.folder = checkpoints.write(
                    root, done, save, {**linkage, "metrics": metrics, "total_steps": n_total}
                )
                progress.write_s = time.perf_counter() - writing
                key = heldout_metrics.get("heldout_loss", train_loss)
                if best is None or key <= best[0]:
                    best = (key, done)
                checkpoints.prune(
                    root, keep_last=self.params.keep_last, keep={best[1]} if best else set()
                )
                outcome.checkpoints.append(progress)
                if on_checkpoint is not None:
                    on_checkpoint(progress)
            if stopping:
                outcome.stopped = done < n_total
                break
        return outcome


# --- a sentence encoder on pairs ----------------------------------------------


class ContrastiveTrainer(Trainer):
    """In-batch negatives (each anchor against every positive, and the negatives
    when triplets give them), mean pooling, cosine similarity × scale."""

    def __init__(self, params: TrainParams, base: Path, device: torch.device | None = None):
        from transformers import AutoModel, AutoTokenizer

        super().__init__(params)
        self.device = device or work_device()
        self.tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        self.model = AutoModel.from_pretrained(base, local_files_only=True).to(self.device)

    def embed(self, texts: list[str]) -> torch.Tensor:
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.params.max_tokens,
            return_tensors="pt",
        ).to(self.device)
        hidden = self.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled.float(), p=2, dim=1)

    def _scores(self, pairs: Sequence[Pair]) -> torch.Tensor:
        anchors = self.embed([p.anchor for p in pairs])
        candidates = [p.positive for p in pairs] + [p.negative for p in pairs if p.negative]
        return self.params.scale * anchors @ self.embed(candidates).T

    def loss(self, pairs: Sequence[Pair]) -> torch.Tensor:
        scores = self._scores(pairs)
        return F.cross_entropy(scores, torch.arange(len(pairs), device=self.device))

    @torch.no_grad()
    def remember_base(self, pairs: Sequence[Pair]) -> None:
        """The base model's vectors of the held-out anchors, to measure drift against."""
        self.model.eval()
        self._base_vectors = self.embed([p.anchor for p in pairs]) if pairs else None

    @torch.no_grad()
    def evaluate(self, pairs: Sequence[Pair]) -> dict:
        """Loss and top-1 retrieval accuracy of anchors among the held-out positives, and
        cosine stability: mean cosine between the base model's vector of each held-out
        anchor and this model's (1.0: the space did not move)."""
        self.model.eval()
        scores = self._scores(pairs)
        target = torch.arange(len(pairs), device=self.device)
        metrics = {
            "heldout_loss": float(F.cross_entropy(scores, target)),
            "heldout_accuracy": float((scores.argmax(dim=1) == target).float().mean()),
        }
        base = getattr(self, "_base_vectors", None)
        if base is not None and len(base) == len(pairs):
            now = self.embed([p.anchor for p in pairs])
            metrics["cosine_stability"] = float((now * base).sum(dim=1).mean())
        return metrics

    def save(self, folder: Path) -> None:
        # A standard model folder: the text-embedding processor loads it as is.
        self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)

    def load(self, folder: Path) -> None:
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(folder, local_files_only=True).to(self.device)
        self.optimizer = None


# --- an image classifier on labels ------------------------------------------------


class ClassifierTrainer(Trainer):
    """Cross-entropy on labelled images; `train: head` freezes all but the last layer."""

    def __init__(
        self,
        params: TrainParams,
        model: torch.nn.Module,
        to_tensor: Callable[[object], torch.Tensor],
        *,
        train: str = "head",
        device: torch.device | None = None,
    ):
        super().__init__(params)
        self.device = device or work_device()
        self.model = model.to(self.device)
        self.to_tensor = to_tensor
        self.train_what = train
        parameters = list(self.model.named_parameters())
        if train == "head":
            last_prefix = parameters[-1][0].rsplit(".", 1)[0]
            for name, p in parameters:
                p.requires_grad = name.rsplit(".", 1)[0] == last_prefix
        else:
            for _, p in parameters:
                p.requires_grad = True

    def _logits(self, examples: Sequence[tuple[object, int]]) -> torch.Tensor:
        images = torch.stack([self.to_tensor(image) for image, _ in examples]).to(self.device)
        out = self.model(images)
        # A model may return (logits, features), as the classification processor allows.
        return out[0] if isinstance(out, tuple | list) else out

    def loss(self, examples: Sequence[tuple[object, int]]) -> torch.Tensor:
        labels = torch.tensor([label for _, label in examples], device=self.device)
        return F.cross_entropy(self._logits(examples).float(), labels)

    @torch.no_grad()
    def evaluate(self, examples: Sequence[tuple[object, int]]) -> dict:
        self.model.eval()
        logits = self._logits(examples).float()
        labels = torch.tensor([label for _, label in examples], device=self.device)
        return {
            "heldout_loss": float(F.cross_entropy(logits, labels)),
            "heldout_accuracy": float((logits.argmax(dim=1) == labels).float().mean()),
        }

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}
        save_file(state, str(folder / "model.safetensors"))

    def load(self, folder: Path) -> None:
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(str(folder / "model.safetensors")))
        self.model.to(self.device)
        self.optimizer = None
