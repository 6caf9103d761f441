"""What an agent may reach (issue 18, item 6): the actions it may submit, and whose intents it
sees and cancels.

An action pattern is ``*`` (every action), ``<prefix>.*`` (every action under the prefix:
``payments.*`` matches ``payments.charge`` and ``payments.refund``, not ``payments``) or one
action's exact name (``email.send``). An agent with no pattern may submit nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from operations.models import Agent

#: One pattern: ``*``, ``name(.name)*`` or ``name(.name)*.*``; names as actions are written.
PATTERN = re.compile(r"^(\*|[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*(\.\*)?)$")
#: Every action: the default of ``create_agent``, and what existing agents got (migration 0021).
ALL_ACTIONS = ["*"]


def action_patterns_parse(text: str) -> list[str]:
    """The patterns of a comma-separated list (``"payments.*, email.send"``), de-duplicated in
    order; an empty text is no pattern at all (the agent may submit nothing).

    Raises:
        ValueError: naming the first pattern that is not ``*``, ``prefix.*`` or an action name.
    """
    patterns: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if not PATTERN.match(item):
            raise ValueError(f"not an action pattern: {item!r} (use '*', 'payments.*' or 'email.send')")
        if item not in patterns:
            patterns.append(item)
    return patterns


def action_allowed(patterns: Iterable[str], action: str) -> bool:
    """Whether ``action`` (``payments.charge``) is matched by one of ``patterns``."""
    for pattern in patterns:
        if pattern == "*" or pattern == action:
            return True
        if pattern.endswith(".*") and action.startswith(pattern[:-1]):
            return True
    return False


def agent_sees_principal(agent: Agent) -> str | None:
    """The principal whose intents ``agent`` reads, lists and cancels: its own when its scope is
    ``own``, None (every principal of its tenant) when ``tenant``."""
    return agent.principal if agent.scope == Agent.Scope.OWN else None
