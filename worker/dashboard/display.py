"""How the dashboard shows a value it did not write (job types, errors, reasons, keys, ids): escaped, with
control and bidirectional-formatting characters made visible (``\\u202e``: "evil" never shows as "live"), in a
``<bdi>`` so it cannot reorder the text around it, and optionally clipped to one line with the full value in
its title (a 256-character job type must not stretch the page)."""

from __future__ import annotations

from markupsafe import Markup, escape

from worker.ops.dlq_records import escape_bidi, printable


def visible(value: object) -> str:
    """``value`` as text with control and bidi formatting characters escaped (``\\x1b``, ``\\u202e``)."""
    return printable(str(value))


def shown(value: object, clip: int | None = None) -> Markup:
    """The Jinja filter ``shown``: ``{{ v | shown }}``, or ``{{ v | shown(40) }}`` to clip to 40 characters
    (an ellipsis, the whole value in the title)."""
    text = visible(value)
    if clip is not None and len(text) > clip:
        return Markup('<bdi class="clip" title="{}">{}…</bdi>').format(text, text[: clip - 1])
    return Markup("<bdi>{}</bdi>").format(escape(text))


def shown_block(text: str) -> Markup:
    """The Jinja filter ``shown_block``, for multi-line text the page already made printable (a body, a result):
    line breaks kept, bidi formatting characters escaped, isolated."""
    return Markup("<bdi>{}</bdi>").format(escape_bidi(text))
