"""The embedded broker (`filesystem://`, portal/broker.py) under writers that race its readers.

Writers are separate processes, as beat, the web process and `campaign run`
are; readers are kombu consumers polling as a worker's consumer does.
"""

from __future__ import annotations

import collections
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import kombu.transport
import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.exceptions import ChannelError

REPO = Path(__file__).resolve().parents[2]
QUEUE = Queue("stress", Exchange("stress", type="direct"), routing_key="stress")

# Run as `python -c`: a process that loads the app, as the web process does,
# and publishes through `filesystem://` whatever transport that names.
WRITER = """
import sys
import portal  # loads the Celery app, which names the embedded transport
from kombu import Connection, Exchange, Producer, Queue

root, writer, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
queue = Queue("stress", Exchange("stress", type="direct"), routing_key="stress")
options = {"data_folder_in": root + "/queue", "data_folder_out": root + "/queue",
           "control_folder": root + "/control"}
with Connection("filesystem://", transport_options=options) as conn:
    producer = Producer(conn.channel())
    for seq in range(count):
        producer.publish({"writer": writer, "seq": seq, "pad": "x" * 200},
                         exchange=queue.exchange, routing_key="stress",
                         declare=[queue], serializer="json")
"""

# Run as `python -c`: a second consumer, printing what it took.
CONSUMER = """
import sys
import portal
from kombu import Connection, Consumer, Exchange, Queue

root = sys.argv[1]
queue = Queue("stress", Exchange("stress", type="direct"), routing_key="stress")
options = {"data_folder_in": root + "/queue", "data_folder_out": root + "/queue",
           "control_folder": root + "/control", "polling_interval": 0.001}

def on_message(body, message):
    print(body["writer"], body["seq"], flush=True)
    message.ack()

with Connection("filesystem://", transport_options=options) as conn:
    with Consumer(conn, [queue], callbacks=[on_message]):
        print("ready", flush=True)
        while True:
            try:
                conn.drain_events(timeout=1)
            except TimeoutError:
                break
"""


@pytest.fixture
def broker_root(tmp_path) -> Path:
    for folder in ("queue", "control"):
        (tmp_path / "broker" / folder).mkdir(parents=True)
    # The transport remembers, per process, which bindings it declared and then
    # skips writing them: forget those of earlier tests, whose folders are gone.
    kombu.transport.resolve_transport("filesystem").global_state.clear()
    return tmp_path / "broker"


def connection(root: Path, **options) -> Connection:
    return Connection(
        "filesystem://",
        transport_options={
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "control_folder": str(root / "control"),
            "polling_interval": 0.001,
            **options,
        },
    )


def start_writers(root: Path, writers: int, per_writer: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(w), str(per_writer)], cwd=REPO, env=env
        )
        for w in range(writers)
    ]


def take(
    root: Path, expected: int, writers: list[subprocess.Popen], timeout: float
) -> tuple[collections.Counter, list[str]]:
    """What one consumer took (message -> times) and the errors its polls raised,
    until `expected` arrived or the writers are done and the queue is empty."""
    got: collections.Counter = collections.Counter()
    errors: list[str] = []

    def on_message(body, message):
        got[(body["writer"], body["seq"])] += 1
        message.ack()

    with connection(root) as conn, Consumer(conn, [QUEUE], callbacks=[on_message]):
        deadline = time.monotonic() + timeout
        while sum(got.values()) < expected and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=0.5)
            except TimeoutError:
                if all(w.poll() is not None for w in writers):
                    break
            except Exception as exc:  # what stops a Celery worker
                errors.append(repr(exc))
    return got, errors


def test_thousands_of_messages_written_while_a_consumer_polls_arrive_each_once(broker_root):
    # given two processes sending 1,500 messages each, one at a time
    writers = start_writers(broker_root, writers=2, per_writer=1500)
    started = time.monotonic()

    # when a consumer polls every millisecond meanwhile
    got, errors = take(broker_root, 3000, writers, timeout=50)
    for w in writers:
        assert w.wait(timeout=30) == 0

    # then no poll failed, and every message arrived, once
    assert errors == []
    assert sorted(got) == [(w, s) for w in range(2) for s in range(1500)]
    assert set(got.values()) == {1}
    assert time.monotonic() - started < 60


