"""The broker's queue depths for the health page (``operations.selectors.health``): asked with a
bounded wait (``HEALTH_BROKER_TIMEOUT_SECONDS``), each queue judged by ``HEALTH_QUEUE_DEPTH_*``,
"unknown" with the reason rather than a failure when the broker does not answer.
"""

from __future__ import annotations

import contextlib
import queue as queue_module
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from operations.selectors.health_levels import AMBER, GREEN, RED, Signal, health_settings, worst


@dataclass
class QueueDepth:
    """A broker queue's depth: ``messages`` (None when unknown, with ``reason``)."""

    name: str
    messages: int | None
    reason: str = ""
    level: str = GREEN


@dataclass
class BrokerReport:
    """What the broker said: its transport, each queue's depth, or why it could not answer."""

    transport: str
    queues: list[QueueDepth] = field(default_factory=list)
    unreachable: str = ""


def _measure(names: list[str], timeout: float) -> BrokerReport:
    from celery import current_app

    url = str(settings.CELERY_BROKER_URL)
    options = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {})
    if url.startswith(("redis://", "rediss://")):
        options.update(socket_connect_timeout=timeout, socket_timeout=timeout)
    transport = url.split("://", 1)[0] or "unknown"
    report = BrokerReport(transport=transport)
    with current_app.connection_for_read(
        url, connect_timeout=timeout, transport_options=options, heartbeat=0
    ) as conn:
        conn.ensure_connection(max_retries=1, interval_start=0, timeout=max(1, round(timeout)))
        # AMQP keeps a declared queue, empty or not: NOT_FOUND means nobody declared it. kombu's
        # virtual transports (Redis, filesystem) keep no queue object: an empty queue is absent.
        amqp = conn.transport.driver_type == "amqp"
        for name in names:
            channel: Any = conn.channel()  # a kombu channel (StdChannel's stub lacks queue_declare)
            try:
                _, count, _ = channel.queue_declare(queue=name, passive=True)
                report.queues.append(QueueDepth(name, int(count)))
            except conn.channel_errors as exc:
                if amqp:
                    report.queues.append(
                        QueueDepth(name, None, f"not declared on the broker yet ({exc})"[:200])
                    )
                else:
                    report.queues.append(QueueDepth(name, 0))
            finally:
                with contextlib.suppress(Exception):  # closed by the broker already
                    channel.close()
    return report


def broker_queue_depths(names: list[str], *, timeout: float | None = None) -> BrokerReport:
    """Messages waiting in each named queue of the configured broker (a passive declare:
    AMQP's ``queue.declare-ok`` message count, kombu's list length on Redis, files on the
    filesystem transport), within ``timeout`` seconds (default ``HEALTH_BROKER_TIMEOUT_SECONDS``).

    Never raises and never waits past the timeout: the broker is asked from a daemon thread, and
    an error or no answer in time becomes ``unreachable`` with the reason (the page shows
    "unknown (reason)"). Each queue is judged by ``HEALTH_QUEUE_DEPTH_AMBER`` / ``_RED``.
    """
    wait = float(timeout if timeout is not None else health_settings()["HEALTH_BROKER_TIMEOUT_SECONDS"])
    transport = str(settings.CELERY_BROKER_URL).split("://", 1)[0] or "unknown"
    answers: queue_module.Queue[BrokerReport | BaseException] = queue_module.Queue(maxsize=1)

    def ask() -> None:
        try:
            answers.put(_measure(names, wait))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller as the reason
            answers.put(exc)

    threading.Thread(target=ask, name="health-broker-probe", daemon=True).start()
    try:
        answer = answers.get(timeout=wait + 0.5)
    except queue_module.Empty:
        return BrokerReport(transport=transport, unreachable=f"no answer within {wait:g} s")
    if isinstance(answer, BaseException):
        return BrokerReport(transport=transport, unreachable=f"{type(answer).__name__}: {answer}"[:300])
    amber = int(health_settings()["HEALTH_QUEUE_DEPTH_AMBER"])
    red = int(health_settings()["HEALTH_QUEUE_DEPTH_RED"])
    for depth in answer.queues:
        if depth.messages is None:
            depth.level = AMBER
        elif depth.messages >= red:
            depth.level = RED
        elif depth.messages >= amber:
            depth.level = AMBER
    return answer


def broker_signal(report: BrokerReport) -> Signal:
    """Red when the broker cannot be reached (nothing can be published); else the worst queue."""
    if report.unreachable:
        return Signal("broker", "Broker queue", RED, f"unknown ({report.unreachable})")
    level = worst(*(q.level for q in report.queues))
    parts = [
        f"{q.name}: {q.messages}" if q.messages is not None else f"{q.name}: unknown ({q.reason})"
        for q in report.queues
    ]
    return Signal("broker", "Broker queue", level, "; ".join(parts) or "no queue")
