"""HTTP load generators: a closed loop (N clients as fast as answers come) and an open loop
(requests started on a fixed schedule, latency measured from the scheduled time)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

#: ``send(client, seq)`` sends request number ``seq`` and returns (HTTP status, intent_id or "").
Sender = Callable[[httpx.Client, int], tuple[int, str]]


@dataclass
class Sample:
    """One request: wall-clock start (epoch seconds), client-side duration (seconds), answer."""

    seq: int
    started_at: float
    seconds: float
    status: int
    intent_id: str


def _client() -> httpx.Client:
    return httpx.Client(timeout=30.0)


def closed_loop(
    send: Sender, *, total: int | None, clients: int, duration: float | None = None
) -> list[Sample]:
    """``clients`` threads send back to back until ``total`` requests (or ``duration`` seconds)
    are done. Returns every sample."""
    samples: list[Sample] = []
    lock = threading.Lock()
    counter = iter(range(10**12))
    stop_at = time.monotonic() + duration if duration else None

    def run() -> None:
        with _client() as client:
            while True:
                with lock:
                    seq = next(counter)
                if total is not None and seq >= total:
                    return
                if stop_at is not None and time.monotonic() >= stop_at:
                    return
                wall, began = time.time(), time.perf_counter()
                try:
                    status, intent_id = send(client, seq)
                except httpx.HTTPError:
                    status, intent_id = 0, ""
                sample = Sample(seq, wall, time.perf_counter() - began, status, intent_id)
                with lock:
                    samples.append(sample)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def open_loop(send: Sender, *, total: int, rate: float, clients: int) -> list[Sample]:
    """Start request ``i`` at ``t0 + i / rate`` (``rate`` per second) on a pool of ``clients``
    threads. ``started_at`` is the scheduled time, so a backlog shows up as latency instead of
    being hidden (no coordinated omission)."""
    samples: list[Sample] = []
    lock = threading.Lock()
    jobs: queue.Queue[tuple[int, float] | None] = queue.Queue()

    def run() -> None:
        with _client() as client:
            while (job := jobs.get()) is not None:
                seq, scheduled = job
                try:
                    status, intent_id = send(client, seq)
                except httpx.HTTPError:
                    status, intent_id = 0, ""
                with lock:
                    samples.append(Sample(seq, scheduled, time.time() - scheduled, status, intent_id))

    threads = [threading.Thread(target=run, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    t0 = time.time() + 0.05
    for seq in range(total):
        scheduled = t0 + seq / rate
        delay = scheduled - time.time()
        if delay > 0:
            time.sleep(delay)
        jobs.put((seq, scheduled))
    for _ in threads:
        jobs.put(None)
    for thread in threads:
        thread.join()
    return samples
