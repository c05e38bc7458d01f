"""The runbooks at `/runbooks`: docs/runbooks.md as one HTML page with an anchor per alert (``#gpuoverheating``), so
the links of the alerts, the status page and the CLI work inside a datacentre with no internet (docs/alerting.md,
"Runbook links").

markdown-it-py renders it (CommonMark and tables, the Markdown the file is written in) on the first request, and the
page is kept: the agent's memory and idle CPU are tuned (benchmarks/README.md), so the library is imported only when
someone reads the runbooks, never at start. Raw HTML in the Markdown is escaped, not passed through, and markdown-it
refuses javascript:, vbscript: and data: links, so the document cannot put a script on the page; gpuwatch.web.server
serves it with a Content-Security-Policy that forbids scripts besides.
"""

from __future__ import annotations

import html
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpuwatch import __version__
from gpuwatch.core.latch import Latch
from gpuwatch.core.thresholds import RUNBOOK_FILE
from gpuwatch.files.shipped import shipped_file

if TYPE_CHECKING:
    from markdown_it.token import Token

log = logging.getLogger(__name__)

# No script, no frame, no form, no base, no image or font from anywhere: the page is text, links and inline style.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:60em;line-height:1.45}
h1{font-size:1.4em;margin:0 0 .4em}h2{font-size:1.15em;margin:1.6em 0 .3em;padding-top:.4em;border-top:1px solid #ddd}
p{margin:.4em 0}ul{margin:.3em 0;padding-left:1.4em}li{margin:.2em 0}
code{font-family:ui-monospace,monospace;font-size:.9em;background:#f4f4f4;padding:0 .2em;border-radius:.2em}
table{border-collapse:collapse}td,th{padding:.3em .5em;border-bottom:1px solid #ddd;text-align:left}
th{background:#f4f4f4}.nav{font-size:.9em;color:#666;margin-bottom:1em}h2:target{background:#fff6e0}
"""


class RunbooksUnavailable(Exception):
    """The runbooks cannot be shown (the file or markdown-it-py missing: a broken install); the message says which."""


class RunbooksPage:
    """docs/runbooks.md rendered once, on the first call, and kept; thread-safe (one thread per request)."""

    def __init__(self, locate: Callable[[], Path] = lambda: shipped_file(RUNBOOK_FILE)) -> None:
        self._locate = locate
        self._page: bytes | None = None
        self._lock = threading.Lock()
        self._problem = Latch(log)

    def html(self) -> bytes:
        """The page; RunbooksUnavailable (logged once until it clears) when it cannot be made. A failure is not
        kept, so a repaired install serves the page without a restart."""
        with self._lock:
            if self._page is None:
                try:
                    self._page = _page(render_markdown(self._read()))
                except RunbooksUnavailable as exc:
                    self._problem.fail("/runbooks: %s", exc, level=logging.ERROR)
                    raise
                self._problem.recover("/runbooks: the runbooks are readable again")
            return self._page

    def _read(self) -> str:
        try:
            return self._locate().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # ShippedFileMissing is an OSError
            raise RunbooksUnavailable(f"cannot read the runbooks: {exc}") from None


def render_markdown(text: str) -> str:
    """The document's HTML: each heading with an id, GitHub's way (``## GpuOverheating`` -> ``gpuoverheating``), so
    the anchors the rules and docs link work here as on a rendered repository; raw HTML escaped; links to the other
    documents of docs/, which the agent does not serve, left as their text and path."""
    try:
        from markdown_it import MarkdownIt
    except ImportError as exc:
        raise RunbooksUnavailable(
            f"markdown-it-py is missing ({exc}): reinstall gpuwatch-agent, which depends on it"
        ) from None
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    tokens = md.parse(text)
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            token.attrSet("id", heading_id(tokens[i + 1].content))
        elif token.type == "inline" and token.children:
            token.children = _unlink_other_documents(token.children)
    return str(md.renderer.render(tokens, md.options, {}))


def heading_id(text: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _unlink_other_documents(children: list[Token]) -> list[Token]:
    """A link to another file of docs/ ("alerting.md#opt-in-alerts") would be a 404 on the agent: keep its text and
    name the file after it instead."""
    from markdown_it.token import Token

    out: list[Token] = []
    closing: list[str | None] = []  # per open link: the note to put at its close, None for a link kept
    for child in children:
        if child.type == "link_open":
            href = str(child.attrGet("href") or "")
            relative = not re.match(r"[a-z][a-z0-9+.\-]*:|#|/", href, re.IGNORECASE)
            closing.append(f" (docs/{href})" if relative else None)
            if relative:
                continue
        elif child.type == "link_close" and closing:
            note = closing.pop()
            if note is not None:
                out.append(Token(type="text", tag="", nesting=0, content=note))
                continue
        out.append(child)
    return out


def _page(body: str) -> bytes:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>gpuwatch runbooks</title>
<style>{_STYLE}</style></head><body>
<p class="nav"><a href="./">← this node's status page</a> · served by the gpuwatch agent {html.escape(__version__)} from
{RUNBOOK_FILE}</p>
{body}
</body></html>""".encode()