def test_two_consumers_never_take_the_same_message(broker_root):
    # given a backlog of 1,000 messages
    writers = start_writers(broker_root, writers=1, per_writer=1000)
    assert writers[0].wait(timeout=60) == 0

    # when two processes take from it at once
    other = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(broker_root)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None
    assert other.stdout.readline() == "ready\n"
    mine, errors = take(broker_root, 1000, [other], timeout=40)
    # The rest of its output through the reader that read "ready": that read
    # may have taken the first lines it printed with it, and communicate()
    # reads the pipe underneath and never sees them. (It prints a few KiB, less
    # than a pipe holds, so it does not wait on this process to read.)
    assert other.wait(timeout=30) == 0
    with other.stdout:
        out = other.stdout.read()
    theirs = collections.Counter(tuple(map(int, line.split())) for line in out.splitlines())

    # then between them each message arrived once
    assert errors == []
    assert mine and theirs, "both consumers took a share"
    assert sorted((mine + theirs).elements()) == [(0, s) for s in range(1000)]


def publish_one(root: Path, body: dict) -> None:
    with connection(root) as conn:
        Producer(conn.channel()).publish(
            body, exchange=QUEUE.exchange, routing_key="stress", declare=[QUEUE]
        )


def test_a_half_written_message_is_taken_once_it_is_whole(broker_root):
    # given a message file a writer has created but not finished (kombu's own
    # transport writes after creating the file under its final name)
    publish_one(broker_root, {"writer": 0, "seq": 0})
    [name] = os.listdir(broker_root / "queue")
    whole = (broker_root / "queue" / name).read_bytes()
    (broker_root / "queue" / name).write_bytes(whole[: len(whole) // 2])

    with connection(broker_root) as conn:
        channel = conn.channel()
        # when a consumer polls: it leaves the file for the next poll
        with pytest.raises(kombu.transport.virtual.Empty):
            channel._get("stress")
        assert os.listdir(broker_root / "queue") == [name]

        # then, the write finished, the next poll takes the message
        (broker_root / "queue" / name).write_bytes(whole)
        assert channel._get("stress")["body"]
    assert os.listdir(broker_root / "queue") == []


def test_a_file_that_stays_undecodable_is_set_aside_with_a_log_line(broker_root, caplog):
    # given a damaged message file ahead of a good message
    (broker_root / "queue" / "1_damaged.stress.msg").write_bytes(b'{"body": "tru')
    publish_one(broker_root, {"writer": 0, "seq": 7})

    with connection(broker_root, undecodable_grace_seconds=1.5) as conn:
        got = take_all(conn)
        # the good message is not held behind the damaged one
        assert got == [(0, 7)]
        assert (broker_root / "queue" / "1_damaged.stress.msg").exists()

        # when the damaged file is still undecodable after the grace
        time.sleep(1.5)
        with caplog.at_level(logging.WARNING, logger="portal.broker"):
            take_all(conn)

    # then it is in the bad folder, and the log names it
    assert os.listdir(broker_root / "queue") == ["bad"]
    assert os.listdir(broker_root / "queue" / "bad") == ["1_damaged.stress.msg"]
    assert "1_damaged.stress.msg" in caplog.text
    assert "still undecodable" in caplog.text


def take_all(conn: Connection) -> list[tuple[int, int]]:
    """What a consumer takes until the queue has been empty for 0.2 s."""
    got: list[tuple[int, int]] = []

    def on_message(body, message):
        got.append((body["writer"], body["seq"]))
        message.ack()

    with Consumer(conn, [QUEUE], callbacks=[on_message]):
        while True:
            try:
                conn.drain_events(timeout=0.2)
            except TimeoutError:
                return got


def test_a_damaged_exchange_table_is_a_channel_error_not_a_crash(broker_root):
    # A channel error makes Celery's consumer reconnect; a JSONDecodeError
    # stops the worker.
    (broker_root / "control" / "stress.exchange").write_bytes(b"")
    with connection(broker_root) as conn, pytest.raises(ChannelError):
        conn.channel().get_table("stress")
