"""The process configurations the benchmark compares: Celery pools and gunicorn worker classes.

Written on the command line as ``pool:concurrency[:prefetch]`` (``prefork:1``, ``threads:4``,
``threads:8:2``) and ``class[:threads]`` (``sync``, ``gthread:4``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CeleryPool:
    """``celery worker -P pool -c concurrency --prefetch-multiplier prefetch`` per process."""

    pool: str = "prefork"
    concurrency: int = 1
    prefetch: int = 1

    @classmethod
    def parse(cls, text: str) -> CeleryPool:
        """``"threads:4"`` -> ``CeleryPool("threads", 4, 1)``; ValueError for anything else."""
        pool, _, rest = text.partition(":")
        numbers = [int(n) for n in rest.split(":") if n] if rest else []
        if pool not in ("prefork", "threads", "solo") or len(numbers) > 2 or any(n < 1 for n in numbers):
            raise ValueError(f"not a Celery pool: {text!r} (pool:concurrency[:prefetch])")
        return cls(pool, *numbers)

    @property
    def label(self) -> str:
        """The command-line spelling, e.g. ``threads:4:1``."""
        return f"{self.pool}:{self.concurrency}:{self.prefetch}"


@dataclass(frozen=True)
class WebWorkers:
    """``gunicorn -k worker_class --threads threads`` per process."""

    worker_class: str = "sync"
    threads: int = 1

    @classmethod
    def parse(cls, text: str) -> WebWorkers:
        """``"gthread:4"`` -> ``WebWorkers("gthread", 4)``; ValueError for anything else."""
        worker_class, _, threads = text.partition(":")
        if worker_class not in ("sync", "gthread") or (threads and int(threads) < 1):
            raise ValueError(f"not a gunicorn worker class: {text!r} (sync or gthread:N)")
        if worker_class == "sync" and threads not in ("", "1"):
            raise ValueError("sync workers have one thread")
        return cls(worker_class, int(threads or 1))

    @property
    def label(self) -> str:
        """The command-line spelling, e.g. ``gthread:4``."""
        return self.worker_class if self.worker_class == "sync" else f"{self.worker_class}:{self.threads}"
