"""Naive executors, the crash lab's controls. They exist to show the failures the product
prevents; nothing in the product calls them.

* ``retry``: call the provider with a fresh key per delivery (the key is not stable, so the
  provider cannot deduplicate), never record anything; redeliveries call again.
* ``record-after``: skip if marked done; call; then mark done. A crash between the provider's
  effect and the mark repeats the effect.
* ``record-before``: skip if marked done; mark done; then call. A crash between the mark and
  the provider's effect loses the operation.

Each is a Celery task with late acknowledgement, so a worker killed mid-call gets its message
redelivered, exactly as production recovery would.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import httpx
from celery import Task, shared_task
from django.conf import settings

from console.lab.models import LabOperation

STRATEGIES = ("retry", "record-after", "record-before")


def _charge(op: LabOperation, timeout: float) -> None:
    httpx.post(
        f"{settings.SANDBOX_PROVIDER_URL}/v1/charges",
        json={"amount": op.amount, "currency": "EUR", "customer": "cus_lab", "reference": op.reference},
        headers={"Idempotency-Key": f"naive-{uuid.uuid4()}"},  # a fresh key: the bug being shown
        timeout=timeout,
    ).raise_for_status()


def _start(op_id: int) -> LabOperation:
    LabOperation.objects.filter(id=op_id).update(pid=os.getpid())
    op = LabOperation.objects.get(id=op_id)
    LabOperation.objects.filter(id=op_id).update(attempts=op.attempts + 1)
    return op


def _finish(op_id: int, label: str) -> str:
    LabOperation.objects.filter(id=op_id).update(finished=True, pid=None)
    return label


@shared_task(
    name="crashlab.naive_execute",
    acks_late=True,
    reject_on_worker_lost=True,
    bind=True,
    max_retries=3,
)
def naive_execute(self: Task[Any, Any], op_id: int, strategy: str, timeout: float) -> str:
    """One delivery of a naive executor for ``LabOperation`` ``op_id``.

    A failed call (timeout, dropped connection, 5xx) is retried by Celery up to three times,
    except under ``record-before``, where the operation already counts as done.
    """
    op = _start(op_id)
    if strategy == "record-before":
        if op.done:
            return _finish(op_id, "skipped")
        LabOperation.objects.filter(id=op_id).update(done=True)
        try:
            _charge(op, timeout)
        except httpx.HTTPError:
            return _finish(op_id, "gave-up")  # it is "done" already: nothing will retry it
        return _finish(op_id, "called")
    if strategy == "record-after" and op.done:
        return _finish(op_id, "skipped")
    try:
        _charge(op, timeout)
    except httpx.HTTPError as exc:
        if self.request.retries >= (self.max_retries or 0):
            return _finish(op_id, "gave-up")
        raise self.retry(exc=exc, countdown=0.1) from exc
    if strategy == "record-after":
        LabOperation.objects.filter(id=op_id).update(done=True)
    return _finish(op_id, "called")
