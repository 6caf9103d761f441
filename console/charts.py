"""Small charts drawn on the server as inline SVG (no JavaScript, no external library)."""

from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

WIDTH = 600
HEIGHT = 120
AXIS = 16  # room for the labels under the bars


def throughput_svg(minutes: list[dict[str, Any]]) -> SafeString:
    """A stacked bar per minute (succeeded in green, failed in red) with a text summary for
    screen readers. ``minutes`` is ``selectors.throughput_last_hour()``."""
    succeeded = sum(row["succeeded"] for row in minutes)
    failed = sum(row["failed"] for row in minutes)
    peak = max([row["succeeded"] + row["failed"] for row in minutes] + [1])
    slot = WIDTH / max(len(minutes), 1)
    plot = HEIGHT - AXIS
    bars = []
    for index, row in enumerate(minutes):
        x = round(index * slot + 1, 1)
        width = round(max(slot - 2, 1), 1)
        ok_height = round(plot * row["succeeded"] / peak, 1)
        fail_height = round(plot * row["failed"] / peak, 1)
        label = f"{row['minute']:%H:%M} UTC: {row['succeeded']} succeeded, {row['failed']} failed"
        bars.append(
            (
                x,
                plot - ok_height,
                width,
                ok_height,
                x,
                plot - ok_height - fail_height,
                width,
                fail_height,
                label,
            )
        )
    body = format_html_join(
        "",
        '<g><title>{}</title><rect class="ok" x="{}" y="{}" width="{}" height="{}"/>'
        '<rect class="fail" x="{}" y="{}" width="{}" height="{}"/></g>',
        ((b[8], b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]) for b in bars),
    )
    first = f"{minutes[0]['minute']:%H:%M}" if minutes else ""
    last = f"{minutes[-1]['minute']:%H:%M}" if minutes else ""
    return format_html(
        '<svg class="chart" viewBox="0 0 {w} {h}" width="100%" height="{h}" preserveAspectRatio="xMinYMid meet" role="img" '
        'aria-label="Intents finished per minute over the last hour: {s} succeeded, {f} failed, '
        'busiest minute {p}">'
        '<line x1="0" y1="{plot}" x2="{w}" y2="{plot}" class="axis"/>{body}'
        '<text x="0" y="{h}" class="label">{first}</text>'
        '<text x="{w}" y="{h}" class="label" text-anchor="end">{last} UTC</text></svg>',
        w=WIDTH,
        h=HEIGHT,
        plot=plot,
        s=succeeded,
        f=failed,
        p=peak if succeeded + failed else 0,
        body=body,
        first=first,
        last=last,
    )
