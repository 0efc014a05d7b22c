"""The embedded broker under load: kombu's filesystem transport, the project's
(portal/broker.py) and kombu's SQLAlchemy transport on SQLite.

    .venv/bin/python bench/embedded_broker.py --messages 3000 --writers 2

Each transport in a fresh folder, four measures:

- stress: --writers processes publish --messages messages between them, one
  at a time as beat and the web process do, while one consumer in this process
  takes them, polling every millisecond. Counts what arrived, what was lost or
  came twice, and the errors the consumer raised (a Celery worker stops at the
  first); messages/s from the consumer's start (the writers start with it) to the
  last receipt.
- publish: one process publishes --messages into an empty queue.
- consume: one consumer takes that backlog.
- idle: a consumer polls the empty queue every 10 ms (the worker's
  polling_interval in portal/settings.py) for --idle-seconds; the CPU it used,
  in % of one core.

SQLAlchemy is not a dependency of the project: its transport is measured only
when the module imports (give a folder that has it on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kombu import Connection, Consumer, Exchange, Producer, Queue  # noqa: E402

QUEUE = Queue("bench", Exchange("bench", type="direct"), routing_key="bench")
TRANSPORTS = {
    "kombu filesystem": "kombu.transport.filesystem:Transport",
    "portal.broker (filesystem)": "portal.broker:Transport",
    "kombu SQLAlchemy, SQLite": "kombu.transport.sqlalchemy:Transport",
}


def connection(name: str, root: Path, polling_interval: float) -> Connection:
    transport = TRANSPORTS[name]
    root.mkdir(parents=True, exist_ok=True)
    if "sqlalchemy" in transport:
        conn = Connection(f"sqla+sqlite:///{root / 'broker.sqlite3'}")
        # Its transport options go to create_engine: the interval is set after.
        conn.transport.polling_interval = polling_interval
        return conn
    options = {
        "data_folder_in": str(root / "queue"),
        "data_folder_out": str(root / "queue"),
        "control_folder": str(root / "control"),
        "polling_interval": polling_interval,
    }
    for folder in ("queue", "control"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    return Connection("filesystem://", transport=transport, transport_options=options)


def publish(name: str, root: Path, writer: int, count: int) -> None:
    with connection(name, root, 0.01) as conn:
        producer = Producer(conn.channel())
        for i in range(count):
            producer.publish(
                {"writer": writer, "seq": i, "pad": "x" * 200},
                exchange=QUEUE.exchange,
                routing_key=QUEUE.routing_key,
                declare=[QUEUE],
                serializer="json",
            )


def writer_process(name: str, root: Path, writer: int, count: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--write", name, str(root), str(writer), str(count)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])},
    )


def consume(
    name: str,
    root: Path,
    expected: int,
    *,
    writers: list[subprocess.Popen] = (),  # type: ignore[assignment]
    polling_interval: float = 0.001,
    timeout: float = 120.0,
) -> dict:
    """Take messages until `expected` arrived, or the writers are done and the queue
    stays empty, or `timeout`."""
    got: collections.Counter = collections.Counter()
    errors: collections.Counter = collections.Counter()
    with connection(name, root, polling_interval) as conn:

        def on_message(body, message):
            got[(body["writer"], body["seq"])] += 1
            message.ack()

        with Consumer(conn, [QUEUE], callbacks=[on_message], accept=["json"]):
            start = last = time.monotonic()
            while time.monotonic() - start < timeout and sum(got.values()) < expected:
                before = sum(got.values())
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    if all(w.poll() is not None for w in writers):
                        break
                except Exception as exc:  # what would stop a Celery worker
                    errors[type(exc).__name__] += 1
                if sum(got.values()) > before:
                    last = time.monotonic()
    for w in writers:
        w.wait()
    seconds = max(last - start, 1e-9)
    return {
        "received": len(got),
        "lost": expected - len(got),
        "duplicated": sum(n - 1 for n in got.values()),
        "errors": dict(errors),
        "seconds": seconds,
        "per_s": sum(got.values()) / seconds,
    }


def idle_cpu(name: str, root: Path, seconds: float) -> float:
    """% of one core a consumer polling the empty queue every 10 ms uses."""
    with connection(name, root, 0.01) as conn, Consumer(conn, [QUEUE], accept=["json"]):
        before = resource.getrusage(resource.RUSAGE_SELF)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=end - time.monotonic())
        after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return 100 * cpu / seconds


def measure(name: str, args: argparse.Namespace) -> dict:
    per_writer = args.messages // args.writers
    expected = per_writer * args.writers
    with tempfile.TemporaryDirectory(prefix="bench-broker-") as folder:
        # One folder for the three measures: kombu keeps the bindings it
        # declared in memory, per transport class, and would not write them
        # to a second folder.
        root = Path(folder)
        writers = [writer_process(name, root, w, per_writer) for w in range(args.writers)]
        stress = consume(name, root, expected, writers=writers)

        start = time.monotonic()
        publish(name, root, 0, args.messages)
        publish_s = args.messages / (time.monotonic() - start)
        backlog = consume(name, root, args.messages)

        idle = idle_cpu(name, root, args.idle_seconds)
    return {"stress": stress, "publish_s": publish_s, "backlog": backlog, "idle": idle}


def main() -> None:
    if sys.argv[1:2] == ["--write"]:
        name, root, writer, count = sys.argv[2:6]
        publish(name, Path(root), int(writer), int(count))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--only", choices=list(TRANSPORTS), action="append")
    args = parser.parse_args()

    names = args.only or list(TRANSPORTS)
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        print("SQLAlchemy not importable: its transport is left out.")
        names = [n for n in names if "SQLAlchemy" not in n]

    print(
        f"{args.messages} messages, {args.writers} writer processes; idle {args.idle_seconds} s\n"
    )
    print(
        "| transport | stress msg/s | lost | duplicated | consumer errors "
        "| publish msg/s | consume msg/s | idle CPU % |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for name in names:
        r = measure(name, args)
        s = r["stress"]
        errors = ", ".join(f"{k} ×{v}" for k, v in s["errors"].items()) or "none"
        print(
            f"| {name} | {s['per_s']:,.0f} | {s['lost']} | {s['duplicated']} | {errors} "
            f"| {r['publish_s']:,.0f} | {r['backlog']['per_s']:,.0f} | {r['idle']:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
