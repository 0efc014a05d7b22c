"""The embedded broker: kombu's filesystem transport, safe while another process writes.

kombu's own transport (kombu/transport/filesystem.py) creates a message file
with ``open(name, "wb")`` and writes it afterwards, and its reader takes the
first file it lists without the writer's lock: a worker polling every 10 ms
takes a file that is still empty, deletes it, and dies on
``JSONDecodeError`` (celery/kombu#1551). Its exchange tables are truncated
the same way before they are rewritten (treeverse/dvc-task#73). Here:

- a message is written under a temporary name that no reader lists, then
  renamed into place (``os.replace``), so a listed file is always whole;
- a reader claims a message by deleting the file after decoding it: of two
  readers of one file only one deletes it, and only that one delivers it;
- a file that does not decode (a writer that does not rename, a disk that
  filled, a process killed mid-write on another filesystem) is skipped and
  retried on later polls, and moved to the bad folder with a log line only
  once it has stayed undecodable for ``undecodable_grace_seconds``: the
  worker never stops on it;
- an exchange table is rewritten whole and renamed into place, its
  read-modify-write serialised by a lock on a file of its own.

``register()`` makes ``filesystem://`` mean this transport in the process that
calls it (portal/celery.py, so every process that loads the Celery app).
Measured against kombu's transport and its SQLAlchemy transport on SQLite:
bench/RESULTS.md, "Embedded broker".
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import kombu.transport
from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

logger = logging.getLogger(__name__)

# A message file is written and renamed in well under a millisecond; one that
# still does not decode after this long is not being written, it is damaged.
UNDECODABLE_GRACE_SECONDS = 30.0
# A torn exchange table (only from a writer that does not rename) is re-read
# this many times, 10 ms apart, before the channel reports an error.
TABLE_READ_ATTEMPTS = 20

TRANSPORT = "portal.broker:Transport"


def register() -> None:
    """`filesystem://` URLs use this transport from now on, in this process."""
    kombu.transport.TRANSPORT_ALIASES["filesystem"] = TRANSPORT
    # kombu caches a transport class per name once resolved.
    kombu.transport._transport_cache.pop("filesystem", None)  # type: ignore[attr-defined]


def write_atomically(path: str | Path, data: bytes) -> None:
    """`data` at `path`, all of it or nothing: readers never see a partial file.

    The temporary name starts with a dot and ends in `.tmp`, so neither this
    reader nor kombu's (`<time>_<uuid>.<queue>.msg`) lists it. No fsync: a
    message lost to a power cut is sent again by the lost-message sweep
    (docs/operations.md), and a file torn by one is set aside, not read.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Channel(filesystem.Channel):
    """kombu's filesystem channel with whole-file writes and tolerant reads."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Message file name -> when this channel first failed to decode it.
        self._undecodable: dict[str, float] = {}

    # --- messages ---------------------------------------------------------

    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's naming: the time first, so a sorted listing is oldest first.
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        try:
            write_atomically(os.path.join(self.data_folder_out, name), str_to_bytes(dumps(payload)))
        except OSError as exc:
            raise ChannelError(f"Cannot add file {name!r} to {self.data_folder_out}") from exc

    def _get(self, queue: str) -> dict[str, Any]:  # type: ignore[override]
        wanted = f"{queue}.msg"
        names = sorted(n for n in os.listdir(self.data_folder_in) if n.partition(".")[2] == wanted)
        if self._undecodable:
            # Forget files another reader delivered or set aside.
            listed = set(names)
            for gone in [n for n in self._undecodable if n not in listed]:
                del self._undecodable[gone]
        for name in names:
            path = os.path.join(self.data_folder_in, name)
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except FileNotFoundError:
                continue  # another reader took it since the listing
            except OSError as exc:
                raise ChannelError(f"Cannot read file {path!r} from queue.") from exc
            payload = _decode(raw)
            if payload is None:
                self._skip_undecodable(name, path, size=len(raw))
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue  # another reader read it too and claimed it first
            except OSError as exc:
                raise ChannelError(f"Cannot remove file {path!r} from queue.") from exc
            self._undecodable.pop(name, None)
            return payload
        raise Empty()

    def _skip_undecodable(self, name: str, path: str, *, size: int) -> None:
        now = time.monotonic()
        first = self._undecodable.setdefault(name, now)
        if now - first < self.undecodable_grace_seconds:
            return  # perhaps still being written: look again next poll
        bad = Path(self.bad_folder)
        bad.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, bad / name)
            logger.warning(
                "broker: message file %s (%d bytes) still undecodable after %.1f s: "
                "moved to %s, the worker goes on",
                name,
                size,
                now - first,
                bad,
            )
        del self._undecodable[name]

    @property
    def bad_folder(self) -> str:
        default = os.path.join(self.data_folder_in, "bad")
        return str(self.transport_options.get("bad_folder", default))

    @property
    def undecodable_grace_seconds(self) -> float:
        return float(
            self.transport_options.get("undecodable_grace_seconds", UNDECODABLE_GRACE_SECONDS)
        )

    # --- exchange tables ----------------------------------------------------

    def get_table(self, exchange: str) -> list[filesystem.exchange_queue_t]:  # type: ignore[override]
        file = self._table_file(exchange)
        for _ in range(TABLE_READ_ATTEMPTS):
            try:
                raw = file.read_bytes()
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise ChannelError(f"Cannot open {file}") from exc
            try:
                return [filesystem.exchange_queue_t(*q) for q in loads(bytes_to_str(raw))]
            except (ValueError, TypeError):
                time.sleep(0.01)
        # A ChannelError, not the JSONDecodeError: Celery's consumer reconnects
        # on a channel error instead of stopping the worker.
        raise ChannelError(f"Cannot decode the exchange table {file}")

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange) as file:
            queues = self.get_table(exchange)
            if entry not in queues:
                queues.insert(0, entry)
                write_atomically(file, str_to_bytes(dumps(queues)))

    def _delete(
        self, queue: str, exchange: str, routing_key: str, pattern: str, *args: Any, **kwargs: Any
    ) -> None:
        virtual.Channel._delete(self, queue, exchange, routing_key, pattern, *args, **kwargs)
        entry = filesystem.exchange_queue_t(routing_key or "", pattern or "", queue or "")
        with self._table_lock(exchange) as file:
            queues = self.get_table(exchange)
            if entry in queues:
                queues.remove(entry)
                write_atomically(file, str_to_bytes(dumps(queues)))

    def _table_file(self, exchange: str) -> Path:
        """kombu's path for the table, which refuses a name that would leave the folder."""
        file: Path = self._exchange_file(exchange)  # type: ignore[attr-defined]
        return file

    @contextlib.contextmanager
    def _table_lock(self, exchange: str) -> Iterator[Path]:
        """The exchange's table file, with its read-modify-write held by one process.

        The lock is on a file of its own: the table itself is replaced, and a
        lock on a replaced file guards nothing.
        """
        file = self._table_file(exchange)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            with open(file.with_name(file.name + ".lock"), "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                yield file
        except OSError as exc:
            raise ChannelError(f"Cannot update {file}") from exc


def _decode(raw: bytes) -> dict[str, Any] | None:
    """The message in a file's bytes, or None when they are not (yet) one."""
    try:
        payload = loads(bytes_to_str(raw))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return None
    return payload if isinstance(payload, dict) else None


class Transport(filesystem.Transport):
    """The embedded default's transport (`filesystem://` once register() ran)."""

    Channel = Channel
    # The bindings this process declared, kept apart from kombu's transport's:
    # a binding kombu's remembers would otherwise never reach this one's tables.
    global_state = virtual.BrokerState()
